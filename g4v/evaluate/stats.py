"""The statistics that settle a question about two arms: pure functions of the per-sample rows.

* Answers are compared after :func:`normalise` (one place for it): lower case, trimmed, spaces
  collapsed, final punctuation dropped. ``exact_*`` keeps the strict comparison next to it.
* Accuracy gets a 95 % Wilson score interval (:func:`wilson_interval`): unlike the normal
  approximation it stays inside [0, 1] and behaves at 0 % and 100 %, which small categories hit.
* Paired right/wrong outcomes get the exact McNemar test (:func:`mcnemar_exact`): only the
  discordant pairs (one arm right, the other wrong) carry information about which arm is better,
  and under "no difference" each of them is a fair coin, so the p-value is a two-sided binomial
  test on them. Exact, because discordant counts in a category are often small.
* Whether the arms are the same within a margin (TOST), the smallest difference the rows can
  detect, the noise floor of an arm run twice: :mod:`g4v.evaluate.equivalence`; per-field scores
  of key-value and table answers: :mod:`g4v.evaluate.fields`.
"""

import math
import re
import string

from g4v.evaluate.equivalence import (ALPHA, DISCORDANCE, MARGIN, POWER, detectable_difference, noise_floor,
                                      rows_to_detect, tost_paired)
from g4v.evaluate.fields import field_scores
from g4v.evaluate.summary import Arms, ArmScore, BlankSame, Block, Detectable, KLStats, Paired, RunSummary

#: z for a two-sided 95 % interval.
Z95 = 1.959963984540054
#: Rows listed in the summary's ``worst``.
WORST_ROWS = 20
_SPACES = re.compile(r"\s+")


def normalise(text: str | None) -> str:
    """The form two answers are compared in: ``" The  Star. "`` -> ``"the star"``."""
    text = _SPACES.sub(" ", (text or "").lower()).strip()
    return text.rstrip(string.punctuation + " ")


def matches(answer: str, reference: str | None) -> tuple[bool | None, bool | None]:
    """``(normalised match, exact match)`` of an answer against the reference; None without one."""
    if reference is None:
        return None, None
    return normalise(answer) == normalise(reference), answer.strip() == reference.strip()


def wilson_interval(successes: int, n: int, z: float = Z95) -> list[float] | None:
    """Wilson score interval ``[lo, hi]`` for ``successes`` out of ``n``; None when ``n == 0``."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [max(0.0, centre - half), min(1.0, centre + half)]


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: P(a binomial(n, 1/2) count is as far from n/2 as the
    smaller discordant count), doubled and capped at 1. No discordant pairs: 1."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1)) / 2**n
    return min(1.0, 2 * tail)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def kl_stats(values: list[float]) -> KLStats | None:
    """mean, q90, q99, max of per-position KL values; None when there are none."""
    if not values:
        return None
    return KLStats(mean=sum(values) / len(values), q90=quantile(values, 0.9), q99=quantile(values, 0.99),
                   max=max(values))


def summarise(rows: list, label_a: str, label_b: str, complete: bool = True, *, margin: float = MARGIN,
              discordance: float = DISCORDANCE, same_arm: bool = False) -> RunSummary:
    """The summary of a run (``summary.json``, what the app draws); ``rows`` are SampleResults.
    ``margin`` is the equivalence margin, ``discordance`` the share of discordant rows assumed
    for the detectable difference; ``same_arm``: B is A again (a noise-floor run)."""
    whole = _block(rows, label_a, label_b, margin)
    categories = sorted({row.category for row in rows if row.category is not None})
    paired = whole.equivalence  # its n: the rows both arms answered, with a reference
    return RunSummary(
        **vars(whole), complete=complete,
        by_category={name: _block([r for r in rows if r.category == name], label_a, label_b, margin)
                     for name in categories},
        worst=worst_rows(rows), detectable=detectable(paired.n, discordance, paired.a_only + paired.b_only, margin),
        noise_floor=noise_floor(rows) if same_arm else None, fields=field_scores(rows))


def detectable(rows: int, discordance: float = DISCORDANCE, discordant: int | None = None,
               margin: float = MARGIN) -> Detectable:
    """The smallest accuracy difference ``rows`` paired rows detect (McNemar, two-sided ``ALPHA``,
    power ``POWER``) at the assumed share of discordant rows, and at the observed one when
    ``discordant`` is given, and how many rows would detect ``margin`` at the assumed share
    (``rows_for_margin``, None when the margin exceeds it): what the CLI prints before a run and
    the summary keeps."""
    observed = discordant / rows if discordant is not None and rows else None
    return Detectable(rows=rows, alpha=ALPHA, power=POWER, discordance_assumed=discordance,
                      at_assumed=detectable_difference(rows, discordance),
                      margin=margin, rows_for_margin=rows_to_detect(margin, discordance),
                      discordance_observed=observed,
                      at_observed=detectable_difference(rows, observed) if observed else None)


def _block(rows: list, label_a: str, label_b: str, margin: float = MARGIN) -> Block:
    """Every number of the summary for one group of rows (the whole run, or one category)."""
    ok = [row for row in rows if row.error is None]
    scored = [row for row in ok if row.correct_a is not None and row.correct_b is not None]
    a_only = sum(r.correct_a and not r.correct_b for r in scored)
    b_only = sum(r.correct_b and not r.correct_a for r in scored)
    paired = Paired(both_right=sum(r.correct_a and r.correct_b for r in scored), a_only=a_only, b_only=b_only,
                    both_wrong=sum(not r.correct_a and not r.correct_b for r in scored),
                    mcnemar_p=mcnemar_exact(a_only, b_only))
    row_kl = [row.kl_mean for row in ok if row.kl_mean is not None]
    return Block(
        n=len(rows),
        n_errors=len(rows) - len(ok),
        arms=Arms(_arm(label_a, [r.correct_a for r in ok]), _arm(label_b, [r.correct_b for r in ok])),
        paired=paired,
        equivalence=tost_paired(a_only, b_only, len(scored), margin),
        agreement=sum(r.agree for r in ok) / len(ok) if ok else None,
        kl=_kl_over_rows(ok) if row_kl else None,
        blank_same=BlankSame(_rate([r.blank_same_a for r in ok]), _rate([r.blank_same_b for r in ok])),
    )


def _arm(label: str, correct: list) -> ArmScore:
    known = [c for c in correct if c is not None]
    right = sum(known)
    return ArmScore(label=label, accuracy=right / len(known) if known else None,
                    ci95=wilson_interval(right, len(known)), n_scored=len(known))


def _kl_over_rows(rows: list) -> KLStats:
    """Across rows: the mean of per-row means, the q90/q99 of the per-row means, the largest
    per-position KL of any row."""
    means = [row.kl_mean for row in rows if row.kl_mean is not None]
    stats = kl_stats(means)
    stats.max = max(row.kl_max for row in rows if row.kl_max is not None)
    return stats


def _rate(flags: list) -> float | None:
    known = [flag for flag in flags if flag is not None]
    return sum(known) / len(known) if known else None


def worst_rows(rows: list, limit: int = WORST_ROWS) -> list[int]:
    """Row indices most worth a look, worst first: errors, then answers that disagree (one arm
    right and the other wrong before both wrong), then by mean KL; agreeing rows only by KL."""

    def badness(row):
        if row.error is not None:
            return (3, 0.0)
        split = row.correct_a is not None and row.correct_a != row.correct_b
        return (0 if row.agree else (2 if split else 1), row.kl_mean or 0.0)

    candidates = [row for row in rows if row.error is not None or not row.agree or (row.kl_mean or 0) > 0]
    ranked = sorted(candidates, key=badness, reverse=True)
    return [row.index for row in ranked[:limit]]
