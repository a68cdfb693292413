"""transformers vs vLLM (CPU build) over the bundled dataset: the same greedy answers, token for token.

The vllm arm runs where vLLM does not import (this suite's environment): through a local
OpenAI-compatible server started from ``.venv-vllm`` (one server start for this module) and
stopped when the run ends. Where that environment is missing the run refuses in one line, and this
test fails: it is never skipped. ``python -m g4v bench eval`` runs the same pair over all 300 rows
(see docs/benchmarks.md).
"""

import pytest

from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval
from g4v.paths import TRAINED_MODEL_DIR

ROWS = 32


@pytest.fixture(scope="module")
def hf_vs_vllm(tmp_path_factory):
    from g4v.engines.hf import TransformersEngine

    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("vllm"), data=str(BUNDLED_DATASET), limit=ROWS, seed=0,
                        max_new_tokens=8)
    return run_eval(config, tmp_path_factory.mktemp("hf-vs-vllm"), reuse={ArmSpec("hf"): engine})


def test_hf_and_vllm_give_the_same_greedy_tokens(hf_vs_vllm):
    result = hf_vs_vllm
    summary = result.summary
    assert summary.n == ROWS and summary.n_errors == 0 and summary.complete
    assert summary.agreement == 1.0
    assert all(row.agree and row.first_divergence is None for row in result.rows)
    assert summary.arms.a.accuracy == summary.arms.b.accuracy
    assert summary.paired.a_only == summary.paired.b_only == 0
    assert {row.category for row in result.rows} == {"colour", "shape", "position", "count"}


def test_only_the_hf_arm_scores(hf_vs_vllm):
    result = hf_vs_vllm
    for row in result.rows:
        assert row.logprob_a_under_b is None and row.kl_mean is None  # vLLM's logits are not here
        assert row.logprob_b_under_a is not None and row.logprob_b_under_a <= 0
        assert row.image_tokens > 0

