"""The LoRA comparison's models by name on the layout checkpoint (base language model, vision
model, vision model + adapter, or the adapter in place of the vision LoRA), through ``lora-diff``
in process; each side's answer against a reference built without g4v's LoRA code, and the vision
model's answer against Chat's. A checkpoint without a vision LoRA has two models, not a fake third."""

import json

import pytest
from tests.cli import run_cli as run_main
from tests.vision_lora_cases import IMAGE_PROMPTS, base_copy, merged_copy

from g4v.demo.layout_adapters import ON_VISION_MODEL_NAME, REPLACEMENT_NAME, build_layout_adapters
from g4v.paths import FRENCH_ADAPTER_DIR, TRAINED_MODEL_DIR, VLORA_MODEL_DIR

pytestmark = pytest.mark.slow
LAYOUT = str(VLORA_MODEL_DIR)
PROMPT = IMAGE_PROMPTS[0][0].text  # a colour question on which the three models answer differently
TOKENS = "6"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    """The held-out picture of that question, as a file (PNG: the same pixels)."""
    path = str(tmp_path_factory.mktemp("image") / "picture.png")
    IMAGE_PROMPTS[0][0].images[0].save(path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_layout_adapters(tmp_path_factory.mktemp("layout-adapters") / "out")


@pytest.fixture(scope="module")
def references(tmp_path_factory, image):
    """Greedy answers of plain checkpoints: the base alone, the vision model, it + French."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.engines.hf import TransformersEngine
    from g4v.images import open_image

    folders = {"base": base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base")),
               "vision": merged_copy(VLORA_MODEL_DIR, [VLORA_MODEL_DIR], tmp_path_factory.mktemp("vision")),
               "french": merged_copy(VLORA_MODEL_DIR, [VLORA_MODEL_DIR, FRENCH_ADAPTER_DIR], tmp_path_factory.mktemp("fr"))}
    messages = [Message("user", PROMPT, [open_image(image)])]
    settings = SamplingSettings(max_new_tokens=int(TOKENS))
    answers = {name: TransformersEngine(str(folder), device="cpu", dtype="float32").generate(messages, settings).text
               for name, folder in folders.items()}
    assert len(set(answers.values())) == 3, f"the three models must answer differently here: {answers}"
    return answers


def lora_diff(image, *flags, model=LAYOUT, adapters=None):
    argv = ["lora-diff", "--model", model, "--image", image, "--prompt", PROMPT, "--max-new-tokens", TOKENS,
            "--json", *flags]
    if adapters is not None:
        argv += ["--adapters-dir", str(adapters)]
    return run_main(*argv)


def test_default_is_the_vision_model_against_it_with_the_adapter(image, built, references):
    done = lora_diff(image, "--adapter", ON_VISION_MODEL_NAME, adapters=built["adapters"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["left"], data["right"]) == ("vision model", f"vision model + {ON_VISION_MODEL_NAME}")
    assert (data["base_text"], data["adapter_text"]) == (references["vision"], references["french"])
    assert "vision LoRA: native, rank 16, 70 modules" in done.stderr


def test_the_base_language_model_and_a_replacement(image, built, references):
    done = lora_diff(image, "--left", "base", "--right", "adapter", "--adapter", REPLACEMENT_NAME, adapters=built["adapters"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["left"], data["right"]) == ("base language model", f"{REPLACEMENT_NAME} (replaces the vision LoRA)")
    assert (data["base_text"], data["adapter_text"]) == (references["base"], references["french"])


def test_base_against_vision_needs_no_adapter_and_the_vision_model_answers_as_chat(image, references):
    done = lora_diff(image, "--left", "base", "--right", "vision")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["base_text"], data["adapter_text"]) == (references["base"], references["vision"])
    chat = run_main("chat", "--backend", "hf", "--model", LAYOUT, "--image", image, "--max-new-tokens", TOKENS, PROMPT)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.strip() == data["adapter_text"].strip()


def test_a_checkpoint_without_a_vision_lora_has_two_models(image):
    done = lora_diff(image, "--left", "base", "--right", "vision", model=str(TRAINED_MODEL_DIR))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: there is no base language model to compare: this checkpoint has no vision LoRA (its weights are the "
        "vision model); the models here are 'vision' and 'adapter'")


def test_merged_mode_has_two_models_and_refuses_a_replacement(image, built):
    done = lora_diff(image, "--vision-lora", "merged", "--left", "base", "--right", "vision")
    assert done.returncode == 1 and "its vision LoRA is merged (--vision-lora merged)" in done.stderr
    assert "Traceback" not in done.stderr
    done = lora_diff(image, "--vision-lora", "merged", "--adapter", REPLACEMENT_NAME, adapters=built["adapters"])
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith(
        f"error: adapter {REPLACEMENT_NAME} replaces the vision LoRA, which is merged")


def test_a_model_compared_with_itself_is_one_line(image):
    """Left and right both the same model compared its answer with itself ("the greedy choices
    never differ", an empty KL axis); now one line naming it, before anything runs."""
    done = lora_diff(image, "--left", "vision", "--right", "vision", model=str(TRAINED_MODEL_DIR))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "error: both sides are the model (vision): choose two different models to compare")


def test_an_adapter_side_without_an_adapter_is_one_line(image):
    done = lora_diff(image)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith("error: --adapter is needed")


def test_chat_and_the_inspectors_say_which_model_and_mode_they_run(hf_engine):
    from g4v.engines.hf import TransformersEngine
    from webapp.common import engine_line

    assert engine_line(hf_engine) == "Model: `granite4-vision-tiny` (hf), no vision LoRA (its weights are the vision model)"
    merged = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora="merged")
    assert engine_line(merged, inspector=True) == ("Model: `granite4-vision-tiny-vlora` (hf) · runs the vision model (LoRA "
                                                   "merged at load) · vision LoRA: merged, rank 16, 70 modules")
    off = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora="off")
    assert "runs the base language model (vision LoRA off) · vision LoRA: off" in engine_line(off)
