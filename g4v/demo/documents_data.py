"""The demo checkpoint's two document tasks (issue 21), as the engines ask them.

* **chart to CSV**: a bar chart (:mod:`g4v.demo.charts`) with the ``<chart2csv>`` preset's prompt;
  the answer is the chart's CSV.
* **key-value extraction**: a shape picture (:mod:`g4v.demo.shapes`) with the key-value preset's
  prompt around :data:`KVP_SCHEMA`; the answer is one compact JSON object: the number of shapes
  and each shape's kind, colour and place, in reading order (top to bottom, then left to right, as
  the places' centres lie: top, left, right, bottom), so every field has one right value.

Both prompts come from :func:`g4v.documents.presets.build_prompt`, the same function the Chat tab
and ``python -m g4v chat --task`` use, so training sees what a user sends. The bundled tiny
checkpoints' chat template expands no task tag: ``<chart2csv>`` reaches the model as written.
"""

import json
from dataclasses import dataclass
from functools import lru_cache

from g4v.demo import shapes as S
from g4v.documents.presets import build_prompt

#: The kinds of document examples (the :class:`g4v.demo.shapes.QA` ``kind`` they carry).
DOCUMENT_TASKS = ("chart", "kvp")
#: The schema a user would write for a shapes picture. Kept short: the tokenizer is tiny, and the
#: key-value prompt carries the schema (one line of JSON, about 250 of its 330 tokens) on every example.
KVP_SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "shapes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"shape": {"type": "string"}, "colour": {"type": "string"},
                               "place": {"type": "string"}},
                "required": ["shape", "colour", "place"],
            },
        },
    },
    "required": ["count", "shapes"],
}


@dataclass
class DocumentItem:
    """One document question: the picture (``.image``), the question as sent, and its right answer
    (a :class:`g4v.demo.shapes.QA` of kind ``chart`` or ``kvp``), so the shapes evaluation's
    batching and the training's encoding take it as they take a shape picture's question."""

    image: object
    qa: S.QA
    #: The right answer as data: the CSV's bars, or the key-value JSON as a dict.
    truth: object
    #: For the training's attention pointer: the drawn objects (bars or shapes, object ``i`` as
    #: value ``i + 1``), their number, and which stretch of the answer is about which:
    #: (first character, end character, object index or a tuple of them to spread over).
    mask: object = None
    objects: int = 0
    segments: tuple[tuple[int, int, int | tuple[int, ...]], ...] = ()

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


@lru_cache(maxsize=None)
def chart_prompt() -> str:
    return build_prompt("chart2csv")


@lru_cache(maxsize=None)
def kvp_prompt() -> str:
    return build_prompt("kvp", schema_text=json.dumps(KVP_SCHEMA))


def reading_order(picture: S.Picture) -> list[S.Shape]:
    """The picture's shapes top to bottom, then left to right, by their places' centres."""
    return sorted(picture.shapes, key=lambda shape: (S.PLACES[shape.place][1], S.PLACES[shape.place][0]))


def kvp_truth(picture: S.Picture) -> dict:
    """The key-value answer as data."""
    return {"count": len(picture.shapes),
            "shapes": [{"shape": s.kind, "colour": s.colour, "place": s.place} for s in reading_order(picture)]}


def kvp_answer(picture: S.Picture) -> str:
    """The key-value answer as the model should write it: compact JSON (fewest tokens)."""
    return json.dumps(kvp_truth(picture), separators=(",", ":"))


def chart_segments(csv: str, bars: int) -> tuple:
    """Bar ``i``'s row of the CSV (after the header line): (first character, end character, i);
    and the character that ends the row (a newline, or the end of text after the last row, one
    past the answer): the next bar, or after the last one the empty plot right of it (object
    ``bars``), which is where "another row or stop?" is decided."""
    segments, start = [], 0
    for line_number, line in enumerate(csv.split("\n")):
        if line_number:
            end = start + len(line)
            segments += [(start, end, line_number - 1), (end, end + 1, line_number)]
        start += len(line) + 1
    return tuple(segments)


def kvp_segments(picture: S.Picture, answer: str) -> tuple:
    """(first character, end character, object) for the count's value (spread over every
    shape, as the first stage's count pointer), each shape's JSON object (that shape, in reading
    order as the answer lists them) and the comma before the next object (the next shape); nothing
    after the last object."""
    value = answer.index('"count":') + len('"count":')
    segments = [(value, value + 1, tuple(range(len(picture.shapes))))]
    order, start = reading_order(picture), 0
    for position, shape in enumerate(order):
        first = answer.index('{"shape"', start)
        start = answer.index("}", first) + 1
        segments.append((first, start, picture.shapes.index(shape)))
        if position + 1 < len(order):
            segments.append((start, start + 1, picture.shapes.index(order[position + 1])))
    return tuple(segments)


def chart_item(chart) -> DocumentItem:
    return DocumentItem(chart.image, S.QA("chart", chart_prompt(), chart.csv), list(chart.bars), chart.mask,
                        len(chart.bars) + 1, chart_segments(chart.csv, len(chart.bars)))


def kvp_item(picture: S.Picture) -> DocumentItem:
    answer = kvp_answer(picture)
    return DocumentItem(picture.image, S.QA("kvp", kvp_prompt(), answer), kvp_truth(picture), picture.mask,
                        len(picture.shapes), kvp_segments(picture, answer))


def held_out_items(n: int) -> list[DocumentItem]:
    """``n`` held-out charts, then the key-value question on the ``n`` held-out shape pictures."""
    from g4v.demo.charts import chart_eval_set

    return [chart_item(c) for c in chart_eval_set(n)] + [kvp_item(p) for p in S.eval_set(n)]


def validation_items(n: int) -> list[DocumentItem]:
    """``n`` validation charts and ``n`` validation shape pictures (never held-out ones)."""
    from g4v.demo.charts import chart_validation_set

    return [chart_item(c) for c in chart_validation_set(n)] + [kvp_item(p) for p in S.validation_set(n)]


def pairs(items: list[DocumentItem]) -> list[tuple[DocumentItem, S.QA]]:
    """(picture, question) pairs as :func:`g4v.demo.answering.batched_answers` takes them."""
    return [(item, item.qa) for item in items]


def data_settings() -> dict:
    """What the document examples are, for the checkpoint's provenance."""
    from g4v.demo import charts as C

    return {
        "chart": {"generator": "g4v.demo.charts", "bars": list(C.BARS), "heights": list(C.HEIGHTS),
                  "prompt": chart_prompt(), "answer": "CSV: header " + ",".join(C.CSV_HEADER) + ", one row per bar",
                  "train": "train_chart(seed, index) (string seeds 'chart:SEED:INDEX')",
                  "held_out": f"chart_eval_set(n), integer seeds {C.CHART_EVAL_SEED} * 10_000_000 + i"},
        "kvp": {"pictures": "g4v.demo.shapes (string seeds 'docs:SEED:INDEX' in training)",
                "schema": KVP_SCHEMA, "answer": "compact JSON, shapes in reading order"},
    }
