"""g4v.model.sites: every capture point's name resolves to the module transformers itself names so,
on the bundled checkpoint loaded by the real transformers classes (vLLM's side: tests/vllm/test_port_diff.py)."""

import pytest
import torch
from transformers import Granite4VisionForConditionalGeneration
from transformers.models.granite4_vision import modeling_granite4_vision as hf

from g4v.errors import G4VError
from g4v.model.levels import describe_levels
from g4v.model.sites import SITES, projector_site, site, site_names
from g4v.paths import BUNDLED_MODEL_DIR


@pytest.fixture(scope="module")
def model():
    return Granite4VisionForConditionalGeneration.from_pretrained(str(BUNDLED_MODEL_DIR), dtype=torch.float32)


def expected_paths(config) -> dict[str, str]:
    """Each capture point's path in ``named_modules()`` of transformers' model, from the config's sizes."""
    layers = config.text_config.num_hidden_layers
    paths = {"language_model": "model.language_model"}
    paths.update({f"layers.{i}": f"model.language_model.layers.{i}" for i in range(layers)})
    paths.update({f"layers.{i}.self_attn": f"model.language_model.layers.{i}.self_attn" for i in range(layers)})
    paths.update({f"layerwise_projectors.{i}": f"model.layerwise_projectors.{i}"
                  for i in range(len(config.deepstack_layer_map))})
    paths.update({f"spatial_projectors.{i}": f"model.spatial_projectors.{i}"
                  for i in range(len(config.spatial_target_layers))})
    return paths


def test_every_name_is_the_module_transformers_names_so(model):
    modules = dict(model.named_modules())
    expected = expected_paths(model.config)
    assert sorted(site_names(model)) == sorted(expected)
    for name, path in expected.items():
        assert site(model, name) is modules[path], name
    kinds = {"language_model": hf.Granite4VisionTextModel, "layers.{i}": hf.Granite4VisionTextDecoderLayer,
             "layers.{i}.self_attn": hf.Granite4VisionTextAttention,
             "layerwise_projectors.{i}": hf.Granite4VisionWindowQFormerDownsampler,
             "spatial_projectors.{i}": hf.Granite4VisionWindowQFormerDownsampler}
    assert set(kinds) == set(SITES)
    for pattern, kind in kinds.items():
        names = site_names(model, pattern)
        assert names and all(type(site(model, name)) is kind for name in names), pattern
    assert site_names(model, "layers.{i}") == [f"layers.{i}" for i in range(model.config.text_config.num_hidden_layers)]


def test_each_level_names_the_projector_transformers_runs_for_its_layer(model):
    """transformers runs ``layerwise_projectors[i]`` for ``deepstack_layer_map[i]`` and
    ``spatial_projectors[g]`` for ``spatial_target_layers[g]``: a level's projector is the one that
    feeds its language-model layer."""
    config, inner = model.config, model.model
    for level in describe_levels(config):
        if level.kind == "deepstack":
            index = [llm for _, llm in config.deepstack_layer_map].index(level.llm_layer)
            expected = inner.layerwise_projectors[index]
        else:
            expected = inner.spatial_projectors[list(config.spatial_target_layers).index(level.llm_layer)]
        assert site(model, projector_site(level)) is expected, level.name


def test_peft_wrapped_model_resolves_to_the_same_modules(model):
    from peft import LoraConfig, get_peft_model

    wrapped = Granite4VisionForConditionalGeneration.from_pretrained(str(BUNDLED_MODEL_DIR), dtype=torch.float32)
    peft_model = get_peft_model(wrapped, LoraConfig(r=2, target_modules=["q_proj"]))
    modules = dict(wrapped.named_modules())
    for name, path in expected_paths(wrapped.config).items():
        assert site(peft_model, name) is modules[path], name
    assert site_names(peft_model) == site_names(model)


@pytest.mark.parametrize("name", ["layers.99", "layers.-1", "layer.1", "layers.1.mlp", "lm_head", "", "layers.{i}"])
def test_a_bad_name_is_one_line_listing_the_names(model, name):
    layers = model.config.text_config.num_hidden_layers
    with pytest.raises(G4VError) as caught:
        site(model, name)
    message = str(caught.value)
    assert "\n" not in message and repr(name) in message
    for listed in ("language_model", f"layers.0-{layers - 1}", f"layers.0-{layers - 1}.self_attn",
                   f"layerwise_projectors.0-{len(model.config.deepstack_layer_map) - 1}"):
        assert listed in message


def test_an_unknown_pattern_and_a_model_that_is_no_granite_are_one_line(model):
    with pytest.raises(G4VError, match=r"no capture point pattern 'blocks\.\{i\}': the patterns are language_model, "):
        site_names(model, "blocks.{i}")
    with pytest.raises(G4VError, match="^Linear is not a Granite 4 Vision model$"):
        site(torch.nn.Linear(2, 2), "language_model")
