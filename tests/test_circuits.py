"""Circuits views against the model's own computation (bundled checkpoint): attention over image
tokens against ``output_attentions=True`` on an eager forward, knockout against a forward whose
attention mask the test builds itself."""

import pytest
import torch

from g4v.circuits.attention import image_attention
from g4v.circuits.common import CircuitSettings
from g4v.conversation import Message
from g4v.model.capture import language_model_of
from g4v.model.levels import describe_levels
from g4v.tiling import plan_tiling
from tests.conftest import make_image

PROMPT = "What colour is the shape?"
#: (width, height): three pictures that the bundled checkpoint tiles differently.
SIZES = [(300, 140), (100, 100), (140, 400)]


def _reference_attentions(model, inputs):
    """The model's own attention weights: eager everywhere, ``output_attentions=True``."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            return model(**inputs, output_attentions=True).attentions
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
    implementation = language_model_of(model).config._attn_implementation
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
    assert language_model_of(model).config._attn_implementation == implementation
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
