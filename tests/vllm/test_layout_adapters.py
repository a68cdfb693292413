"""A user's adapters on the layout checkpoint in vLLM in process: the replacement natively, the
adapter on the vision model on merged weights, each token for token against transformers on the
vision model with the French adapter merged by the test's own arithmetic (tests/test_layout_adapters.py
checks the transformers engine against the same reference). The combination vLLM would run
differently (an adapter on the vision model, natively) is one line. The native engine here has
LoRA slots of rank 32 (the replacement's 24), so it starts here; the merged one is the session's."""

import pytest
from tests.vision_lora_cases import IMAGE_PROMPTS, base_copy, tokens, vision_model_plus_french

from g4v.errors import G4VError
from g4v.paths import FRENCH_ADAPTER_DIR, VLORA_MODEL_DIR

pytestmark = pytest.mark.vllm
LAYOUT = str(VLORA_MODEL_DIR)
PROMPTS = [IMAGE_PROMPTS[i] for i in (0, 2, 4, 8)]  # as in tests/test_layout_adapters.py


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from g4v.demo.layout_adapters import build_layout_adapters

    return build_layout_adapters(tmp_path_factory.mktemp("layout-adapters") / "out")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from g4v.engines.hf import TransformersEngine

    def answers(folder):
        return tokens(TransformersEngine(str(folder), device="cpu", dtype="float32"), PROMPTS)

    return {"french": answers(vision_model_plus_french(VLORA_MODEL_DIR, FRENCH_ADAPTER_DIR, tmp_path_factory.mktemp("r"))),
            "base": answers(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base")))}


def test_native_serves_the_replacement_and_refuses_the_adapter_on_the_vision_model(built, references):
    from g4v.demo.layout_adapters import ON_VISION_MODEL_NAME, REPLACEMENT_NAME
    from g4v.engines.base import WITHOUT_VISION_LORA
    from g4v.engines.vllm_engine import VLLMEngine
    from g4v.engines.vllm_settings import VLLMSettings
    from g4v.lora.activation import activate_adapter

    engine = VLLMEngine(LAYOUT, VLLMSettings(max_lora_rank=32), vision_lora="native")  # the replacement has rank 24
    try:
        replacement = activate_adapter(engine, REPLACEMENT_NAME, built["adapters"])
        assert tokens(engine, PROMPTS, adapter=replacement.name) == references["french"]
        assert tokens(engine, PROMPTS, adapter=WITHOUT_VISION_LORA) == references["base"]
        with pytest.raises(G4VError) as refused:
            activate_adapter(engine, ON_VISION_MODEL_NAME, built["adapters"])
        assert str(refused.value) == (
            f"adapter {ON_VISION_MODEL_NAME} was trained on the vision model, and vLLM in native mode would run it "
            "without the vision LoRA (one LoRA per request): use --vision-lora merged")
        assert engine.adapters() == [replacement.name]
    finally:
        engine.close()


def test_merged_serves_the_adapter_on_the_vision_model_and_refuses_the_replacement(built, references, layout_engine):
    from g4v.demo.layout_adapters import ON_VISION_MODEL_NAME, REPLACEMENT_NAME
    from g4v.lora.activation import activate_adapter

    engine = layout_engine("merged")  # the session's: vLLM's default settings, as a user's start
    stacked = activate_adapter(engine, ON_VISION_MODEL_NAME, built["adapters"])
    assert tokens(engine, PROMPTS, adapter=stacked.name) == references["french"]
    with pytest.raises(G4VError, match=f"^adapter {REPLACEMENT_NAME} replaces the vision LoRA, which is merged"):
        activate_adapter(engine, REPLACEMENT_NAME, built["adapters"])
