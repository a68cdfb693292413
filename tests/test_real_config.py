"""The real granite-vision-4.1-4b geometry, built on the meta device from the bundled fixture."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from g4v.paths import REAL_CONFIG_DIR


@pytest.fixture(scope="module")
def real_model():
    config = AutoConfig.from_pretrained(REAL_CONFIG_DIR)
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def test_real_model_builds_at_full_size(real_model):
    params = sum(p.numel() for p in real_model.parameters())
    assert 3.8e9 < params < 4.6e9  # "about 4B parameters"
    assert len(real_model.model.language_model.layers) == 40
    assert len(real_model.model.vision_tower.encoder.layers) == 27


def test_eight_injection_levels_at_the_documented_layers(real_model):
    config = real_model.config
    deepstack_targets = [llm for _, llm in config.deepstack_layer_map]
    spatial_targets = list(config.spatial_target_layers)
    assert len(real_model.model.layerwise_projectors) == len(deepstack_targets) == 4
    assert len(real_model.model.spatial_projectors) == len(spatial_targets) == 4
    assert deepstack_targets == [9, 6, 3, 0]
    assert spatial_targets == [12, 15, 18, 21]
    assert sorted(deepstack_targets + spatial_targets) == [0, 3, 6, 9, 12, 15, 18, 21]


def test_projectors_have_the_shapes_vllm_builds(real_model):
    projector = real_model.model.layerwise_projectors[0]
    qformer_config = projector.qformer.config
    assert qformer_config.hidden_size == 1152 and qformer_config.num_attention_heads == 1152 // 64
    assert qformer_config.num_hidden_layers == 1 and qformer_config.intermediate_size == 3072
    assert (projector.query_side, projector.window_side) == (4, 8)
    assert projector.out_linear.out_features == 2560


def test_pinpoints_cover_up_to_ten_tiles(real_model):
    pinpoints = real_model.config.image_grid_pinpoints
    assert len(pinpoints) == 27
    assert all(h % 384 == 0 and w % 384 == 0 for h, w in pinpoints)
    assert max((h // 384) * (w // 384) for h, w in pinpoints) == 10
    assert [384, 3840] in pinpoints and [3840, 384] in pinpoints
