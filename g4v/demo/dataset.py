"""``python -m g4v.demo dataset [--out DIR]``: the bundled dataset for dataset runs.

The held-out pictures of ``python -m g4v.demo eval`` (:func:`g4v.demo.shapes.eval_set`, the same
seeds, never seen in training), four questions each, written in the ``imagefolder`` layout that
Hugging Face ``datasets`` reads: lossless PNG pictures and a ``metadata.jsonl`` with one row per
question (``file_name``, ``prompt``, ``answer``, ``category``, ``id``). Accuracies measured on it
are therefore comparable with ``g4v.demo eval`` on the same number of pictures.

Everything is a function of the seeds and Pillow's PNG encoder, so a rebuild gives the same bytes
(the tests rebuild it and compare the files' SHA-256).
"""

import json
from pathlib import Path

from g4v.demo import shapes as S

#: Held-out pictures in the bundled dataset (four questions each).
PICTURES = 75
README = """# shapes-heldout

Held-out synthetic pictures for dataset runs (`python -m g4v eval --data assets/datasets/shapes-heldout`):
{pictures} pictures from `g4v.demo.shapes.eval_set` (the seeds `python -m g4v.demo eval` uses), four
questions each ({rows} rows). `metadata.jsonl` holds `file_name`, `prompt`, `answer` (the reference),
`category` (colour, shape, position, count) and `id`. Rebuild with `python -m g4v.demo dataset`.
"""


def rows_for(number: int, picture: S.Picture, file_name: str) -> list[dict]:
    """One metadata row per question about ``picture``."""
    return [{"file_name": file_name, "prompt": qa.question, "answer": qa.answer, "category": qa.kind,
             "id": f"p{number:03d}-{qa.kind}"} for qa in picture.qas]


def build_dataset(out: Path, pictures: int = PICTURES) -> Path:
    """Write the dataset to ``out`` (created; files there are overwritten) and return it."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for number, picture in enumerate(S.eval_set(pictures)):
        file_name = f"images/p{number:03d}.png"
        picture.image.save(out / file_name, format="PNG", optimize=True)
        rows.extend(rows_for(number, picture, file_name))
    with open(out / "metadata.jsonl", "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    (out / "README.md").write_text(README.format(pictures=pictures, rows=len(rows)))
    return out
