"""Can the attribution map be trusted on this example? The deletion test.

Zero the injected features at the top-k% image tokens by attribution and record the target's
log-probability; do the same for k% chosen at random (several seeds). A map that points at what the
model really uses makes the log-probability fall faster than chance: the area between the random
curve (mean over seeds) and the attribution curve is positive. Removal is either at every level
(the ranking by the combined score) or at one level only (that level's own ranking).
"""

from dataclasses import dataclass

import torch

from g4v.attribution.forward import DEFAULT_BATCH, Answer, Encoded, logprobs_of_variants
from g4v.attribution.gradients import Attribution
from g4v.attribution.settings import (DEFAULT_FRACTIONS, DEFAULT_RANKING, DEFAULT_SEEDS, RANKINGS, check_fractions,
                                      check_seeds)
from g4v.errors import G4VError, check_value


@dataclass
class DeletionCurve:
    level: str | None  # None: removed at every level; else only at this level
    ranking: str  # one of RANKINGS
    fractions: list[float]  # share of image tokens removed
    attributed: list[float]  # target log-prob with the top fraction by attribution removed
    random: list[list[float]]  # per seed: the same with a random fraction removed
    random_mean: list[float]
    #: The area between the two curves: the random-removal mean minus the attributed curve, summed
    #: over the share of tokens removed by the trapezoid rule (target units x share of tokens).
    #: Above 0: removing the tokens the map ranks first lowers the target more than removing random
    #: ones, so the map beats chance on this example (see :func:`describe_area`).
    area_between: float

    @property
    def beats_random(self) -> bool:
        return self.area_between > 0

    def to_dict(self) -> dict:
        return {"level": self.level, "ranking": self.ranking, "fractions": self.fractions, "attributed": self.attributed,
                "random": self.random, "random_mean": self.random_mean, "area_between": self.area_between,
                "beats_random": self.beats_random}


def describe_area(deletion: DeletionCurve, measure: str) -> str:
    """The deletion test's result as a reader gets it (the tab's report and the CLI): what
    ``area_between`` is, in words, its value and the verdict. ``measure``: what the target's number
    is (a log-probability, or a contrast's log-odds)."""
    verdict = "beats" if deletion.beats_random else "does not beat"
    return (f"deletion test ({deletion.level or 'all levels'}): area between the curves "
            f"{deletion.area_between:.4g}, i.e. how much further the target's {measure} falls when the "
            f"image tokens the map ranks first are removed than when random ones are (the random mean minus "
            f"the attributed curve, summed over the share removed by the trapezoid rule); above 0 the map "
            f"beats chance: here it {verdict} random removal.")


def removal_masks(order: torch.Tensor, fractions: list[float], num_levels: int, level: int | None) -> torch.Tensor:
    """Keep-masks that remove the first ``round(f * tokens)`` tokens of ``order`` for each fraction.

    ``order``: (tokens,) token indices, most important first. Returns (fractions, num_levels, tokens)
    of 1 (keep) and 0 (removed), removing at every level, or only at ``level`` when given."""
    tokens = order.numel()
    keep = torch.ones(len(fractions), num_levels, tokens)
    for row, fraction in enumerate(fractions):
        removed = order[: round(fraction * tokens)]
        rows = slice(None) if level is None else slice(level, level + 1)
        keep[row, rows, removed] = 0.0
    return keep


def area_between(fractions: list[float], random_mean: list[float], attributed: list[float]) -> float:
    """Trapezoid area of ``random_mean - attributed`` over ``fractions`` (in nats x share of tokens)."""
    gap = [r - a for r, a in zip(random_mean, attributed)]
    return float(sum((fractions[i + 1] - fractions[i]) * (gap[i] + gap[i + 1]) / 2 for i in range(len(gap) - 1)))


def removal_scores(scores: torch.Tensor, index: int | None, ranking: str) -> torch.Tensor:
    """(num_levels, tokens) attribution -> (tokens,) the score removal ranks by (see :data:`RANKINGS`),
    over every level (``index`` None) or one level's row."""
    if ranking not in RANKINGS:
        raise G4VError(f"unknown deletion ranking {ranking!r} (expected one of {', '.join(RANKINGS)})")
    chosen = scores if index is None else scores[index:index + 1]
    return (chosen.clamp(min=0) if ranking == "positive" else chosen).sum(0)


def deletion_curve(model, encoded: Encoded, answer: Answer, attribution: Attribution, level: str | None = None,
                   fractions=DEFAULT_FRACTIONS, seeds: int = DEFAULT_SEEDS, batch_size: int = DEFAULT_BATCH,
                   ranking: str = DEFAULT_RANKING) -> DeletionCurve:
    """The deletion curve for all levels (``level=None``) or one level, against ``seeds`` random
    orders; every variant of the curve goes through :func:`logprobs_of_variants` in batches."""
    fractions = check_fractions(fractions)
    check_value("seeds", seeds, check_seeds)
    names = [lv.name for lv in attribution.levels]
    if level is not None and level not in names:
        raise G4VError(f"unknown level {level!r}: use one of {', '.join(names)}")
    index = None if level is None else names.index(level)
    scores = removal_scores(attribution.scores, index, ranking)
    tokens = scores.numel()
    orders = [torch.argsort(scores, descending=True, stable=True)]
    for seed in range(seeds):
        orders.append(torch.randperm(tokens, generator=torch.Generator().manual_seed(seed)))
    keep = torch.cat([removal_masks(order, fractions, len(names), index) for order in orders])
    values = logprobs_of_variants(model, encoded, answer, keep, attribution.levels, batch_size)
    curves = values.reshape(len(orders), len(fractions))  # (1 + seeds, fractions)
    attributed, random = curves[0].tolist(), curves[1:].tolist()
    random_mean = curves[1:].mean(0).tolist()
    return DeletionCurve(level, ranking, fractions, attributed, random, random_mean,
                         area_between(fractions, random_mean, attributed))
