"""One request of the Training tab and of ``python -m g4v training``: a run opened, measured if
it must be, and its numbers as the table and the lines both fronts show (so they cannot differ)."""

import math
from collections.abc import Callable
from pathlib import Path

from g4v.errors import G4VError
from g4v.training.records import ALERT_NAMES, counted
from g4v.training.runs import RunCurves, read_run, resolve_run

#: The table's columns (the tab's headers; the command prints the same rows).
COLUMNS = ["level", "records", "ratio first", "ratio last", "injected first", "injected last", "dominant last",
           "grad last", "update last", "warnings"]


def open_run(choice: str, dirs: list[Path] | None = None, measure: bool = False, probe: list[tuple] | None = None,
             device: str | None = None, progress: Callable[[int, int, float], None] | None = None) -> RunCurves:
    """The run named ``choice`` (inside the run folders ``dirs``): its logged records, or, for a
    run without them (or with ``measure``), its checkpoints measured on the probe set."""
    name, folder = resolve_run(choice, dirs)
    curves = read_run(folder, name)
    if curves.records and not measure:
        return curves
    if not curves.checkpoints:
        raise G4VError(f"run {name!r} keeps no checkpoints to measure")
    from g4v.training.measure import measure_checkpoints

    return measure_checkpoints(curves, probe=probe, device=device, progress=progress)


def _shown(value) -> float | str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return float(f"{value:.4g}")


def summary_rows(curves: RunCurves) -> list[list]:
    """Per level: how many records, its ratio and injected norm at the first and last record, its
    last dominant share, gradient and update norms, and its warnings (count and kinds)."""
    rows = []
    for index, name in enumerate(curves.levels):
        mine = [next(lv for lv in record.levels if lv.name == name) for record in curves.records]
        measured = [lv for lv in mine if lv.injected_norm is not None]
        first, last = (measured[0], measured[-1]) if measured else (None, None)
        kinds = sorted({ALERT_NAMES[lv.alert] for lv in mine if lv.alert})
        warned = sum(1 for lv in mine if lv.alert)
        last_of = lambda metric: next((getattr(lv, metric) for lv in reversed(mine) if getattr(lv, metric) is not None),
                                      None)
        rows.append([name, len(measured), _shown(first and first.ratio), _shown(last and last.ratio),
                     _shown(first and first.injected_norm), _shown(last and last.injected_norm),
                     _shown(last and last.dominant_share), _shown(last_of("grad_norm")), _shown(last_of("update_norm")),
                     f"{warned} ({', '.join(kinds)})" if warned else "0"])
    return rows


def headline(curves: RunCurves) -> str:
    """One line: the run, where its numbers come from, its steps and its warnings."""
    steps = [record.step for record in curves.records]
    span = "no steps" if not steps else f"step {steps[0]}" if steps[0] == steps[-1] else f"steps {steps[0]}-{steps[-1]}"
    alerts = curves.alerts
    said = counted(len(alerts), "warning") if alerts else "no warnings"
    return f"run {curves.name!r}: {counted(len(steps), 'record')} from {curves.source}, {span}, {said}"


def kept_line(curves: RunCurves) -> str:
    """Which checkpoints the run keeps: how many, and at which steps."""
    kept = sorted(curves.checkpoints)
    if not kept:
        return "This run keeps no checkpoints."
    return f"Checkpoints kept: {len(kept)}, at step{'' if len(kept) == 1 else 's'} {', '.join(map(str, kept))}."


def alert_lines(curves: RunCurves, limit: int = 40) -> list[str]:
    """The warnings, one line each (at most ``limit``, then how many more)."""
    lines = [alert.line() for alert in curves.alerts]
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])
