"""How long ``python app.py`` takes to serve, against importing its three big libraries alone.

    .venv/bin/python scripts/bench_startup.py [--runs 3] [--model DIR]

Each run is a fresh process: first ``import torch, transformers, gradio`` alone (the floor no app
can beat), then ``app.py`` on the bundled checkpoint until its port answers (the page is served;
the model loads behind it, :mod:`g4v.engines.deferred`) and until it says "Model loaded" (the
first answer needs nothing more). Prints each run and the ratios of the
medians measured in this run (issue 36's target: serving at most 1.5x the imports).
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository's g4v, not an installed one

from g4v.engines.serving import free_port, wait_until_serving  # noqa: E402
from g4v.errors import G4VError  # noqa: E402
IMPORTS = "import torch, transformers, gradio"


def time_imports() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, cwd=ROOT)
    return time.perf_counter() - start


def time_app(model: str, limit: float = 300) -> tuple[float, float]:
    """Seconds from starting ``app.py`` until its port accepts a connection, and until it says
    its model is loaded."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port)}
    start = time.perf_counter()
    app = subprocess.Popen([sys.executable, "app.py", "--model", model], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    said_loaded: list[float] = []

    def read_lines():
        for line in app.stdout:
            if line.startswith("* Model loaded") and not said_loaded:
                said_loaded.append(time.perf_counter() - start)

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    try:
        wait_until_serving(port, limit, app, interval=0.05)
        serving = time.perf_counter() - start
        while not said_loaded and app.poll() is None and time.perf_counter() - start < limit:
            time.sleep(0.05)
        if not said_loaded:
            raise SystemExit("error: app.py served its page but never said its model loaded")
        return serving, said_loaded[0]
    except G4VError as err:
        raise SystemExit(f"error: app.py: {err}") from None
    finally:
        app.terminate()
        try:
            app.wait(30)
        except subprocess.TimeoutExpired:
            app.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default=str(ROOT / "assets" / "granite4-vision-tiny"))
    args = parser.parse_args()
    imports, serving, ready = [], [], []
    for run in range(args.runs):
        imports.append(time_imports())
        served, loaded = time_app(args.model)
        serving.append(served)
        ready.append(loaded)
        print(f"run {run + 1}: imports {imports[-1]:5.2f} s   app.py serving {served:5.2f} s   model loaded {loaded:5.2f} s")
    floor, page, model = (statistics.median(times) for times in (imports, serving, ready))
    print(f"median: imports {floor:.2f} s, app.py serving {page:.2f} s ({page / floor:.2f}x the imports alone), "
          f"model loaded {model:.2f} s ({model / floor:.2f}x)")


if __name__ == "__main__":
    main()
