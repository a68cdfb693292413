"""The Chat examples of the demo checkpoint's document tasks: ``python -m g4v.demo examples``.

Draws a bar chart (asked with the ``<chart2csv>`` preset) and a shape picture (asked with the
key-value preset and :data:`g4v.demo.documents_data.KVP_SCHEMA`) into ``assets/examples/``, and
lists both in ``examples.json`` with their right answers, the task preset they are asked with
(``task``, and the key-value one's ``schema`` file: clicking the example in the Chat tab picks
both, so the structured panel reads the answer) and the checkpoint that learnt them (``model``:
the app lists them only with that one), beside the entries already there (an
entry with the same file name is replaced, every other one kept); and the schema as a file, for
``python -m g4v chat --task kvp --schema``. Seeded: the same files every run.
"""

import json
import random
from pathlib import Path

from g4v.demo import documents_data as D
from g4v.demo import shapes as S
from g4v.demo.charts import make_chart
from g4v.paths import DOCUMENTS_MODEL_DIR, EXAMPLES_DIR

CHART_FILE = "chart-bars.png"
KVP_FILE = "shapes-kvp.png"
SCHEMA_FILE = "shapes-kvp-schema.json"


def example_entries() -> list[tuple[object, dict]]:
    """(image, examples.json entry) for the chart and the key-value example."""
    chart = make_chart(random.Random(f"example:{CHART_FILE}:0"), canvas="wide")
    picture = S.make_picture(random.Random(f"example:{KVP_FILE}:0"), canvas="square", max_shapes_p=1.0)
    model = DOCUMENTS_MODEL_DIR.name
    return [
        (chart.image, {"file": CHART_FILE, "prompt": D.chart_prompt(), "answer": chart.csv, "task": "chart2csv",
                       "model": model,
                       "made_by": f"g4v.demo.charts.make_chart(random.Random('example:{CHART_FILE}:0'), canvas='wide')"}),
        (picture.image, {"file": KVP_FILE, "prompt": D.kvp_prompt(), "answer": D.kvp_answer(picture), "task": "kvp",
                         "schema": SCHEMA_FILE, "model": model,
                         "made_by": f"g4v.demo.shapes.make_picture(random.Random('example:{KVP_FILE}:0'), "
                                    "canvas='square', max_shapes_p=1.0)"}),
    ]


def merged(listed: list[dict], new: list[dict]) -> list[dict]:
    """``listed`` with each entry of ``new`` replacing the one of the same file, or appended."""
    by_file = {entry["file"]: entry for entry in new}
    kept = [by_file.pop(entry["file"], entry) for entry in listed]
    return kept + list(by_file.values())


def write_examples(folder: Path = EXAMPLES_DIR) -> list[Path]:
    """Write both pictures and the schema, and update ``examples.json``; returns the files written."""
    (folder / SCHEMA_FILE).write_text(json.dumps(D.KVP_SCHEMA, indent=2) + "\n")
    written = [folder / SCHEMA_FILE]
    entries = example_entries()
    for image, entry in entries:
        path = folder / entry["file"]
        image.save(path, optimize=False)
        written.append(path)
    listing = folder / "examples.json"
    listed = json.loads(listing.read_text()) if listing.is_file() else []
    listing.write_text(json.dumps(merged(listed, [entry for _, entry in entries]), indent=2) + "\n")
    return written + [listing]
