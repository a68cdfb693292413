"""The port inspector's vision LoRA audit (:mod:`g4v.port.lora_audit`) on the layout checkpoint,
without vLLM: which serving arguments make the two sides different models, one line each. The
comparison under each of them, with vLLM really started, is tests/vllm/test_port_diff_vision_lora.py."""

import pytest

from g4v.engines.vision_lora import find_vision_lora
from g4v.errors import G4VError
from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR
from g4v.port import lora_audit

LORA = find_vision_lora(str(VLORA_MODEL_DIR))
RECIPE = {"enable_lora": True, "max_lora_rank": 16, "default_mm_loras": {"image": str(VLORA_MODEL_DIR)}}


def test_the_recipe_serves_the_lora_to_image_requests():
    assert LORA.rank == 16  # the layout checkpoint's adapter (adapter_config.json)
    assert lora_audit.recipe(LORA, "native") == RECIPE
    assert lora_audit.recipe(LORA, "merged") == lora_audit.recipe(LORA, "off") == {}
    for transformers in ("native", "merged"):
        for vllm, serving in (("native", RECIPE), ("merged", {})):
            assert lora_audit.findings(LORA, transformers, vllm, serving) == []
    assert lora_audit.findings(LORA, "off", "off", {}) == []  # the base against the base: one model


@pytest.mark.parametrize("transformers, vllm, serving, start", [
    ("off", "native", RECIPE, "transformers does not apply the checkpoint's vision LoRA (vision-lora=off)"),
    ("native", "off", {}, "vLLM does not apply the checkpoint's vision LoRA (vision-lora=off)"),
    ("native", "native", {}, "vLLM does not apply the checkpoint's vision LoRA (enable_lora is off)"),
    ("merged", "native", {"enable_lora": True, "max_lora_rank": 16},
     "vLLM does not apply the checkpoint's vision LoRA (default_mm_loras has no image entry"),
    ("native", "native", {"hf_overrides": {"adapter_path": str(VLORA_MODEL_DIR)}},
     "hf_overrides adapter_path is read by no code in vLLM 0.32's granite4_vision"),
    ("native", "native", {**RECIPE, "max_lora_rank": 8}, "max_lora_rank 8 is below the vision LoRA's rank 16"),
])
def test_each_mistake_is_one_line_with_what_to_do(transformers, vllm, serving, start):
    found = lora_audit.findings(LORA, transformers, vllm, serving)
    assert any(line.startswith(start) for line in found), found
    assert all("\n" not in line and ": " in line for line in found)
    assert lora_audit.summary(LORA, transformers, vllm, serving)["ok"] is False


def test_a_rank_vllm_refuses_is_not_started_with_the_lora():
    assert lora_audit.runnable(LORA, {**RECIPE, "max_lora_rank": 8})["default_mm_loras"] is None
    assert lora_audit.runnable(LORA, RECIPE) == RECIPE


def test_adapter_path_is_flagged_on_a_merged_checkpoint_too():
    lora = find_vision_lora(str(TRAINED_MODEL_DIR))
    assert lora is None
    [line] = lora_audit.findings(lora, "off", "off", {"hf_overrides": {"adapter_path": "x"}})
    assert line.startswith("hf_overrides adapter_path")


@pytest.mark.parametrize("text, words", [
    ("[1]", "JSON object of vLLM's LoRA arguments"), ("{", "must be a JSON object"),
    ('{"lora": 1}', "'lora' is not one of"), ('{"enable_lora": 1}', "enable_lora must be true or false"),
])
def test_bad_serving_text_is_one_line(text, words):
    with pytest.raises(G4VError, match=words):
        lora_audit.parse_serving(text)
