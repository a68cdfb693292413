"""The GPU check: the workbench at the real model's size, in one run, one report.

    python scripts/gpu_check.py OUT_DIR              # on a CUDA GPU: the real config, bf16
    python scripts/gpu_check.py --cpu-smoke OUT_DIR  # the same code path on the CPU, narrow widths

(``scripts/gpu_check.sh`` wraps it: it puts the carried transformers wheel on the path first.)

Why random weights: no machine that lends a GPU to this project can reach a model hub. Weights
built from ``assets/granite-vision-4.1-4b-config`` in bf16 have the real model's shapes, so its
compute and memory traffic, and therefore its timings and memory, are real; only the answers are
noise. They are built directly on the device (``torch.device`` context): a 4B model never passes
through CPU memory. The bundled checkpoint's tokenizer stands in for the real one (its ids stay
below the real vocabulary size); the image processor is the real one (384-pixel tiles, 27 pinpoints).

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

#: Widths of the CPU smoke config; every layer count, map and size that shapes the code path stays real.
SMOKE_WIDTHS = {
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 1},
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1},
    "qformer_config": {"intermediate_size": 128},
}


@dataclass
class Sizes:
    """How much work each step does: the GPU run's, or the smoke run's (fewer tokens and repeats)."""

    # (height, width): 1536 x 768 px (width x height), tiles 4 wide x 2 tall + the base view: 1320 image
    # tokens on the real config.
    image_hw: tuple[int, int] = (768, 1536)
    new_tokens: int = 128
    batch: int = 8
    repeats: int = 5
    side_by_side_tokens: int = 32
    bandwidth_bytes_s: float = 4.8e12  # H200 HBM3e


SMOKE_SIZES = Sizes(new_tokens=8, batch=2, repeats=1, side_by_side_tokens=4)


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


def real_config(smoke: bool):
    """The real granite-vision-4.1-4b config; for the smoke run with :data:`SMOKE_WIDTHS`."""
    from transformers import Granite4VisionConfig

    from g4v.loading import read_raw_config
    from g4v.paths import REAL_CONFIG_DIR

    raw = read_raw_config(REAL_CONFIG_DIR)
    if smoke:
        for part, widths in SMOKE_WIDTHS.items():
            raw[part] = {**raw[part], **widths}
    raw.pop("model_type", None)
    return Granite4VisionConfig(**raw)


def stand_in_processor(config):
    """The real image processor (from ``processor_config.json``) with the bundled tokenizer."""
    from transformers import AutoProcessor, Granite4VisionProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR

    raw = json.loads((REAL_CONFIG_DIR / "processor_config.json").read_text())
    image_settings = {key: value for key, value in raw["image_processor"].items() if key != "image_processor_type"}
    image_settings["image_grid_pinpoints"] = config.image_grid_pinpoints
    bundled = AutoProcessor.from_pretrained(str(BUNDLED_MODEL_DIR))
    return Granite4VisionProcessor(
        image_processor=LlavaNextImageProcessorPil(**image_settings), tokenizer=bundled.tokenizer,
        chat_template=bundled.chat_template,
        **{key: raw[key] for key in ("patch_size", "vision_feature_select_strategy", "image_token",
                                     "num_additional_image_tokens", "downsample_rate")})


def build_engine(check: Check):
    """Random weights from the real config, built on ``check.device`` in ``check.dtype``, behind
    the workbench's transformers engine. The image token becomes the stand-in tokenizer's."""
    from transformers import Granite4VisionForConditionalGeneration

    from g4v.engines.hf import TransformersEngine
    from g4v.loading import LoadedModel

    config = real_config(check.smoke)
    processor = stand_in_processor(config)
    tokenizer = processor.tokenizer
    if len(tokenizer) > config.text_config.vocab_size:
        raise RuntimeError("the stand-in tokenizer has more ids than the model's vocabulary")
    config.image_token_index = tokenizer.convert_tokens_to_ids(processor.image_token)
    torch.manual_seed(0)
    with torch.device(check.device):
        model = Granite4VisionForConditionalGeneration._from_config(config, dtype=check.dtype)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    loaded = LoadedModel(model=model, processor=processor, source="granite-vision-4.1-4b config, random weights",
                         device=check.device, dtype=check.dtype)
    return TransformersEngine(loaded.source, loaded=loaded)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
             "bandwidth_ratio", "time_norms", "time_full", "ablation_kl", "pinpoints_ok", "max_pinpoint_tokens",
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
    from gpu_check_steps import STEPS

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
