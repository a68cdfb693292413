"""Scores for document answers against the right answer: plain functions, numbers in [0, 1].

* :func:`teds`: Tree-Edit-Distance-based Similarity of two HTML tables (Zhong et al. 2020,
  "Image-based table recognition", arXiv:1911.10683), the table metric Granite Vision's model cards
  report. The tree is ``table -> tr -> cell``; inserting or deleting a node costs 1; renaming a cell
  costs 1 when the spans differ, else the normalised edit distance between the two cell texts (0
  for equal texts). ``TEDS = 1 - distance / max(nodes of either tree)``. Unlike the reference code,
  ``th`` and ``td`` count as the same cell (a header marked up either way is the same table) and
  ``thead``/``tbody`` wrappers are not nodes, rows without cells are dropped and several tables
  in one answer are read as one (rows in order; the reference code reads the first); see
  docs/evaluate.md, "Document scores"; ``structure_only`` ignores texts (TEDS-S).
* :func:`csv_cell_accuracy`: the share of cells that match at the same row and column, out of the
  larger of the two tables (so missing and extra cells both cost).
* :func:`key_value_match`: exact match per field of the right answer, fields being the paths to its
  leaf values (``$.total``, ``$.items[0].price``).

An answer that does not parse scores 0; a right answer that does not parse is the caller's bug and
raises.
"""

import json
import math
from dataclasses import dataclass

from apted import APTED, Config

from g4v.documents import tables


@dataclass
class _Node:
    """A node of a table tree: its tag, and for cells the spans and the text's characters."""

    tag: str
    colspan: int = 1
    rowspan: int = 1
    text: str = ""
    children: list = None

    def __post_init__(self):
        self.children = self.children or []


class _TedsCosts(Config):
    valuecls = float

    def __init__(self, structure_only: bool):
        self.structure_only = structure_only

    def rename(self, a: _Node, b: _Node) -> float:
        if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
            return 1.0
        if a.tag != "td" or self.structure_only:
            return 0.0
        return normalised_edit_distance(a.text, b.text)


def table_tree(markup: str) -> _Node:
    """HTML table -> ``table`` node with one ``tr`` child per row and one ``td`` child per cell."""
    rows = tables.html_cells(markup)
    return _Node("table", children=[
        _Node("tr", children=[_Node("td", colspan, rowspan, text) for text, colspan, rowspan in row])
        for row in rows])


def _size(node: _Node) -> int:
    return 1 + sum(_size(child) for child in node.children)


def tree_edit_distance(a: _Node, b: _Node, structure_only: bool = False) -> float:
    """The least total cost of node edits turning tree ``a`` into tree ``b`` (APTED)."""
    return float(APTED(a, b, _TedsCosts(structure_only)).compute_edit_distance())


def teds(predicted_html: str, true_html: str, structure_only: bool = False) -> float:
    """TEDS of a predicted HTML table against the true one: 1 for the same table, 0 for no table."""
    truth = table_tree(true_html)
    try:
        prediction = table_tree(predicted_html)
    except tables.TableError:
        return 0.0
    distance = tree_edit_distance(prediction, truth, structure_only)
    return 1.0 - distance / max(_size(prediction), _size(truth))


def normalised_edit_distance(a: str, b: str) -> float:
    """Levenshtein distance of two texts divided by the longer length (0 equal, 1 nothing shared)."""
    if a == b:
        return 0.0
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1] / max(len(a), len(b))


def csv_cell_accuracy(predicted_csv: str, true_csv: str, numeric_tolerance: float = 0.0) -> float:
    """Cells equal at the same (row, column), over the larger table's cell count.

    Texts compare after trimming and case folding; two numbers (``"1,200"`` reads as 1200, a
    trailing ``%`` is dropped) are equal within ``numeric_tolerance`` relative to the true value.
    """
    truth = tables.parse_csv(true_csv).rows
    try:
        prediction = tables.parse_csv(predicted_csv).rows
    except tables.TableError:
        return 0.0
    total = max(sum(map(len, truth)), sum(map(len, prediction)))
    matched = sum(_cells_equal(p, t, numeric_tolerance)
                  for p_row, t_row in zip(prediction, truth) for p, t in zip(p_row, t_row))
    return matched / total


def _cells_equal(predicted: str, true: str, tolerance: float) -> bool:
    a, b = _number(predicted), _number(true)
    if a is not None and b is not None:
        return abs(a - b) <= tolerance * abs(b)
    return predicted.strip().casefold() == true.strip().casefold()


def _number(text: str) -> float | None:
    """The cell as a finite number, else None (``"nan"`` and ``"inf"`` are texts, compared as such)."""
    try:
        value = float(text.strip().rstrip("%").replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass
class KeyValueScore:
    """Per field of the right answer (a leaf path), whether the answer has the same value there;
    ``accuracy`` is the share of fields matched (0 when the answer is not JSON)."""

    fields: dict
    accuracy: float
    error: str | None = None


def key_value_match(predicted_json: str, truth) -> KeyValueScore:
    """Exact match per field: same path, same JSON value (strings trimmed; ``"12"`` is not ``12``)."""
    true_fields = leaf_values(truth)
    try:
        prediction = leaf_values(json.loads(tables.strip_fence(predicted_json)))
        error = None
    except (json.JSONDecodeError, RecursionError) as err:
        prediction, error = {}, f"not JSON: {' '.join(str(err).split())[:200]}"
    fields = {path: path in prediction and same_value(prediction[path], value) for path, value in true_fields.items()}
    accuracy = sum(fields.values()) / len(fields) if fields else float(not prediction)
    return KeyValueScore(fields, accuracy, error)


def same_value(a, b) -> bool:
    """Two JSON leaves are the same answer: strings equal after trimming, others of one type and equal."""
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    return type(a) is type(b) and a == b


def leaf_values(value, path: str = "$") -> dict:
    """A JSON value as {path of each leaf: leaf}: ``{"a": [1, {"b": 2}]}`` -> ``$.a[0]``, ``$.a[1].b``.
    Empty objects and lists are leaves themselves (an answer must produce them too)."""
    if isinstance(value, dict) and value:
        return {p: v for key, item in value.items() for p, v in leaf_values(item, f"{path}.{key}").items()}
    if isinstance(value, list) and value:
        return {p: v for i, item in enumerate(value) for p, v in leaf_values(item, f"{path}[{i}]").items()}
    return {path: value}
