"""The golden-output cases: CLI commands on fixed inputs whose JSON must not change when code moves.

Recorded before the panel restructuring (``python -m tests.golden.cases --write``) and compared by
``tests/test_golden_cli.py``. Re-record only for a change that means to alter an output, and say so in
the commit. Paths that depend on where the repository lies are written as ``<repo>`` / ``<out>``.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from g4v.paths import EXAMPLES_DIR, REAL_CONFIG_DIR, REPO_ROOT
from tests.cli import run_cli

GOLDEN_DIR = Path(__file__).resolve().parent
EXAMPLE_WIDE = EXAMPLES_DIR / "shapes-wide.png"
EXAMPLE_SQUARE = EXAMPLES_DIR / "shapes-square.png"
QUESTION = "What colour is the shape?"


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after ``python -m g4v``; "{out}" is a fresh folder
    result: str = "stdout-json"  # or "stdout-text", or a file name inside {out}


CASES = [
    Case("tiling-bundled", ("tiling", "--json", str(EXAMPLE_WIDE))),
    Case("tiling-real-config", ("tiling", "--config", str(REAL_CONFIG_DIR), "--json", str(EXAMPLES_DIR / "shapes-tall.png"))),
    Case("chat-greedy", ("chat", "--backend", "hf", "--max-new-tokens", "12", "--image", str(EXAMPLE_SQUARE), QUESTION),
         result="stdout-text"),
    Case("inspect-ablate", ("inspect", "--image", str(EXAMPLE_SQUARE), "--prompt", QUESTION, "--out", "{out}",
                            "--ablate", "deepstack0", "--scale", "spatial_TL=0.5", "--max-new-tokens", "6"),
         result="summary.json"),
    Case("lora-diff", ("lora-diff", "--adapter", "tiny-trained-french", "--image", str(EXAMPLE_WIDE), "--prompt", QUESTION,
                       "--max-new-tokens", "8", "--json")),
    Case("attribute-lens", ("attribute", "--image", str(EXAMPLE_SQUARE), "--prompt", QUESTION, "--out", "{out}",
                            "--seeds", "2", "--max-new-tokens", "4"), result="summary.json"),
    Case("attribute-contrast", ("attribute", "--image", str(EXAMPLE_WIDE), "--prompt", QUESTION, "--out", "{out}",
                                "--against", "green", "blue", "--method", "ig", "--steps", "4", "--seeds", "2",
                                "--no-lens", "--deletion-level", "deepstack1", "--target", "red"),
         result="summary.json"),
]


def run_case(case: Case, out: Path):
    argv = [arg.replace("{out}", str(out)) for arg in case.argv]
    done = run_cli(*argv)
    if done.returncode != 0:
        raise RuntimeError(f"{case.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    if case.result == "stdout-text":
        value = done.stdout
    elif case.result == "stdout-json":
        value = json.loads(done.stdout)
    else:
        value = json.loads((out / case.result).read_text())
    return normalise(value, out)


def normalise(value, out: Path):
    """Machine-dependent paths become placeholders, so a clone anywhere compares equal."""
    if isinstance(value, dict):
        return {k: normalise(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(str(out), "<out>").replace(str(REPO_ROOT), "<repo>")
    return value


def golden_path(case: Case) -> Path:
    return GOLDEN_DIR / f"{case.name}.json"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    for case in CASES:
        with tempfile.TemporaryDirectory() as folder:
            golden_path(case).write_text(json.dumps(run_case(case, Path(folder)), indent=1, sort_keys=True) + "\n")
            print("wrote", golden_path(case))
