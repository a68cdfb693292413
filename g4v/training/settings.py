"""What the training monitor records and when it warns: :class:`MonitorSettings`, every default once.

The callback (:mod:`g4v.training.callback`), the plain monitor of a custom loop
(:mod:`g4v.training.monitor`), the demo's trainer, the measurement of a run's checkpoints and the
Training tab and command all read their thresholds from here. No torch here.
"""

from dataclasses import dataclass, field

from g4v.errors import G4VError, check_fields, whole_number


def _positive(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value \
            or value == float("inf"):
        raise ValueError(f"must be a finite number above 0, got {value!r}")


def _above_one(value) -> None:
    _positive(value)
    if value <= 1:
        raise ValueError(f"must be a number above 1, got {value!r}")


@dataclass(frozen=True)
class MonitorSettings:
    """How often the 8 levels are measured while training, and the thresholds of the warnings.

    A level **collapses** when its features shrink to nothing beside the residual stream (the ratio
    of the injected norm to the stream's at its injection layer falls under ``collapse_ratio``) or
    shrink by more than ``jump`` times from one record to the next; it **explodes** when the ratio
    rises over ``explosion_ratio``, grows by more than ``jump`` times between records, or is not
    finite. The defaults were set from the demo's own training (docs/training.md has its numbers):
    from its first step to its last, its levels' ratios stayed between 0.099 and 3.09 and no level's
    norm changed by more than 2.45 times between two records 10 steps apart; so the thresholds sit 10
    times under, 30 times over and 4 times beyond what a healthy run of it did.
    """

    every: int = field(default=10, metadata={
        "check": whole_number(1), "help": "measure every N optimizer steps (and at the first step)"})
    collapse_ratio: float = field(default=0.01, metadata={
        "check": _positive, "help": "warn when a level's injected norm / residual norm falls under this"})
    explosion_ratio: float = field(default=100.0, metadata={
        "check": _positive, "help": "warn when a level's injected norm / residual norm rises over this"})
    jump: float = field(default=10.0, metadata={
        "check": _above_one, "help": "warn when a level's injected norm changes by more than this factor "
                                     "between two records"})
    update_norms: bool = field(default=True, metadata={
        "help": "keep a copy of the projectors (and a LoRA's weights) to measure each record's update norm"})

    def __post_init__(self):
        check_fields(self)
        if self.collapse_ratio >= self.explosion_ratio:
            raise G4VError(f"collapse_ratio ({self.collapse_ratio:g}) must be under explosion_ratio "
                             f"({self.explosion_ratio:g})")

    def due(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1 = the first) is measured."""
        return step == 1 or step % self.every == 0
