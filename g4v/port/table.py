"""The per-level table of a ``port-diff`` summary, written once for both of its readers: the CLI's
report and the app's vLLM port tab show the same numbers in the same form (the tab once printed
18-digit floats where the CLI printed ``6.38e-06``).

The summary's typed levels in (:class:`~g4v.port.compare.LevelDiff`), strings out.
"""

import math
from pathlib import Path

#: The table's columns, in order; "share of tolerance used" is ``max |diff| / allowed`` of the worst
#: element (:meth:`g4v.port.compare.Tolerance.used`): 1 is the limit, it is not a tolerance itself.
LEVEL_COLUMNS = ("level", "LLM layer", "max |diff|", "max relative diff", "share of tolerance used", "verdict")
#: Significant digits of every number in the table.
DIGITS = 3


def number(value) -> str:
    """A difference or a share in ``DIGITS`` significant digits (``6.38e-06``, ``0.021``); ``-``
    when nothing was compared; ``inf`` when anything differs where nothing is allowed."""
    if value is None:
        return "-"
    value = float(value)
    if math.isinf(value):
        return "inf"
    return f"{value:.{DIGITS}g}"


def level_rows(levels: list) -> list[list[str]]:
    """One row of :data:`LEVEL_COLUMNS` per level of the summary, every cell a string."""
    return [[row.name, str(row.llm_layer), number(row.max_abs_diff), number(row.max_rel_diff),
             number(row.share_of_tolerance_used), "ok" if row.ok else row.problem or "differs"]
            for row in levels]


def model_label(model: str) -> str:
    """What a reader is shown of the model: a local folder by its name alone (the server's path
    is nobody else's business), a hub id as it is."""
    path = Path(model)
    return path.name if path.is_absolute() or path.is_dir() else model


def without_model_path(summary):
    """The summary (a :class:`~g4v.port.summary.PortDiffSummary`) with the model's path replaced by
    :func:`model_label` wherever it occurs (the ``model`` field, and messages that quote it, such as
    a load error); the caller's is left as it was."""
    source = str(summary.model or "")
    if not source or model_label(source) == source:
        return summary
    label = model_label(source)
    return with_texts(summary, lambda text: text.replace(source, label))


def with_texts(summary, change):
    """A copy of ``summary`` (a record) with ``change`` applied to every string in it."""

    def changed(value):
        if isinstance(value, str):
            return change(value)
        if isinstance(value, dict):
            return {key: changed(item) for key, item in value.items()}
        if isinstance(value, list):
            return [changed(item) for item in value]
        return value

    return type(summary).from_dict(changed(summary.to_dict()))
