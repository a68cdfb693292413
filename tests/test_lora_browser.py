"""The LoRA tab on the layout checkpoint in headless Chromium: the three models by name, the
adapter's entry named as its kind runs it, each column's answer equal to a reference checkpoint
built without g4v's LoRA code, the vision model's answer equal to Chat's, and the one line that
says which model and vision LoRA mode Chat and the inspectors run."""

import re

import pytest
from tests.browser import browser_page
from tests.conftest import running_app
from tests.vision_lora_cases import IMAGE_PROMPTS, base_copy, merged_copy

from g4v.paths import FRENCH_ADAPTER_DIR, VLORA_MODEL_DIR

PROMPT = IMAGE_PROMPTS[0][0].text  # the three models answer it differently (tests/test_lora_models.py)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from g4v.conversation import Message, SamplingSettings
    from g4v.demo.layout_adapters import build_layout_adapters
    from g4v.engines.hf import TransformersEngine

    image = tmp_path_factory.mktemp("image") / "picture.png"
    IMAGE_PROMPTS[0][0].images[0].save(image)
    folders = {"base": base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base")),
               "vision": merged_copy(VLORA_MODEL_DIR, [VLORA_MODEL_DIR], tmp_path_factory.mktemp("vision")),
               "french": merged_copy(VLORA_MODEL_DIR, [VLORA_MODEL_DIR, FRENCH_ADAPTER_DIR], tmp_path_factory.mktemp("fr"))}
    messages = [Message("user", PROMPT, [IMAGE_PROMPTS[0][0].images[0]])]
    answers = {name: TransformersEngine(str(folder), device="cpu", dtype="float32")
               .generate(messages, SamplingSettings(max_new_tokens=48)).text for name, folder in folders.items()}
    assert len(set(answers.values())) == 3, answers
    return {"image": str(image), "answers": answers,
            "adapters": build_layout_adapters(tmp_path_factory.mktemp("built") / "out")["adapters"]}


def choose(page, box: str, label: str) -> None:
    page.locator(f"{box} input").click()
    page.locator(f"{box} [role=option]", has_text=label).filter(visible=True).first.click()
    page.wait_for_function("([box, label]) => document.querySelector(`${box} input`).value === label",
                           arg=[box, label])


def options(page, box: str) -> list[str]:
    page.locator(f"{box} input").click()
    shown = [o.strip().splitlines()[-1] for o in page.locator(f"{box} [role=option]").all_inner_texts()]  # after ✓
    page.keyboard.press("Escape")
    return shown


def run_side_by_side(page) -> tuple[str, str]:
    for box in ("#lora-left-answer", "#lora-right-answer"):
        page.evaluate(f"() => {{ const t = document.querySelector('{box} textarea'); t.value = ''; }}")
    page.get_by_role("button", name="Run side by side").click()
    page.wait_for_function("() => ['#lora-left-answer', '#lora-right-answer'].every(b => "
                           "document.querySelector(`${b} textarea`).value.trim().length > 0)", timeout=120_000)
    page.wait_for_timeout(1500)  # both streams finish
    return tuple(page.locator(f"{box} textarea").input_value() for box in ("#lora-left-answer", "#lora-right-answer"))


def test_the_lora_tab_shows_the_three_models_with_the_right_answers(setup, output_dir):
    answers = setup["answers"]
    with running_app("--model", str(VLORA_MODEL_DIR), "--backend", "hf", "--adapters-dir", str(setup["adapters"])) as url, \
            browser_page(height=1600) as page:
        page.goto(url)
        page.wait_for_selector("#chat-engine-line")
        assert re.search(r"runs the vision model on image prompts, the base language model on text-only ones · "
                         r"vision LoRA: native, rank 16, 70 modules", page.inner_text("#chat-engine-line"))

        # Chat: the picture and the question, answered by the vision model
        page.locator("#chat-box input[type=file]").set_input_files(setup["image"])
        page.locator("#chat-box textarea").fill(PROMPT)
        page.wait_for_timeout(500)
        page.keyboard.press("Enter")
        page.wait_for_function("() => { const m = document.querySelectorAll('[data-testid=\"bot\"]');"
                               " return m.length && m[m.length - 1].innerText.trim().length > 0 }", timeout=120_000)
        page.wait_for_timeout(1500)
        chat_answer = page.locator("[data-testid='bot']").last.inner_text().strip()
        assert chat_answer == answers["vision"].strip()

        page.get_by_role("tab", name="Deepstack").click()
        assert "runs the vision model · vision LoRA: native" in page.inner_text("#deepstack-engine-line")

        page.get_by_role("tab", name="LoRA").click()
        page.locator("#lora-image input[type=file]").set_input_files(setup["image"])
        page.locator("#lora-prompt textarea").fill(PROMPT)
        page.locator("#lora-adapter input").click()
        page.get_by_role("option", name=re.compile("^french-on-vision-model ")).click()
        page.keyboard.press("Escape")
        page.wait_for_function("() => document.querySelector('#lora-right-answer').innerText"
                               ".includes('vision model + french-on-vision-model')")
        assert options(page, "#lora-left") == ["base language model", "vision model",
                                              "vision model + french-on-vision-model"]
        left, right = run_side_by_side(page)
        assert (left.strip(), right.strip()) == (answers["vision"].strip(), answers["french"].strip())
        assert left.strip() == chat_answer  # the vision model's answer is Chat's

        # the replacement, against the base language model
        page.locator("#lora-adapter input").click()
        page.get_by_role("option", name=re.compile("^french-replaces-vision-lora ")).click()
        page.wait_for_timeout(1000)
        choose(page, "#lora-left", "base language model")
        choose(page, "#lora-right", "french-replaces-vision-lora (replaces the vision LoRA)")
        assert "french-replaces-vision-lora (replaces the vision LoRA)" in page.inner_text("#lora-right-answer")
        left, right = run_side_by_side(page)
        assert (left.strip(), right.strip()) == (answers["base"].strip(), answers["french"].strip())
        page.screenshot(path=str(output_dir / "lora-layout-three-models.png"), full_page=True)
