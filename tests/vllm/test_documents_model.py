"""The documents checkpoint (issue 21) through vLLM: the same greedy answers as the
transformers engine, text for text, on held-out charts and key-value pictures (so vLLM's document
scores equal transformers'; ``python -m g4v.demo eval --backend vllm`` runs all 300 of each)."""

from g4v.paths import DOCUMENTS_MODEL_DIR

N_ITEMS = 6


def test_vllm_answers_the_document_tasks_as_transformers_does():
    from g4v.demo.documents_data import held_out_items
    from g4v.demo.documents_eval import engine_answers, score
    from g4v.engines.hf import TransformersEngine
    from g4v.engines.vllm_engine import VLLMEngine

    items = held_out_items(N_ITEMS)
    reference = engine_answers(TransformersEngine(str(DOCUMENTS_MODEL_DIR), device="cpu", dtype="float32"), items)
    engine = VLLMEngine(str(DOCUMENTS_MODEL_DIR))
    try:
        replies = engine_answers(engine, items, workers=4)
    finally:
        engine.close()
    assert replies == reference
    scores = score(items, replies)
    assert scores.charts == scores.kvp == N_ITEMS and scores.chart_cells > 0.5  # a reading model, not noise
