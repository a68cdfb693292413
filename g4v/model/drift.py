"""How far one side's injected features are from a reference's, level by level: the one feature
comparison of the workbench.

The port inspector (vLLM's features against transformers', :mod:`g4v.port.compare`) and the
precision arms (bf16 or int8 against float32, :mod:`g4v.model.precision`) ask the same question of
the same tensors, so both read the numbers from :func:`feature_drift`: a relative error means the
same thing in both reports.
"""

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class FeatureDrift:
    """One level's features ``got`` against ``ref``, both ``(image tokens, hidden)``.

    ``rel_error`` is ``||got - ref|| / ||ref||`` over the whole level (Frobenius norms): the share of
    the level's signal that changed. ``max_token_rel_error`` is the worst image token's own ratio,
    ``cosine`` the mean over image tokens of the cosine between the two vectors (1: same direction),
    ``min_cosine`` the worst token's. A level without image tokens drifts by 0 with cosine 1.
    """

    max_abs_diff: float
    mean_abs_diff: float
    reference_max_abs: float
    rel_error: float
    max_token_rel_error: float
    cosine: float
    min_cosine: float
    token_diff: list[float] = field(default_factory=list)  # per image token: max |got - ref|

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["token_diff"]
        return out


def feature_drift(got: torch.Tensor, ref: torch.Tensor) -> FeatureDrift:
    """``got`` against ``ref`` (same shape, ``(tokens, hidden)``), computed in float64: a cosine of
    0.99998 in float32 would carry a rounding error of a few percent of its distance from 1."""
    ref, got = ref.detach().to(torch.float64), got.detach().to(torch.float64)
    if not ref.numel():
        return FeatureDrift(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, [])
    delta = got - ref
    diff = delta.abs()
    ref_norm = torch.linalg.vector_norm(ref, dim=-1)
    got_norm = torch.linalg.vector_norm(got, dim=-1)
    token_rel = torch.linalg.vector_norm(delta, dim=-1) / ref_norm.clamp(min=1e-12)
    # Two zero vectors point the same way (cosine 1); one zero vector against another does not (0).
    both_zero = (ref_norm == 0) & (got_norm == 0)
    cosine = torch.where(both_zero, torch.ones_like(ref_norm),
                         (got * ref).sum(dim=-1) / (ref_norm * got_norm).clamp(min=1e-30))
    total = torch.linalg.vector_norm(ref)
    return FeatureDrift(
        max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()), reference_max_abs=float(ref.abs().max()),
        rel_error=float(torch.linalg.vector_norm(delta) / total.clamp(min=1e-12)),
        max_token_rel_error=float(token_rel.max()), cosine=float(cosine.mean()), min_cosine=float(cosine.min()),
        token_diff=diff.amax(dim=-1).float().tolist(),
    )
