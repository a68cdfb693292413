"""No string from a file, a dataset, a model or an adapter is rendered as markup (the red team's S4).

One app whose every outside string carries HTML and Markdown: the model's folder name, an adapter's
recorded base model (an image and a link to a local listener, as the red team planted) and another
adapter's folder name, a data folder's name, a dataset row's picture name and prompt, a chat
message. The page is read in Chromium: each shows as written, no element is made of it, and the
listener is never called.
"""

import json
import re
import shutil

import pytest

from g4v.paths import ASSETS_DIR, BUNDLED_MODEL_DIR, EXAMPLES_DIR
from tests.browser import browser_page
from tests.conftest import running_app
from tests.test_app_bad_input import listener

#: A name a folder may have (no slash) that is an image with a script, as the red team named one.
FOLDER_TAG = "<img src=x onerror=alert(1)>"
#: What a page must not make of any outside string.
ELEMENTS = "img, a, script, em, strong"


def no_elements(page, selector: str) -> None:
    """``selector`` shows text only: no element made of a planted string inside it."""
    made = page.evaluate("([s, e]) => [...document.querySelectorAll(s)].flatMap(n => [...n.querySelectorAll(e)])"
                         ".map(n => n.outerHTML).filter(h => /beacon|onerror|planted/.test(h))", [selector, ELEMENTS])
    assert made == [], made


def choose(page, box: str, pattern: str) -> None:
    page.locator(f"{box} input").click()
    page.get_by_role("option", name=re.compile(pattern)).first.click()
    page.keyboard.press("Escape")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The app's folders, every name and text in them carrying markup; and the listener's hits."""
    root = tmp_path_factory.mktemp("planted")
    with listener() as (address, hits):
        model = root / FOLDER_TAG
        shutil.copytree(BUNDLED_MODEL_DIR, model)
        base = f'<img src="{address}/beacon.png"> <a href="{address}/planted">click</a> *planted*'
        adapters = root / "adapters"
        for name, recorded in (("planted-base", base), (FOLDER_TAG, "another/model")):
            shutil.copytree(ASSETS_DIR / "adapters" / "demo-lora", adapters / name)
            config = json.loads((adapters / name / "adapter_config.json").read_text())
            (adapters / name / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": recorded}))
        dataset = root / "data" / FOLDER_TAG
        dataset.mkdir(parents=True)
        shutil.copy(EXAMPLES_DIR / "shapes-tall.png", dataset / "shape.png")
        rows = [{"file_name": "shape.png", "prompt": f'What is <img src="{address}/beacon.png"> **planted**?'},
                {"file_name": "<b>planted</b>.png", "prompt": "What colour?"}]
        (dataset / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        with running_app("--model", str(model), "--adapters-dir", str(adapters), "--data-dir",
                         str(root / "data")) as url:
            yield {"url": url, "address": address, "hits": hits, "base": base}
        assert hits == [], hits  # nothing planted was fetched


def test_the_models_folder_name_shows_as_written(planted):
    with browser_page(height=1200) as page:
        page.goto(planted["url"])
        page.wait_for_selector("#chat-engine-line")
        for box in ("#model-banner", "#chat-engine-line"):
            assert FOLDER_TAG in page.inner_text(box)
            no_elements(page, box)


def test_an_adapters_recorded_base_and_its_folder_name_show_as_written_in_the_lora_tab(planted):
    with browser_page(height=1400) as page:
        page.goto(planted["url"])
        page.get_by_role("tab", name="LoRA").click()
        for name, recorded in (("planted-base", planted["base"]), (FOLDER_TAG, "another/model")):
            choose(page, "#lora-adapter", "^" + re.escape(name) + " ")
            page.wait_for_function("(text) => document.querySelector('#lora-base-warning').innerText.includes(text)",
                                   arg=recorded, timeout=30_000)
            line = page.inner_text("#lora-base-warning")
            assert f"warning: adapter {name} was made for {recorded}" in line, line
            no_elements(page, "#lora-base-warning")


def test_a_dataset_folder_its_picture_names_and_prompts_show_as_written_in_evaluate_and_chat(planted):
    with browser_page(width=1400, height=1600) as page:
        page.goto(planted["url"])
        page.get_by_role("tab", name="Evaluate").click()
        choose(page, "#eval-dataset", re.escape(FOLDER_TAG))
        page.wait_for_function("() => document.querySelector('#eval-dataset-info').innerText.includes('2 rows')")
        assert f"2 rows in data folder: {FOLDER_TAG}." in page.inner_text("#eval-dataset-info")
        no_elements(page, "#eval-dataset-info")
        choose(page, "#eval-arm-b", "^same as arm A")
        page.locator("#eval-limit input").fill("0")
        page.locator("#eval-run").click()
        page.wait_for_function("() => /Finished|Stopped/.test(document.querySelector('#eval-status').innerText)",
                               timeout=300_000)
        table = page.inner_text("#eval-samples")
        assert "<b>planted</b>.png" in table and '**planted**' in table, table
        for box in ("#eval-samples", "#eval-status"):
            no_elements(page, box)

        page.get_by_role("tab", name="Chat").click()
        message = f'Is <img src="{planted["address"]}/beacon.png"> a *planted* <a href="x">link</a>?'
        page.locator("#chat-box textarea").fill(message)
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelectorAll('[data-testid=\"bot\"]').length > 0", timeout=120_000)
        page.wait_for_timeout(1000)
        assert message in page.locator("[data-testid='user']").last.inner_text()
        no_elements(page, "#chatbot")
