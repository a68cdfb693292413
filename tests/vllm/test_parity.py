"""Greedy tokens from vLLM (in process, and its server through the remote engine) equal the
transformers engine's, token for token, in the same environment."""

import pytest
from g4v_cases import CASES, CHUNK_TOKENS, GREEDY, GRID_SIZES

pytestmark = pytest.mark.vllm


def anyres_grid(processor, width: int, height: int) -> tuple[int, int]:
    """(rows, columns) of tiles the processor picks for a picture of this size."""
    from transformers.image_processing_utils import select_best_resolution

    image_processor = processor.image_processor
    tile = image_processor.crop_size["height"]
    best_height, best_width = select_best_resolution((height, width), image_processor.image_grid_pinpoints)
    return best_height // tile, best_width // tile


def test_cases_cover_three_grid_shapes(hf_engine):
    grids = {anyres_grid(hf_engine.processor, w, h) for w, h in GRID_SIZES.values()}
    assert len(grids) == 3, grids


@pytest.mark.parametrize("case", sorted(CASES))
def test_in_process_engine_matches_transformers(case, vllm_engine, reference):
    expected = reference(case)
    got = vllm_engine.generate(CASES[case], GREEDY)
    assert got.token_ids == expected.token_ids
    assert got.prompt_tokens == expected.prompt_tokens
    assert got.finish_reason == expected.finish_reason


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_through_remote_engine_matches_transformers(case, remote_engine, reference):
    expected = reference(case)
    got = remote_engine.generate(CASES[case], GREEDY)
    assert got.token_ids == expected.token_ids
    assert got.prompt_tokens == expected.prompt_tokens


def test_chunked_prefill_splits_image_tokens(vllm_engine, hf_engine, reference):
    """The in-process engine's prefill budget is smaller than one image's feature tokens, so the
    parity above was reached with every image split across several prefill steps."""
    image_token = hf_engine.model.config.image_token_index
    inputs = hf_engine.prepare_inputs(CASES["grid_wide"])
    image_tokens = int((inputs["input_ids"] == image_token).sum())
    assert vllm_engine.arguments["max_num_batched_tokens"] == CHUNK_TOKENS
    assert image_tokens > 2 * CHUNK_TOKENS
    assert vllm_engine.generate(CASES["grid_wide"], GREEDY).token_ids == reference("grid_wide").token_ids


def test_text_after_image_equals_fresh_engine(vllm_engine, reference):
    """No deepstack features or other image state leak into the next, text-only request."""
    vllm_engine.generate([CASES["grid_tall"][0]], GREEDY)
    after_image = vllm_engine.generate(CASES["text_only"], GREEDY)
    assert after_image.token_ids == vllm_engine.fresh_text_only.token_ids
    assert after_image.token_ids == reference("text_only").token_ids


def test_text_batched_with_image_equals_fresh_engine(vllm_engine):
    """The same when the text-only request shares a batch with an image request."""
    from threading import Thread

    results = {}

    def run(name, messages):
        results[name] = vllm_engine.generate(messages, GREEDY)

    threads = [Thread(target=run, args=("image", [CASES["grid_square"][0]])),
               Thread(target=run, args=("text", CASES["text_only"]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["text"].token_ids == vllm_engine.fresh_text_only.token_ids


def test_seeded_sampling_repeats(vllm_engine):
    """Sampling with a seed is reproducible per request (vLLM seeds each request on its own)."""
    from g4v.conversation import SamplingSettings

    settings = SamplingSettings(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    first = vllm_engine.generate(CASES["grid_square"], settings)
    second = vllm_engine.generate(CASES["grid_square"], settings)
    other_seed = vllm_engine.generate(CASES["grid_square"], SamplingSettings(16, 1.0, 0.9, seed=8))
    assert first.token_ids == second.token_ids
    assert first.token_ids != other_seed.token_ids
