"""The summary of a dataset run, as types: what ``summary.json`` holds, what the CLI prints and what
the Evaluate tab, its pictures and the token-budget sweep read, by attribute.

Read top to bottom: the parts (one arm's accuracy, the paired outcomes, the KL, the blank probe,
the equivalence test, the detectable difference, the noise floor, the per-field scores, the
per-level drift of a precision pair), then :class:`Block` (every number of one group of rows) and
:class:`RunSummary` (the whole run's block plus the per-category blocks and the run's own parts).

Shares (accuracy, agreement, rates, margins, discordance) are fractions in [0, 1], not percent;
KL values are in nats; intervals are ``[low, high]`` lists. The functions that compute the parts are
:func:`g4v.evaluate.stats.summarise` and the modules it calls; this module only holds the types.

Every part is a :class:`~g4v.model.records.Record`: its fields are ``summary.json``'s keys, in its
order, so ``summary.json`` is derived in one place, :meth:`RunSummary.to_dict`, and read back in one
place, :meth:`RunSummary.from_dict` (a part missing from an older run's file is a ``TypeError``: the
run's rows are summed up again, :func:`g4v.evaluate.run.stored_summary`).
"""

from dataclasses import dataclass, field

from g4v.model.precision import DriftSummary
from g4v.model.records import Record, optional


@dataclass
class ArmScore(Record):
    """One arm's accuracy over the rows with a reference it answered (``n_scored``)."""

    label: str  # the arm's name as the run shows it
    accuracy: float | None  # share right after normalising; None without any scored row
    ci95: list[float] | None  # Wilson score 95 % interval of the accuracy
    n_scored: int


@dataclass
class Arms(Record):
    """Arm A's and arm B's scores (``summary.json``: ``"arms": {"a": ..., "b": ...}``)."""

    a: ArmScore
    b: ArmScore

    def side(self, arm: str) -> ArmScore:
        """The score of arm ``"a"`` or ``"b"`` (the pictures draw both in one loop)."""
        return {"a": self.a, "b": self.b}[arm]


@dataclass
class Paired(Record):
    """Rows both arms answered, with a reference, by outcome; ``mcnemar_p`` is the exact McNemar
    p-value of ``a_only`` against ``b_only`` (only discordant rows say which arm is better)."""

    both_right: int
    a_only: int
    b_only: int
    both_wrong: int
    mcnemar_p: float


@dataclass
class KLStats(Record):
    """KL(A || B) of the next-token distributions, in nats. Over the rows of a group: ``mean``,
    ``q90``, ``q99`` of the per-row means and ``max`` the largest per-position KL of any row."""

    mean: float
    q90: float
    q99: float
    max: float


@dataclass
class BlankSame(Record):
    """Per arm, the share of rows whose answer did not change with every picture blanked (the
    blank probe); None where the probe did not run."""

    a: float | None
    b: float | None


@dataclass
class Equivalence(Record):
    """The paired TOST of ``|acc A - acc B| < margin`` (:func:`g4v.evaluate.equivalence.tost_paired`).
    ``difference`` is A minus B; ``ci`` its ``1 - 2 alpha`` score interval; ``p_value`` the larger
    of the two one-sided p-values."""

    margin: float
    alpha: float
    n: int  # rows both arms answered, with a reference
    a_only: int
    b_only: int
    difference: float | None
    ci: list[float] | None
    p_lower: float | None  # H0: difference <= -margin
    p_upper: float | None  # H0: difference >= +margin
    p_value: float | None
    equivalent: bool
    verdict: str
    method: str = "TOST (Schuirmann 1987), Tango score statistic for paired proportions"


@dataclass
class Detectable(Record):
    """The smallest accuracy difference ``rows`` paired rows detect (McNemar, two-sided ``alpha``,
    ``power``), at the assumed share of discordant rows and, after a run, at the observed one
    (:func:`g4v.evaluate.stats.detectable`). Before a run it is the plan line; the summary keeps it."""

    rows: int
    alpha: float
    power: float
    discordance_assumed: float
    at_assumed: float | None  # None: too few rows for any difference
    margin: float
    rows_for_margin: int | None  # rows that would detect ``margin``; None when it exceeds the discordance
    discordance_observed: float | None  # None before a run (or without paired rows)
    at_observed: float | None


@dataclass
class NoiseFloor(Record):
    """An arm run twice over the same rows (B is A again): how often the two runs differ. A
    deterministic arm (greedy decoding, the same batches) must show 0 everywhere."""

    rows: int
    disagree: int  # greedy tokens differ
    text_differs: int  # answer texts differ
    discordant: int  # right in one run, wrong in the other
    rate: float | None  # disagree / rows


@dataclass
class FieldScore(Record):
    """One field of key-value or table answers over a run: each arm's outcome counts
    (``{"right", "wrong", "missing", "extra"}``), the rows where the two arms' outcomes for it
    differ (``moved``), and ``right_change`` = B's right count minus A's."""

    name: str
    a: dict = field(default_factory=dict)
    b: dict = field(default_factory=dict)
    rows: int = 0
    moved: int = 0
    right_change: int = 0


@dataclass
class FieldScores(Record):
    """The per-field block (:func:`g4v.evaluate.fields.field_scores`): ``rows`` scored per field,
    ``fields`` by name (most moved first, then by name) and the names of the fields that moved."""

    rows: int
    fields: dict[str, FieldScore]
    moved: list[str]


@dataclass
class LevelDrift(DriftSummary):
    """A precision pair's per-level drift: B (``of``) against A (``against``), the per-level means
    over the rows (:class:`g4v.model.precision.DriftSummary`: relative errors and cosines of the
    injected features, the next-token KL, in nats)."""

    of: str = ""
    against: str = ""

    def to_dict(self) -> dict:
        """``of`` and ``against`` first, then the drift's own keys (as ``summary.json`` has them)."""
        values = super().to_dict()
        return {"of": values.pop("of"), "against": values.pop("against"), **values}


@dataclass
class Block(Record):
    """Every number of one group of rows: the whole run, or one category."""

    n: int  # rows in the group, errors included
    n_errors: int  # rows that could not be compared (a picture missing, an arm failing)
    arms: Arms
    paired: Paired
    equivalence: Equivalence
    agreement: float | None  # share of rows whose greedy answers agree; None without an answered row
    kl: KLStats | None  # None unless both arms are local transformers (no full distributions otherwise)
    blank_same: BlankSame


@dataclass
class RunSummary(Block):
    """The summary of a run (``summary.json``): the whole run's :class:`Block`, then what only the
    run as a whole has."""

    complete: bool  # every row of the run is done (False: stopped or cancelled; Run again resumes)
    by_category: dict[str, Block]  # by category name, sorted
    worst: list[int]  # row indices most worth a look, worst first (:func:`g4v.evaluate.stats.worst_rows`)
    detectable: Detectable
    noise_floor: NoiseFloor | None  # only when B is A again
    fields: FieldScores | None  # None without a key-value or table reference
    level_drift: LevelDrift | None = optional()  # only when the arms differ in precision alone (absent otherwise)
