"""The GPU check: the workbench at the real model's size, in one run, one report.

    python scripts/gpu_check.py OUT_DIR              # on a CUDA GPU: the real config, bf16
    python scripts/gpu_check.py --cpu-smoke OUT_DIR  # the same code path on the CPU, narrow widths

(``scripts/gpu_check.sh`` wraps it: it puts the carried wheels on the path first.)

The model under test (random weights from the real config) is :mod:`gpu_check_model`'s; the steps
are :mod:`gpu_check_steps`'s. This module runs them: the imports go one way, runner -> steps ->
model, so the four modules form no circle.

``--cpu-smoke`` keeps every count that shapes the code path (27 vision and 40 language layers, the
level map, the 27 pinpoints, 384-pixel tiles and 16-pixel patches, so the same image-token counts)
and shrinks only the widths, so CI runs the whole check in about a minute and it cannot rot
before a GPU is lent.

Each step (:mod:`gpu_check_steps`) is timed and memory-measured on its own; a step that fails is
recorded with its error and the others still run. Writes ``OUT_DIR/gpu_check.json`` and
``OUT_DIR/gpu_check.txt`` (a short table); exits 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_check_model import SMOKE_SIZES, Sizes, synchronize  # noqa: E402,F401 (the tests import the sizes from here)
from gpu_check_steps import STEPS  # noqa: E402

@dataclass
class StepResult:
    """One step of the report: ``status`` is ok, failed or skipped; ``peak_bytes`` is the CUDA
    allocator's peak during the step (on the CPU: the process's peak resident size so far)."""

    name: str
    status: str
    seconds: float
    peak_bytes: int
    metrics: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class Check:
    """What the steps share: the device, the model under test (once built) and the run's sizes."""

    device: torch.device
    dtype: torch.dtype
    sizes: Sizes
    out_dir: Path
    smoke: bool
    engine: object = None  # a g4v TransformersEngine around the random-weight model
    facts: dict = field(default_factory=dict)  # measured by earlier steps, read by later ones


@contextmanager
def measured(device: torch.device):
    """Wall time and peak memory of the block: yields a dict that gets ``seconds`` and ``peak_bytes``."""
    record = {}
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    try:
        yield record
    finally:
        synchronize(device)
        record["seconds"] = time.perf_counter() - start
        if device.type == "cuda":
            record["peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        else:
            record["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_step(check: Check, name: str, step, deadline: float) -> StepResult:
    """Run one step in isolation: its failure (an exception, out of memory) becomes its result."""
    if step is None:
        return StepResult(name, "skipped", 0.0, 0, error="not written yet")
    if time.monotonic() > deadline:
        return StepResult(name, "skipped", 0.0, 0, error="out of time (--budget-s)")
    if name != "load" and check.engine is None:
        return StepResult(name, "skipped", 0.0, 0, error="needs the model, which did not load")
    record, metrics, error = {}, {}, None
    try:
        with measured(check.device) as record:
            metrics = step(check) or {}
    except Exception as err:  # every failure is reported, and the next step still runs
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:500]
        metrics = {"traceback": traceback.format_exc(limit=-4)[-2000:]}
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    status = "skipped" if metrics.pop("skipped", None) else ("failed" if error else "ok")
    return StepResult(name, status, record.get("seconds", 0.0), record.get("peak_bytes", 0), metrics, error)


def environment(check: Check) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": str(check.device), "dtype": str(check.dtype),
           "mode": "cpu-smoke" if check.smoke else "gpu"}
    if check.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(check.device)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(check.device).total_memory
    return env


def table(results: list[StepResult]) -> str:
    """The short text table of the report: one row per step, its main numbers in a few words."""
    rows = [f"{'step':<18} {'status':<8} {'seconds':>8} {'peak GiB':>9}  main numbers"]
    for r in results:
        shown = {k: v for k, v in r.metrics.items() if k in _HEADLINE}
        text = ", ".join(f"{k}={_short(v)}" for k, v in shown.items()) or (r.error or "")
        rows.append(f"{r.name:<18} {r.status:<8} {r.seconds:>8.2f} {r.peak_bytes / 2**30:>9.2f}  {text}")
    return "\n".join(rows)


_HEADLINE = ("parameters", "image_tokens", "ttft_s", "decode_tok_s_batch1", "decode_tok_s_batch8",
             "bandwidth_ratio", "engine_over_bare", "chats_over_one_at_a_time", "compile_s", "same_as_eager", "time_norms", "time_full", "ablation_kl", "pinpoints_ok", "max_pinpoint_tokens",
             "merged_vs_adapter_max_rel", "merged_vs_native_max_rel", "native_over_merged_decode_batch1", "rows_per_s", "agreement",
             "batched_over_one_by_one", "same_answers", "circuits_s", "patching_s", "reason")


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="The workbench at the real model's size, on one GPU.")
    parser.add_argument("out_dir", type=Path, help="where gpu_check.json and gpu_check.txt go")
    parser.add_argument("--cpu-smoke", action="store_true", help="the same steps on the CPU, narrow widths")
    parser.add_argument("--budget-s", type=float, default=450.0, help="steps starting later than this are skipped")
    args = parser.parse_args(argv)
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("error: no CUDA GPU here; use --cpu-smoke for the CPU run", file=sys.stderr)
        return 2
    device = torch.device("cpu" if smoke else "cuda")
    check = Check(device, torch.float32 if smoke else torch.bfloat16, SMOKE_SIZES if smoke else Sizes(),
                  args.out_dir, smoke)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    start, deadline = time.monotonic(), time.monotonic() + args.budget_s
    results = []
    for name, step in STEPS():
        result = run_step(check, name, step, deadline)
        results.append(result)
        print(f"{name}: {result.status} in {result.seconds:.1f} s" + (f" ({result.error})" if result.error else ""),
              flush=True)
    report = {"environment": environment(check), "sizes": asdict(check.sizes),
              "total_seconds": time.monotonic() - start, "steps": [asdict(r) for r in results]}
    (args.out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(results)
    (args.out_dir / "gpu_check.txt").write_text(json.dumps(report["environment"]) + "\n" + text + "\n")
    print(text)
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
