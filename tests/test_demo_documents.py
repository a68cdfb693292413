"""The demo checkpoint's document tasks (issue 21): synthetic charts whose CSV is what the chart
draws, key-value answers that validate against their schema, prompts as the engines send them, the
scores against hand-counted cases, the document training stages and the Chat examples."""

import json

import numpy as np
import pytest

from g4v.demo import charts as C
from g4v.demo import documents_data as D
from g4v.demo import shapes as S
from g4v.documents import metrics, tables
from g4v.documents.presets import PRESETS
from g4v.documents.structured import read_answer
from g4v.loading import sha256_file
from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR

# ── charts ──────────────────────────────────────────────────────────────────────────────────────


def test_charts_are_seeded_and_their_csv_round_trips():
    a, b = C.chart_eval_set(5), C.chart_eval_set(5)
    assert [c.image.tobytes() for c in a] == [c.image.tobytes() for c in b]
    for chart in C.chart_eval_set(120):
        colours = [colour for colour, _ in chart.bars]
        assert 2 <= len(chart.bars) <= 4 and len(set(colours)) == len(colours)
        assert set(colours) <= set(S.COLOURS) and all(value in range(1, 6) for _, value in chart.bars)
        rows = tables.parse_csv(chart.csv).rows
        assert rows == [["label", "value"]] + [[colour, str(value)] for colour, value in chart.bars]
        assert chart.csv == tables.strip_fence(chart.csv)  # no fence, nothing to strip


def _bar_boxes(chart) -> list[tuple[int, int, int, int]]:
    """Each bar's bounding box found from the pixels alone: the pixels within the drawing jitter of
    its colour's RGB (text and axes are grey, the background light)."""
    pixels = np.asarray(chart.image).astype(int)
    boxes = []
    for colour, _ in chart.bars:
        near = (np.abs(pixels - np.array(S.COLOURS[colour])) <= 22).all(axis=-1)
        ys, xs = np.nonzero(near)
        boxes.append((xs.min(), ys.min(), xs.max(), ys.max()))
    return boxes


def test_bar_heights_in_the_pixels_are_the_csv_values():
    """Measured independently of the drawing code: bar heights in pixels are proportional to the
    CSV's values (one common unit per chart), the bars stand on one baseline, left to right."""
    for chart in C.chart_eval_set(60):
        boxes = _bar_boxes(chart)
        values = [value for _, value in chart.bars]
        heights = [bottom - top + 1 for _, top, _, bottom in boxes]
        unit = sum(heights) / sum(values)
        assert unit > 8, chart.size  # a unit spans more than one vision patch
        for height, value in zip(heights, values):
            assert abs(height - value * unit) < 0.3 * unit, (chart.bars, heights)
        assert len({bottom for *_, bottom in boxes}) == 1
        lefts = [left for left, *_ in boxes]
        assert lefts == sorted(lefts)


def test_charts_make_several_anyres_grids():
    """The grid LLaVA-NeXT's own resolution picker chooses for each chart, from the checkpoint's pinpoints."""
    from transformers.image_processing_utils import select_best_resolution

    pinpoints = json.loads((TRAINED_MODEL_DIR / "config.json").read_text())["image_grid_pinpoints"]
    grids = {tuple(select_best_resolution((c.size[1], c.size[0]), pinpoints)) for c in C.chart_eval_set(60)}
    assert {(128, 128), (128, 256), (256, 128)} <= grids and len(grids) >= 4


def test_chart_seeds_keep_training_validation_and_held_out_apart():
    held_out = {c.image.tobytes() for c in C.chart_eval_set(40)}
    validation = {c.image.tobytes() for c in C.chart_validation_set(40)}
    training = {C.train_chart(0, i).image.tobytes() for i in range(40)}
    assert len(held_out) == len(validation) == len(training) == 40
    assert not held_out & validation and not held_out & training and not validation & training


# ── key-value extraction ────────────────────────────────────────────────────────────────────────


def test_every_key_value_answer_validates_and_matches_the_picture():
    for picture in S.eval_set(150) + [S.picture(f"docs:0:{i}") for i in range(50)]:
        answer = D.kvp_answer(picture)
        read = read_answer("json", answer, D.KVP_SCHEMA)
        assert read.ok, (answer, read.problems, read.error)
        assert read.data["count"] == len(picture.shapes)
        assert sorted((s["shape"], s["colour"], s["place"]) for s in read.data["shapes"]) == sorted(
            (s.kind, s.colour, s.place) for s in picture.shapes)
        places = [s["place"] for s in read.data["shapes"]]
        assert places == [p for p in ("top", "left", "right", "bottom") if p in places]  # reading order
        assert metrics.key_value_match(answer, D.kvp_truth(picture)).accuracy == 1.0


def test_the_schema_refuses_a_broken_answer():
    truth = D.kvp_truth(S.eval_set(1)[0])
    del truth["shapes"][0]["place"]
    broken = read_answer("json", json.dumps({**truth, "count": "one"}), D.KVP_SCHEMA)
    assert {p.path for p in broken.problems} == {"$.count", "$.shapes[0].place"}


# ── prompts as the engines send them ────────────────────────────────────────────────────────────


def test_prompts_are_the_presets_and_labels_only_the_answers():
    from g4v.demo.build import build_processor
    from g4v.demo.data import encode, render

    assert D.chart_prompt() == PRESETS["chart2csv"].prompt == "<chart2csv>"
    assert D.kvp_prompt() == PRESETS["kvp"].prompt.format(schema=json.dumps(D.KVP_SCHEMA))
    processor = build_processor()
    items = [D.chart_item(C.train_chart(0, 0, canvas="square")), D.kvp_item(S.picture("docs:0:0", canvas="square"))]
    for item in items:
        text = render(processor, [(item.qa.question, item.qa.answer)])
        # The tiny checkpoint's chat template expands no tag: the prompt arrives as written.
        assert text.startswith("<|start_of_role|>user<|end_of_role|><image>\n" + item.qa.question + "<|end_of_text|>")
        batch = encode(processor, [item], [[(item.qa.question, item.qa.answer)]])
        labels = batch["labels"][0]
        assert processor.tokenizer.decode(labels[labels != -100]) == item.qa.answer + "<|end_of_text|>"
        ids = processor.tokenizer.encode(item.qa.answer, add_special_tokens=False)
        assert processor.tokenizer.decode(ids) == item.qa.answer  # byte-level BPE: nothing lost


# ── the attention pointer's targets ─────────────────────────────────────────────────────────────


def test_segments_are_each_rows_and_objects_text_and_the_mask_marks_that_object():
    """A chart's segments are bar i's CSV row (pointing at bar i, which its mask marks where the
    pixels have bar i's colour, found from the pixels alone), then the character ending that row
    (pointing at the next bar, or after the last at the empty plot right of it). A key-value
    answer's are the count (spread over every shape), each shape's JSON and the comma before the
    next shape's (pointing at that one)."""
    for chart in C.chart_eval_set(30):
        item, bars = D.chart_item(chart), len(chart.bars)
        text = chart.csv + "\0"  # the end of text after the last row: one past the answer
        assert [text[a:b] for a, b, _ in item.segments[0::2]] == [f"{c},{v}" for c, v in chart.bars]
        assert [text[a:b] for a, b, _ in item.segments[1::2]] == ["\n"] * (bars - 1) + ["\0"]
        assert [i for *_, i in item.segments] == [i + half for i in range(bars) for half in (0, 1)]
        mask = np.asarray(chart.mask)
        boxes = _bar_boxes(chart)
        for (_, _, index), (left, top, right, bottom) in zip(item.segments[0::2], boxes):
            assert (mask[top:bottom + 1, left:right + 1] == index + 1).mean() > 0.95
        ys, xs = np.nonzero(mask == bars + 1)
        assert item.objects == bars + 1 and xs.size > 0 and xs.min() > boxes[-1][2]
    for picture in S.eval_set(30):
        item, order = D.kvp_item(picture), D.reading_order(picture)
        (a, b, spread), *objects = item.segments
        assert item.qa.answer[a:b] == str(len(picture.shapes)) and spread == tuple(range(len(picture.shapes)))
        for (a, b, index), shape in zip(objects[0::2], order):
            assert picture.shapes[index] == shape
            assert json.loads(item.qa.answer[a:b]) == {"shape": shape.kind, "colour": shape.colour, "place": shape.place}
        for (a, b, index), shape in zip(objects[1::2], order[1:]):
            assert item.qa.answer[a:b] == "," and picture.shapes[index] == shape


def _document_batch():
    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.data import encode

    processor = build_processor()
    model = build_random_model(processor)
    items = [D.chart_item(C.train_chart(0, 3, canvas="square")), D.kvp_item(S.picture("docs:0:5", canvas="square"))]
    batch = encode(processor, items, [[(item.qa.question, item.qa.answer)] for item in items])
    return model, processor, items, batch


def test_segment_tokens_decode_to_each_segments_text():
    from g4v.demo.aids import segment_tokens, token_ends
    from g4v.demo.data import answer_spans

    _, processor, items, batch = _document_batch()
    for row, item in enumerate(items):
        span = answer_spans(batch["labels"][row])[0]
        ids = batch["input_ids"][row, span.start:span.stop].tolist()
        found = segment_tokens(token_ends(processor.tokenizer, ids), item.segments)
        starts = [len(processor.tokenizer.decode(ids[:k])) for k in range(len(ids))]
        # Every token found lies in a segment about that object, and every token of a segment is found.
        assert all(any(first <= starts[k] < stop and i == index for first, stop, index in item.segments)
                   for k, i in found)
        assert len(found) == sum(first <= start < stop for start in starts for first, stop, _ in item.segments)
        text = item.qa.answer + "<|end_of_text|>"
        for first, stop, index in item.segments:
            tokens = [ids[k] for k, i in found if i == index and first <= len(processor.tokenizer.decode(ids[:k])) < stop]
            assert processor.tokenizer.decode(tokens) == (text[first:stop] if stop <= len(item.qa.answer) else
                                                          "<|end_of_text|>")


def test_segment_pointer_loss_is_minus_the_log_attention_on_each_segments_object():
    """Against the model's own attention weights (eager attention, ``output_attentions``): the loss
    is the mean, over every position predicting a segment's token, of minus the log of the head's
    attention mass on that segment's object."""
    import torch

    from g4v.demo.aids import AttentionPointer, object_tokens
    from g4v.demo.data import answer_spans

    model, processor, items, batch = _document_batch()
    model.set_attn_implementation("eager")
    pointer = AttentionPointer(model, layer=9, head=0)
    try:
        attentions = model(**batch, output_attentions=True).attentions[9][:, 0]  # (rows, queries, keys)
        loss = pointer.segment_losses(batch, items, processor.tokenizer)["pointer"]
    finally:
        pointer.remove()
    expected = []
    for row, item in enumerate(items):
        image = (batch["input_ids"][row] == model.config.image_token_index).nonzero().flatten()
        per_object = object_tokens(item.mask, item.size, item.objects, model.config, pointer.min_cover)
        answer = answer_spans(batch["labels"][row])[0]
        text = ""
        for position in range(answer.start, answer.stop):
            start = len(text)
            text = processor.tokenizer.decode(batch["input_ids"][row, answer.start:position + 1])
            for first, stop, index in item.segments:
                spread = [i for i in (index if isinstance(index, tuple) else (index,)) if per_object[i]]
                if first <= start < stop and spread:
                    attention = attentions[row, position - 1]
                    expected.append(-sum(torch.log(attention[image[per_object[i]]].sum()) for i in spread) / len(spread))
    assert len(expected) > 40
    assert torch.allclose(loss, torch.stack(expected).mean(), rtol=1e-4)


# ── scores ──────────────────────────────────────────────────────────────────────────────────────


def test_document_scores_count_what_is_right():
    from g4v.demo.documents_eval import score

    charts = [D.chart_item(c) for c in C.chart_eval_set(3)]
    pictures = [D.kvp_item(p) for p in S.eval_set(2)]
    first = charts[0].truth
    one_wrong = C.chart_csv([(first[0][0], first[0][1] % 5 + 1), *first[1:]])
    truth = json.loads(pictures[0].qa.answer)
    truth["shapes"][0]["colour"] = "white"
    replies = [one_wrong, charts[1].qa.answer, "a bar chart", json.dumps(truth), "{not json"]
    got = score(charts + pictures, replies)
    cells = 2 + 2 * len(first)
    assert got.chart_exact == pytest.approx(1 / 3)
    assert got.chart_cells == pytest.approx(((cells - 1) / cells + 1 + 0) / 3)
    fields = 1 + 3 * len(pictures[0].truth["shapes"])
    assert got.kvp_valid == pytest.approx(1 / 2)  # a wrong value still validates; broken JSON does not
    assert got.kvp_fields == pytest.approx((fields - 1) / fields / 2)
    assert (got.charts, got.kvp) == (3, 2)


# ── the document training stages ────────────────────────────────────────────────────────────────


@pytest.mark.skipif(not (TRAINED_MODEL_DIR / "model.safetensors").is_file(), reason="no trained checkpoint")
def test_train_documents_runs_a_few_steps_and_records_its_sha(tmp_path):
    from g4v.demo.__main__ import main

    out = tmp_path / "documents"
    # Three steps that draw one of each task (chart, key-value, shapes) with the default seed.
    flags = ["--steps", "3", "--batch-size", "2", "--chart-share", "0.4", "--kvp-share", "0.3", "--no-progress"]
    assert main(["train-documents", "--out", str(out), *flags]) == 0
    provenance = json.loads((out / "g4v_build.json").read_text())
    assert provenance["weights_sha256"] == sha256_file(out / "model.safetensors")
    assert provenance["init"] == json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())
    assert provenance["steps_per_task"] == {"shapes": 1, "chart": 1, "kvp": 1}
    assert set(provenance["final_loss"]) == {"shapes", "chart", "kvp", "pointer"}
    assert provenance["builder"].startswith("python -m g4v.demo train-documents")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        assert (out / name).read_bytes() == (TRAINED_MODEL_DIR / name).read_bytes(), name
    assert provenance["weights_sha256"] != json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())[
        "weights_sha256"]  # it trained
    again = tmp_path / "again"
    assert main(["train-documents", "--out", str(again), *flags]) == 0
    assert sha256_file(again / "model.safetensors") == provenance["weights_sha256"]  # seeded: the same weights


@pytest.mark.skipif(not (TRAINED_MODEL_DIR / "model.safetensors").is_file(), reason="no trained checkpoint")
def test_a_stage_continues_from_a_documents_stage_with_the_first_stages_pointers(tmp_path, capfd):
    """A third stage (``--init`` a documents checkpoint) nests its start's provenance, adds up the
    wall time of all stages, and points with the first stage's heads (found under both ``init``s).
    ``--no-progress`` draws no bar, transformers' loading bar included, and leaves that switch on."""
    from transformers import Granite4VisionForConditionalGeneration
    from transformers.utils import logging

    from g4v.demo.__main__ import main
    from g4v.demo.documents_training import first_stage_pointers, stages

    second, third = tmp_path / "second", tmp_path / "third"
    bars_were_on = logging.is_progress_bar_enabled()
    flags = ["--steps", "1", "--batch-size", "2", "--kvp-share", "1", "--chart-share", "0"]
    assert main(["train-documents", "--out", str(second), *flags]) == 0
    assert ("Loading weights" in capfd.readouterr().err) == bars_were_on  # the control: bars shown
    assert main(["train-documents", "--init", str(second), "--out", str(third), *flags, "--no-progress"]) == 0
    assert "Loading weights" not in capfd.readouterr().err and logging.is_progress_bar_enabled() == bars_were_on
    provenance = json.loads((third / "g4v_build.json").read_text())
    assert provenance["weights_sha256"] == sha256_file(third / "model.safetensors")
    assert provenance["init"] == json.loads((second / "g4v_build.json").read_text())
    chain = stages(provenance)
    assert chain[-1] == json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())
    assert len(chain) == 3 and provenance["steps_per_task"]["kvp"] == 1 and "pointer" in provenance["final_loss"]
    assert provenance["total_wall_time_s"] == pytest.approx(sum(stage["wall_time_s"] for stage in chain), abs=0.2)

    model = Granite4VisionForConditionalGeneration.from_pretrained(third)
    heads = []
    for init in (TRAINED_MODEL_DIR, second, third):
        pointers = first_stage_pointers(model, init)
        heads.append([(p.attention, p.head, p.kinds) for p in pointers])
        for pointer in pointers:
            pointer.remove()
    assert heads[0] == heads[1] == heads[2] and len(heads[0]) == 3
    first = json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())["settings"]
    layers = model.model.language_model.layers
    assert heads[0][1][:2] == (layers[first["shape_pointer_layer"]].self_attn, first["shape_pointer_head"])
    assert heads[0][2][:2] == (layers[first["count_pointer_layer"]].self_attn, first["count_pointer_head"])


def test_train_documents_flags_are_the_settings_fields():
    import argparse
    import dataclasses

    from g4v.demo.__main__ import _add_training_commands
    from g4v.demo.recipe import DocumentsSettings

    sub = argparse.ArgumentParser().add_subparsers()
    _add_training_commands(sub)
    by_dest = {action.dest: action for action in sub.choices["train-documents"]._actions}
    for field in dataclasses.fields(DocumentsSettings):
        assert by_dest[field.name].default == field.default and by_dest[field.name].help, field.name
    assert set(by_dest) == {"help", "out", "no_progress"} | {f.name for f in dataclasses.fields(DocumentsSettings)}


# ── Chat examples ───────────────────────────────────────────────────────────────────────────────


def test_examples_are_rebuilt_bit_for_bit_and_answer_right(tmp_path):
    from argparse import Namespace

    from g4v.commands.tasks import task_prompt
    from g4v.demo.examples import CHART_FILE, KVP_FILE, SCHEMA_FILE, write_examples

    listed = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    (tmp_path / "examples.json").write_text(json.dumps(listed, indent=2) + "\n")
    write_examples(tmp_path)
    for name in (CHART_FILE, KVP_FILE, SCHEMA_FILE, "examples.json"):
        assert (tmp_path / name).read_bytes() == (EXAMPLES_DIR / name).read_bytes(), name
    entries = {entry["file"]: entry for entry in listed}
    assert {"shapes-square.png", "shapes-wide.png", "shapes-tall.png"} <= set(entries)
    chart, kvp = entries[CHART_FILE], entries[KVP_FILE]
    assert chart["prompt"] == "<chart2csv>" and tables.parse_csv(chart["answer"]).rows[0] == ["label", "value"]
    assert read_answer("json", kvp["answer"], D.KVP_SCHEMA).ok and kvp["prompt"] == D.kvp_prompt()
    # The CLI's --task kvp with the schema file sends the example's prompt.
    cli = Namespace(task="kvp", schema=str(EXAMPLES_DIR / SCHEMA_FILE), prompt=None, image=[EXAMPLES_DIR / KVP_FILE])
    assert task_prompt(cli) == kvp["prompt"]


def test_document_examples_are_offered_with_the_checkpoint_that_learnt_them():
    """The app lists the chart and key-value examples only on the documents checkpoint (the
    first stage answers them wrongly), and its banner says how to start that one."""
    from pathlib import Path

    from g4v.demo.examples import CHART_FILE, KVP_FILE
    from g4v.paths import DOCUMENTS_MODEL_DIR
    from webapp.layout import banner, example_rows

    def files(model: Path) -> set[str]:
        return {Path(message["files"][0]).name for message, _, _ in example_rows(str(model))}

    assert {CHART_FILE, KVP_FILE, "shapes-wide.png"} <= files(DOCUMENTS_MODEL_DIR)
    assert "shapes-wide.png" in files(TRAINED_MODEL_DIR) and not {CHART_FILE, KVP_FILE} & files(TRAINED_MODEL_DIR)
    assert f"--model assets/{DOCUMENTS_MODEL_DIR.name}" in banner(str(TRAINED_MODEL_DIR))
    assert "Chart to CSV" in banner(str(DOCUMENTS_MODEL_DIR)) and "random weights" not in banner(str(DOCUMENTS_MODEL_DIR))


def test_clicking_a_document_example_picks_its_task_preset_and_keeps_its_prompt():
    """Each example row carries its preset (and the key-value one its schema): the Chat tab's
    task.change then rebuilds the box (``fill_prompt``), which must give back the example's own
    prompt and picture; plain questions carry no preset."""
    from pathlib import Path

    from g4v.demo.examples import CHART_FILE, KVP_FILE
    from g4v.paths import DOCUMENTS_MODEL_DIR
    from webapp.documents import fill_prompt
    from webapp.layout import example_rows

    rows = {Path(message["files"][0]).name: (message, task, schema) for message, task, schema in
            example_rows(str(DOCUMENTS_MODEL_DIR))}
    assert rows[CHART_FILE][1] == "chart2csv" and rows[KVP_FILE][1] == "kvp" and rows["shapes-wide.png"][1] == ""
    assert json.loads(rows[KVP_FILE][2]) == D.KVP_SCHEMA
    for name in (CHART_FILE, KVP_FILE):
        message, task, schema = rows[name]
        box, schema_field = fill_prompt(task, schema, message)
        assert box == message and schema_field["visible"] == (task == "kvp")


# ── eval ────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.skipif(not (TRAINED_MODEL_DIR / "model.safetensors").is_file(), reason="no trained checkpoint")
def test_eval_reports_the_document_tasks(tmp_path, capsys):
    """``eval --doc-n 1`` asks one held-out chart and one key-value picture through the transformers
    engine; its rows are the documents metrics of the replies it records (recomputed here)."""
    from g4v.demo.__main__ import main

    out = tmp_path / "eval.json"
    assert main(["eval", "--n", "1", "--doc-n", "1", "--no-ablations", "--adapter", "", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert "document tasks: 1 held-out charts, 1 key-value pictures" in printed.out
    # The progress bar (stderr) named each phase and counted every question asked: 4 about the
    # picture, through the engine and batched, then the chart and the key-value picture, the same two ways.
    progress = printed.err.replace("\r", "\n")
    assert "eval (hf engine)" in progress and "eval (documents, hf batched)" in progress
    assert "12 questions [" in progress.strip().splitlines()[-1]
    results = json.loads(out.read_text())
    # Batched answers come from the engine's own batches: the same greedy answers as one by one.
    assert results["batched_agrees_with_engine"] == 1.0
    documents = results["documents"]
    chart_reply, kvp_reply = documents["replies"]
    chart, picture = C.chart_eval_set(1)[0], S.eval_set(1)[0]
    try:
        exact = tables.parse_csv(chart_reply).rows == tables.parse_csv(chart.csv).rows
    except tables.TableError:
        exact = False
    for row in ("hf", "hf batched"):
        assert documents["rows"][row]["charts"] == documents["rows"][row]["kvp"] == 1
    hf = documents["rows"]["hf"]
    chance = documents["rows"]["chance (a training example's answer)"]
    assert chance["kvp_valid"] == 1.0 and chance["chart_cells"] == metrics.csv_cell_accuracy(
        C.train_chart(0, 0).csv, chart.csv)
    assert hf["chart_exact"] == float(exact)
    assert hf["chart_cells"] == metrics.csv_cell_accuracy(chart_reply, chart.csv)
    assert hf["kvp_valid"] == float(read_answer("json", kvp_reply, D.KVP_SCHEMA).ok)
    assert hf["kvp_fields"] == metrics.key_value_match(kvp_reply, D.kvp_truth(picture)).accuracy


@pytest.mark.parametrize("flags, words", [
    (["--init", "/nonexistent"], "is not a trained demo checkpoint"),
    (["--chart-share", "-1"], "must lie in 0-1 and add up to at most 1"),
    (["--chart-share", "0.8", "--kvp-share", "0.5"], "add up to at most 1"),
])
def test_train_documents_refuses_bad_settings_in_one_line(flags, words, tmp_path, capsys):
    from g4v.demo.__main__ import run

    assert run(["train-documents", *flags, "--steps", "1", "--out", str(tmp_path / "o")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0]
    assert not (tmp_path / "o").exists()


def test_eval_checks_the_french_adapter_only_with_the_checkpoint_it_was_trained_on():
    from g4v.paths import FRENCH_ADAPTER_DIR
    from g4v.demo.evaluate import default_adapter
    from g4v.paths import DOCUMENTS_MODEL_DIR, REPO_ROOT

    base = json.loads((FRENCH_ADAPTER_DIR / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (REPO_ROOT / base).resolve() == TRAINED_MODEL_DIR.resolve()
    assert default_adapter(TRAINED_MODEL_DIR) == str(FRENCH_ADAPTER_DIR)
    assert default_adapter(DOCUMENTS_MODEL_DIR) == ""


@pytest.mark.slow
def test_the_unseen_set_replays_training_and_avoids_every_trained_answer():
    """Issue 31, item 12. The replay of the documents checkpoint's stages is checked against what
    the stages recorded while training (steps per task, in ``g4v_build.json``) and against the
    review's count of old held-out answers found verbatim in training (103 chart CSVs, 168
    key-value JSONs of 300 each); the fresh set then holds none of the trained answers."""
    from g4v.demo.documents_training import stages
    from g4v.demo.unseen import replay, unseen_items
    from g4v.paths import DOCUMENTS_MODEL_DIR as model_dir

    seen, steps = replay(model_dir)
    recorded = [stage["steps_per_task"] for stage in reversed(stages(json.loads((model_dir / "g4v_build.json").read_text())))
                if stage.get("settings", {}).get("kvp_share") is not None]
    assert steps == recorded
    old = D.held_out_items(300)
    assert sum(item.qa.answer in seen["chart"] for item in old[:300]) == 103
    assert sum(item.qa.answer in seen["kvp"] for item in old[300:]) == 168
    fresh = unseen_items(40, seen)
    assert [item.qa.kind for item in fresh] == ["chart"] * 40 + ["kvp"] * 40
    assert not any(item.qa.answer in seen[item.qa.kind] for item in fresh)
