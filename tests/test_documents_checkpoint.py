"""The documents checkpoint as bundled (issue 21): the stored weights are the ones its provenance
names, each of its document stages recorded the command that rebuilds its recipe, it fits the size
budget, it reads charts and fills the key-value schema on held-out pictures (scored against the
generator's own truth), it still answers the four shape questions, and with all 8 levels ablated its
charts fall to chance."""

import json
from dataclasses import asdict

import pytest

from g4v.demo import documents_data as D
from g4v.demo import documents_eval as E
from g4v.demo import shapes as S
from g4v.loading import sha256_file
from g4v.paths import FRENCH_ADAPTER_DIR
from g4v.paths import DOCUMENTS_MODEL_DIR, TRAINED_MODEL_DIR

#: Held-out charts and key-value pictures here (the 300-item numbers are in docs/demo-model.md).
N_ITEMS = 40
#: Issue 21's targets (met on 300 + 300 items: docs/demo-model.md), but for key-value fields: 40
#: pictures hold too few fields to hold 95% to within a wrong shape or two, so its floor is a little
#: lower. (Chance here is 0% / 32.5% for charts and 100% / 34.2% for key-value.)
FLOORS = {"chart_exact": 0.9, "chart_cells": 0.97, "kvp_valid": 0.97, "kvp_fields": 0.9}
#: Issue 5's targets for the shape questions, which the document stages must keep (40 pictures, as in
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
    """The weights are the ones recorded; every stage they came through took at most 30 minutes
    (issue 21), and the first is the bundled trained checkpoint's."""
    from g4v.demo.documents_training import stages

    assert provenance["weights_sha256"] == sha256_file(DOCUMENTS_MODEL_DIR / "model.safetensors")
    chain = stages(provenance)
    assert chain[-1] == json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())
    for stage in chain[:-1]:
        assert stage["wall_time_s"] <= 30 * 60, stage["builder"]  # each stage within 30 minutes on 2 cores
    assert provenance["total_wall_time_s"] == pytest.approx(sum(stage["wall_time_s"] for stage in chain), abs=0.5)
    # The first stage's architecture, processor and tokenizer, unchanged.
    for name in ("processor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (DOCUMENTS_MODEL_DIR / name).read_bytes() == (TRAINED_MODEL_DIR / name).read_bytes(), name
    assert json.loads((DOCUMENTS_MODEL_DIR / "config.json").read_text()) == json.loads(
        (TRAINED_MODEL_DIR / "config.json").read_text())


def test_each_documents_stage_recorded_the_command_that_rebuilds_its_recipe(provenance):
    """Each documents stage's settings are its recorded command's flags over the defaults, and the
    defaults are the second stage's recipe: `python -m g4v.demo train-documents` with no options
    rebuilds it (the validation curve's options change no weight)."""
    import argparse
    import shlex

    from g4v.settings.flags import settings_from_args
    from g4v.demo.__main__ import _add_training_commands
    from g4v.demo.documents_training import stages
    from g4v.demo.recipe import DocumentsSettings

    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    _add_training_commands(sub)
    documents = stages(provenance)[:-1]  # the bundled stage first, the second stage last
    for stage in documents:
        assert stage["builder"].startswith("python -m g4v.demo train-documents")
        args = sub.choices["train-documents"].parse_args(shlex.split(stage["builder"])[4:])
        assert stage["settings"] == asdict(settings_from_args(DocumentsSettings, args)), stage["builder"]
    watching = {"eval_every", "eval_n"}
    second = {k: v for k, v in documents[-1]["settings"].items() if k not in watching}
    assert second == {k: v for k, v in asdict(DocumentsSettings()).items() if k not in watching}


def test_checkpoints_and_adapter_under_30_mb():
    folders = (TRAINED_MODEL_DIR, DOCUMENTS_MODEL_DIR, FRENCH_ADAPTER_DIR)
    assert sum(f.stat().st_size for d in folders for f in d.iterdir()) < 30 * 2**20


def test_reads_charts_and_fills_the_schema_through_the_engine(engine, held_out):
    """Each answer scored against the chart's bars and the picture's shapes as drawn; the batched
    greedy answers (what the ablations use) equal the engine's."""
    replies = E.engine_answers(engine, held_out, workers=engine.concurrent_streams)  # as `demo eval` asks them
    scores = E.score(held_out, replies)
    assert scores.charts == scores.kvp == N_ITEMS
    for name, floor in FLOORS.items():
        assert getattr(scores, name) >= floor, (name, scores)
    assert E.batched(engine, held_out) == replies


def test_still_answers_the_shape_questions(engine):
    from g4v.demo.answering import accuracy, answers, items

    pairs = items(S.eval_set(40))
    scores = accuracy(pairs, answers(engine, pairs, workers=engine.concurrent_streams))
    for kind, target in SHAPE_TARGETS.items():
        assert scores[kind] >= target, (kind, scores)


def test_with_all_levels_ablated_charts_fall_to_chance(engine, held_out):
    """Chance is measured: a training chart's CSV in place of each held-out chart's answer."""
    from g4v.demo.answering import ablation_scales

    charts = [item for item in held_out if item.qa.kind == "chart"]
    blind = E.score(charts, E.ablated(engine, charts, ablation_scales(engine.model, None)))
    chance = E.score(charts, E.blind_answers(N_ITEMS)[:N_ITEMS])
    assert blind.chart_exact <= 0.05
    assert blind.chart_cells <= chance.chart_cells + 0.1, (blind, chance)
