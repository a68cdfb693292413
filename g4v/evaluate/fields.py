"""Per-field scores for key-value and table answers: for each field, how often an arm's answer has it
right, wrong, missing, or adds it where the reference has none, and which fields moved between arms.

A row is scored per field when its reference is structured (:func:`reference_kind`):

* **key-value**: the reference is a JSON object or list. Fields are the paths to its leaf values
  (:func:`g4v.documents.metrics.leaf_values`) with list positions folded (``$.items[0].price`` and
  ``$.items[1].price`` both count under ``$.items[*].price``), so a field is the same across rows.
  A leaf is *right* when the answer has the same JSON value at the same path (strings trimmed,
  ``"12"`` is not ``12``, as :func:`~g4v.documents.metrics.key_value_match`), *wrong* when it has
  another value there, *missing* when it has none; each leaf of the answer at a path the
  reference lacks is *extra*. An answer that is not JSON has every field missing.
* **table**: the reference is an HTML table (``<table``) or CSV of at least two rows and two
  columns. Fields are the columns, named by the reference's first row; the answer's columns are
  matched by header (case folded), its body rows by position. A body cell is right when the texts
  are equal after trimming and case folding; a cell of an answer column no reference column has,
  or of a body row past the reference's last, is extra.

Everything else (a one-word answer, plain text) has no fields and is left out.
"""

import json
import re
from collections import Counter

import g4v.documents.metrics as metrics
import g4v.documents.tables as tables
from g4v.evaluate.summary import FieldScore, FieldScores

#: The outcomes a field can have in one answer.
OUTCOMES = ("right", "wrong", "missing", "extra")
#: The columns of :func:`field_rows` (the Evaluate tab's per-field table).
FIELD_HEADERS = ["field", "rows", "A right / wrong / missing / extra", "B right / wrong / missing / extra",
                 "moved (rows)", "B right minus A right"]
_INDEX = re.compile(r"\[\d+\]")


def reference_kind(reference: str | None) -> str | None:
    """``"key-value"``, ``"table"`` or None (not scored per field) for a row's reference."""
    text = tables.strip_fence(reference or "")
    if text[:1] in "{[" and text:
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return None
        return "key-value" if isinstance(value, (dict, list)) else None
    if "<table" in text.lower():
        return "table" if _html_rows(text) else None
    return "table" if "\n" in text and _csv_rows(text) else None


def field_outcomes(answer: str, reference: str | None) -> dict[str, Counter] | None:
    """``{field: Counter(outcome: count)}`` of one answer against its reference; None when the
    reference is not structured. Key-value fields are folded leaf paths, table fields column names."""
    kind = reference_kind(reference)
    if kind == "key-value":
        return _key_value(answer, json.loads(tables.strip_fence(reference)))
    if kind == "table":
        return _table(answer, reference)
    return None


def _key_value(answer: str, truth) -> dict[str, Counter]:
    true_leaves = metrics.leaf_values(truth)
    try:
        given = metrics.leaf_values(json.loads(tables.strip_fence(answer)))
    except (json.JSONDecodeError, RecursionError):
        given = {}
    counts: dict[str, Counter] = {}
    for path, value in true_leaves.items():
        outcome = "missing" if path not in given else "right" if metrics.same_value(given[path], value) else "wrong"
        counts.setdefault(_folded(path), Counter())[outcome] += 1
    for path in given.keys() - true_leaves.keys():
        counts.setdefault(_folded(path), Counter())["extra"] += 1
    return counts


def _folded(path: str) -> str:
    return _INDEX.sub("[*]", path)


def _table(answer: str, reference: str) -> dict[str, Counter]:
    truth = _rows(reference)
    given = _rows(answer) or [[]]
    names = _column_names(truth[0])
    given_names = _column_names(given[0])
    where = {}  # the answer's column of each name (the first one)
    for position, name in enumerate(given_names):
        where.setdefault(name.casefold(), position)
    counts: dict[str, Counter] = {name: Counter() for name in names}
    for r, row in enumerate(truth[1:], start=1):
        for name, cell in zip(names, row):
            column = where.get(name.casefold())
            got = given[r][column] if r < len(given) and column is not None and column < len(given[r]) else None
            counts[name]["missing" if got is None else "right" if _cell(got) == _cell(cell) else "wrong"] += 1
    known = {name.casefold(): name for name in names}  # an extra cell of a known column counts under its name
    for r, row in enumerate(given[1:], start=1):
        for name, _ in zip(given_names, row):
            if name.casefold() not in known or r >= len(truth):
                counts.setdefault(known.get(name.casefold(), name), Counter())["extra"] += 1
    return counts


def _column_names(header: list[str]) -> list[str]:
    """A name for each header cell; an empty header cell is named by its position (``column 1``)."""
    return [text.strip() or f"column {i + 1}" for i, text in enumerate(header)]


def _cell(text: str) -> str:
    return " ".join(text.split()).casefold()


def _rows(text: str) -> list[list[str]]:
    """A table answer's cell texts row by row (HTML or CSV); [] when it is neither."""
    return _html_rows(text) if "<table" in text.lower() else _csv_rows(text)


def _html_rows(text: str) -> list[list[str]]:
    try:
        return [[cell_text for cell_text, _, _ in row] for row in tables.html_cells(text)]
    except tables.TableError:
        return []


def _csv_rows(text: str) -> list[list[str]]:
    try:
        rows = tables.parse_csv(text).rows
    except tables.TableError:
        return []
    return rows if len(rows) >= 2 and len(rows[0]) >= 2 else []


def field_scores(rows: list) -> FieldScores | None:
    """The per-field block of the summary for rows (SampleResults; error rows left out): ``rows``
    scored per field, ``fields`` by name (most moved first, then by name) and ``moved`` (the names
    of fields that moved). None when no row has a structured reference."""
    scores: dict[str, FieldScore] = {}
    scored = 0
    for row in rows:
        if row.error is not None:
            continue
        outcomes_a = field_outcomes(row.answer_a, row.reference)
        if outcomes_a is None:
            continue
        outcomes_b = field_outcomes(row.answer_b, row.reference)
        scored += 1
        for name in outcomes_a.keys() | outcomes_b.keys():
            score = scores.setdefault(name, FieldScore(name, dict.fromkeys(OUTCOMES, 0), dict.fromkeys(OUTCOMES, 0)))
            got_a, got_b = outcomes_a.get(name, Counter()), outcomes_b.get(name, Counter())
            for outcome in OUTCOMES:
                score.a[outcome] += got_a[outcome]
                score.b[outcome] += got_b[outcome]
            score.rows += 1
            score.moved += +(got_a != got_b)
    if not scored:
        return None
    for score in scores.values():
        score.right_change = score.b["right"] - score.a["right"]
    ordered = sorted(scores.values(), key=lambda s: (-s.moved, s.name))
    return FieldScores(scored, {s.name: s for s in ordered}, [s.name for s in ordered if s.moved])


def field_rows(block: FieldScores | None) -> list[list]:
    """The summary's per-field block as table rows (:data:`FIELD_HEADERS`), most moved first."""
    if not block:
        return []
    return [[name, score.rows, " / ".join(str(score.a[k]) for k in OUTCOMES),
             " / ".join(str(score.b[k]) for k in OUTCOMES), score.moved, score.right_change]
            for name, score in block.fields.items()]
