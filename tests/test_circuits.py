"""Circuits views against the model's own computation (bundled checkpoint): attention over image
tokens against ``output_attentions=True`` on an eager forward, knockout against a forward whose
attention mask the test builds itself."""

from dataclasses import replace

import pytest
import torch

from g4v.circuits.attention import image_attention
from contextlib import contextmanager

from g4v.circuits.common import CircuitSettings
from g4v.circuits.knockout import attention_knockout, knockout_layers
from g4v.images import open_image
from g4v.paths import EXAMPLES_DIR, TRAINED_MODEL_DIR
from g4v.conversation import Message
from g4v.model.levels import describe_levels
from g4v.model.sites import site
from g4v.tiling import plan_tiling
from tests.conftest import make_image

PROMPT = "What colour is the shape?"
#: (width, height): three pictures that the bundled checkpoint tiles differently.
SIZES = [(300, 140), (100, 100), (140, 400)]


def _reference_attentions(model, inputs):
    """The model's own attention weights: eager everywhere, ``output_attentions=True``."""
    with eager_everywhere(model), torch.inference_mode():
        return model(**inputs, output_attentions=True).attentions


@contextmanager
def eager_everywhere(model):
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_three_tilings_differ(hf_engine):
    grids = {plan_tiling((h, w), hf_engine.model.config).grid for w, h in SIZES}
    assert len(grids) == 3


@pytest.mark.parametrize("width,height", SIZES)
def test_attention_equals_output_attentions(hf_engine, width, height):
    model = hf_engine.model
    picture = make_image(width, height, seed=width)
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [picture])])
    reference = _reference_attentions(model, inputs)  # installs transformers' own capture hooks first
    implementation = site(model, "language_model").config._attn_implementation
    hooks = _hook_count(model)
    result = image_attention(hf_engine, picture, PROMPT)
    ids = inputs["input_ids"][0]
    positions = torch.nonzero(ids == model.config.image_token_index).flatten()
    last = ids.shape[0] - 1
    assert result.query_position == last
    assert result.image_positions == positions.tolist()
    assert result.layers == list(range(model.config.text_config.num_hidden_layers))
    for row, layer in enumerate(result.layers):
        expected = reference[layer][0, :, last].float()  # (heads, seq)
        torch.testing.assert_close(result.per_head[row], expected[:, positions], rtol=0, atol=1e-6)
        torch.testing.assert_close(result.image_share[row], expected[:, positions].sum(-1).mean(), rtol=0, atol=1e-6)
        text = torch.ones_like(ids, dtype=torch.bool)
        text[positions] = False
        torch.testing.assert_close(result.text_per_head[row], expected[:, text].sum(-1), rtol=0, atol=1e-6)

    # The token boxes are the tiling plan's, one per image position, in the plan's order.
    plan = plan_tiling((height, width), model.config)
    tokens = result.to_dict()["image_tokens"]
    assert len(tokens) == plan.num_image_tokens == positions.numel()
    assert [(t["kind"], tuple(t["box"])) for t in tokens] == [(t.kind, tuple(t.box)) for t in plan.tokens]
    # Eager was for that pass only; no hook stays behind.
    assert site(model, "language_model").config._attn_implementation == implementation
    assert _hook_count(model) == hooks


def test_attention_layer_range_and_token(hf_engine):
    model = hf_engine.model
    picture = make_image(300, 140, seed=1)
    result = image_attention(hf_engine, picture, PROMPT, CircuitSettings(layers="3-5", token=-4))
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [picture])])
    reference = _reference_attentions(model, inputs)
    position = inputs["input_ids"].shape[1] - 4
    assert result.layers == [3, 4, 5] and result.query_position == position
    positions = torch.tensor(result.image_positions)
    for row, layer in enumerate(result.layers):
        torch.testing.assert_close(result.per_head[row], reference[layer][0, :, position, positions].float(),
                                   rtol=0, atol=1e-6)
    summary = result.to_dict()
    levels = {int(k): v for k, v in summary["injection_layers"].items()}
    assert levels == {level.llm_layer: level.name for level in describe_levels(model.config)}


# ── knockout ──────────────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def trained_engine():
    """The trained demo checkpoint: its answers depend on the picture, so a knockout shows."""
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def shapes():
    return open_image(EXAMPLES_DIR / "shapes-square.png")


SHAPES_PROMPT = "What colour is the circle?"
STEPS = 4


def _knockout_mask(length: int, image: torch.Tensor, answer: int) -> torch.Tensor:
    """(1, 1, length, length) additive mask, built here: causal, and rows from ``answer`` on may not
    see the ``image`` columns."""
    low = torch.finfo(torch.float32).min
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    columns = torch.zeros(length, dtype=torch.bool)
    columns[: image.numel()] = image
    allowed[answer:] &= ~columns
    return torch.zeros(1, 1, length, length).masked_fill(~allowed, low)


def _greedy_reference(model, inputs, image, answer, steps, eos, masked=True):
    """Log-probabilities of the first answer token and ``steps`` greedy tokens, one full forward per
    token (no cache), each given the 4-D mask of :func:`_knockout_mask`."""
    ids, first, new = inputs["input_ids"], None, []
    for _ in range(steps):
        extra = {"attention_mask": _knockout_mask(ids.shape[1], image, answer)} if masked else {}
        with torch.inference_mode():
            logits = model(input_ids=ids, pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"],
                           use_cache=False, **extra).logits[0, -1].float()
        first = torch.log_softmax(logits, -1) if first is None else first
        token = int(logits.argmax())
        if token == eos:
            break
        new.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return first, new


def test_knockout_every_layer_equals_a_masked_forward(trained_engine, shapes):
    model = trained_engine.model
    result = attention_knockout(trained_engine, shapes, SHAPES_PROMPT,
                                CircuitSettings(layers="all", max_new_tokens=STEPS))
    inputs = trained_engine.prepare_inputs([Message("user", SHAPES_PROMPT, [shapes])])
    image = inputs["input_ids"][0] == model.config.image_token_index
    answer = inputs["input_ids"].shape[1] - 1
    eos = trained_engine.tokenizer.eos_token_id
    with eager_everywhere(model):
        clean, clean_ids = _greedy_reference(model, inputs, image, answer, STEPS, eos, masked=False)
        blocked, blocked_ids = _greedy_reference(model, inputs, image, answer, STEPS, eos)
    token = int(clean.argmax())
    assert result.answer_token_id == token and result.answer_position == answer
    assert result.logprob_before == pytest.approx(float(clean[token]), abs=1e-5)
    assert result.logprob_after == pytest.approx(float(blocked[token]), abs=1e-5)
    assert result.continuation_ids_before == clean_ids
    assert result.continuation_ids_after == blocked_ids
    assert abs(result.logprob_after - result.logprob_before) > 0.1  # the picture mattered


def test_knockout_at_some_layers_equals_an_attention_function_that_masks_them(trained_engine, shapes):
    """At layers 5-9 only: the reference masks inside an attention function registered with
    transformers (keyed by each module's layer index), not through the knockout's hooks."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask
    from transformers.models.granite4_vision.modeling_granite4_vision import eager_attention_forward

    model = trained_engine.model
    layers = [5, 6, 7, 8, 9]
    inputs = trained_engine.prepare_inputs([Message("user", SHAPES_PROMPT, [shapes])])
    image = inputs["input_ids"][0] == model.config.image_token_index
    answer = inputs["input_ids"].shape[1] - 1

    def masked_attention(module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx in layers:
            attention_mask = attention_mask.clone()
            attention_mask[:, :, answer:, torch.nonzero(image).flatten()] = torch.finfo(attention_mask.dtype).min
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("g4v_test_knockout", masked_attention)
    AttentionMaskInterface.register("g4v_test_knockout", eager_mask)
    language_model = site(model, "language_model")
    previous = language_model.config._attn_implementation
    language_model.set_attn_implementation("g4v_test_knockout")
    try:
        with torch.inference_mode():
            logits = model(**inputs, use_cache=False).logits[0, -1].float()
    finally:
        language_model.set_attn_implementation(previous)
    expected = torch.log_softmax(logits, -1)

    result = attention_knockout(trained_engine, shapes, SHAPES_PROMPT, CircuitSettings(layers="5-9", max_new_tokens=0))
    assert result.layers == layers
    assert result.logprob_after == pytest.approx(float(expected[result.answer_token_id]), abs=1e-5)
    assert result.continuation_ids_after == []


def test_knockout_window_around_injection_layers(trained_engine):
    config = trained_engine.model.config
    targets = [level.llm_layer for level in describe_levels(config)]
    last = config.text_config.num_hidden_layers - 1
    assert knockout_layers(config, CircuitSettings(window=0)) == sorted(targets)
    expected = sorted({t + d for t in targets for d in (-1, 0, 1) if 0 <= t + d <= last})
    assert knockout_layers(config, CircuitSettings(window=1)) == expected


def test_a_failed_pass_leaves_no_eager_attention_and_no_hook(hf_engine):
    """The pass fails half-way (a hook of the test's raises in layer 2): eager attention is switched
    back and the circuits hooks are gone all the same."""
    from g4v.circuits.attention import attention_rows
    from g4v.model.attention import eager_attention
    from g4v.circuits.knockout import knocked_out
    from g4v.model.hooks import Hooks

    model = hf_engine.model
    language_model = site(model, "language_model")
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [make_image(100, 100)])])
    _reference_attentions(model, inputs)  # transformers' own capture hooks, installed once
    implementation, hooks = language_model.config._attn_implementation, _hook_count(model)

    def fail(module, args):
        raise ValueError("stop here")

    with Hooks() as failing:
        failing.before(language_model.layers[2], fail)
        with pytest.raises(ValueError, match="stop here"):
            attention_rows(model, inputs, [0, 1, 2, 3], 5)
        image = inputs["input_ids"][0] == model.config.image_token_index
        with pytest.raises(ValueError, match="stop here"), eager_attention(model), \
                knocked_out(model, [0, 1], image, 5), torch.inference_mode():
            model(**inputs)
    assert language_model.config._attn_implementation == implementation
    assert _hook_count(model) == hooks


# ── the reverse view ──────────────────────────────────────────────────────────────────────────


def _tokens_touching(plan, box, size) -> set[int]:
    """The base and tile tokens whose box shares a pixel with ``box``, found by painting the region
    on a pixel grid (not by interval arithmetic, as the library does)."""
    import numpy as np

    width, height = size
    painted = np.zeros((height, width), dtype=bool)
    painted[box[1]:box[3], box[0]:box[2]] = True
    return {i for i, t in enumerate(plan.tokens) if t.kind != "newline"
            and painted[int(t.box[1]):int(np.ceil(t.box[3])), int(t.box[0]):int(np.ceil(t.box[2]))].any()}


@pytest.mark.parametrize("width,height,region", [(300, 140, (40, 20, 180, 100)), (140, 400, (0, 300, 140, 400))])
def test_reverse_view_equals_output_attentions(hf_engine, width, height, region):
    from g4v.circuits.reverse import region_attention

    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    picture = make_image(width, height, seed=height)
    steps = 3
    settings = CircuitSettings(layers="1-6", max_new_tokens=steps, box=",".join(map(str, region)))
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [picture])], steps)
    with torch.inference_mode():  # the answer as generate gives it, cut at the end-of-text token
        generated = model.generate(**inputs, max_new_tokens=steps, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    answer = generated.tolist()
    if tokenizer.eos_token_id in answer:
        answer = answer[: answer.index(tokenizer.eos_token_id)]
    ids = torch.cat([inputs["input_ids"][0], torch.tensor(answer, dtype=torch.long)])
    reference = _reference_attentions(model, {**inputs, "input_ids": ids[None],
                                              "attention_mask": torch.ones_like(ids)[None]})
    hooks = _hook_count(model)  # transformers' own capture hooks, installed by the reference, counted
    result = region_attention(hf_engine, picture, PROMPT, settings)

    plan = plan_tiling((height, width), model.config)
    image = torch.nonzero(ids == model.config.image_token_index).flatten()
    chosen = sorted(_tokens_touching(plan, region, (width, height)))
    assert result.region_token_indices == chosen and chosen
    assert [t["box"] for t in result.to_dict()["region_tokens"]] == [list(plan.tokens[i].box) for i in chosen]
    text = torch.tensor([p for p in range(ids.numel()) if p not in set(image.tolist())])
    assert result.text_positions == text.tolist()
    assert result.answer_start == inputs["input_ids"].shape[1]
    assert [t["part"] for t in result.to_dict()["text_tokens"]].count("answer") == len(answer)
    assert result.layers == [1, 2, 3, 4, 5, 6]
    for row, layer in enumerate(result.layers):
        weights = reference[layer][0].float()  # (heads, seq, seq)
        expected = weights[:, text][:, :, image[chosen]].sum(-1).mean(0)
        torch.testing.assert_close(result.weights[row], expected, rtol=0, atol=1e-6)
        base = [i for i in chosen if plan.tokens[i].kind == "base"]
        torch.testing.assert_close(result.by_kind["base"][row], weights[:, text][:, :, image[base]].sum(-1).mean(0),
                                   rtol=0, atol=1e-6)
    assert _hook_count(model) == hooks


@pytest.mark.parametrize("region, words", [
    ("1,2,3", "four numbers"), ("5,5,5,9", "empty"),
    ("0,0,1e30,10", r"^the region 0,0,1e\+30,10 reaches past the picture, which is 100 x 100 px \(width x height\)$"),
    ("-1,0,10,10", r"^the region -1,0,10,10 reaches past the picture, which is 100 x 100 px"),
    ("100,0,120,10", r"^the region 100,0,120,10 is outside the picture, which is 100 x 100 px \(width x height\)$"),
    ("-9,-9,0,5", r"^the region -9,-9,0,5 is outside the picture"),
    ("a,b,c,d", "numbers of pixels"), ("nan,0,4,4", "numbers of pixels"),
    ("20,20,abc", r"^a region's corners are numbers of pixels, got 'abc'$"),  # not "got 3": 'abc' is what is wrong
    ("", "needs a region"), ("1," * 200, "characters"),
])
def test_reverse_view_refuses_bad_regions(hf_engine, region, words):
    from g4v.circuits.reverse import region_attention
    from g4v.errors import G4VError

    with pytest.raises(G4VError, match=words):
        region_attention(hf_engine, make_image(100, 100), PROMPT, CircuitSettings(box=region))


def test_the_tile_maps_mark_the_newline_tokens(hf_engine):
    """Attention on the newline tokens alone shows in the tile maps (the strip at each row's right
    end): its picture differs from one with no attention anywhere, which paints every token alike."""
    import numpy as np

    from viz.circuits import attention_map_figure, newline_strip

    picture = make_image(300, 140, seed=2)
    result = image_attention(hf_engine, picture, PROMPT, CircuitSettings(layers="0"))
    kinds = [t.kind for t in result.image_tokens]
    assert "newline" in kinds and newline_strip((0, 0, 100, 10)) == (96.0, 0, 100, 10)

    def drawn(kind: str) -> np.ndarray:
        values = torch.tensor([[[1.0 if k == kind else 0.0 for k in kinds]]])  # (1 layer, 1 head, image tokens)
        painted = replace(result, injection_layers={}, per_head=values)
        return np.asarray(attention_map_figure(picture, painted, "tile"), dtype=float)

    newline, nothing = drawn("newline"), drawn("no token")
    assert newline.shape == nothing.shape
    changed = np.abs(newline - nothing).max(axis=-1) > 30  # pixels painted differently
    assert 0.001 < changed.mean() < 0.2  # a thin strip per row (and the colour bar's labels), not the picture
