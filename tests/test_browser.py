"""The real app in headless Chromium (Debian's package, driven by Playwright): chat with an image,
then the Tiling and Deepstack tabs. Screenshots land in test-output/browser/."""

import pytest

from g4v.paths import EXAMPLES_DIR
from tests.browser import CHROMIUM, browser_page, pick_pdf_pages

EXAMPLE = str(EXAMPLES_DIR / "shapes-tall.png")


@pytest.fixture(scope="module")
def shots(output_dir):
    folder = output_dir / "browser"
    folder.mkdir(exist_ok=True)
    return folder


def test_chat_tiling_and_deepstack_in_a_browser(app_url, shots):
    assert CHROMIUM, "Debian's chromium is needed (scripts/setup_browser.sh installs it)"
    with browser_page() as page:
        page.goto(app_url)
        page.wait_for_selector("#model-banner")
        assert "Demo checkpoint in use" in page.inner_text("#model-banner")

        # Chat: attach an image, type, send, and watch the answer stream in.
        page.locator("#chat-box input[type=file]").set_input_files(EXAMPLE)
        page.locator("#chat-box textarea").fill("Which shapes do you see?")
        page.wait_for_timeout(500)
        page.keyboard.press("Enter")
        bot = page.locator(".message.bot, [data-testid='bot']").last
        bot.wait_for(state="visible")
        page.wait_for_function(
            "() => { const m = document.querySelectorAll('[data-testid=\"bot\"]');"
            " return m.length && m[m.length - 1].innerText.trim().length > 0 }"
        )
        page.screenshot(path=str(shots / "1-chat.png"), full_page=True)
        assert page.locator("[data-testid='bot']").last.inner_text().strip()

        # Tiling: use the image just sent in chat, see the overlay.
        page.get_by_role("tab", name="Tiling").click()
        page.locator("#tiling-from-chat").click()
        overlay = page.locator("#tiling-overlay img")
        overlay.wait_for(state="visible")
        page.wait_for_function("() => { const i = document.querySelector('#tiling-overlay img');"
                               " return i && i.naturalWidth > 0 }")
        page.screenshot(path=str(shots / "2-tiling.png"), full_page=True)

        # Deepstack: same image, run the inspector, see the norms chart.
        page.get_by_role("tab", name="Deepstack").click()
        page.locator("#deepstack-from-chat").click()
        page.wait_for_timeout(500)
        page.locator("#deepstack-run").click()
        page.locator("#deepstack-norms img").wait_for(state="visible", timeout=120_000)
        page.wait_for_function("() => { const i = document.querySelector('#deepstack-norms img');"
                               " return i && i.naturalWidth > 0 }")
        page.screenshot(path=str(shots / "3-deepstack.png"), full_page=True)


def toast_text(page) -> str:
    page.wait_for_selector("[data-testid='toast-body']", timeout=60_000)
    return " ".join(page.locator("[data-testid='toast-body']").all_inner_texts())


def close_toasts(page):
    for close in page.locator("[data-testid='toast-close']").all():
        close.click()


def box_is_clickable(page) -> bool:
    """A person can click into the box: nothing (such as an error panel) lies over it."""
    return page.evaluate("() => { const box = document.querySelector('#chat-box textarea');"
                         " box.scrollIntoView({block: 'start'}); const r = box.getBoundingClientRect();"
                         " return document.elementFromPoint(r.x + 10, r.y + 10) === box; }")


def test_a_refused_message_leaves_the_chat_usable(app_url, shots):
    """Refusals before the answer starts (a typed image placeholder, five pictures) and after it
    was accepted (too long for the context window): each shows one line, leaves the box enabled
    with the message still in it, and the next message in the same page is answered."""
    with browser_page() as page:
        page.goto(app_url)
        box = page.locator("#chat-box textarea")
        upload = page.locator("#chat-box input[type=file]")

        box.fill("What is <image> here?")
        page.keyboard.press("Enter")
        assert "image placeholder" in toast_text(page)
        assert box.is_enabled() and box.input_value() == "What is <image> here?"
        close_toasts(page)
        assert box_is_clickable(page)
        box.click()  # a real click (Playwright checks that nothing intercepts it), then edit by typing
        page.keyboard.press("End")
        page.keyboard.type(" Really?")
        assert box.input_value() == "What is <image> here? Really?"

        upload.set_input_files([EXAMPLE] * 5)
        box.fill("All five?")
        page.wait_for_timeout(500)
        page.keyboard.press("Enter")
        assert "too many images" in toast_text(page)
        assert box.is_enabled() and box.input_value() == "All five?" and box_is_clickable(page)
        assert page.locator("#chat-box .thumbnail-item, #chat-box [data-testid='file-preview'] img, #chat-box img").count() >= 5
        close_toasts(page)
        page.reload()
        page.wait_for_selector("#chat-box textarea")

        too_long = "shape " * 6000
        box.fill(too_long)
        page.keyboard.press("Enter")
        assert "too long" in toast_text(page)
        page.wait_for_function("() => !document.querySelector('#chat-box textarea').disabled")
        assert box.input_value().strip() == too_long.strip()
        assert page.locator("[data-testid='user']").count() == 0  # the refused turn left the history
        close_toasts(page)
        assert box_is_clickable(page)
        page.screenshot(path=str(shots / "4-refused.png"), full_page=True)

        box.fill("")
        upload.set_input_files(EXAMPLE)
        box.fill("Which shapes do you see?")
        page.wait_for_timeout(500)
        page.keyboard.press("Enter")
        page.wait_for_function("() => { const m = document.querySelectorAll('[data-testid=\"bot\"]');"
                               " return m.length && m[m.length - 1].innerText.trim().length > 0 }")
        page.wait_for_function("() => !document.querySelector('#chat-box textarea').disabled")
        assert page.locator("[data-testid='user']").count() >= 1
        page.screenshot(path=str(shots / "5-after-refusal.png"), full_page=True)


def test_a_pdf_page_a_task_preset_and_the_structured_panel_in_a_browser(app_url, shots):
    """Chat: a PDF uploaded in the document picker shows its page thumbnails; its page 2 joins the
    message as a picture; the "Table to HTML" preset puts the documented tag in the box; the answer
    is read in the structured panel. The demo checkpoint's answer is not a table, so the panel shows
    it as-is with the parse error: this proves the wiring end to end, and the table rendering is
    proven on real HTML by tests/test_documents_app.py. Tiling: the same page's token budget."""
    from g4v.documents.examples import REPORT_PDF

    with browser_page(height=1400) as page:
        page.goto(app_url)
        pick_pdf_pages(page, "chat", REPORT_PDF, thumbnails=2, pages="2")
        page.wait_for_function("() => document.querySelectorAll('#chat-box img').length >= 1")
        page.locator("#chat-task input").click()
        page.get_by_role("option", name="Table to HTML").click()
        page.wait_for_function("() => document.querySelector('#chat-box textarea').value == '<tables_html>'")
        page.locator("#chat-box textarea").focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => /Read as HTML|Could not read the answer as HTML/"
                               ".test(document.querySelector('#chat-structured-notes').innerText)", timeout=120_000)
        answer = page.locator("[data-testid='bot']").last.inner_text().strip()
        notes = page.inner_text("#chat-structured-notes")
        assert "Could not read the answer as HTML" in notes and "no <table> in the answer" in notes
        shown = page.inner_text("#chat-structured-html").strip()
        assert shown and shown.split()[0] in answer  # the raw answer, shown as text
        assert page.locator("[data-testid='user'] img").count() >= 1  # the page went as a picture
        page.screenshot(path=str(shots / "6-documents.png"), full_page=True)

        page.get_by_role("tab", name="Tiling").click()
        pick_pdf_pages(page, "tiling", REPORT_PDF, thumbnails=2)
        page.wait_for_function("() => { const i = document.querySelector('#tiling-overlay img');"
                               " return i && i.naturalWidth > 0 }")
        assert "total" in page.inner_text("body")
        page.screenshot(path=str(shots / "7-tiling-pdf.png"), full_page=True)


def test_a_document_example_brings_its_task_preset_and_the_panel_reads_its_answer(shots):
    """On the documents checkpoint, the key-value example picks its preset and shows the schema it
    is asked with (also when clicked again), and its answer is read as JSON valid against it;
    Clear empties the panel; clicking the chart example fills the box with its prompt and picture
    and picks the Chart to CSV preset; its answer is then read in the structured panel, whose table
    holds the answer's rows; a plain question's example clears the preset again."""
    import json

    from g4v.documents.tables import parse_csv
    from g4v.paths import DOCUMENTS_MODEL_DIR
    from tests.conftest import running_app

    listed = {item["file"]: item for item in json.loads((EXAMPLES_DIR / "examples.json").read_text())}

    def click_example(page, name: str):
        # The cards show short labels on this checkpoint: a document example's names its file.
        page.locator("#chat-examples button", has_text=name if "task" in listed[name] else listed[name]["prompt"]).click()
        page.wait_for_function(f"() => document.querySelector('#chat-box textarea').value == {json.dumps(listed[name]['prompt'])}"
                               f" && document.querySelector(\"#chat-box img[src*='{name}']\") !== null")

    with running_app("--model", str(DOCUMENTS_MODEL_DIR)) as url, browser_page(height=1400) as page:
        page.goto(url)
        for _ in range(2):  # the second click finds the preset already chosen: the schema stays shown
            click_example(page, "shapes-kvp.png")
            page.wait_for_function("() => document.querySelector('#chat-task input').value.startsWith('Key-value')")
            page.wait_for_timeout(1000)
            page.locator("#chat-schema").wait_for(state="visible")
        assert json.loads(page.locator("#chat-schema .cm-content").inner_text()) == \
            json.loads((EXAMPLES_DIR / listed["shapes-kvp.png"]["schema"]).read_text())
        page.locator("#chat-box textarea").focus()
        page.keyboard.press("Enter")  # the default token limit fits the whole JSON answer
        page.wait_for_function("() => /Read as JSON|Could not read/"
                               ".test(document.querySelector('#chat-structured-notes').innerText)", timeout=120_000)
        assert "Read as JSON and valid against the schema" in page.inner_text("#chat-structured-notes")
        page.locator("#chat-clear").click()  # a cleared chat has no answer to read
        page.wait_for_function("() => document.querySelector('#chat-structured-notes').innerText.trim() === ''")

        click_example(page, "chart-bars.png")
        page.wait_for_function("() => document.querySelector('#chat-task input').value == 'Chart to CSV'")
        page.locator("#chat-schema").wait_for(state="hidden")
        assert page.locator("#chat-box img").count() == 1
        page.locator("#chat-box textarea").focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => /Read as CSV|Could not read/"
                               ".test(document.querySelector('#chat-structured-notes').innerText)", timeout=120_000)
        answer = page.locator("[data-testid='bot']").last.inner_text().strip()
        assert "Read as CSV" in page.inner_text("#chat-structured-notes")
        rows = parse_csv(answer).rows  # the header, then one row per bar
        grid = page.locator("#chat-structured-table [role=grid]")  # virtualised: counts rows, draws what shows
        grid.scroll_into_view_if_needed()
        page.wait_for_function("() => [...document.querySelectorAll('#chat-structured-table tbody td')]"
                               ".some(td => td.textContent.trim())")
        assert grid.get_attribute("aria-rowcount") == str(len(rows)) and grid.get_attribute("aria-colcount") == "2"
        assert [th.get_attribute("title") for th in page.locator("#chat-structured-table th").all()[:2]] == rows[0]
        drawn = [td.strip() for td in page.locator("#chat-structured-table tbody td").all_text_contents() if td.strip()]
        cells = [cell for row in rows[1:] for cell in row]
        assert len(drawn) >= 2 and drawn == cells[:len(drawn)]
        page.screenshot(path=str(shots / "8-document-example.png"), full_page=True)

        click_example(page, "shapes-wide.png")
        page.wait_for_function("() => document.querySelector('#chat-task input').value == '(free question)'")
