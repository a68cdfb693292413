"""On the layout checkpoint in native mode the inspectors run the vision model, as Chat does on an
image prompt: Deepstack (with an ablation), Attribution and the teacher-forced scoring that the
LoRA token diff and Evaluate's rows use each give the numbers of a plain checkpoint holding the
vision model (merged by the test's own arithmetic), not the base language model's; the scoring of
a text-only prompt gives the base language model's, as its generation does."""

import pytest
import torch
from tests.vision_lora_cases import IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, merged_copy

from g4v.engines.hf import TransformersEngine
from g4v.paths import VLORA_MODEL_DIR

pytestmark = pytest.mark.slow
PROMPT = IMAGE_PROMPTS[0]  # the base language model answers it otherwise


def engine(folder, mode=None):
    return TransformersEngine(str(folder), device="cpu", dtype="float32", vision_lora=mode)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return {"native": engine(VLORA_MODEL_DIR, "native"),
            "vision": engine(merged_copy(VLORA_MODEL_DIR, [VLORA_MODEL_DIR], tmp_path_factory.mktemp("vision"))),
            "base": engine(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base")))}


def test_deepstack_and_its_ablation_run_the_vision_model(engines, tmp_path):
    from g4v.inspect.run import run_inspection

    def inspect(name):
        return run_inspection(engines[name], PROMPT[0].images[0], PROMPT[0].text, ablate=["deepstack0"],
                              max_new_tokens=4, out_dir=tmp_path / name, make_zip=False)

    native, vision, base = inspect("native"), inspect("vision"), inspect("base")
    assert native.outcome.continuation_ids == vision.outcome.continuation_ids != base.outcome.continuation_ids
    torch.testing.assert_close(native.outcome.next_token_probs, vision.outcome.next_token_probs, rtol=1e-4, atol=1e-5)
    assert native.ablation.after.continuation_ids == vision.ablation.after.continuation_ids
    assert native.ablation.kl_divergence == pytest.approx(vision.ablation.kl_divergence, rel=1e-3, abs=1e-5)


def test_attribution_runs_the_vision_model(engines, tmp_path):
    from g4v.attribution.run import AttributionSettings, run_attribution

    settings = AttributionSettings(lens=False, seeds=1, fractions=(0.0, 0.5))
    native = run_attribution(engines["native"], PROMPT[0].images[0], PROMPT[0].text, settings, out_dir=tmp_path / "n")
    vision = run_attribution(engines["vision"], PROMPT[0].images[0], PROMPT[0].text, settings, out_dir=tmp_path / "v")
    base = run_attribution(engines["base"], PROMPT[0].images[0], PROMPT[0].text, settings, out_dir=tmp_path / "b")
    assert native.to_dict()["answer"]["ids"] == vision.to_dict()["answer"]["ids"] != base.to_dict()["answer"]["ids"]
    assert native.to_dict()["answer"] == vision.to_dict()["answer"]


def test_teacher_forced_scoring_runs_the_model_the_prompt_gets(engines):
    """Image prompt: the vision model; text-only prompt: the base language model (as ``generate``)."""
    from g4v.conversation import SamplingSettings
    from g4v.model.scoring import answer_logits

    for prompt, reference in ((PROMPT, "vision"), (TEXT_PROMPTS[0], "base")):
        tokens = engines[reference].generate(prompt, SamplingSettings(max_new_tokens=4)).token_ids
        torch.testing.assert_close(answer_logits(engines["native"], prompt, tokens, None),
                                   answer_logits(engines[reference], prompt, tokens, None), rtol=1e-4, atol=1e-4)
