"""The comparisons of the port inspector: what transformers computed against what vLLM computed.

Plain tensors and numbers in, verdicts out; nothing here starts a model (:mod:`g4v.port.run` gathers
both sides and calls these):

1. **Per-level features** (:func:`split_levels`, :func:`compare_levels`): vLLM's packed multimodal
   embedding, split per level, against what transformers injects at the same LLM layer, under a
   :class:`Tolerance`; a level that fails is explained when possible (swapped, dropped, scaled).
2. **The residual trajectory** (:func:`compare_trajectories`): the mean residual norm at image and
   text tokens after every decoder layer, and the first layer where the two sides depart.
3. **Next token and continuation** (:func:`compare_next_token`): KL of the next-token
   distributions, the top-5 lists, and where the greedy continuations first differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from g4v.errors import G4VError
from g4v.model.drift import feature_drift
from g4v.model.levels import Level
from g4v.model.records import Record, TokenProb, optional
from g4v.model.scoring import kl_divergence, top_tokens

#: Per-level feature tolerance ``(atol, rtol)`` by dtype (see :class:`Tolerance` for the rule).
#: The reference is ``torch.testing.assert_close``'s defaults, read from the installed torch
#: (2.13, ``torch/testing/_comparison.py``, ``_DTYPE_PRECISIONS``): float32 atol 1e-5, rtol 1.3e-6;
#: float16 atol 1e-5, rtol 1e-3; bfloat16 atol 1e-5, rtol 1.6e-2. Those rtols allow one operation's
#: rounding; the features here come out of the vision tower, the Q-Formers and the projectors,
#: computed by two implementations with their own kernels and summation orders, so rtol is wider:
#: far wider in float32 (rounding accumulates over many steps, but a 0.1 % fault must still stand
#: out), less so in float16 and bfloat16 (their own rounding of every input already dominates).
#: atol stays torch's: it only matters where a whole token is near zero.
DEFAULT_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-5, 1e-2), torch.bfloat16: (1e-5, 5e-2)}
#: Trajectory points agree when the mean norms differ by at most this share (float32).
DEFAULT_TRAJECTORY_RTOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


# ── per-level features ──────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Tolerance(Record):
    """When one level's features agree: elementwise ``|got - ref| <= atol + rtol * max(|ref|, rms)``.

    That is ``torch.testing.assert_close``'s rule with one change: ``|ref|`` is floored at the RMS of
    the token's reference features. Float rounding in a matrix product scales with the numbers an
    element was computed from, not with the element itself, so an element that happens to be near
    zero carries rounding of its token's size; with plain ``|ref|`` only ``atol`` covers it, and a
    fixed ``atol`` is too tight for large features and too loose for small ones. A fault (a level
    scaled, swapped or dropped) still shows on the elements that carry the token's weight.
    """

    atol: float
    rtol: float
    source: str  # where the numbers came from: a dtype's defaults, or given by the caller

    def allowed(self, ref: torch.Tensor) -> torch.Tensor:
        """The largest difference each element of ``ref`` (tokens, hidden) may show."""
        rms = ref.pow(2).mean(dim=-1, keepdim=True).sqrt() if ref.numel() else ref
        return self.atol + self.rtol * torch.maximum(ref.abs(), rms)

    def used(self, got: torch.Tensor, ref: torch.Tensor) -> float:
        """max over elements of |got - ref| / allowed: the level agrees when it is at most 1."""
        if not ref.numel():
            return 0.0
        diff = (got - ref).abs()
        # diff == 0 uses none of it, even where nothing is allowed (atol = rtol = 0: any other
        # difference is then infinitely over).
        return float(torch.where(diff == 0, 0.0, diff / self.allowed(ref)).max())

    def within(self, got: torch.Tensor, ref: torch.Tensor) -> bool:
        return got.shape == ref.shape and self.used(got, ref) <= 1.0

    @property
    def rule(self) -> str:
        """What the report and the picture print."""
        return f"|vLLM - transformers| <= {self.atol:g} + {self.rtol:g} * max(|transformers|, token RMS)"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "rule": self.rule}


def default_tolerance(dtype: torch.dtype, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The dtype's defaults (:data:`DEFAULT_TOLERANCE`), with ``atol`` / ``rtol`` overriding each
    side when given. Dtypes without an entry get the loosest one (bfloat16's)."""
    name = str(dtype).removeprefix("torch.")
    default_atol, default_rtol = DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE[torch.bfloat16])
    given = [flag for flag, value in (("atol", atol), ("rtol", rtol)) if value is not None]
    source = f"{name} defaults" if not given else f"{' and '.join(given)} given, {name} defaults otherwise"
    return Tolerance(_tolerance_value("atol", atol, default_atol), _tolerance_value("rtol", rtol, default_rtol), source)


def _tolerance_value(name: str, value, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise G4VError(f"{name} must be a number >= 0, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise G4VError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


@dataclass
class LevelDiff(Record):
    """One level's features, vLLM against transformers (its per-token differences stay out of the
    JSON: the picture draws them in the process that computed them)."""

    name: str
    llm_layer: int
    kind: str
    ok: bool
    max_abs_diff: float | None  # None when the level is missing or shaped differently
    max_rel_diff: float | None  # max over tokens of ||vllm - ref|| / ||ref||
    mean_abs_diff: float | None
    reference_max_abs: float | None
    problem: str | None  # None when ok
    share_of_tolerance_used: float | None = None  # max |diff| / allowed (Tolerance.used); ok when <= 1
    token_diff: list[float] = field(default_factory=list)  # per image token: max |vllm - ref|

    def to_dict(self) -> dict:
        out = super().to_dict()
        del out["token_diff"]
        out["problem"] = out.pop("problem")  # last, as the JSON always had it
        return out


def split_levels(packed: torch.Tensor, llm_layers: list[int], hidden: int) -> dict[int, torch.Tensor]:
    """vLLM's packed ``(tokens, hidden * levels)`` tensor -> ``{llm_layer: (tokens, hidden)}``, the
    way vLLM's ``embed_input_ids`` splits it (level ``i`` goes to ``llm_layers[i]``)."""
    if packed.shape[-1] != hidden * len(llm_layers):
        raise G4VError(f"vLLM packed {packed.shape[-1]} features per token, expected {hidden} x {len(llm_layers)} levels")
    return dict(zip(llm_layers, packed.split(hidden, dim=-1)))


def compare_levels(levels: list[Level], reference: dict[str, torch.Tensor], candidate: dict[int, torch.Tensor],
                   tolerance: Tolerance) -> list[LevelDiff]:
    """Each reference level (by name) against what vLLM injects at the same LLM layer.

    A level agrees when vLLM has it, with the same shape, and every element is within ``tolerance``.
    A level that fails is explained when possible: it matches *another* reference level (swapped),
    one side is zeros (dropped), or one factor explains the difference (scaled).
    """
    rows = []
    for level in levels:
        ref = reference.get(level.name)
        got = candidate.get(level.llm_layer)
        base = {"name": level.name, "llm_layer": level.llm_layer, "kind": level.kind}
        if ref is None or got is None:
            side = "transformers" if ref is None else "vLLM"
            rows.append(LevelDiff(**base, ok=False, max_abs_diff=None, max_rel_diff=None, mean_abs_diff=None,
                                  reference_max_abs=None,
                                  problem=f"{side} injects nothing at LLM layer {level.llm_layer}"))
            continue
        # Compare in the wider of the two dtypes (float64 references stay float64).
        dtype = torch.promote_types(torch.promote_types(ref.dtype, got.dtype), torch.float32)
        ref, got = ref.to(dtype), got.to(dtype)
        if ref.shape != got.shape:
            rows.append(LevelDiff(**base, ok=False, max_abs_diff=None, max_rel_diff=None, mean_abs_diff=None,
                                  reference_max_abs=float(ref.abs().max()) if ref.numel() else 0.0,
                                  problem=f"shape {tuple(got.shape)} in vLLM, {tuple(ref.shape)} in transformers"))
            continue
        drift = feature_drift(got, ref)
        used = tolerance.used(got, ref)
        ok = used <= 1.0
        problem = None if ok else _explain(got, ref, reference, level.name, drift.max_abs_diff, used, tolerance)
        rows.append(LevelDiff(**base, ok=ok, max_abs_diff=drift.max_abs_diff, max_rel_diff=drift.max_token_rel_error,
                              mean_abs_diff=drift.mean_abs_diff, reference_max_abs=drift.reference_max_abs,
                              problem=problem, share_of_tolerance_used=used, token_diff=drift.token_diff))
    return rows


def _explain(got: torch.Tensor, ref: torch.Tensor, reference: dict[str, torch.Tensor], name: str, max_abs: float,
             used: float, tolerance: Tolerance) -> str:
    """One line on a level that does not agree: by how much, and the likeliest reason."""
    problem = f"differs by up to {max_abs:.3g}, {used:.3g}x what the tolerance allows"
    twin = next((other for other, features in reference.items()
                 if other != name and tolerance.within(got, features.to(got.dtype))), None)
    if twin:
        return problem + f"; vLLM's features here equal transformers' {twin} (levels swapped?)"
    if torch.count_nonzero(got) == 0:
        return problem + "; vLLM injects zeros here (level dropped?)"
    if torch.count_nonzero(ref) == 0:
        return problem + "; transformers injects zeros here (level dropped?)"
    # A uniform factor explains the difference when what is left after it is small.
    ratio = float((got * ref).sum() / (ref * ref).sum().clamp(min=1e-30))
    left = float(torch.linalg.vector_norm(got - ratio * ref) / torch.linalg.vector_norm(ref).clamp(min=1e-30))
    if left < 0.1 * abs(ratio - 1):
        problem += f"; vLLM's features are transformers' times {ratio:.6g} (scaled?)"
    return problem


# ── the residual trajectory ─────────────────────────────────────────────────────────────────────


@dataclass
class SideNorms(Record):
    """One side's mean residual norm at each trajectory point (None where it has no such tokens)."""

    image_norm: list[float | None]
    text_norm: list[float | None]


@dataclass(kw_only=True)
class TrajectoryDiff(Record):
    """The residual trajectories of both sides, compared point by point; the norms and differences
    only when both sides were recorded alike."""

    layers: list[int]
    injection_layers: dict[str, str]  # llm layer -> level name
    rtol: float
    transformers: SideNorms | None = optional()
    vllm: SideNorms | None = optional()
    rel_diff_image: list[float | None] | None = optional()
    rel_diff_text: list[float | None] | None = optional()
    max_token_rel_diff: list[float] | None = optional()
    max_rel_diff: float | None = optional()
    first_departure: int | None = None  # the first point past rtol
    ok: bool = False
    problem: str | None = None


def compare_trajectories(reference: torch.Tensor, candidate: torch.Tensor | None, image_mask: torch.Tensor,
                         injection_layers: dict[int, str], rtol: float) -> TrajectoryDiff:
    """Per-token residual norms ``(layers + 1, tokens)`` of both sides -> the mean norm at image and
    text tokens per point, their relative differences and the first layer where they depart."""
    points = reference.shape[0]
    frame = {"layers": list(range(points)), "injection_layers": {str(k): v for k, v in sorted(injection_layers.items())},
             "rtol": rtol}
    if candidate is None or candidate.shape != reference.shape:
        shape = None if candidate is None else list(candidate.shape)
        return TrajectoryDiff(**frame, ok=False, problem=f"vLLM recorded residual norms of shape {shape}, "
                                                         f"transformers {list(reference.shape)}")
    sides = {side: SideNorms(_masked_means(norms, image_mask), _masked_means(norms, ~image_mask))
             for side, norms in (("transformers", reference), ("vllm", candidate))}
    ref, got = sides["transformers"], sides["vllm"]
    rel_image = [_rel(a, b) for a, b in zip(got.image_norm, ref.image_norm)]
    rel_text = [_rel(a, b) for a, b in zip(got.text_norm, ref.text_norm)]
    token_rel = ((candidate - reference).abs() / reference.abs().clamp(min=1e-12)).amax(dim=1).tolist()
    worst = [max(x for x in (a, b, c) if x is not None) for a, b, c in zip(rel_image, rel_text, token_rel)]
    first = next((layer for layer, value in enumerate(worst) if value > rtol), None)
    return TrajectoryDiff(
        **frame, transformers=ref, vllm=got, rel_diff_image=rel_image, rel_diff_text=rel_text,
        max_token_rel_diff=token_rel, max_rel_diff=max(worst) if worst else 0.0,
        first_departure=first, ok=first is None, problem=None if first is None else
        f"residual norms depart at layer {first} by {worst[first]:.3g} (tolerance {rtol:.3g})")


def _masked_means(norms: torch.Tensor, mask: torch.Tensor) -> list[float | None]:
    if not bool(mask.any()):
        return [None] * norms.shape[0]
    return norms[:, mask].mean(dim=1).tolist()


def _rel(a, b):
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(b), 1e-12)


# ── next token and continuation ─────────────────────────────────────────────────────────────────


@dataclass(kw_only=True)
class NextTokenDiff(Record):
    """The next-token distributions and the greedy continuations of both sides."""

    kl_divergence: float  # KL(transformers || vLLM), nats
    kl_over: str  # the full vocabulary, or how much of it vLLM's logprobs covered
    top5_transformers: list[TokenProb]
    top5_vllm: list[TokenProb]
    top5_overlap: int
    argmax_agrees: bool
    continuation_transformers: str
    continuation_vllm: str
    continuation_ids_transformers: list[int]
    continuation_ids_vllm: list[int]
    first_divergence: int | None  # the first greedy token where they differ
    prompt_token_ids_equal: bool | None = optional()


def compare_next_token(reference_probs: torch.Tensor, vllm_logprobs: dict[int, float], tokenizer,
                       reference_ids: list[int], vllm_ids: list[int], k: int = 5) -> NextTokenDiff:
    """KL(transformers || vLLM) of the next-token distribution, the two top-5 lists and their
    overlap, and where the greedy continuations first differ."""
    vocab = reference_probs.numel()
    logp = torch.full((vocab,), -math.inf)
    for token, value in vllm_logprobs.items():
        if 0 <= token < vocab:
            logp[token] = value
    vllm_probs = torch.softmax(logp, dim=-1)  # renormalise (vLLM's logprobs are log-softmaxed already)
    covered = len([t for t in vllm_logprobs if 0 <= t < vocab])
    top_ref, top_vllm = top_tokens(reference_probs, tokenizer, k), top_tokens(vllm_probs, tokenizer, k)
    overlap = len({t.token_id for t in top_ref} & {t.token_id for t in top_vllm})
    first = next((i for i, (a, b) in enumerate(zip(reference_ids, vllm_ids)) if a != b), None)
    if first is None and len(reference_ids) != len(vllm_ids):
        first = min(len(reference_ids), len(vllm_ids))
    return NextTokenDiff(
        kl_divergence=float(kl_divergence(reference_probs.float().log(), torch.log_softmax(logp, dim=-1))),
        kl_over="full vocabulary" if covered == vocab else f"{covered} of {vocab} tokens",
        top5_transformers=top_ref, top5_vllm=top_vllm, top5_overlap=overlap,
        argmax_agrees=top_ref[0].token_id == top_vllm[0].token_id,
        continuation_transformers=tokenizer.decode(reference_ids, skip_special_tokens=True),
        continuation_vllm=tokenizer.decode(vllm_ids, skip_special_tokens=True),
        continuation_ids_transformers=reference_ids, continuation_ids_vllm=vllm_ids, first_divergence=first)
