"""Two-picture patching per level against an independent computation: the test computes each
picture's injected features itself (``get_image_features``), builds A's features with one level's
(or a region's) replaced by B's, and hands them to the model through its own ``mm_encoder_outputs``
argument, with no hook of g4v's; the patched run must give the same next-token distribution and the
same greedy tokens. Patching every level from B must give B's own next-token distribution (the text
is the same). Bad input: one line each, through the command's ``run()`` in this process."""

import json

import pytest
import torch
from transformers.models.granite4_vision.modeling_granite4_vision import Granite4VisionImageFeaturesOutput

from g4v.circuits.common import CircuitSettings
from g4v.circuits.patching import patch_levels
from g4v.conversation import Message
from g4v.demo.pairs import picture_pair
from g4v.errors import G4VError
from g4v.model.levels import describe_levels
from g4v.paths import TRAINED_MODEL_DIR
from g4v.tiling import plan_tiling
from tests.cli import run_cli
from tests.test_figure_text import drawn, legends_clear_of_the_buttons, legends_clear_of_the_data, smallest_shown_text  # noqa: F401

TOKENS = 3  # greedy continuation length in the comparisons


@pytest.fixture(scope="module")
def engine():
    from g4v.engines.hf import TransformersEngine

    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def pair():
    """A colour pair whose pictures the trained checkpoint answers differently (red star, blue star...)."""
    return picture_pair(0, "colour")


@pytest.fixture(scope="module")
def patched(engine, pair):
    return patch_levels(engine, pair.a, pair.b, pair.prompt, CircuitSettings(max_new_tokens=TOKENS))


def _features(model, inputs) -> list[torch.Tensor]:
    """The packed features of each level, in the model's level order, computed by the test."""
    with torch.inference_mode():
        output = model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"],
                                                vision_feature_select_strategy=model.config.vision_feature_select_strategy)
    return [torch.cat(packed) if isinstance(packed, (list, tuple)) else packed for _, packed in output.deepstack_features]


def _run_with(model, inputs, features: list[torch.Tensor], tokens: int) -> tuple[torch.Tensor, list[int]]:
    """Log-probabilities of the next token and ``tokens`` greedy tokens (a cache-free loop), with the
    given per-level features passed through ``mm_encoder_outputs`` instead of the pixels."""
    layers = [llm_layer for _, llm_layer in model.config.deepstack_layer_map] + list(model.config.spatial_target_layers)
    ids, first, generated = inputs["input_ids"], None, []
    for _ in range(max(tokens, 1)):
        encoder = {"image": Granite4VisionImageFeaturesOutput(deepstack_features=list(zip(layers, features)))}
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_encoder_outputs=encoder,
                           use_cache=False).logits[0, -1].float()
        first = torch.log_softmax(logits, dim=-1) if first is None else first
        token = int(logits.argmax())
        generated.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return first, generated


def _inputs(engine, picture, prompt):
    return engine.prepare_inputs([Message("user", prompt, [picture])], TOKENS)


def _hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _trimmed(ids: list[int], tokenizer) -> list[int]:
    return ids[: ids.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in ids else ids


def test_the_pair_is_answered_differently(patched, pair):
    a_from_b = patched.directions[0]
    assert pair.answer_a != pair.answer_b
    assert (a_from_b.receiver_continuation, a_from_b.donor_continuation) == (pair.answer_a, pair.answer_b)
    assert not a_from_b.same_first_token


@pytest.mark.parametrize("level", range(8))
@pytest.mark.parametrize("direction", [0, 1], ids=["a_from_b", "b_from_a"])
def test_each_level_equals_features_replaced_independently(engine, pair, patched, level, direction):
    model, tokenizer = engine.model, engine.tokenizer
    pictures = {"A": pair.a, "B": pair.b}
    result = patched.directions[direction]
    receiver, donor = _inputs(engine, pictures[result.receiver], pair.prompt), _inputs(engine, pictures[result.donor], pair.prompt)
    mixed = _features(model, receiver)
    mixed[level] = _features(model, donor)[level]
    logprobs, ids = _run_with(model, receiver, mixed, TOKENS)
    run = result.levels[level]
    assert run.levels == [describe_levels(model.config)[level].name]
    torch.testing.assert_close(run.logprobs, logprobs, rtol=0, atol=2e-5)
    assert run.continuation_ids == _trimmed(ids, tokenizer)
    expected = float(logprobs[result.donor_token_id] - logprobs[result.receiver_token_id])
    assert run.logodds == pytest.approx(expected, abs=5e-5)
    span = result.logodds_donor - result.logodds_receiver
    assert run.moved == pytest.approx((expected - result.logodds_receiver) / span, abs=1e-4)


@pytest.fixture(scope="module")
def complemented(engine, pair):
    return patch_levels(engine, pair.a, pair.b, pair.prompt,
                        CircuitSettings(direction="a_from_b", complement=True, max_new_tokens=0))


@pytest.mark.parametrize("level", range(8))
def test_complement_keeps_only_that_level(engine, pair, complemented, level):
    """Every level from B but ``level``, which stays A's: against features the test mixes itself."""
    model = engine.model
    a, b = _inputs(engine, pair.a, pair.prompt), _inputs(engine, pair.b, pair.prompt)
    mixed = _features(model, b)
    mixed[level] = _features(model, a)[level]
    logprobs, _ = _run_with(model, a, mixed, 0)
    [direction] = complemented.directions
    run = direction.levels[level]
    name = describe_levels(model.config)[level].name
    assert run.label == f"all but {name}" and name not in run.levels and len(run.levels) == 7
    torch.testing.assert_close(run.logprobs, logprobs, rtol=0, atol=2e-5)
    assert complemented.to_dict()["complement"] is True


def test_all_levels_from_b_is_b(engine, pair, patched):
    model = engine.model
    for result in patched.directions:
        donor = _inputs(engine, {"A": pair.a, "B": pair.b}[result.donor], pair.prompt)
        with torch.inference_mode():
            own = torch.log_softmax(model(**donor, use_cache=False).logits[0, -1].float(), dim=-1)
        torch.testing.assert_close(result.all_levels.logprobs, own, rtol=0, atol=2e-5)
        assert result.all_levels.moved == pytest.approx(1.0, abs=1e-4)
        assert result.all_levels.continuation == result.donor_continuation
        assert result.all_levels.levels == [level.name for level in describe_levels(model.config)]


def test_region_patches_only_those_tokens(engine, pair):
    model = engine.model
    hooks = _hook_count(model)
    result = patch_levels(engine, pair.a, pair.b, pair.prompt,
                          CircuitSettings(levels="deepstack0,spatial_BR", direction="a_from_b", region="tokens:10-40",
                                          max_new_tokens=0))
    assert _hook_count(model) == hooks  # nothing left behind
    assert result.patched_tokens == list(range(10, 41))
    a, b = _inputs(engine, pair.a, pair.prompt), _inputs(engine, pair.b, pair.prompt)
    features_a, features_b = _features(model, a), _features(model, b)
    [direction] = result.directions
    names = [level.name for level in describe_levels(model.config)]
    for run in direction.levels:
        level = names.index(run.levels[0])
        mixed = list(features_a)
        mixed[level] = features_a[level].clone()
        mixed[level][10:41] = features_b[level][10:41]
        logprobs, _ = _run_with(model, a, mixed, 0)
        torch.testing.assert_close(run.logprobs, logprobs, rtol=0, atol=2e-5)
    assert [run.levels[0] for run in direction.levels] == ["deepstack0", "spatial_BR"]
    # A box covering the whole picture is every token with a box: all tokens but the padding-only ones.
    plan = plan_tiling((pair.a.height, pair.a.width), model.config)
    whole = patch_levels(engine, pair.a, pair.b, pair.prompt, CircuitSettings(
        levels="0", direction="a_from_b", region=f"box:0,0,{pair.a.width},{pair.a.height}", max_new_tokens=0))
    assert whole.patched_tokens == [t.index for t in plan.tokens if t.box[2] > t.box[0] and t.box[3] > t.box[1]]


def test_progress_reaches_one(engine, pair):
    seen = []
    patch_levels(engine, pair.a, pair.b, pair.prompt, CircuitSettings(levels="1", max_new_tokens=0),
                 progress=lambda fraction, text: seen.append((fraction, text)))
    assert [round(f, 6) for f, _ in seen] == [round(i / 6, 6) for i in range(1, 7)]  # 2 own + 2 x (1 level + bound)
    assert seen[-1][1] == "B with all of A's levels"


def test_a_picture_patched_with_itself_is_unchanged(engine, pair, drawn):
    """A as its own donor: every patched run is A's own run, and with one answer there is no way to
    move (``moved`` None); the figure says so and stays readable."""
    from viz.circuits import patching_figure
    from viz.figures import MIN_TEXT_PX

    result = patch_levels(engine, pair.a, pair.a, pair.prompt, CircuitSettings(levels="0,7", direction="a_from_b",
                                                                                 max_new_tokens=0))
    [direction] = result.directions
    assert direction.same_first_token and direction.logodds_receiver == 0.0
    for run in [*direction.levels, direction.all_levels]:
        torch.testing.assert_close(run.logprobs, direction.donor_logprobs, rtol=0, atol=1e-6)
        assert run.moved is None and run.logodds == pytest.approx(0.0, abs=1e-6)
    patching_figure(result)
    size, text = smallest_shown_text(drawn)
    assert size >= MIN_TEXT_PX, f"{text!r} is {size:.1f} px at the page's width"
    legends_clear_of_the_data(drawn["figures"][-1])
    legends_clear_of_the_buttons(drawn["figures"][-1])
    assert "nothing to move" in drawn["figures"][-1].axes[0].get_title()


def test_the_figure_of_both_directions_is_readable(patched, drawn):
    from viz.circuits import patching_figure
    from viz.figures import MIN_TEXT_PX

    patching_figure(patched)
    size, text = smallest_shown_text(drawn)
    assert size >= MIN_TEXT_PX, f"{text!r} is {size:.1f} px at the page's width"
    legends_clear_of_the_data(drawn["figures"][-1])
    legends_clear_of_the_buttons(drawn["figures"][-1])


def test_mismatched_grids_name_both(engine, pair):
    wide = pair.a.resize((pair.a.width * 2 + 40, pair.a.height))
    config = engine.model.config
    plan_a, plan_b = (plan_tiling((p.height, p.width), config) for p in (pair.a, wide))
    assert plan_a.grid != plan_b.grid
    words = [f"tiles {p.grid[1]} wide x {p.grid[0]} tall with {p.num_image_tokens} image tokens" for p in (plan_a, plan_b)]
    with pytest.raises(G4VError, match=f"A {words[0]}, B {words[1]}"):
        patch_levels(engine, pair.a, wide, pair.prompt)


# ── the command ────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def files(tmp_path_factory, pair):
    folder = tmp_path_factory.mktemp("pair")
    pair.a.save(folder / "a.png")
    pair.b.save(folder / "b.png")
    pair.b.resize((pair.b.width * 2 + 40, pair.b.height)).save(folder / "wide.png")
    return folder


def _cli(files, *flags, other="b.png"):
    return run_cli("circuits", "patch", "--model", TRAINED_MODEL_DIR, "--device", "cpu", "--dtype", "float32",
                   "--image", files / "a.png", "--other", files / other, *flags)


@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_cli_json_is_the_library_result(files, pair, patched, tmp_path):
    from PIL import Image

    from g4v.commands.circuits import PATCHING_FILES
    from viz.figures import MAX_PICTURE_SIDE

    result = _cli(files, "--prompt", pair.prompt, "--max-new-tokens", str(TOKENS), "--json", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    expected = patched.to_dict()
    for got, want in zip(summary["directions"], expected["directions"], strict=True):
        for run, reference in zip([*got["levels"], got["all_levels"]], [*want["levels"], want["all_levels"]], strict=True):
            assert (run["levels"], run["continuation"]) == (reference["levels"], reference["continuation"])
            assert run["logodds"] == pytest.approx(reference["logodds"], abs=1e-4)
    assert [d["all_levels"]["continuation"] for d in summary["directions"]] == [pair.answer_b, pair.answer_a]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(PATCHING_FILES)
    assert json.loads((tmp_path / "out" / "patching.json").read_text()) == summary
    with Image.open(tmp_path / "out" / "patching.png") as picture:
        assert max(picture.size) <= MAX_PICTURE_SIDE


def test_cli_table(files, pair):
    result = _cli(files, "--prompt", pair.prompt, "--levels", "deepstack0", "--direction", "a_from_b", "--max-new-tokens", "0")
    assert result.returncode == 0, result.stderr
    assert "deepstack0" in result.stdout and "all levels" in result.stdout and "B with" not in result.stdout
    result = _cli(files, "--prompt", pair.prompt, "--levels", "spatial_TL", "--complement", "--max-new-tokens", "0")
    assert result.returncode == 0, result.stderr
    assert "all but spatial_TL" in result.stdout and "B with A's" in result.stdout


BAD = [
    ({"other": "wide.png"}, [], "do not share a token layout"),
    ({}, ["--levels", "8"], "unknown level '8'"),
    ({}, ["--levels", "99999999999999999999"], "unknown level"),
    ({}, ["--levels", "deepstack0,,spatial_TL"], "empty entry"),
    ({}, ["--levels", "0,deepstack0"], "named twice"),
    ({}, ["--levels", "x" * 300], "at most 200"),
    ({}, ["--direction", "sideways"], "unknown direction"),
    ({}, ["--region", "tokens:0-99999999999999999999"], "out of range"),
    ({}, ["--region", "tokens:5-2"], "empty"),
    ({}, ["--region", "tokens:-1-4"], "a region is written"),
    ({}, ["--region", "box:0,0,100000,100000"], "reaches past picture A"),
    ({}, ["--region", "box:10,10,10,20"], "is empty"),
    ({}, ["--region", "box:0,0,1,1"], "no image token's centre"),
    ({}, ["--region", "everything"], "a region is written"),
    ({}, ["--max-new-tokens", "1000000000"], "too long"),
    ({"other": "missing.png"}, [], "missing.png"),
]


def test_an_out_that_is_a_file_is_refused_as_the_flag_is_read(files, pair):
    """argparse refuses it (exit 2) in one line naming the flag, before any model loads."""
    result = _cli(files, "--prompt", pair.prompt, "--out", str(files / "a.png"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "argument --out" in lines[0] and "is a file" in lines[0], result.stderr


@pytest.mark.parametrize("other,flags,words", BAD, ids=[" ".join(flags) or str(other) for other, flags, _ in BAD])
def test_bad_input_is_one_line(files, pair, other, flags, words):
    result = _cli(files, "--prompt", pair.prompt, *flags, **other)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert lines[-1].startswith("error:") and words in lines[-1], result.stderr
    assert all(line.startswith("Loading weights") for line in lines[:-1]), result.stderr
    assert "Traceback" not in result.stderr and "/work" not in result.stderr


def test_the_example_pairs_the_tab_names_share_a_layout():
    """The hint beside picture B names bundled examples that patch together: each named pair passes
    the layout check, and every other example paired with them does not (so the hint names them all)."""
    from itertools import combinations

    from PIL import Image

    from g4v.circuits.patching import same_layout
    from g4v.errors import G4VError
    from g4v.loading import load_config
    from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR
    from g4v.tiling import plan_tiling
    from webapp.circuits import PATCH_PAIRS, PICTURE_B_HINT

    config = load_config(BUNDLED_MODEL_DIR)
    plans = {path.name: plan_tiling(Image.open(path).size[::-1], config) for path in sorted(EXAMPLES_DIR.glob("*.png"))}
    pairing = set()
    for a, b in combinations(plans, 2):
        try:
            same_layout(plans[a], plans[b])
        except G4VError:
            continue
        pairing.add(frozenset((a, b)))
    assert pairing == {frozenset(pair) for pair in PATCH_PAIRS}
    assert all(name in PICTURE_B_HINT for pair in PATCH_PAIRS for name in pair)
