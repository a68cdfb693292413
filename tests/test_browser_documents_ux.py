"""The documents checkpoint's Chat in headless Chromium (one app on that checkpoint): example cards
with short labels instead of raw prompts, and a CSV answer shown once. Screenshots in
test-output/browser/."""

import json

from g4v.documents.presets import PRESETS
from g4v.paths import DOCUMENTS_MODEL_DIR, EXAMPLES_DIR
from tests.browser import browser_page
from tests.conftest import running_app

LISTED = json.loads((EXAMPLES_DIR / "examples.json").read_text())


def test_example_cards_have_short_labels_and_a_csv_answer_shows_once(output_dir):
    """Every card reads as a short label (a document example: its task and file; a question: the
    question), none as a tag or a JSON schema; a click still fills the box with the whole prompt and
    picture. The chart example's CSV answer fills the table and is not repeated as an HTML table."""
    shots = output_dir / "browser"
    shots.mkdir(exist_ok=True)
    shown = [item for item in LISTED if "model" not in item or item["model"] == DOCUMENTS_MODEL_DIR.name]
    with running_app("--model", str(DOCUMENTS_MODEL_DIR)) as url, browser_page(height=1400) as page:
        page.goto(url)
        page.wait_for_selector("#chat-examples button")
        cards = [text.strip() for text in page.locator("#chat-examples button").all_inner_texts() if text.strip()]
        assert len(cards) == len(shown), cards
        for item, card in zip(shown, cards):
            if "task" in item:
                assert card == f"{PRESETS[item['task']].label}: {item['file']}"
            else:
                assert card == item["prompt"]
            assert "{" not in card and "<" not in card and len(card) <= 60, card

        chart = next(item for item in shown if item.get("task") == "chart2csv")
        page.locator("#chat-examples button", has_text=chart["file"]).click()
        page.wait_for_function("(text) => document.querySelector('#chat-box textarea').value === text"
                               " && document.querySelector('#chat-box img') !== null", arg=chart["prompt"])
        page.wait_for_function("() => document.querySelector('#chat-task input').value == 'Chart to CSV'")
        page.locator("#chat-box textarea").focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => /Read as CSV|Could not read/"
                               ".test(document.querySelector('#chat-structured-notes').innerText)", timeout=120_000)
        assert "Read as CSV" in page.inner_text("#chat-structured-notes")
        page.locator("#chat-structured-table [role=grid]").wait_for(state="visible")
        assert page.locator("#chat-structured-html table").count() == 0  # the rows show once, in the grid
        page.screenshot(path=str(shots / "ux-10-document-examples.png"), full_page=True)
