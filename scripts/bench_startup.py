"""How long ``python app.py`` takes to serve, against importing its three big libraries alone.

    .venv/bin/python scripts/bench_startup.py [--runs 3] [--model DIR]

Each run is a fresh process: first ``import torch, transformers, gradio`` alone (the floor no app
can beat), then ``app.py`` on the bundled checkpoint until its port answers. Prints each run and the
ratio of the medians measured in this run (issue 36's target: at most 1.5x).
"""

import argparse
import os
import statistics
import subprocess
import sys
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


def time_app(model: str, limit: float = 300) -> float:
    """Seconds from starting ``app.py`` until its port accepts a connection."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port)}
    start = time.perf_counter()
    app = subprocess.Popen([sys.executable, "app.py", "--model", model], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(port, limit, app, interval=0.05)
        return time.perf_counter() - start
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
    imports, apps = [], []
    for run in range(args.runs):
        imports.append(time_imports())
        apps.append(time_app(args.model))
        print(f"run {run + 1}: imports {imports[-1]:5.2f} s   app.py serving {apps[-1]:5.2f} s")
    floor, app = statistics.median(imports), statistics.median(apps)
    print(f"median: imports {floor:.2f} s, app.py {app:.2f} s: {app / floor:.2f}x the imports alone")


if __name__ == "__main__":
    main()
