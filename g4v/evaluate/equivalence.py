"""Statistics that can say "no change": a paired equivalence test, the smallest difference a dataset
can detect, and the noise floor of an arm run twice. Pure functions of counts (standard library only).

Two arms answer the same n rows; ``a_only`` rows are right for A only, ``b_only`` for B only. The
accuracy difference is ``d = (a_only - b_only) / n`` (A minus B).

* :func:`tost_paired`: **two one-sided tests** (Schuirmann 1987) of ``H0: |Δ| >= margin`` with
  **Tango's score statistic** for paired proportions (Tango 1998, Statistics in Medicine 17:891;
  its use for equivalence: Liu, Hsueh, Hsieh, Chen 2002, Statistics in Medicine 21:231). The score
  statistic's variance is taken at the restricted maximum-likelihood cell probabilities under each
  null (``Δ = -margin``, ``Δ = +margin``), so it is defined with zero discordant pairs (where the
  Wald standard error is 0 and would call any two arms "equivalent" on 10 rows) and with every
  pair discordant. The ``1 - 2 alpha`` interval is Tango's score interval (the set of ``Δ`` whose
  score statistic is inside ``±z(1 - alpha)``): it lies inside ``(-margin, margin)`` exactly when
  the TOST p-value is below ``alpha``.
* :func:`detectable_difference`: the smallest ``|Δ|`` a two-sided McNemar test at ``alpha`` finds
  with the given power on n rows, by the normal approximation of Connor 1987 (Biometrics 43:207):
  ``sqrt(n) Δ = z(1 - alpha/2) sqrt(ψ) + z(power) sqrt(ψ - Δ²)``, with ``ψ`` the share of
  discordant rows. It grows with ``sqrt(ψ)``: before a run ``ψ`` is an assumption (a pilot's value,
  or :data:`DISCORDANCE`), after it the observed share.
* :func:`noise_floor`: how often an arm run twice disagrees with itself.
"""

import math
from statistics import NormalDist

from g4v.evaluate.summary import Detectable, Equivalence, NoiseFloor, RunSummary

#: The user's margin unless told otherwise: 2 points of accuracy.
MARGIN = 0.02
#: One-sided level of each of the two tests (so the interval shown is 90 %).
ALPHA = 0.05
#: Power the detectable difference is computed for.
POWER = 0.8
#: Share of rows assumed discordant (one arm right, the other wrong) before a run: 10 %, a
#: conservative value for two arms meant to be close (the detectable difference grows with its
#: square root; the summary also gives it at the observed share).
DISCORDANCE = 0.1
_NORMAL = NormalDist()
_BISECTIONS = 200


def score_z(a_only: int, b_only: int, n: int, delta: float) -> float:
    """Tango's score statistic for ``H0: p(A only) - p(B only) = delta`` on n paired rows:
    ``(a_only - b_only - n delta) / sqrt(n (2 q + delta - delta²))`` with ``q`` the restricted
    maximum-likelihood probability of a B-only row (the root of
    ``2n q² + (delta (2n - a_only + b_only) - a_only - b_only) q - b_only delta (1 - delta) = 0``)."""
    if delta < 0:  # the same test with the arms swapped
        return -score_z(b_only, a_only, n, -delta)
    linear = delta * (2 * n - a_only + b_only) - a_only - b_only
    q = (-linear + math.sqrt(linear * linear + 8 * n * b_only * delta * (1 - delta))) / (4 * n)
    variance = n * (2 * q + delta - delta * delta)
    numerator = a_only - b_only - n * delta
    if variance <= 0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def score_interval(a_only: int, b_only: int, n: int, z: float) -> list[float]:
    """``[lo, hi]``: every ``delta`` in [-1, 1] whose score statistic lies in ``[-z, z]`` (the
    statistic falls as ``delta`` grows; found by bisection)."""
    observed = (a_only - b_only) / n

    def crossing(low: float, high: float, target: float) -> float:
        for _ in range(_BISECTIONS):
            middle = (low + high) / 2
            if score_z(a_only, b_only, n, middle) > target:
                low = middle
            else:
                high = middle
        return (low + high) / 2

    return [crossing(-1.0, observed, z), crossing(observed, 1.0, -z)]


def tost_paired(a_only: int, b_only: int, n: int, margin: float = MARGIN, alpha: float = ALPHA) -> Equivalence:
    """Whether two arms are equivalent within ``±margin`` of accuracy on n paired rows, of which
    ``a_only`` were right for A only and ``b_only`` for B only."""
    if n <= 0:
        return Equivalence(margin, alpha, 0, 0, 0, None, None, None, None, None, False,
                           "no paired rows with a reference: nothing to test")
    z = _NORMAL.inv_cdf(1 - alpha)
    p_lower = 1 - _NORMAL.cdf(score_z(a_only, b_only, n, -margin))
    p_upper = _NORMAL.cdf(score_z(a_only, b_only, n, margin))
    p_value = max(p_lower, p_upper)
    equivalent = p_value < alpha
    points = f"±{100 * margin:g} points"
    verdict = (f"equivalent within {points}" if equivalent else
               f"not shown equivalent within {points}")
    return Equivalence(margin, alpha, n, a_only, b_only, (a_only - b_only) / n,
                       score_interval(a_only, b_only, n, z), p_lower, p_upper, p_value, equivalent, verdict)


def detectable_difference(n: int, discordance: float = DISCORDANCE, alpha: float = ALPHA,
                          power: float = POWER) -> float | None:
    """The smallest accuracy difference a two-sided McNemar test at ``alpha`` detects with
    ``power`` on ``n`` rows of which a share ``discordance`` is discordant (Connor 1987); None when
    no difference up to ``discordance`` (the largest one possible) is detectable."""
    if n <= 0 or discordance <= 0:
        return None
    z_test, z_power = _NORMAL.inv_cdf(1 - alpha / 2), _NORMAL.inv_cdf(power)

    def gap(delta: float) -> float:  # rises with delta; zero at the answer
        return math.sqrt(n) * delta - z_test * math.sqrt(discordance) - z_power * math.sqrt(max(0.0, discordance - delta ** 2))

    if gap(discordance) < 0:
        return None
    low, high = 0.0, discordance
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return (low + high) / 2


def rows_to_detect(difference: float, discordance: float = DISCORDANCE, alpha: float = ALPHA,
                   power: float = POWER) -> int | None:
    """The fewest rows on which :func:`detectable_difference` is at most ``difference`` (the same
    formula solved for n: ``n = ((z_test sqrt(d) + z_power sqrt(d - delta^2)) / delta)^2``), so a run
    too short for any difference can say how long one must be; None when ``difference`` is not
    above 0 or exceeds ``discordance`` (no share of discordant rows that small allows it)."""
    if not 0 < difference <= discordance:
        return None
    z_test, z_power = _NORMAL.inv_cdf(1 - alpha / 2), _NORMAL.inv_cdf(power)
    root = (z_test * math.sqrt(discordance) + z_power * math.sqrt(discordance - difference ** 2)) / difference
    return math.ceil(root ** 2 - 1e-9)  # the bound itself counts; the epsilon absorbs rounding


def noise_floor(rows: list) -> NoiseFloor:
    """The noise floor of rows (SampleResults) whose B arm is A again; error rows are left out."""
    ok = [row for row in rows if row.error is None]
    disagree = sum(not row.agree for row in ok)
    discordant = sum(row.correct_a is not None and row.correct_b is not None and row.correct_a != row.correct_b
                     for row in ok)
    return NoiseFloor(len(ok), disagree, sum(row.answer_a != row.answer_b for row in ok), discordant,
                      disagree / len(ok) if ok else None)


def plan_line(planned: Detectable) -> str:
    """Before a run: the smallest accuracy difference its rows can detect (``planned`` as
    :func:`g4v.evaluate.stats.detectable` gives it)."""
    points, margin, needed = planned.at_assumed, planned.margin, planned.rows_for_margin
    found = f"{100 * points:.1f} points" if points is not None else "none (too few rows for any difference)"
    if needed is not None and needed > planned.rows:
        found += f"; about {needed} rows would detect ±{100 * margin:g} points"
    return (f"detectable difference at {100 * planned.power:.0f}% power (McNemar, alpha {planned.alpha:g}) on "
            f"{planned.rows} rows, assuming {100 * planned.discordance_assumed:g}% of rows right in one arm "
            f"only: {found}")


def summary_lines(summary: RunSummary) -> list[str]:
    """After a run, in words: the TOST verdict, the detectable difference at the observed
    discordance, and the noise floor (the CLI prints them, the Evaluate tab shows them)."""
    lines = []
    test = summary.equivalence
    if test.n:
        low, high = test.ci
        lines.append(f"equivalence (TOST, margin ±{100 * test.margin:g} points): {test.verdict}; difference "
                     f"A-B {100 * test.difference:+.1f} points, {100 * (1 - 2 * test.alpha):.0f}% CI "
                     f"[{100 * low:+.1f}, {100 * high:+.1f}], p {test.p_value:.3g}")
    observed = summary.detectable.discordance_observed
    if observed == 0:
        lines.append("no row was right in one arm only: the observed discordance gives no detectable difference")
    elif observed is not None:
        at = summary.detectable.at_observed
        lines.append(f"detectable difference at the observed {100 * observed:.1f}% of rows right in one arm only: "
                     + (f"{100 * at:.1f} points" if at is not None else "none (too few rows)"))
    floor = summary.noise_floor
    if floor:
        lines.append(f"noise floor (A run twice): {floor.disagree} of {floor.rows} rows disagree, "
                     f"{floor.text_differs} answer texts differ, {floor.discordant} right in one run only")
    return lines
