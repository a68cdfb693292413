"""The bundled checkpoint: loads through from_pretrained, is reproducible, and fits both runtimes."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoProcessor, Granite4VisionForConditionalGeneration

from g4v.demo.build import build
from g4v.demo.tokenizer import END_OF_ROLE, END_OF_TEXT, IMAGE, START_OF_ROLE
from g4v.paths import BUNDLED_MODEL_DIR


def test_loads_through_from_pretrained_with_every_weight():
    model, info = Granite4VisionForConditionalGeneration.from_pretrained(
        BUNDLED_MODEL_DIR, dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    assert model.config.model_type == "granite4_vision"
    assert len(model.model.layerwise_projectors) == 4
    assert len(model.model.spatial_projectors) == 4
    assert model.model.image_newline is not None


def test_builder_reproduces_the_bundled_checkpoint_bit_for_bit(tmp_path):
    out = tmp_path / "rebuilt"
    build(out)
    bundled = sorted(p.name for p in BUNDLED_MODEL_DIR.iterdir())
    rebuilt = sorted(p.name for p in out.iterdir())
    assert rebuilt == bundled
    for name in bundled:
        assert (out / name).read_bytes() == (BUNDLED_MODEL_DIR / name).read_bytes(), name


def test_weights_are_in_the_hub_layout_that_vllm_loads():
    with safe_open(BUNDLED_MODEL_DIR / "model.safetensors", "pt") as f:
        names = list(f.keys())
    tower = [n for n in names if n.startswith("model.vision_tower.")]
    assert tower and all(n.startswith("model.vision_tower.vision_model.") for n in tower)
    assert any(n.startswith("model.layerwise_projectors.3.qformer.") for n in names)
    assert any(n.startswith("model.spatial_projectors.3.qformer.") for n in names)


def test_sizes_obey_vllm_port_constraints():
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    vision, text, qformer = config["vision_config"], config["text_config"], config["qformer_config"]
    assert vision["hidden_size"] % 64 == 0
    assert qformer["num_hidden_layers"] == 1 and qformer["intermediate_size"] == 3072
    assert qformer["hidden_size"] == qformer["encoder_hidden_size"] == vision["hidden_size"]
    assert qformer["num_attention_heads"] == vision["hidden_size"] // 64
    assert text["hidden_size"] // text["num_attention_heads"] == 64
    assert config["architectures"] == ["Granite4VisionForConditionalGeneration"]


def test_anyres_pinpoints_give_several_grid_shapes():
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    tile = config["vision_config"]["image_size"]
    grids = {(h // tile, w // tile) for h, w in config["image_grid_pinpoints"]}
    assert len(grids) >= 6 and (1, 1) in grids and (2, 2) in grids


def test_checkpoint_is_small():
    total = sum(p.stat().st_size for p in BUNDLED_MODEL_DIR.iterdir())
    assert total < 25 * 1024 * 1024


@pytest.fixture(scope="module")
def processor():
    return AutoProcessor.from_pretrained(BUNDLED_MODEL_DIR)


def test_tokenizer_is_byte_level_and_round_trips_anything(processor):
    tokenizer = processor.tokenizer
    for text in ["What colour is the circle?", "naïve café 東京 🙂", "  spaces\tand\nlines  ", "x" * 50]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    for token in (END_OF_TEXT, START_OF_ROLE, END_OF_ROLE, IMAGE):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1


def test_image_token_id_matches_config(processor):
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    assert processor.tokenizer.convert_tokens_to_ids(IMAGE) == config["image_token_index"]
    assert config["text_config"]["vocab_size"] >= len(processor.tokenizer)


def test_chat_template_is_granite_style(processor):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Text only"},
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|start_of_role|>user<|end_of_role|><image>\nHi?<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>Hello.<|end_of_text|>\n"
        "<|start_of_role|>user<|end_of_role|>Text only<|end_of_text|>\n"
        "<|start_of_role|>assistant<|end_of_role|>"
    )
