"""``python -m g4v bench inspect``: what the deepstack inspector's capture costs.

One forward pass of the whole model (vision tower, 8 projectors, language model) is timed and its
peak memory measured three ways, in one run: capture off (the plain model), norms captured (what
the inspector does by default), and ``--full`` (every tensor kept). Results are ratios to the plain
pass; the target is ``norms / off <= 1.10`` in time.

How time and memory are measured, and the models and inputs: :mod:`g4v.model.bench`.

Models: ``bundled`` (the shipped checkpoint), ``larger`` (random weights, the real architecture at
a few times the bundled size, see :func:`g4v.model.bench.larger_config`), ``real`` (random weights from the real
granite-vision-4.1-4b config: for a GPU, in bf16), or a path to a config.json / model folder.
Inputs are synthetic: random pixels for one image of ``--image-size`` and as many ``<image>``
tokens as the tiling plan says, inside a short run of text tokens.
"""

import argparse
from dataclasses import dataclass
from functools import partial

import torch

from g4v.errors import G4VError, read_whole
from g4v.model.bench import BenchSetup, add_model_flags, build_model, measure_modes, run_benchmarks, synthetic_inputs

MODES = ("off", "norms", "full")


@dataclass
class BenchResult(BenchSetup):
    repeats: int
    seconds: dict  # mode -> fastest seconds per forward
    peak_bytes: dict  # mode -> peak bytes allocated by the forward above the starting point

    def ratios(self) -> dict:
        return {
            "time_norms": self.seconds["norms"] / self.seconds["off"],
            "time_full": self.seconds["full"] / self.seconds["off"],
            "memory_norms": self.peak_bytes["norms"] / max(self.peak_bytes["off"], 1),
            "memory_full": self.peak_bytes["full"] / max(self.peak_bytes["off"], 1),
        }


def forward_once(model, inputs: dict, mode: str) -> None:
    from g4v.model.capture import capture_forward

    with torch.inference_mode():
        if mode == "off":
            model(**inputs, logits_to_keep=1)
        else:
            capture_forward(model, inputs, full=(mode == "full"), logits_to_keep=1)


def bench(name: str, device: torch.device, dtype: torch.dtype, image_size_hw: tuple[int, int],
          repeats: int) -> BenchResult:
    label, model = build_model(name, device, dtype)
    inputs = synthetic_inputs(model.config, image_size_hw, device, dtype)
    seconds, peaks = measure_modes(partial(forward_once, model, inputs), MODES, device, repeats)
    image_tokens = int((inputs["input_ids"] == model.config.image_token_index).sum())
    parameters = sum(p.numel() for p in model.parameters())
    return BenchResult(label, str(device), str(dtype).removeprefix("torch."), parameters,
                       int(inputs["input_ids"].shape[1]), image_tokens, repeats, seconds, peaks)


def format_result(result: BenchResult) -> str:
    r = result.ratios()
    return (f"{result.headline()}, best of {result.repeats}\n"
            f"  time  off {result.seconds['off'] * 1e3:.1f} ms | norms {result.seconds['norms'] * 1e3:.1f} ms "
            f"(x{r['time_norms']:.3f}) | full {result.seconds['full'] * 1e3:.1f} ms (x{r['time_full']:.3f})\n"
            f"  peak  off {result.peak_bytes['off'] / 2**20:.1f} MiB | "
            f"norms {result.peak_bytes['norms'] / 2**20:.1f} MiB (x{r['memory_norms']:.3f}) | full {result.peak_bytes['full'] / 2**20:.1f} MiB (x{r['memory_full']:.3f})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser, models=("bundled", "larger"), repeats=7)
    parser.add_argument("--threads", type=read_whole, default=None, help="torch CPU threads (default: torch's choice)")


def run(args) -> int:
    return run_benchmarks(args, bench, format_result)


def main(argv=None) -> int:
    """Standalone entry (``python -m g4v.inspect.bench``), for machines without the full CLI set-up."""
    parser = argparse.ArgumentParser(prog="python -m g4v.inspect.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except G4VError as err:
        print(f"error: {err}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
