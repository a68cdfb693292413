"""The demo adapter on vLLM: side by side equals separate per-request LoRA runs, and the merged
checkpoint (``python -m g4v merge-lora``) answers through vLLM with the same greedy tokens as vLLM's
per-request LoRA on the base model."""

import pytest
from g4v_cases import CASES, GREEDY

from g4v.conversation import SamplingSettings
from g4v.demo.adapter import ADAPTER_NAME

pytestmark = pytest.mark.vllm

SAMPLED = SamplingSettings(max_new_tokens=24, temperature=0.8, top_p=0.9, seed=3)
CHAT = CASES["grid_square"]


@pytest.fixture(scope="module")
def demo_engine(vllm_engine):
    """The session's vLLM engine with the demo adapter registered the way the app does it."""
    from g4v.lora.activation import activate_adapter

    activate_adapter(vllm_engine, ADAPTER_NAME)
    return vllm_engine


@pytest.fixture(scope="module")
def merged_engine(tmp_path_factory):
    """vLLM on the merged checkpoint (no LoRA support needed), started once for this module."""
    from g4v.engines.vllm_engine import VLLMEngine
    from g4v.engines.vllm_settings import VLLMSettings
    from g4v.lora.merge import merge_lora
    from g4v.paths import BUNDLED_MODEL_DIR

    out = tmp_path_factory.mktemp("merged") / "demo-merged"
    merge_lora(str(BUNDLED_MODEL_DIR), ADAPTER_NAME, out)
    engine = VLLMEngine(str(out), VLLMSettings(enable_lora=False))
    try:
        yield engine
    finally:
        engine.close()


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_side_by_side_equals_separate_runs(demo_engine, settings):
    from g4v.lora.side_by_side import stream_side_by_side

    final = list(stream_side_by_side(demo_engine, CHAT, settings, ADAPTER_NAME))[-1]
    assert final.base_done and final.adapter_done
    assert final.base == demo_engine.generate(CHAT, settings).text
    assert final.adapter == demo_engine.generate(CHAT, settings, adapter=ADAPTER_NAME).text
    assert final.base != final.adapter


def test_side_by_side_concurrent(demo_engine):
    """Base and adapter submitted together, with a second adapter loaded. vLLM CPU 0.32 reads base
    tokens' LoRA slot -1 as the last slot; the engine keeps that slot free (docs/benchmarks.md)."""
    from g4v.lora.side_by_side import stream_side_by_side

    final = list(stream_side_by_side(demo_engine, CHAT, GREEDY, ADAPTER_NAME, concurrent=True))[-1]
    assert final.base == demo_engine.generate(CHAT, GREEDY).text
    assert final.adapter == demo_engine.generate(CHAT, GREEDY, adapter=ADAPTER_NAME).text


@pytest.mark.parametrize("case", ["grid_square", "grid_wide", "text_only"])
def test_merged_greedy_tokens_equal_per_request_lora(demo_engine, merged_engine, case):
    per_request = demo_engine.generate(CASES[case], GREEDY, adapter=ADAPTER_NAME)
    merged = merged_engine.generate(CASES[case], GREEDY)
    assert merged.token_ids == per_request.token_ids
    assert per_request.token_ids != demo_engine.generate(CASES[case], GREEDY).token_ids  # the adapter matters
