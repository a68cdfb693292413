"""The trained demo checkpoint (issue 5): the training script keeps working, the stored weights are
the ones its provenance names, and the model sees (accuracy, ablation, adapter)."""

import json
from pathlib import Path

import pytest

from g4v.demo import shapes as S
from g4v.loading import sha256_file
from g4v.paths import FRENCH_ADAPTER_DIR
from g4v.paths import BUNDLED_MODEL_DIR, TRAINED_MODEL_DIR

#: Held-out pictures for the accuracy tests (4 questions each); the 300-picture numbers are in
#: docs/demo-model.md.
N_PICTURES = 40
#: What the bundled trained checkpoint reliably does (regression floors, well above chance: colour
#: 1/6, shape and position 1/4, count 1/3; it scores 100 / 85 / 100 / 85% on these 40 pictures):
#: if tiling, projection or injection broke, these would fall to chance.
FLOORS = {"colour": 0.9, "shape": 0.75, "position": 0.9, "count": 0.75}
#: Issue 5's targets (on 300 pictures, where the bundled checkpoint scores 97.7 / 92.0 / 98.0 /
#: 84.0%: docs/demo-model.md; a little lower here for the smaller sample).
TARGETS = {"colour": 0.9, "shape": 0.8, "position": 0.75, "count": 0.7}

needs_trained = pytest.mark.skipif(not (TRAINED_MODEL_DIR / "model.safetensors").is_file(),
                                   reason="no trained checkpoint (python -m g4v.demo train)")


@pytest.fixture(scope="module")
def trained_engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def held_out():
    return S.eval_set(N_PICTURES)


# ── data ────────────────────────────────────────────────────────────────────────────────────────


def test_pictures_are_seeded_and_answers_canonical():
    a, b = S.eval_set(5), S.eval_set(5)
    assert [p.image.tobytes() for p in a] == [p.image.tobytes() for p in b]
    assert S.train_picture(0, 0).image.tobytes() != a[0].image.tobytes()
    for p in S.eval_set(40):
        assert 1 <= len(p.shapes) <= 3
        for qa in p.qas:
            assert len(qa.answer.split()) <= 2
        assert {qa.kind for qa in p.qas} == set(S.QUESTION_TYPES)


def test_several_anyres_grids_occur():
    from g4v.demo.build import build_processor

    processor = build_processor()
    views = {processor.image_processor(p.image, return_tensors="pt")["pixel_values"].shape[1]
             for p in S.eval_set(60)}
    assert len(views) >= 3  # 1 tile, 2 tiles, 4 tiles (+ the base view each)


def test_max_shapes_p_biases_towards_three_shapes():
    counts = [len(S.train_picture(0, i, max_shapes_p=0.5).shapes) for i in range(300)]
    assert counts.count(3) > 2 * counts.count(2) and counts.count(1) > 0
    assert all(len(S.train_picture(0, i, max_shapes_p=1.0).shapes) == 3 for i in range(20))


def test_validation_pictures_are_apart_from_held_out_and_training():
    validation = {p.image.tobytes() for p in S.validation_set(30)}
    held_out = {p.image.tobytes() for p in S.eval_set(30)}
    training = {S.train_picture(0, i).image.tobytes() for i in range(30)}
    assert not validation & held_out and not validation & training and len(validation) == 30


def test_conversation_plan_gives_no_answer_away():
    import random
    from collections import Counter

    from g4v.demo.data import conversation_plan

    rng = random.Random(0)
    first_kinds = Counter()
    for i in range(200):
        picture = S.train_picture(3, i)
        plan = conversation_plan(picture, rng, max_turns=8)
        first_kinds[plan[0][0].kind] += 1
        facts = [("count",) if qa.kind == "count" else ("place" if qa.kind == "position" else "identity", index)
                 for qa, index in plan]
        assert len(facts) == len(set(facts)), plan  # no fact asked twice (colour of X = shape of X's colour)
        assert len(plan) == 2 * len(picture.shapes) + 1  # every other fact is asked
        for qa, index in plan:
            if index is not None:
                shape = picture.shapes[index]
                assert qa.answer in (shape.colour, shape.kind, shape.place)
                assert shape.kind in qa.question or shape.colour in qa.question
    assert min(first_kinds.values()) > 30 and set(first_kinds) == set(S.QUESTION_TYPES)


def test_shape_share_sets_how_later_turns_ask_a_shapes_identity():
    import random

    from g4v.demo.data import conversation_plan

    pictures = [S.train_picture(4, i) for i in range(60)]
    for share, asked, never in ((1.0, "shape", "colour"), (0.0, "colour", "shape")):
        rng = random.Random(0)
        later = [qa.kind for p in pictures for qa, _ in conversation_plan(p, rng, 8, shape_share=share)[1:]]
        assert asked in later and never not in later
    rng = random.Random(0)
    later = [qa.kind for p in pictures for qa, _ in conversation_plan(p, rng, 8, shape_share=0.7)[1:]]
    assert later.count("shape") > later.count("colour")


def test_pointer_targets_lie_where_the_shape_is():
    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.aids import AttentionPointer
    from g4v.tiling import plan_tiling

    model = build_random_model(build_processor())
    pointer = AttentionPointer(model, layer=8)
    side = {"left": lambda x, y: x < 0.5, "right": lambda x, y: x > 0.5,
            "top": lambda x, y: y < 0.5, "bottom": lambda x, y: y > 0.5}
    for picture in S.eval_set(25):
        width, height = picture.size
        plan = plan_tiling((height, width), model.config)
        per_shape = pointer.shape_tokens(picture)
        assert not set().union(*map(set, per_shape)) & set(plan.newline_positions)
        for shape, indices in zip(picture.shapes, per_shape):
            kinds = {plan.tokens[i].kind for i in indices}
            assert kinds == {"base", "tile"}, (shape, kinds)  # seen in the base view and in the tiles
            for i in indices:
                left, top, right, bottom = plan.tokens[i].box
                assert side[shape.place]((left + right) / 2 / width, (top + bottom) / 2 / height), (shape, i)
        flat = [i for indices in per_shape for i in indices]
        assert len(flat) == len(set(flat))  # no token belongs to two shapes


def _pointer_batch(readout: bool):
    import random

    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.aids import AttentionPointer
    from g4v.demo.data import conversation_plan, encode

    processor = build_processor()
    model = build_random_model(processor)
    pointer = AttentionPointer(model, layer=8, readout=readout)
    pictures = [S.train_picture(0, i, canvas="square") for i in range(2)]
    plans = [conversation_plan(p, random.Random(i), max_turns=8) for i, p in enumerate(pictures)]
    batch = encode(processor, pictures, [[(qa.question, qa.answer) for qa, _ in plan] for plan in plans])
    model(**batch)
    return model, pointer, pointer.losses(batch, pictures, plans)


def test_pointer_loss_trains_attention_and_vision():
    model, pointer, losses = _pointer_batch(readout=False)
    assert set(losses) == {"pointer"}
    loss = losses["pointer"]
    # Uniform attention over the few hundred visible tokens puts little mass on one shape's cells.
    assert 1.0 < loss.item() < 8.0
    loss.backward()
    attention = model.model.language_model.layers[8].self_attn
    assert attention.q_proj.weight.grad.abs().sum() > 0 and attention.k_proj.weight.grad.abs().sum() > 0
    assert attention.v_proj.weight.grad is None  # where it looks, not what it reads
    assert model.model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0
    assert model.model.language_model.layers[9].self_attn.q_proj.weight.grad is None  # only layer 8 is aimed
    pointer.remove()


def test_pointer_readout_trains_what_the_head_reads():
    import math

    model, pointer, losses = _pointer_batch(readout=True)
    readout = losses["readout"]
    # A fresh head guesses: about the mean of log(6), log(4) and log(4) nats.
    chance = (math.log(len(S.COLOURS)) + 2 * math.log(len(S.SHAPES))) / 3
    assert abs(readout.item() - chance) < 0.5
    readout.backward()
    attention = model.model.language_model.layers[8].self_attn
    assert attention.v_proj.weight.grad.abs().sum() > 0  # the values must say what the shape is
    assert attention.q_proj.weight.grad.abs().sum() > 0  # and the attention where to read it
    assert pointer.readout.weight.grad.abs().sum() > 0
    assert attention.o_proj.weight.grad is None  # the readout taps the head before o_proj
    pointer.remove()


def test_shape_pointer_aims_only_at_shape_questions():
    import random

    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.data import conversation_plan, encode
    from g4v.demo.loop import make_pointers
    from g4v.demo.recipe import TrainSettings

    processor = build_processor()
    model = build_random_model(processor)
    assert make_pointers(model, TrainSettings(pointer_weight=0.0, shape_pointer_layer=8)) == []
    pointers = make_pointers(model, TrainSettings(pointer_layer=9, shape_pointer_layer=8, shape_pointer_head=1,
                                                  count_pointer_layer=None))
    layers = model.model.language_model.layers
    assert [(p.attention, p.head, p.kinds) for p in pointers] == [
        (layers[9].self_attn, 0, None), (layers[8].self_attn, 1, frozenset({"shape"}))]
    pictures = [S.train_picture(0, i, canvas="square") for i in range(2)]
    colour_plans = [[(qa, index) for qa, index in conversation_plan(p, random.Random(i), 8, shape_share=0.0)
                     if qa.kind == "colour"] for i, p in enumerate(pictures)]
    shape_plans = [[(S.question("shape", p.shapes, 0), 0)] for p in pictures]
    for asked, plans in (("colour", colour_plans), ("shape", shape_plans)):
        assert all(plans)
        batch = encode(processor, pictures, [[(qa.question, qa.answer) for qa, _ in plan] for plan in plans])
        model.zero_grad(set_to_none=True)
        model(**batch)
        every_question, shape_only = (p.losses(batch, pictures, plans) for p in pointers)
        assert every_question["pointer"].item() > 1.0
        if asked == "colour":
            assert shape_only["pointer"].item() == 0.0 and shape_only["readout"].item() == 0.0
            continue
        assert shape_only["pointer"].item() > 1.0
        shape_only["pointer"].backward()
        assert layers[8].self_attn.q_proj.weight.grad.abs().sum() > 0
        assert layers[9].self_attn.q_proj.weight.grad is None
    for pointer in pointers:
        pointer.remove()


def test_count_pointer_spreads_over_every_shape():
    """The count pointer's loss on "How many shapes?" is the mean, over the picture's shapes, of the
    one-shape pointer loss at the same head: smallest when the mass is on the shapes, evenly."""
    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.aids import AttentionPointer
    from g4v.demo.data import encode
    from g4v.demo.loop import make_pointers
    from g4v.demo.recipe import TrainSettings

    processor = build_processor()
    model = build_random_model(processor)
    count = make_pointers(model, TrainSettings(count_pointer_layer=8, count_pointer_head=1))[-1]
    assert (count.head, count.kinds, count.readout) == (1, frozenset({"count"}), None)
    one_shape = AttentionPointer(model, 8, head=1)
    picture = next(p for i in range(50) if len((p := S.train_picture(0, i, canvas="square")).shapes) == 3)
    how_many = S.question("count", picture.shapes, 0)
    batch = encode(processor, [picture], [[(how_many.question, how_many.answer)]])
    model(**batch)
    kept = one_shape._inputs
    per_shape = []
    for index in range(3):
        one_shape._inputs = kept
        per_shape.append(one_shape.losses(batch, [picture], [[(how_many, index)]])["pointer"].item())
    spread = count.losses(batch, [picture], [[(how_many, None)]])
    assert spread["pointer"].item() == pytest.approx(sum(per_shape) / 3, rel=1e-5)
    assert len(set(round(v, 4) for v in per_shape)) == 3  # three different shapes, three different masses
    model(**batch)  # the one-shape pointer skips the count question: it names no shape
    assert one_shape.losses(batch, [picture], [[(how_many, None)]])["pointer"].item() == 0.0
    for pointer in (count, one_shape):
        pointer.remove()


def test_train_script_runs_a_few_steps(tmp_path):
    from g4v.demo.__main__ import main

    out = tmp_path / "trained"
    assert main(["train", "--steps", "2", "--batch-size", "2", "--out", str(out), "--no-progress",
                 "--vision-warmup-steps", "2", "--readout-weight", "0.5", "--eval-every", "1", "--eval-n", "1"]) == 0
    provenance = json.loads((out / "g4v_build.json").read_text())
    assert [point["step"] for point in provenance["validation_curve"]] == [1, 2]
    assert provenance["weights_sha256"] == sha256_file(out / "model.safetensors")
    assert provenance["settings"]["steps"] == 2 and provenance["seed"] == 0
    assert provenance["settings"]["readout_weight"] == 0.5
    assert provenance["builder"].startswith("python -m g4v.demo train")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "processor_config.json"):
        assert (out / name).read_bytes() == (BUNDLED_MODEL_DIR / name).read_bytes(), name
    assert provenance["final_loss"] == provenance["final_loss"]  # not NaN
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert log[0]["weights_sha256"] == provenance["weights_sha256"] and log[0]["command"] == provenance["builder"]
    assert [entry["step"] for entry in log[1:]] == [1]  # the monitor measures the first step, then every 10th
    assert len([key for key in log[1] if key.startswith("deepstack/")]) == 8 * 7

    again = tmp_path / "again"
    assert main(["train", "--steps", "2", "--batch-size", "2", "--out", str(again), "--no-progress",
                 "--vision-warmup-steps", "2", "--readout-weight", "0.5", "--eval-every", "1", "--eval-n", "1"]) == 0
    assert sha256_file(again / "model.safetensors") == provenance["weights_sha256"]  # deterministic


#: The flags ``python -m g4v.demo train --help`` and ``train-adapter --help`` listed when each was
#: written out by hand (before the flags were derived from the settings classes): all must stay.
TRAIN_FLAGS_BEFORE = (
    "--aux-place --aux-weight --batch-size --count-pointer-head --count-pointer-layer --device --eval-every "
    "--eval-n --help --init --lr --max-turns --no-aux-place --no-progress --out --pointer-layer --pointer-weight "
    "--qk-scale --readout-weight --seed --shape-pointer-head --shape-pointer-layer --shape-share "
    "--single-shape-start --steps --threads --three-shape-share --vision-lr --vision-warmup-lr "
    "--vision-warmup-steps --warmup-steps").split()
ADAPTER_FLAGS_BEFORE = "--base --help --lr --no-progress --out --seed --steps --threads".split()
EVAL_FLAGS_BEFORE = ("--ablation-n --adapter --adapter-only --backend --doc-n --help --json --model --n --no-ablations "
                     "--no-progress --threads --vision-lora").split()


def _demo_help(command: str, capsys) -> str:
    from g4v.demo.__main__ import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def _demo_subparser(command: str):
    import argparse

    from g4v.demo.__main__ import _add_training_commands

    sub = argparse.ArgumentParser().add_subparsers()
    _add_training_commands(sub)
    return sub.choices[command]


@pytest.mark.parametrize("command, before", [("train", TRAIN_FLAGS_BEFORE), ("train-adapter", ADAPTER_FLAGS_BEFORE),
                                             ("eval", EVAL_FLAGS_BEFORE)])
def test_training_help_still_lists_every_flag(command, before, capsys):
    import re

    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _demo_help(command, capsys)))
    assert set(before) <= listed, sorted(set(before) - listed)


@pytest.mark.parametrize("command, settings_class", [("train", "TrainSettings"), ("train-adapter", "AdapterSettings")])
def test_training_flags_are_the_settings_fields(command, settings_class):
    """One flag per field, --kebab-case, its default the field's (checked field by field here,
    independently of the helper that derives them)."""
    import dataclasses

    from g4v.demo import recipe

    cls = getattr(recipe, settings_class)
    by_dest = {action.dest: action for action in _demo_subparser(command)._actions}
    for field in dataclasses.fields(cls):
        action = by_dest[field.name]
        assert action.option_strings[0] == "--" + field.name.replace("_", "-")
        assert action.default == field.default, field.name
        assert action.help, field.name
    own = {"help", "out", "no_progress"} | ({"base"} if command == "train-adapter" else set())
    assert set(by_dest) == own | {field.name for field in dataclasses.fields(cls)}


def test_training_settings_come_from_the_flags_given():
    from dataclasses import replace

    from g4v.settings.flags import settings_from_args
    from g4v.demo.recipe import AdapterSettings, TrainSettings

    parser = _demo_subparser("train")
    given = ["--steps", "3", "--no-aux-place", "--vision-lr", "1e-4", "--init", "ckpt", "--count-pointer-layer", "7"]
    assert settings_from_args(TrainSettings, parser.parse_args(given)) == replace(
        TrainSettings(), steps=3, aux_place=False, vision_lr=1e-4, init="ckpt", count_pointer_layer=7)
    assert settings_from_args(TrainSettings, parser.parse_args([])) == TrainSettings()
    adapter = _demo_subparser("train-adapter").parse_args(["--lr", "0.01", "--rank", "4"])
    assert settings_from_args(AdapterSettings, adapter) == AdapterSettings(lr=0.01, rank=4)


def test_labels_cover_only_answers():
    import random

    from g4v.demo.build import build_processor
    from g4v.demo.data import conversation_turns, encode

    processor = build_processor()
    pictures = [S.train_picture(0, i) for i in range(3)]
    rng = random.Random(0)
    turns = [conversation_turns(p, rng) for p in pictures]
    batch = encode(processor, pictures, turns)
    tokenizer = processor.tokenizer
    for row, t in zip(batch["labels"], turns):
        kept = row[row != -100]
        assert tokenizer.decode(kept) == "".join(answer + "<|end_of_text|>" for _, answer in t)


def test_vision_warm_up_trains_only_the_vision_tower(tmp_path):
    from g4v.demo.__main__ import main

    out = tmp_path / "warm"
    assert main(["train", "--steps", "1", "--batch-size", "2", "--out", str(out), "--no-progress",
                 "--vision-warmup-steps", "3", "--vision-lr", "3e-4"]) == 0
    provenance = json.loads((out / "g4v_build.json").read_text())
    assert provenance["settings"]["vision_warmup_steps"] == 3 and provenance["settings"]["vision_lr"] == 3e-4
    assert 0.0 <= provenance["vision_warmup"]["final_shape_accuracy"] <= 1.0
    assert provenance["wall_time_s"] >= provenance["vision_warmup"]["wall_time_s"]


def test_object_shape_logits_pool_each_shape():
    from g4v.demo.build import build_processor, build_random_model
    from g4v.demo.aids import object_shape_logits

    processor = build_processor()
    model = build_random_model(processor)
    pictures = [S.train_picture(0, i) for i in range(4)]
    pixel_values = processor.image_processor([p.image for p in pictures], return_tensors="pt",
                                             do_pad=True)["pixel_values"]
    head = __import__("torch").nn.Linear(model.config.vision_config.hidden_size, len(S.SHAPES))
    logits, labels = object_shape_logits(model, head, pictures, pixel_values)
    assert logits.shape == (sum(len(p.shapes) for p in pictures), len(S.SHAPES))
    assert labels.tolist() == [S.SHAPES.index(s.kind) for p in pictures for s in p.shapes]


# ── the stored checkpoint and adapter ───────────────────────────────────────────────────────────


@needs_trained
def test_stored_weights_match_provenance():
    provenance = json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())
    assert provenance["weights_sha256"] == sha256_file(TRAINED_MODEL_DIR / "model.safetensors")
    for key in ("builder", "seed", "settings", "data", "wall_time_s"):
        assert key in provenance
    assert provenance["wall_time_s"] <= 30 * 60  # issue 5: at most 30 minutes on 2 cores
    # Same architecture, processor and tokenizer as the random checkpoint.
    for name in ("config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        assert (TRAINED_MODEL_DIR / name).read_bytes() == (BUNDLED_MODEL_DIR / name).read_bytes(), name


@needs_trained
def test_the_trained_checkpoint_ships_the_training_log_of_its_weights():
    """The log the demo trainer wrote while training these very weights (its header names their
    SHA-256): the Training tab's offline run, small enough to ship."""
    from g4v.training.report import open_run

    log = TRAINED_MODEL_DIR / "training_log.jsonl"
    header = json.loads(log.read_text().splitlines()[0])
    assert header["weights_sha256"] == sha256_file(TRAINED_MODEL_DIR / "model.safetensors")
    assert log.stat().st_size < 300_000
    curves = open_run(TRAINED_MODEL_DIR.name)  # the default run folders hold the bundled checkpoints
    steps = [record.step for record in curves.records]
    assert steps[0] == 1 and steps[-1] == 1050 and all(b - a == 10 for a, b in zip(steps[1:], steps[2:]))
    assert all(level.injected_norm > 0 and level.grad_norm > 0 for r in curves.records for level in r.levels)
    assert sorted(curves.checkpoints) == [1050] and curves.checkpoints[1050] == TRAINED_MODEL_DIR.resolve()


@needs_trained
def test_training_defaults_are_the_stored_recipe():
    """`python -m g4v.demo train` with no options rebuilds the bundled weights: its defaults are the
    settings recorded beside them (the validation curve's options change no weight)."""
    from dataclasses import asdict

    from g4v.demo.recipe import TrainSettings

    stored = json.loads((TRAINED_MODEL_DIR / "g4v_build.json").read_text())["settings"]
    defaults = asdict(TrainSettings())
    watching = {"eval_every", "eval_n"}
    assert {k: v for k, v in stored.items() if k not in watching} == \
        {k: v for k, v in defaults.items() if k not in watching}


@needs_trained
def test_adapter_script_runs_a_few_steps(tmp_path):
    from transformers import AutoConfig

    from g4v.lora.checks import check_adapter
    from g4v.demo.__main__ import main

    out = tmp_path / "adapter"
    assert main(["train-adapter", "--steps", "2", "--out", str(out), "--no-progress"]) == 0
    info = json.loads((out / "g4v_adapter.json").read_text())
    assert info["weights_sha256"] == sha256_file(out / "adapter_model.safetensors")
    assert info["settings"]["steps"] == 2 and info["wall_time_s"] > 0
    assert info["base_weights_sha256"] == sha256_file(TRAINED_MODEL_DIR / "model.safetensors")
    assert check_adapter(out, AutoConfig.from_pretrained(TRAINED_MODEL_DIR)).modules


@needs_trained
def test_checkpoint_and_adapter_under_30_mb():
    size = sum(f.stat().st_size for d in (TRAINED_MODEL_DIR, FRENCH_ADAPTER_DIR) if d.is_dir() for f in d.iterdir())
    assert size < 30 * 2**20


@needs_trained
def test_adapter_is_a_valid_lm_only_lora():
    from transformers import AutoConfig

    from g4v.lora.checks import check_adapter

    config = AutoConfig.from_pretrained(TRAINED_MODEL_DIR)
    spec = check_adapter(FRENCH_ADAPTER_DIR, config)
    assert spec.modules and all(m.startswith("model.language_model.layers.") for m in spec.modules)
    info = json.loads((FRENCH_ADAPTER_DIR / "g4v_adapter.json").read_text())
    assert info["weights_sha256"] == sha256_file(FRENCH_ADAPTER_DIR / "adapter_model.safetensors")


# ── it sees ─────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def engine_accuracy(trained_engine, held_out):
    from g4v.demo.answering import accuracy, answers, items

    pairs = items(held_out)
    return accuracy(pairs, answers(trained_engine, pairs))


@needs_trained
def test_trained_model_sees_through_the_engine(engine_accuracy):
    for kind, floor in FLOORS.items():
        assert engine_accuracy[kind] >= floor, (kind, engine_accuracy)


@needs_trained
def test_trained_model_meets_issue_targets(engine_accuracy):
    for kind, threshold in TARGETS.items():
        assert engine_accuracy[kind] >= threshold, (kind, engine_accuracy)


@needs_trained
def test_ablating_all_levels_drops_colour_accuracy(trained_engine, held_out):
    """Through the engine's own batches: with all 8 levels ablated colour falls to chance, and the
    scaling hooks are gone afterwards (the same answers as before)."""
    from g4v.demo.answering import ablated_answers, ablation_scales, accuracy, engine_batched_answers

    pairs = [(p, qa) for p in held_out for qa in p.qas if qa.kind == "colour"]
    replies = engine_batched_answers(trained_engine, pairs)
    seen = accuracy(pairs, replies)["colour"]
    blind = accuracy(pairs, ablated_answers(trained_engine, pairs, ablation_scales(trained_engine.model, None)))["colour"]
    assert seen >= FLOORS["colour"]
    assert blind <= 0.3 and blind < seen - 0.25  # chance is 1/6
    assert engine_batched_answers(trained_engine, pairs) == replies


@needs_trained
def test_adapter_answers_colours_in_french_and_off_changes_nothing(held_out):
    """The demo adapter registered with an engine as a user's is: asked for, colours come in French;
    not asked for, every answer is the base answer of before it was loaded."""
    from g4v.demo.answering import items
    from g4v.demo.evaluate import DEMO_ADAPTER, evaluate_adapter
    from g4v.engines.hf import TransformersEngine

    pairs = items(held_out[:20])
    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    try:
        result = evaluate_adapter(engine, pairs, FRENCH_ADAPTER_DIR)
        assert engine.adapters() == [DEMO_ADAPTER]
    finally:
        engine.close()
    assert result["adherence"] >= 0.9  # 99.7% on 300 held-out pictures (docs/demo-model.md)
    assert result["off_equals_base"] == 1.0


def test_eval_flags_read_back_as_its_settings():
    """``eval``'s flags are :class:`~g4v.demo.evaluate.DemoEvalSettings`' fields: the defaults are
    the fields' defaults, and the switches read as the settings they name (``--no-ablations``
    turns ablations off; the adapter is left None for ``main`` to pick)."""
    import dataclasses

    from g4v.demo.evaluate import DemoEvalSettings
    from g4v.settings.flags import settings_from_args

    parser = _demo_subparser("eval")
    assert settings_from_args(DemoEvalSettings, parser.parse_args([])) == DemoEvalSettings()
    chosen = settings_from_args(DemoEvalSettings, parser.parse_args(
        ["--n", "7", "--no-ablations", "--adapter", "", "--json", "out.json", "--backend", "vllm", "--no-progress"]))
    assert dataclasses.replace(DemoEvalSettings(), n=7, ablations=False, adapter="", json_out=Path("out.json"),
                               backend="vllm", no_progress=True) == chosen
