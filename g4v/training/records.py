"""What one measurement of the 8 levels during training holds, its names in a trainer's logs, and
the warnings read from it. No torch here: the Training tab and command read these from log files.

A record is flat in the logs, one scalar per name, so that every tracker a ``transformers.Trainer``
reports to (TensorBoard, W&B, trackio) and ``trainer_state.json``'s ``log_history`` take it as it
is: ``deepstack/<level>/<metric>`` for the 8 levels (:data:`LEVEL_METRICS`) and
``lora/<module group>/update_norm`` for a LoRA being trained.
"""

import math
from dataclasses import dataclass, field, fields

from g4v.model.levels import SPATIAL_OFFSETS
from g4v.training.settings import MonitorSettings

PREFIX = "deepstack"
LORA_PREFIX = "lora"
#: Per level, in the order the tab and the command show them.
LEVEL_METRICS = ("injected_norm", "residual_norm", "ratio", "dominant_share", "grad_norm", "update_norm", "alert")
#: The ``alert`` metric's values.
FINE, COLLAPSE, EXPLOSION = 0, -1, 1
ALERT_NAMES = {COLLAPSE: "collapse", EXPLOSION: "explosion"}


def metric_key(level: str, metric: str) -> str:
    return f"{PREFIX}/{level}/{metric}"


def lora_key(group: str) -> str:
    return f"{LORA_PREFIX}/{group}/update_norm"


@dataclass
class LevelRecord:
    """One level at one step. Forward numbers are means over the image tokens of the step's batch
    (or the probe batch); None where the pass had no image."""

    name: str
    injected_norm: float | None = None  # mean L2 norm of the features added at this level
    # Mean L2 norm of the residual stream just before the injection, at the image tokens; for a level
    # injected at LLM layer 0 the stream there is the zeroed placeholders (0), so at the text tokens.
    residual_norm: float | None = None
    ratio: float | None = None  # injected_norm / residual_norm
    dominant_share: float | None = None  # share of image tokens whose injected vector outweighs the stream's
    grad_norm: float | None = None  # this level's projector: the gradient the optimizer applies (clipped)
    update_norm: float | None = None  # this level's projector: how far its weights moved since the last record
    alert: int = FINE

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Alert:
    step: int
    level: str
    kind: int  # COLLAPSE or EXPLOSION
    reason: str

    def line(self) -> str:
        return f"step {self.step}: {self.level} {ALERT_NAMES[self.kind]}: {self.reason}"

    def to_dict(self) -> dict:
        return {"step": self.step, "level": self.level, "kind": ALERT_NAMES[self.kind], "reason": self.reason}


@dataclass
class Record:
    step: int  # the optimizer step whose forward was measured (its loss is logged at the same step)
    levels: list[LevelRecord]
    lora: dict[str, float] = field(default_factory=dict)  # module group -> update norm since the last record
    alerts: list[Alert] = field(default_factory=list)

    def to_logs(self) -> dict[str, float]:
        """The flat scalars a trainer logs (None values left out)."""
        logs = {}
        for level in self.levels:
            for metric in LEVEL_METRICS:
                value = getattr(level, metric)
                if value is not None:
                    logs[metric_key(level.name, metric)] = float(value)
        logs.update({lora_key(group): float(value) for group, value in self.lora.items()})
        return logs

    def to_dict(self) -> dict:
        return {"step": self.step, "levels": [level.to_dict() for level in self.levels], "lora": dict(self.lora),
                "alerts": [alert.to_dict() for alert in self.alerts]}

    @classmethod
    def from_logs(cls, step: int, logs: dict, level_names: list[str]) -> "Record | None":
        """The record in one log entry (``deepstack/...`` keys), None when it holds none."""
        if not any(key.startswith(PREFIX + "/") for key in logs):
            return None
        levels = []
        for name in level_names:
            values = {metric: _number(logs.get(metric_key(name, metric))) for metric in LEVEL_METRICS}
            values["alert"] = int(values["alert"] or FINE)
            levels.append(LevelRecord(name, **values))
        lora = {key.split("/")[1]: float(value) for key, value in logs.items()
                if key.startswith(LORA_PREFIX + "/") and key.endswith("/update_norm") and _number(value) is not None}
        alerts = [Alert(step, level.name, level.alert, describe(level)) for level in levels if level.alert != FINE]
        return cls(step, levels, lora, alerts)


def level_names_in(keys) -> list[str]:
    """The level names that ``deepstack/<level>/...`` keys mention, in the model's order (deepstack
    levels by index, then the spatial ones TL, TR, BL, BR), whatever order the keys came in."""
    names = set()
    for key in keys:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == PREFIX and parts[2] in LEVEL_METRICS:
            names.add(parts[1])
    return sorted(names, key=_level_order)


def _level_order(name: str) -> tuple:
    kind, _, rest = name.partition("_")
    if name.startswith("deepstack") and name[len("deepstack"):].isdigit():
        return 0, int(name[len("deepstack"):]), name
    if kind == "spatial" and rest in SPATIAL_OFFSETS:
        return 1, SPATIAL_OFFSETS.index(rest), name
    return 2, 0, name


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def counted(count: int, noun: str) -> str:
    """``"1 record"``, ``"3 records"``: a count and its noun, singular for one (the lines about a run)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe(level: LevelRecord) -> str:
    """Why a level is flagged, in words, from its numbers."""
    parts = []
    if level.ratio is not None:
        parts.append(f"injected / residual norm {level.ratio:.3g}")
    if level.injected_norm is not None:
        parts.append(f"injected norm {level.injected_norm:.3g}")
    return ", ".join(parts) or "no numbers"


def check_levels(step: int, levels: list[LevelRecord], previous: dict[str, LevelRecord],
                 settings: MonitorSettings) -> list[Alert]:
    """Flag each level that collapsed or exploded (sets its ``alert``); ``previous``: the last
    record's levels by name (empty at the first)."""
    alerts = []
    for level in levels:
        kind, reason = _verdict(level, previous.get(level.name), settings)
        level.alert = kind
        if kind != FINE:
            alerts.append(Alert(step, level.name, kind, reason))
    return alerts


def _verdict(level: LevelRecord, before: LevelRecord | None, settings: MonitorSettings) -> tuple[int, str]:
    norm, ratio = level.injected_norm, level.ratio
    if norm is None:
        return FINE, ""
    if not math.isfinite(norm) or (ratio is not None and not math.isfinite(ratio)):
        return EXPLOSION, f"injected norm {norm:.3g}, not finite"
    if ratio is not None and ratio < settings.collapse_ratio:
        return COLLAPSE, f"injected / residual norm {ratio:.3g} < {settings.collapse_ratio:g}"
    if ratio is not None and ratio > settings.explosion_ratio:
        return EXPLOSION, f"injected / residual norm {ratio:.3g} > {settings.explosion_ratio:g}"
    last = before.injected_norm if before is not None else None
    if last is not None and math.isfinite(last) and last > 0:
        if norm > last * settings.jump:
            return EXPLOSION, f"injected norm {last:.3g} -> {norm:.3g}, more than x{settings.jump:g} since the last record"
        if norm * settings.jump < last:
            return COLLAPSE, f"injected norm {last:.3g} -> {norm:.3g}, under 1/{settings.jump:g} of the last record"
    return FINE, ""
