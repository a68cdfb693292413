"""What zeroing or scaling levels does to the model's answer: the next-token distribution, its top
tokens and the greedy continuation, before and after, and the KL divergence between the two.

A scaled run is a :func:`g4v.model.capture.capture_forward` with the scaling hook on, so its
capture (what was injected, the residual stream) comes with it. Numbers are refused, with a
one-line :class:`G4VError`, when the model's output is not finite: a huge factor overflows a bf16
or fp16 model, and a KL computed from NaN logits says nothing about the level.
"""

import math
from dataclasses import dataclass

import torch

from g4v.errors import G4VError
from g4v.inspect.settings import InspectSettings
from g4v.model.capture import Capture, capture_forward
from g4v.model.levels import Level
from g4v.model.records import TokenProb, plain
from g4v.model.scoring import greedy_continuation, kl_divergence, next_token_logprobs, next_token_probs, top_tokens

#: Greedy tokens shown before and after a change, unless told (``inspect``, the Deepstack tab).
CONTINUATION_TOKENS = InspectSettings.max_new_tokens

@dataclass
class RunOutcome:
    """What a prompt leads to: the next-token distribution and the greedy continuation."""

    next_token_probs: torch.Tensor  # (vocab,) float32, CPU
    top5: list[TokenProb]
    continuation: str
    continuation_ids: list[int]
    # (vocab,) float32, CPU: the same distribution as log-probabilities, finite even where a
    # probability underflows to 0, so the KL between two runs stays a number.
    next_token_logprobs: torch.Tensor


@dataclass
class AblationResult:
    scales: dict[str, float]  # level name -> factor (0 = ablated)
    kl_divergence: float  # KL(before || after) of the next-token distribution, in nats
    before: RunOutcome
    after: RunOutcome
    capture: Capture  # the modified run's capture

    def to_dict(self) -> dict:
        return {
            "scales": self.scales,
            "ablated": sorted(name for name, f in self.scales.items() if f == 0.0),
            "kl_divergence": self.kl_divergence,
            "top5_before": plain(self.before.top5),
            "top5_after": plain(self.after.top5),
            "continuation_before": self.before.continuation,
            "continuation_after": self.after.continuation,
            "levels_after": plain(self.capture.levels),
            "trajectory_after": self.capture.trajectory.to_dict(),
        }


def describe_scales(scales: dict[str, float]) -> str:
    """``{"deepstack0": 1e308, "spatial_TL": 0}`` -> ``"deepstack0 by 1e+308, spatial_TL by 0"``."""
    return ", ".join(f"{name} by {factor:g}" for name, factor in scales.items())


def require_finite_logits(logits: torch.Tensor, scales: dict[str, float] | None = None) -> None:
    """Refuse to report on NaN or infinite logits (an overflow in the model's dtype, or a huge
    scale factor): numbers computed from them would be NaN, not an answer."""
    if bool(torch.isfinite(logits[0, -1]).all()):
        return
    dtype = str(logits.dtype).removeprefix("torch.")
    if scales:
        raise G4VError(f"scaling {describe_scales(scales)} made the model's output non-finite (overflow in "
                       f"{dtype}); try a smaller factor")
    raise G4VError(f"the model's output is non-finite (NaN or infinite logits in {dtype}) for this input")


def run_outcome(model, inputs: dict, tokenizer, logits: torch.Tensor, max_new_tokens: int,
                scales: dict[str, float] | None = None, levels: list[Level] | None = None) -> RunOutcome:
    require_finite_logits(logits, scales)
    probs = next_token_probs(logits)
    ids = greedy_continuation(model, inputs, tokenizer, max_new_tokens, scales, levels) if max_new_tokens else []
    return RunOutcome(probs, top_tokens(probs, tokenizer), tokenizer.decode(ids, skip_special_tokens=True), ids,
                      next_token_logprobs(logits))


def compare_scaled(model, inputs: dict, tokenizer, base: RunOutcome, scales: dict[str, float],
                   max_new_tokens: int = CONTINUATION_TOKENS, full: bool = False,
                   levels: list[Level] | None = None) -> AblationResult:
    """Run again with ``scales`` applied; compare with ``base`` (the unmodified run's outcome).

    Raises :class:`G4VError` naming the factors when the scaled run's output is not finite."""
    capture, logits = capture_forward(model, inputs, scales=scales, full=full, levels=levels, logits_to_keep=1)
    after = run_outcome(model, inputs, tokenizer, logits, max_new_tokens, scales, levels)
    kl = float(kl_divergence(base.next_token_logprobs, after.next_token_logprobs))
    if not math.isfinite(kl):
        raise G4VError(f"scaling {describe_scales(scales)} gave a non-finite KL divergence; try a smaller factor")
    return AblationResult(dict(scales), kl, base, after, capture)
