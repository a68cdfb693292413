"""A fresh held-out set for the documents checkpoint whose answers never occur in training (issue 31).

The 300 held-out charts and pictures of ``python -m g4v.demo eval`` (:func:`held_out_items`) also
chose the recipe (stage 4 was picked on them after stage 3's drop), so they served as validation;
and the answer space is small (2-4 bars of 5 heights; 1-3 shapes), so 103 of their 300 chart CSVs
and 168 of their 300 key-value JSONs are, word for word, answers the model was trained on. This set
is drawn from seeds no stage used (:data:`UNSEEN_CHART_SEED`, :data:`UNSEEN_PICTURE_SEED`) and keeps
only the items whose right answer occurs in no stage's training examples (:func:`training_answers`,
replayed from the checkpoint's recorded stages). Keeping only unseen answers leans the set towards
the larger answers (more bars, more shapes), which are rarer in training: :func:`describe` says by
how much.
"""

import json
import random
from collections import Counter
from dataclasses import fields
from pathlib import Path

from g4v.demo import documents_data as D
from g4v.demo import shapes as S
from g4v.demo.charts import chart

#: Integer seed bases (``SEED * 10_000_000 + i``) no set used before: shapes 7 (held-out) and 8
#: (validation), charts 9 (held-out) and 10 (validation).
UNSEEN_CHART_SEED = 11
UNSEEN_PICTURE_SEED = 12


def document_stage_settings(model_dir: Path) -> list:
    """The :class:`~g4v.demo.recipe.DocumentsSettings` of every document stage of a checkpoint, in
    training order (from its provenance, ``g4v_build.json``)."""
    from g4v.demo.documents_training import stages
    from g4v.demo.recipe import DocumentsSettings

    names = {field.name for field in fields(DocumentsSettings)}
    provenance = json.loads((Path(model_dir) / "g4v_build.json").read_text())
    found = [stage["settings"] for stage in stages(provenance)
             if stage.get("settings", {}).get("kvp_share") is not None]  # the first stage has no document tasks
    return [DocumentsSettings(**{k: v for k, v in settings.items() if k in names}) for settings in reversed(found)]


def training_answers(model_dir: Path) -> dict[str, set[str]]:
    """Every chart CSV and key-value JSON the checkpoint's document stages trained on, by task."""
    return replay(model_dir)[0]


def replay(model_dir: Path) -> tuple[dict[str, set[str]], list[dict[str, int]]]:
    """Each document stage's steps replayed as :func:`g4v.demo.documents_training.train_documents_model`
    draws them (the same task draws, canvases and example indices; no model): the answers trained
    on, by task, and each stage's steps per task (its provenance records them too: a check)."""
    from g4v.demo.documents_training import TASKS, step_batch, step_task

    seen, counts = {"chart": set(), "kvp": set()}, []
    for settings in document_stage_settings(model_dir):
        rng, index, steps = random.Random(f"documents:{settings.seed}"), 0, dict.fromkeys(TASKS, 0)
        for _ in range(settings.steps):
            task = step_task(settings, rng)
            items, _, _, index = step_batch(settings, rng, task, index)
            steps[task] += 1
            if task in seen:
                seen[task].update(item.qa.answer for item in items)
        counts.append(steps)
    return seen, counts


def unseen_items(n: int, seen: dict[str, set[str]], max_draws: int = 100_000) -> list[D.DocumentItem]:
    """``n`` charts, then ``n`` key-value pictures, from the unseen seeds, skipping every item whose
    right answer is in ``seen``; ordered as :func:`g4v.demo.documents_data.held_out_items`."""
    charts = _first_unseen(lambda i: D.chart_item(chart(UNSEEN_CHART_SEED * 10_000_000 + i)), seen["chart"], n, max_draws)
    pictures = _first_unseen(lambda i: D.kvp_item(S.picture(UNSEEN_PICTURE_SEED * 10_000_000 + i)), seen["kvp"], n,
                             max_draws)
    return charts + pictures


def _first_unseen(make, seen: set[str], n: int, max_draws: int) -> list[D.DocumentItem]:
    kept = []
    for i in range(max_draws):
        item = make(i)
        if item.qa.answer not in seen:
            kept.append(item)
            if len(kept) == n:
                return kept
    raise RuntimeError(f"only {len(kept)} of {n} unseen answers in {max_draws} draws")


def describe(items: list[D.DocumentItem]) -> dict:
    """How many bars the charts have and how many shapes the pictures, to set beside the old set's."""
    return {"chart_bars": dict(sorted(Counter(len(item.truth) for item in items if item.qa.kind == "chart").items())),
            "kvp_shapes": dict(sorted(Counter(item.truth["count"] for item in items if item.qa.kind == "kvp").items()))}
