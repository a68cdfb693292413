"""How much each level's injected feature at each image token contributed to the answer.

Both methods attribute to the *injected features* (what the language model is handed at each of
the 8 levels), not to pixels: that is the only place where "which level" has a meaning, and the
tiling plan then maps every image token to the pixels it covers.

* **gradient x input**: ``sum_h grad[t, h] * feature[t, h]`` for every level and token ``t``, from
  one forward and one backward pass: the first-order estimate of what removing that token's
  feature would cost the target log-probability.
* **integrated gradients** (Captum): the same product with the gradient averaged along the path
  ``alpha * features``, ``alpha`` from 0 to 1, for all levels at once. It satisfies completeness:
  the scores add up to ``f(features) - f(0)``, the change from removing all visual input.
"""

from dataclasses import dataclass

import torch

from g4v.attribution.forward import (DEFAULT_BATCH, Answer, Encoded, answer_logprobs, frozen_parameters,
                                     variants_per_pass)
from g4v.attribution.settings import DEFAULT_IG_STEPS, METHODS, check_steps
from g4v.errors import G4VError, check_value
from g4v.model.levels import Level



@dataclass
class Attribution:
    """Per-level, per-image-token attribution of one target log-probability."""

    method: str  # one of METHODS
    levels: list[Level]
    scores: torch.Tensor  # (num_levels, num_image_tokens) float32, CPU: contribution to the target
    target_logprob: float  # the target's log-probability with every feature in place
    baseline_logprob: float | None = None  # ig only: with every feature zeroed
    convergence_delta: float | None = None  # ig only: sum(scores) - (target - baseline)
    steps: int | None = None  # ig only

    @property
    def combined(self) -> torch.Tensor:
        """(num_image_tokens,) the sum over levels: the token's contribution through all 8."""
        return self.scores.sum(0)

    def by_level(self) -> dict[str, list[float]]:
        """Level name -> one score per image token, plus ``"combined"``: what the heatmaps paint."""
        out = {level.name: self.scores[i].tolist() for i, level in enumerate(self.levels)}
        out["combined"] = self.combined.tolist()
        return out

    def level_totals(self) -> dict[str, float]:
        """Each level's score summed over the image tokens."""
        return {level.name: float(self.scores[i].sum()) for i, level in enumerate(self.levels)}

    def to_dict(self, measure: str = "log-probability") -> dict:
        """The numbers for ``summary.json``; ``measure`` names the explained number (an answer's
        log-probability, or with answers to contrast with its log-odds against them)."""
        return {
            "method": self.method,
            "measure": measure,
            "target_value": self.target_logprob,
            "baseline_value": self.baseline_logprob,
            "convergence_delta": self.convergence_delta,
            "steps": self.steps,
            "level_totals": self.level_totals(),
            "total": float(self.scores.sum()),
        }


def gradient_x_input(model, encoded: Encoded, answer: Answer, levels: list[Level]) -> Attribution:
    """One forward and one backward pass with every level's features as leaves that need a grad."""
    with frozen_parameters(model), torch.enable_grad():
        leaves = {layer: feature.unsqueeze(0).clone().requires_grad_(True)  # (1, tokens, hidden)
                  for layer, feature in encoded.features.items()}
        target = answer_logprobs(model, encoded, answer, leaves)[0]
        grads = torch.autograd.grad(target, [leaves[level.llm_layer] for level in levels])
    scores = torch.stack([_token_dot(grad[0], leaves[level.llm_layer][0].detach())
                          for grad, level in zip(grads, levels)])
    return Attribution("gradxinput", levels, scores.cpu(), float(target.detach()))


def integrated_gradients(model, encoded: Encoded, answer: Answer, levels: list[Level],
                         steps: int = DEFAULT_IG_STEPS, batch_size: int = DEFAULT_BATCH) -> Attribution:
    """Captum's integrated gradients over ``alpha * features`` (all levels scaled together), from a
    zero baseline; ``steps`` forward+backward passes, ``batch_size`` at a time."""
    from captum.attr import IntegratedGradients

    check_value("steps", steps, check_steps)
    layers = [level.llm_layer for level in levels]

    def forward(*scaled: torch.Tensor) -> torch.Tensor:  # each (b, tokens, hidden) -> (b,)
        return answer_logprobs(model, encoded, answer, dict(zip(layers, scaled)))

    inputs = tuple(encoded.features[layer].unsqueeze(0) for layer in layers)  # (1, tokens, hidden) each
    with frozen_parameters(model), torch.enable_grad():
        attributions, delta = IntegratedGradients(forward).attribute(
            inputs, baselines=tuple(torch.zeros_like(x) for x in inputs), n_steps=steps,
            internal_batch_size=variants_per_pass(answer, batch_size), return_convergence_delta=True)
        with torch.no_grad():
            ends = forward(*(torch.cat([torch.zeros_like(x), x]) for x in inputs))  # (2,): f(0), f(features)
    scores = torch.stack([a[0].float().sum(-1) for a in attributions])  # (levels, tokens)
    return Attribution("ig", levels, scores.detach().cpu(), float(ends[1]), float(ends[0]),
                       float(delta.reshape(-1)[0]), steps)


def attribute(model, encoded: Encoded, answer: Answer, levels: list[Level], method: str = "gradxinput",
              steps: int = DEFAULT_IG_STEPS, batch_size: int = DEFAULT_BATCH) -> Attribution:
    if method == "gradxinput":
        return gradient_x_input(model, encoded, answer, levels)
    if method == "ig":
        return integrated_gradients(model, encoded, answer, levels, steps, batch_size)
    raise G4VError(f"unknown attribution method {method!r} (expected one of {', '.join(METHODS)})")


def _token_dot(grad: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """(tokens, hidden) x (tokens, hidden) -> (tokens,) float32: each token's gradient . feature."""
    return (grad.float() * feature.float()).sum(-1)
