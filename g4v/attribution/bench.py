"""What gradient x input costs against a plain forward pass: time and peak memory, in one run.

``python -m g4v bench attribute`` builds the model (the bundled checkpoint's config, or the real
one's with random weights: the same compute), one synthetic image prompt, and measures:

* ``forward``: the plain model forward (vision tower and language model), as a chat's prefill;
* ``gradxinput``: what :func:`g4v.attribution.gradients.gradient_x_input` does for one target
  token: the vision tower once, then the language model forward and one backward pass.

Peak memory is the allocator's peak on a GPU and the profiler's CPU allocation events on a CPU
(as ``g4v.model.bench`` measures it). The ratios are what the issue's targets are about.
"""

import argparse
from dataclasses import dataclass
from functools import partial

import torch

from g4v.attribution.forward import encode_image, make_answer
from g4v.attribution.gradients import METHODS, gradient_x_input
from g4v.attribution.pointing import PICTURE_SETS, POINTING_METHOD, POINTING_TARGET, POINTING_TARGETS
from g4v.errors import read_whole
from g4v.model.bench import add_model_flags, build_model, measure_modes, run_benchmarks, synthetic_inputs
from g4v.model.levels import describe_levels

MODES = ("forward", "gradxinput")


@dataclass
class AttributionBench:
    model: str
    device: str
    seq_len: int
    image_tokens: int
    seconds: dict  # mode -> fastest seconds
    peak_bytes: dict  # mode -> peak bytes above the starting point

    def ratios(self) -> dict:
        return {"time": self.seconds["gradxinput"] / self.seconds["forward"],
                "memory": self.peak_bytes["gradxinput"] / max(self.peak_bytes["forward"], 1)}


def run_mode(model, inputs: dict, mode: str) -> None:
    if mode == "forward":
        with torch.inference_mode():
            model(**inputs, logits_to_keep=1)
        return
    prompt = inputs["input_ids"][:, :-1]  # the last prompt token plays the answer token
    answer = make_answer(_NoDecode(), prompt, [int(inputs["input_ids"][0, -1])], 0)
    gradient_x_input(model, encode_image(model, inputs), answer, describe_levels(model.config))


class _NoDecode:
    """Synthetic prompts have no tokenizer: answer tokens are shown by id."""

    def decode(self, ids):
        return str(ids)


def bench(name: str, device: torch.device, dtype: torch.dtype, image_size_hw: tuple[int, int],
          repeats: int) -> AttributionBench:
    label, model = build_model(name, device, dtype)
    inputs = synthetic_inputs(model.config, image_size_hw, device, dtype)
    seconds, peaks = measure_modes(partial(run_mode, model, inputs), MODES, device, repeats)
    image_tokens = int((inputs["input_ids"] == model.config.image_token_index).sum())
    return AttributionBench(label, str(device), int(inputs["input_ids"].shape[1]), image_tokens, seconds, peaks)


def format_result(result: AttributionBench) -> str:
    r = result.ratios()
    return (f"{result.model} on {result.device}: {result.seq_len} tokens ({result.image_tokens} image)\n"
            f"  time  forward {result.seconds['forward'] * 1e3:.1f} ms | gradxinput "
            f"{result.seconds['gradxinput'] * 1e3:.1f} ms (x{r['time']:.2f}, target <= 3)\n"
            f"  peak  forward {result.peak_bytes['forward'] / 2**20:.1f} MiB | gradxinput "
            f"{result.peak_bytes['gradxinput'] / 2**20:.1f} MiB (x{r['memory']:.2f}, target <= 2.5)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    parser.add_argument("--pointing-game", type=read_whole, default=0, metavar="N",
                        help="instead: the pointing game on N held-out demo pictures (trained checkpoint)")
    parser.add_argument("--pointing-model", default=None, metavar="DIR",
                        help="checkpoint for --pointing-game (default: the trained demo checkpoint)")
    parser.add_argument("--pointing-set", default=PICTURE_SETS[0], choices=PICTURE_SETS,
                        help="pictures for --pointing-game: held-out (report) or validation (choose settings)")
    parser.add_argument("--pointing-method", default=POINTING_METHOD, choices=METHODS,
                        help="attribution method for --pointing-game")
    parser.add_argument("--pointing-target", default=POINTING_TARGET, choices=POINTING_TARGETS,
                        help="for --pointing-game: the answer's log-prob, or its log-odds against the other colours")


def run(args) -> int:
    return run_benchmarks(args, bench, format_result)
