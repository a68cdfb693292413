"""A LoRA adapter served by vLLM per request: the adapter's answer equals transformers with the
adapter attached (PEFT), the base answer equals transformers without it, also side by side."""

import threading

import pytest
from g4v_cases import ADAPTER, CASES, GREEDY, make_lm_lora

pytestmark = pytest.mark.vllm

CASE = CASES["grid_wide"]


@pytest.fixture(scope="session")
def lora_reference(lora_engine, hf_engine):
    adapter = lora_engine.generate(CASE, GREEDY, adapter=ADAPTER)
    base = hf_engine.generate(CASE, GREEDY)
    assert adapter.token_ids != base.token_ids, "the test adapter must change the answer"
    return {"adapter": adapter, "base": base}


def together(engine, requests: dict) -> dict:
    """Run ``{key: adapter}`` requests at once, as a side-by-side view does."""
    barrier = threading.Barrier(len(requests))
    results = {}

    def run(key, adapter):
        barrier.wait()
        results[key] = engine.generate(CASE, GREEDY, adapter=adapter)

    threads = [threading.Thread(target=run, args=item) for item in requests.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("backend", ["in_process", "remote"])
def test_adapter_and_base_match_transformers(backend, request, lora_reference):
    engine = request.getfixturevalue("vllm_engine" if backend == "in_process" else "remote_engine")
    assert ADAPTER in engine.adapters()
    assert engine.generate(CASE, GREEDY, adapter=ADAPTER).token_ids == lora_reference["adapter"].token_ids
    assert engine.generate(CASE, GREEDY).token_ids == lora_reference["base"].token_ids


@pytest.mark.parametrize("backend", ["in_process", "remote"])
def test_adapter_and_base_submitted_together(backend, request, lora_reference):
    engine = request.getfixturevalue("vllm_engine" if backend == "in_process" else "remote_engine")
    results = together(engine, {"adapter": ADAPTER, "base": None})
    assert results["adapter"].token_ids == lora_reference["adapter"].token_ids
    assert results["base"].token_ids == lora_reference["base"].token_ids


def test_base_stays_exact_beside_several_adapters(vllm_engine, lora_reference, tmp_path):
    """With a second adapter loaded (so more LoRA slots are in use), a base request batched with
    adapter requests still gets the base answer (vLLM CPU's kernels read the last slot for base
    tokens; the engine keeps that slot empty, see ``adapter_capacity``)."""
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import BUNDLED_MODEL_DIR

    second = tmp_path / "second-lora"
    make_lm_lora(TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32"), second, seed=1)
    vllm_engine.register_adapter("second-lora", str(second))
    alone = vllm_engine.generate(CASE, GREEDY, adapter="second-lora")  # loads it into a slot
    for adapter in (ADAPTER, "second-lora"):
        results = together(vllm_engine, {"adapter": adapter, "base": None})
        assert results["base"].token_ids == lora_reference["base"].token_ids
    assert results["adapter"].token_ids == alone.token_ids


def test_register_adapter_ids_are_stable(vllm_engine, lora_folder):
    first = vllm_engine._adapters[ADAPTER].lora_int_id
    vllm_engine.register_adapter(ADAPTER, lora_folder)  # same folder again: no new id
    assert vllm_engine._adapters[ADAPTER].lora_int_id == first


def test_unknown_adapter_is_a_user_error(vllm_engine, remote_engine, tmp_path):
    from g4v.errors import G4VError

    for engine in (vllm_engine, remote_engine):
        with pytest.raises(G4VError, match="unknown adapter"):
            engine.generate(CASE, GREEDY, adapter="nope")
    with pytest.raises(G4VError, match="not a LoRA adapter folder"):
        vllm_engine.register_adapter("empty", str(tmp_path))
    with pytest.raises(G4VError, match="does not serve adapter"):
        remote_engine.register_adapter("other", str(tmp_path))
