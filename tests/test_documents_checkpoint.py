"""The demo checkpoint's second stage as bundled (issue 21): the stored weights are the ones its
provenance names, its recipe is the command's defaults, it fits the size budget, it reads charts
and fills the key-value schema on held-out pictures (scored against the generator's own truth),
it still answers the four shape questions, and with all 8 levels ablated its charts fall to chance."""

import json
from dataclasses import asdict

import pytest

from g4v.demo import documents_data as D
from g4v.demo import documents_eval as E
from g4v.demo import shapes as S
from g4v.demo.adapter_training import ADAPTER_DIR
from g4v.loading import sha256_file
from g4v.paths import DOCUMENTS_MODEL_DIR, TRAINED_MODEL_DIR

#: Held-out charts and key-value pictures here (the 300-item numbers are in docs/demo-model.md).
N_ITEMS = 40
#: On these 40 + 40 items the bundled stage scores 100% / 100% (charts exact / cells) and 92.5% /
#: 69.6% (key-value valid / fields); measured chance is 0% / 32.5% and 100% / 34.2%. The chart floors
#: are issue 21's targets; the key-value ones regression floors a little under today's scores (the
#: issue's 99% / 95% are not met yet: docs/demo-model.md).
FLOORS = {"chart_exact": 0.9, "chart_cells": 0.97, "kvp_valid": 0.85, "kvp_fields": 0.6}
#: Issue 5's targets for the shape questions, which the second stage must keep (40 pictures, as in
#: tests/test_demo_training.py).
SHAPE_TARGETS = {"colour": 0.9, "shape": 0.8, "position": 0.75, "count": 0.7}

@pytest.fixture(scope="module")
def provenance():
    return json.loads((DOCUMENTS_MODEL_DIR / "g4v_build.json").read_text())


@pytest.fixture(scope="module")
def engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(DOCUMENTS_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def held_out():
    return D.held_out_items(N_ITEMS)


def test_stored_weights_match_provenance(provenance):
    assert provenance["weights_sha256"] == sha256_file(DOCUMENTS_MODEL_DIR / "model.safetensors")
    assert provenance["wall_time_s"] <= 30 * 60  # issue 21: each stage within 30 minutes on 2 cores
    assert provenance["init"] == json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())
    # The first stage's architecture, processor and tokenizer, unchanged.
    for name in ("processor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (DOCUMENTS_MODEL_DIR / name).read_bytes() == (TRAINED_MODEL_DIR / name).read_bytes(), name
    assert json.loads((DOCUMENTS_MODEL_DIR / "config.json").read_text()) == json.loads(
        (TRAINED_MODEL_DIR / "config.json").read_text())


def test_defaults_are_the_stored_recipe(provenance):
    """`python -m g4v.demo train-documents` with no options rebuilds the bundled stage (the
    validation curve's options change no weight)."""
    from g4v.demo.recipe import DocumentsSettings

    watching = {"eval_every", "eval_n"}
    stored = {k: v for k, v in provenance["settings"].items() if k not in watching}
    assert stored == {k: v for k, v in asdict(DocumentsSettings()).items() if k not in watching}


def test_checkpoints_and_adapter_under_30_mb():
    folders = (TRAINED_MODEL_DIR, DOCUMENTS_MODEL_DIR, ADAPTER_DIR)
    assert sum(f.stat().st_size for d in folders for f in d.iterdir()) < 30 * 2**20


def test_reads_charts_and_fills_the_schema_through_the_engine(engine, held_out):
    """Each answer scored against the chart's bars and the picture's shapes as drawn; the batched
    greedy answers (what the ablations use) equal the engine's."""
    replies = E.engine_answers(engine, held_out)
    scores = E.score(held_out, replies)
    assert scores.charts == scores.kvp == N_ITEMS
    for name, floor in FLOORS.items():
        assert getattr(scores, name) >= floor, (name, scores)
    assert E.batched(engine.model, engine.processor, held_out) == replies


def test_still_answers_the_shape_questions(engine):
    from g4v.demo.evaluate import accuracy, answers, items

    pairs = items(S.eval_set(40))
    scores = accuracy(pairs, answers(engine, pairs))
    for kind, target in SHAPE_TARGETS.items():
        assert scores[kind] >= target, (kind, scores)


def test_with_all_levels_ablated_charts_fall_to_chance(engine, held_out):
    """Chance is measured: a training chart's CSV in place of each held-out chart's answer."""
    from g4v.demo.evaluate import ablation_scales

    charts = [item for item in held_out if item.qa.kind == "chart"]
    blind = E.score(charts, E.ablated(engine.model, engine.processor, charts, ablation_scales(engine.model, None)))
    chance = E.score(charts, E.blind_answers(N_ITEMS)[:N_ITEMS])
    assert blind.chart_exact <= 0.05
    assert blind.chart_cells <= chance.chart_cells + 0.1, (blind, chance)
