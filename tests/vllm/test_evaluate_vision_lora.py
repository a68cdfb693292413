"""A dataset run ``vllm:vision-lora=merged`` against ``vllm`` (native: the vision LoRA per image
request) on the layout checkpoint: the same greedy tokens on every row, in vLLM's CPU build.

The two arms are two in-process engines: native serves the base with the LoRA as each image
request's ``lora_request``; merged serves a float32 copy with ``W += s * B @ A``. The check is
independent of either: token ids compared row by row, and the native arm must differ from the
base language model (``vision-lora=off``, answered by transformers here) on image rows, so "the
same tokens" cannot come from both arms dropping the LoRA.
"""

import pytest

from g4v.conversation import Message, SamplingSettings
from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval
from g4v.paths import VLORA_MODEL_DIR

LAYOUT = str(VLORA_MODEL_DIR)
ROWS, TOKENS = 16, 8


@pytest.fixture(scope="module")
def merged_vs_native(tmp_path_factory, layout_engine):
    """Arm A starts its engine as a run does (a merged arm without LoRA slots); arm B, native, is the
    session's native engine, the one a run would start (LoRA slots for the vision LoRA), reused."""
    native = ArmSpec("vllm", LAYOUT)
    config = EvalConfig(a=ArmSpec("vllm", LAYOUT, vision_lora="merged"), b=native,
                        data=str(BUNDLED_DATASET), limit=ROWS, seed=1, max_new_tokens=TOKENS)
    return run_eval(config, tmp_path_factory.mktemp("merged-vs-native"),
                    reuse={native.engine_key(): layout_engine("native")})


def test_merged_and_native_agree_on_every_row(merged_vs_native):
    summary, rows = merged_vs_native.summary, merged_vs_native.rows
    assert summary.n == ROWS and summary.n_errors == 0 and summary.complete
    assert all(row.agree and row.answer_a == row.answer_b for row in rows)
    assert summary.agreement == 1.0
    assert summary.arms.a.label.endswith("[vision LoRA merged]")


def test_the_native_arm_is_not_the_base_language_model(merged_vs_native):
    from g4v.engines.hf import TransformersEngine

    base = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora="off")
    from g4v.evaluate.data import Columns, open_dataset

    dataset = open_dataset(str(BUNDLED_DATASET), Columns())
    by_id = {dataset.sample(i).sample_id: dataset.sample(i) for i in range(len(dataset))}
    settings = SamplingSettings(max_new_tokens=TOKENS, temperature=0)
    differ = sum(base.generate([Message("user", row.prompt, list(by_id[row.sample_id].images))], settings).text
                 != row.answer_b for row in merged_vs_native.rows)
    assert differ >= ROWS // 4
