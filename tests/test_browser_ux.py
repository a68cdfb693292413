"""What a new user trips on, in headless Chromium against one app on the bundled checkpoint:
refusals that must leave no "Error" badge over an image box. Screenshots in test-output/browser/."""

import re
from urllib.parse import urlparse

import pytest

from g4v.commands.panels import PANELS
from g4v.documents.examples import REPORT_PDF
from g4v.paths import EXAMPLES_DIR
from tests.browser import browser_page, pick_pdf_pages
from tests.conftest import TEST_OUTPUT
from webapp.runs import OVERDUE

EXAMPLE = str(EXAMPLES_DIR / "shapes-tall.png")


def image_tabs(app_url) -> list[tuple[str, str]]:
    """Every tab with the picture row (``webapp.pictures``: an image box and a "Use the last chat
    image" button), as (tab, element id prefix), read from the served page's components."""
    import httpx

    served = {component.get("props", {}).get("elem_id")
              for component in httpx.get(f"{app_url}config", timeout=10).json()["components"]}
    return [(panel.tab, panel.id) for panel in PANELS if f"{panel.id}-from-chat" in served]


#: True when an "Error" badge (Gradio's status tracker in its error state) shows inside the element:
#: the tracker stays in the page once hidden, at opacity 0, so visibility is read up the tree.
BADGE_SHOWN = """(selector) => [...document.querySelectorAll(selector + ' .error')].some(badge => {
    if (!badge.getClientRects().length || badge.innerText.trim() !== 'Error') return false;
    for (let node = badge; node; node = node.parentElement) {
        const style = getComputedStyle(node);
        if (style.opacity === '0' || style.visibility === 'hidden' || style.display === 'none') return false;
    }
    return true;
})"""

#: True when the box shows a loaded picture that nothing covers (a click at its centre reaches it).
PICTURE_SHOWN = """(selector) => { const img = document.querySelector(selector + ' img');
    if (!img || !img.complete || !img.naturalWidth) return false;
    img.scrollIntoView({block: 'center'}); const r = img.getBoundingClientRect();
    return document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2) === img; }"""


@pytest.fixture(scope="module")
def shots(output_dir):
    folder = output_dir / "browser"
    folder.mkdir(exist_ok=True)
    return folder


def server_log(app_url) -> str:
    return (TEST_OUTPUT / f"app-{urlparse(app_url).port}.log").read_text(errors="replace")


def toast_says(page, words: str, report: tuple[str, ...] = ()) -> None:
    """Wait for a toast that says ``words``; else fail saying what the toasts and the elements the
    ``report`` selectors name (their text, or a box's value) showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("(words) => [...document.querySelectorAll(\"[data-testid='toast-body']\")]"
                               ".some(t => t.innerText.includes(words))", arg=words)
    except PlaywrightTimeout:
        toasts = page.locator("[data-testid='toast-body']").all_inner_texts()
        shown = {selector: page.evaluate("(s) => { const e = document.querySelector(s);"
                                         " return e ? ('value' in e ? e.value : e.innerText) : null; }", selector)
                 for selector in report}
        pytest.fail(f"no toast said {words!r}: toasts {toasts!r}, the page showed {shown!r}")


def close_toasts(page) -> None:
    for close in page.locator("[data-testid='toast-close']").all():
        close.click()
    page.wait_for_function("() => !document.querySelector(\"[data-testid='toast-body']\")")


def test_refusals_leave_no_error_badge_over_the_image_box(app_url, shots):
    """With no chat image yet, "Use the last chat image" in every image tab says so in a toast and
    leaves no badge in the image box, and a picture uploaded next shows, uncovered; a PDF page the
    picker refuses does the same; the server log gets no traceback for these ordinary refusals."""
    logged_before = len(server_log(app_url))
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.wait_for_selector("#model-banner")
        tabs = image_tabs(app_url)
        assert ("Deepstack", "deepstack") in tabs  # the page's components were read
        for tab, prefix in tabs:
            box = f"#{prefix}-image"
            page.get_by_role("tab", name=tab).click()
            page.locator(f"#{prefix}-from-chat").click()
            toast_says(page, "no chat image yet: send a picture in the Chat tab first")
            assert not page.evaluate(BADGE_SHOWN, box), f"{tab}: an error badge stays in the image box"
            close_toasts(page)
            page.locator(f"{box} input[type=file]").set_input_files(EXAMPLE)
            page.wait_for_function(PICTURE_SHOWN, arg=box)
            assert not page.evaluate(BADGE_SHOWN, box), tab

        # A page the PDF picker refuses (the document has 2): one line, the box keeps its picture.
        page.get_by_role("tab", name="Deepstack").click()
        pick_pdf_pages(page, "deepstack", REPORT_PDF, thumbnails=2, pages="9")
        toast_says(page, "outside the document's pages 1-2")
        assert not page.evaluate(BADGE_SHOWN, "#deepstack-image")
        assert page.evaluate(PICTURE_SHOWN, "#deepstack-image")
        page.screenshot(path=str(shots / "ux-1-no-badge.png"), full_page=True)
    assert "Traceback" not in server_log(app_url)[logged_before:]


def test_a_click_on_the_tiling_overlay_picks_the_token_under_it(app_url, shots):
    """The main overlay answers clicks: a click at the centre of a tile token's box (found on the
    served overlay through its drawn frame, the box from plan_tiling) names that token in the
    selected-token panel."""
    import io

    from PIL import Image

    from g4v.images import open_image
    from g4v.loading import load_config
    from g4v.paths import BUNDLED_MODEL_DIR
    from g4v.tiling import plan_tiling
    from tests.test_tiling_webapp import canvas_in_overlay, overlay_spot

    picture = open_image(EXAMPLE)
    plan = plan_tiling((picture.height, picture.width), load_config(BUNDLED_MODEL_DIR))
    tiles = [token for token in plan.tokens if token.kind == "tile"]
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Tiling").click()
        page.locator("#tiling-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")
        overlay = page.locator("#tiling-overlay img")
        served = Image.open(io.BytesIO(page.request.get(overlay.get_attribute("src")).body()))
        canvas = canvas_in_overlay(served)
        for token in (tiles[len(tiles) // 3], tiles[-2]):
            x, y = overlay_spot(plan, canvas, token)
            box = overlay.bounding_box()  # the picture is drawn inside it with object-fit: contain
            scale = min(box["width"] / served.width, box["height"] / served.height)
            overlay.click(position={"x": (box["width"] - served.width * scale) / 2 + x * scale,
                                    "y": (box["height"] - served.height * scale) / 2 + y * scale})
            page.wait_for_function("(n) => document.querySelector('#tiling-token-info').innerText"
                                   ".includes(`Token ${n} of`)", arg=token.index)
            assert page.locator("#tiling-token-view img").is_visible()
            assert page.locator("#tiling-token-index input").input_value() == str(token.index)
        page.screenshot(path=str(shots / "ux-3-overlay-click.png"), full_page=True)


def choose_preset(page, label: str) -> None:
    page.locator("#chat-task input").click()
    page.get_by_role("option", name=label, exact=True).click()
    page.wait_for_function("(label) => document.querySelector('#chat-task input').value === label", arg=label)


def box_becomes(page, text: str) -> None:
    page.wait_for_function("(text) => document.querySelector('#chat-box textarea').value === text", arg=text)


def test_presets_replace_only_their_own_text_and_the_panel_waits_for_a_new_answer(app_url, shots):
    """A preset never overwrites typed text; switching presets replaces the previous preset's tag
    or key-value prompt, and a free or document question empties it. While a new answer is being
    written, the structured panel says it waits instead of showing the previous answer's reading."""
    from g4v.documents.presets import build_prompt
    from webapp.documents import EXAMPLE_SCHEMA, PENDING_NOTE

    kvp = build_prompt("kvp", schema_text=EXAMPLE_SCHEMA)
    with browser_page(height=1400) as page:
        page.goto(app_url)
        box = page.locator("#chat-box textarea")
        box.fill("How many bars are there?")
        choose_preset(page, "Table to HTML")
        toast_says(page, "The box keeps your text")
        assert box.input_value() == "How many bars are there?"
        close_toasts(page)

        box.fill("")
        for label, text in [("Chart to CSV", "<chart2csv>"), ("Table to HTML", "<tables_html>"),
                            ("Key-value extraction (JSON schema)", kvp), ("(free question)", ""),
                            ("Key-value extraction (JSON schema)", kvp), ("Document question", ""),
                            ("Table to HTML", "<tables_html>")]:
            choose_preset(page, label)
            box_becomes(page, text)

        page.locator("#chat-box input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function("() => document.querySelectorAll('#chat-box img').length >= 1")
        box.focus()
        page.keyboard.press("Enter")
        read = "() => /Could not read|Read as/.test(document.querySelector('#chat-structured-notes').innerText)"
        page.wait_for_function(read, timeout=120_000)
        page.evaluate("""() => { window.notesSeen = []; const notes = document.querySelector('#chat-structured-notes');
            new MutationObserver(() => window.notesSeen.push(notes.innerText.trim()))
                .observe(notes, {subtree: true, childList: true, characterData: true}); }""")
        page.wait_for_function("() => !document.querySelector('#chat-box textarea').disabled")
        box.fill("<tables_html>")
        box.focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelectorAll(\"[data-testid='bot']\").length == 2")
        page.wait_for_function("() => !document.querySelector('#chat-box textarea').disabled", timeout=120_000)
        page.wait_for_function(read, timeout=120_000)
        seen = page.evaluate("() => window.notesSeen")
        pending = PENDING_NOTE.strip("*")
        assert pending in seen, seen  # the second answer's wait was marked
        assert seen.index(pending) < max(i for i, text in enumerate(seen) if "read" in text.lower())
        page.screenshot(path=str(shots / "ux-5-presets.png"), full_page=True)


#: The progress elements Gradio's status trackers show (one per output the event shows progress on).
PROGRESS = ".progress-text"
#: Per header of the two tables: the words whose text runs over more than one line (broken inside).
BROKEN_HEADER_WORDS = """() => [...document.querySelectorAll('#eval-aggregate th span.header, #eval-samples th span.header')]
    .flatMap(span => { const text = span.firstChild; if (!text || text.nodeType !== 3) return [];
        const broken = []; const range = document.createRange(); let at = 0;
        for (const word of text.textContent.split(' ')) {
            range.setStart(text, at); range.setEnd(text, at + word.length); at += word.length + 1;
            const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
            if (lines.size > 1) broken.push(word);
        }
        return broken; })"""


#: Whether the progress text inside the box ``selector`` lies within that box's own height: over
#: an empty box of no height (overflow clipped), the bar was in the page but out of sight.
BAR_IN_SIGHT = """(selector) => { const box = document.querySelector(selector), bar = box.querySelector('.progress-text');
    const outer = box.getBoundingClientRect(), inner = bar.getBoundingClientRect();
    return inner.height > 0 && inner.top >= outer.top - 1 && inner.bottom <= outer.bottom + 1; }"""


def progress_texts(page) -> list[str]:
    return page.evaluate(f"() => [...document.querySelectorAll('{PROGRESS}')].map(e => e.innerText)")


def test_evaluate_shows_one_progress_bar_with_an_estimate_and_whole_header_words(app_url, shots):
    """During a run one element shows progress (not each of the 8 outputs), and it says how long is
    left; the tables' headers wrap between words only, before and after a run. Attribution says
    under its button how long it takes, and its one progress bar estimates the time left too."""
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        page.wait_for_selector("#eval-aggregate th span.header")
        assert page.evaluate(BROKEN_HEADER_WORDS) == []
        # enough rows that the run lasts past its first progress update (8 took under a second)
        page.locator("#eval-limit input").fill("120")
        page.locator("#eval-run").click()
        page.wait_for_function(f"() => [...document.querySelectorAll('{PROGRESS}')].some(e => / s left| min left/"
                               ".test(e.closest('.wrap, div').parentElement.innerText))", timeout=240_000)
        texts = page.evaluate(f"() => [...document.querySelectorAll('{PROGRESS}')]"
                              ".map(e => e.closest('.wrap, div').parentElement.innerText)")
        assert len(texts) == 1 and "samples" in texts[0], texts
        assert page.locator(f"#eval-status {PROGRESS}").count() == 1 and page.evaluate(BAR_IN_SIGHT, "#eval-status")
        page.screenshot(path=str(shots / "ux-6-evaluate-progress.png"), full_page=True)
        # The tables after a run: Stop, rather than wait for the other rows (about 40 s on 2 cores);
        # a stopped run shows its rows as a finished one does (test_evaluate_app tests Stop itself).
        page.locator("#eval-stop").click()
        page.wait_for_function("() => /Stopped|Finished/.test(document.querySelector('#eval-status').innerText)",
                               timeout=300_000)
        page.locator("#eval-samples").scroll_into_view_if_needed()  # a virtualised table draws what shows
        page.wait_for_function("() => [...document.querySelectorAll('#eval-samples tbody td')].some(td => td.textContent.trim())")
        assert page.evaluate(BROKEN_HEADER_WORDS) == []
        page.locator("#eval-aggregate").screenshot(path=str(shots / "ux-6-evaluate-headers.png"))

        page.get_by_role("tab", name="Attribution").click()
        assert "a few seconds" in page.inner_text("#attribution-status")  # the hint the bar is drawn over
        page.locator("#attribution-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#attribution-image")
        page.locator("#attribution-run").click()
        # the time left, or that a stage outlasts it (on this checkpoint an estimate may be under a second)
        page.wait_for_function(f"() => [...document.querySelectorAll('{PROGRESS}')].some(e => / s left| min left|"
                               f"{OVERDUE}/.test(e.closest('.wrap, div').parentElement.innerText))", timeout=240_000)
        assert page.locator(f"#attribution-status {PROGRESS}").count() == 1 and len(progress_texts(page)) == 1
        assert page.evaluate(BAR_IN_SIGHT, "#attribution-status")
        page.wait_for_function("() => /Explained:/.test(document.querySelector('#attribution-report').innerText)",
                               timeout=300_000)


def test_the_lora_tab_warns_about_an_adapter_made_for_another_base(app_url):
    """This app serves the bundled checkpoint: the French adapter (made for the trained one) gets a
    warning line naming its base, the demo adapter (made for this one) none."""
    import json
    import re

    from g4v.paths import ASSETS_DIR

    french = json.loads((ASSETS_DIR / "adapters" / "tiny-trained-french" / "adapter_config.json").read_text())
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="LoRA").click()
        warning = "() => document.querySelector('#lora-base-warning').innerText.trim()"
        for name, expected in [("tiny-trained-french", f"made for {french['base_model_name_or_path']}"),
                               ("demo-lora", "")]:
            page.locator("#lora-adapter input").click()
            page.get_by_role("option", name=re.compile(f"^{name} ")).click()
            if expected:
                page.wait_for_function(f"() => ({warning})().includes({json.dumps(expected)})")
                assert "warning: adapter tiny-trained-french" in page.evaluate(warning)
            else:
                page.wait_for_function(f"() => ({warning})() === ''")


#: The rows of the Evaluate upload box's file list (Gradio's File component: one per file).
UPLOAD_ROWS = "#eval-upload td.filename"


def upload_names(page) -> list[str]:
    return page.evaluate(f"() => [...document.querySelectorAll('{UPLOAD_ROWS}')].map(e => e.getAttribute('aria-label'))")


def test_a_refused_upload_leaves_the_box_and_a_failed_run_marks_the_old_results(app_url, tmp_path, shots):
    """A refused upload (a zip with no table) says so once and leaves the upload box, so a table with
    its pictures uploaded next is the whole upload; the box shows four files without scrolling. A
    Run refused after a finished one leaves no "Error" badge in the status line, whose text then
    says the results below are the previous run's."""
    import zipfile

    from g4v.evaluate import BUNDLED_DATASET
    from g4v.evaluate.data import open_dataset
    from webapp.runs import PREVIOUS_RUN

    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zipped:
        zipped.writestr("readme.txt", "no table here")
    table_and_pictures = two_row_upload(tmp_path, "image,prompt,answer")
    # the waits below tell the upload's fill by its guess: the bundled dataset's differs
    assert open_dataset(str(BUNDLED_DATASET), None).columns.image != "image"
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        page.locator("#eval-limit input").fill("2")
        page.locator("#eval-run").click()
        page.wait_for_function("() => /Finished/.test(document.querySelector('#eval-status').innerText)",
                               timeout=300_000)

        upload = page.locator("#eval-upload input[type=file]")
        upload.set_input_files(str(bad))
        page.wait_for_selector("[data-testid='toast-body']", timeout=60_000)
        page.wait_for_function(f"() => !document.querySelector('{UPLOAD_ROWS}')")
        # the dataset chosen before the upload is back, described again (a Run now runs it)
        page.wait_for_function("() => /rows in bundled/.test(document.querySelector('#eval-dataset-info').innerText)")
        assert page.locator("#eval-dataset input").input_value().startswith("bundled")
        close_toasts(page)
        upload = page.locator("#eval-upload input[type=file]")
        upload.set_input_files(table_and_pictures)
        page.wait_for_function("() => /2 rows in/.test(document.querySelector('#eval-dataset-info').innerText)")
        assert sorted(upload_names(page)) == sorted(["questions.csv", "shapes-tall.png", "shapes-wide.png"])
        assert not page.locator("[data-testid='toast-body']").count()
        # Each upload describes the dataset again and fills the column boxes with its guess, in a
        # step of its own after the description. A box written while that step was on its way was
        # overwritten (in busy runs the refusal below then never came), so every write here waits
        # for the fill it could meet: the table's guess for the picture column, "image", replaces
        # the bundled dataset's ("file_name"), and then replaces a mark written before the next upload.
        page.get_by_text("Column mapping").click()
        column_box = "#eval-column-image input, #eval-column-image textarea"
        image_column = page.locator(column_box).first
        guess_shown = "(boxes) => [...document.querySelectorAll(boxes)].some(box => box.value === 'image')"
        page.wait_for_function(guess_shown, arg=column_box, timeout=60_000)
        image_column.fill("written before the upload")
        page.locator("#eval-upload input[type=file]").set_input_files(str(EXAMPLES_DIR / "chart-bars.png"))
        page.wait_for_function(f"() => document.querySelectorAll('{UPLOAD_ROWS}').length == 4")
        page.wait_for_function(guess_shown, arg=column_box, timeout=60_000)
        rows = page.evaluate("""(rows) => { const box = document.querySelector('#eval-upload .file-preview-holder')
            .getBoundingClientRect();
            return [...document.querySelectorAll(rows)].map(e => {
                const r = e.getBoundingClientRect(); return r.top >= box.top && r.bottom <= box.bottom; }); }""",
                             UPLOAD_ROWS)
        page.locator("#eval-upload").screenshot(path=str(shots / "ux-evaluate-upload-box.png"))
        assert rows == [True] * 4, rows  # every file's row shows inside the box

        image_column.fill("no-such-column")
        page.locator("#eval-run").click()
        toast_says(page, "no-such-column", report=(column_box, "#eval-status"))
        page.wait_for_function("(note) => document.querySelector('#eval-status').innerText.includes(note)",
                               arg=PREVIOUS_RUN.strip("*"))
        assert "Finished" in page.inner_text("#eval-status")
        page.wait_for_timeout(500)
        assert not page.evaluate(BADGE_SHOWN, "#eval-status")
        assert page.locator("[data-testid='toast-body']").count() == 1
        page.screenshot(path=str(shots / "ux-evaluate-refused-upload.png"), full_page=True)


#: Installed in the page: each queued step's request waits ``ms`` before it goes, as it would
#: behind a busy queue or a big upload.
SLOW_QUEUE = """(ms) => { const send = window.fetch;
    window.fetch = (url, ...rest) => String(url).includes('/queue/join')
        ? new Promise(go => setTimeout(go, ms)).then(() => send(url, ...rest)) : send(url, ...rest); }"""


def two_row_upload(folder, header: str) -> list[str]:
    """A table of two rows (picture, question, answer) under ``header`` and its two pictures, in ``folder``."""
    import shutil

    pictures = [shutil.copy(EXAMPLES_DIR / name, folder / name) for name in ("shapes-tall.png", "shapes-wide.png")]
    table = folder / "questions.csv"
    table.write_text(f"{header}\nshapes-tall.png,What shape?,circle\nshapes-wide.png,What shape?,square\n")
    return [str(table), *map(str, pictures)]


def column_boxes(page, url: str) -> dict:
    """The Evaluate tab opened at ``url`` with its column mapping shown; its image, prompt and
    reference boxes."""
    page.goto(url)
    page.get_by_role("tab", name="Evaluate").click()
    page.get_by_text("Column mapping").click()
    return {role: page.locator(f"#eval-column-{role} input, #eval-column-{role} textarea").first
            for role in ("image", "prompt", "reference")}


def test_a_column_typed_while_the_guess_is_pending_is_kept(app_url, tmp_path):
    """An upload fills the column boxes with its guess once the upload is read; a box the visitor
    typed in meanwhile keeps what they typed, and the boxes they did not touch (or typed in before
    the upload) get the guess."""
    upload = two_row_upload(tmp_path, "image,prompt,answer")
    with browser_page(height=1400) as page:
        box = column_boxes(page, app_url)
        box["image"].fill("mark")  # typed before the upload: its guess replaces it
        page.evaluate(SLOW_QUEUE, 1500)
        page.locator("#eval-upload input[type=file]").set_input_files(upload)
        # The upload is in (the dataset choice says so) and its guess is on its way: type now.
        page.wait_for_function("() => document.querySelector('#eval-dataset input').value === 'the uploaded files'",
                               timeout=60_000)
        box["prompt"].fill("my question")
        page.wait_for_function("() => /2 rows in/.test(document.querySelector('#eval-dataset-info').innerText)",
                               timeout=60_000)
        page.wait_for_function("(id) => document.querySelector(id).value === 'image'",
                               arg="#eval-column-image input, #eval-column-image textarea", timeout=30_000)
        assert box["prompt"].input_value() == "my question"
        assert box["reference"].input_value() == "answer"


#: Installed in the page: the answer to each unqueued step's request (a quick step on the server)
#: comes ``ms`` late, as over a slow connection; ``window.quickStepsAway`` counts those on their way.
SLOW_QUICK_STEPS = """(ms) => { const send = window.fetch; window.quickStepsAway = 0;
    window.fetch = (url, ...rest) => String(url).includes('/run/predict')
        ? (window.quickStepsAway++, send(url, ...rest).then(answer => new Promise(go => setTimeout(() => {
            window.quickStepsAway--; go(answer); }, ms))))
        : send(url, ...rest); }"""


def test_a_column_typed_as_the_guess_lands_is_kept(app_url, tmp_path):
    """A visitor who types a column name just as the upload's guess shows keeps it, however slow the
    connection: the boxes are filled in the page (a step on the server, comparing the boxes as they
    were when its request left, wrote the guess over the typed name when its answer came)."""
    upload = two_row_upload(tmp_path, "image,question,answer")
    with browser_page(height=1400) as page:
        box = column_boxes(page, app_url)
        assert box["prompt"].input_value() == "prompt"  # the bundled dataset's guess; the table's is "question"
        page.evaluate(SLOW_QUICK_STEPS, 2000)
        page.locator("#eval-upload input[type=file]").set_input_files(upload)
        page.wait_for_function("() => /2 rows in/.test(document.querySelector('#eval-dataset-info').innerText)",
                               timeout=60_000)
        box["prompt"].fill("my question")
        # a step on the server that the guess's arrival set off has left by now; its answer is let in
        page.wait_for_timeout(1000)
        page.wait_for_function("() => window.quickStepsAway === 0", timeout=60_000)
        assert box["prompt"].input_value() == "my question"
        assert box["image"].input_value() == "image"  # the boxes left alone have the table's guess
        assert box["reference"].input_value() == "answer"


def test_an_upload_whose_picture_column_is_not_guessed_is_kept_for_its_name(app_url, tmp_path):
    """An upload whose picture column has a name the guess does not know is kept, and the line under
    the dataset asks for the column's name: typed in its box, Run runs the upload. (It was refused
    with that same advice, and the refusal emptied the upload box, so the advice led nowhere.)"""
    upload = two_row_upload(tmp_path, "picture,question,answer")
    with browser_page(height=1400) as page:
        box = column_boxes(page, app_url)
        page.locator("#eval-upload input[type=file]").set_input_files(upload)
        page.wait_for_function("() => /No image column guessed/.test(document.querySelector('#eval-dataset-info').innerText)",
                               timeout=60_000)
        assert page.inner_text("#eval-dataset-info") == (
            "2 rows in the uploaded files. No image column guessed (columns: picture, question, answer): "
            "type its name in the box 'image column' (Column mapping).")
        assert sorted(upload_names(page)) == sorted(["questions.csv", "shapes-tall.png", "shapes-wide.png"])
        assert not page.locator("[data-testid='toast-body']").count()
        page.wait_for_function("(box) => document.querySelector(box).value === 'question'",
                               arg="#eval-column-prompt input, #eval-column-prompt textarea")
        assert box["image"].input_value() == ""
        box["image"].fill("picture")
        page.locator("#eval-limit input").fill("2")
        page.locator("#eval-run").click()
        page.wait_for_function("() => /Finished|Stopped/.test(document.querySelector('#eval-status').innerText)",
                               timeout=300_000)
        assert page.inner_text("#eval-status").startswith("Finished: 2 sample(s), 0 with errors.")


def queued_steps(page) -> list[str]:
    """Collects (from now on) the bodies of the page's queued event requests, one per step run."""
    steps = []
    page.on("request", lambda request: steps.append(request.post_data or "") if "/queue/join" in request.url else None)
    return steps


def test_one_preset_switch_gives_one_info_toast(app_url):
    """Switching presets while the box holds typed text says once that the box keeps it: one toast
    per switch (not two), and no count on it. Each pick in a dropdown runs its step once: the
    preset's prompt step, and the Evaluate dataset's description (Gradio 6 fires a Dropdown's
    .input twice per pick)."""
    from webapp.evaluate import UPLOAD_HINT
    from webapp.evaluate_choices import UPLOAD, dataset_label

    keeps = "The box keeps your text"
    with browser_page(height=1400) as page:
        page.goto(app_url)
        steps = queued_steps(page)
        page.locator("#chat-box textarea").fill("How many bars are there?")
        for switches, (label, key) in enumerate([("Table to HTML", "tables_html"), ("Chart to CSV", "chart2csv")], 1):
            choose_preset(page, label)
            toast_says(page, keeps)
            page.wait_for_timeout(3000)  # a second toast for the same switch would be here by now
            texts = page.locator("[data-testid='toast-body']").all_inner_texts()
            assert sum(keeps in text for text in texts) == 1, texts
            assert not any(re.search(r"\(\d+\)", text) for text in texts), texts
            assert sum(f'"{key}"' in body for body in steps) == 1, steps
            close_toasts(page)

        page.get_by_role("tab", name="Evaluate").click()
        steps.clear()
        page.locator("#eval-dataset input").click()
        page.get_by_role("option", name=dataset_label(UPLOAD), exact=True).click()
        page.wait_for_function("(hint) => document.querySelector('#eval-dataset-info').innerText.includes(hint)",
                               arg=UPLOAD_HINT)
        page.wait_for_timeout(3000)
        assert sum(f'"{UPLOAD}"' in body for body in steps) == 1, steps


def test_a_refused_picture_leaves_the_chat_box_with_one_toast_and_the_text_kept(app_url, tmp_path, shots):
    """An attachment that is not a readable picture (not an image, an SVG, truncated, more pixels
    than the limit) is taken out of the Chat box at once with one toast naming it and what the box
    takes, and a line under the box that says the same until the message is sent; the typed text
    and the good picture stay, and the message then sends. A .txt the box does not take is refused
    in one line that says what it takes (by Gradio, before any upload)."""
    import struct
    import zlib

    from g4v.settings.limits import limits
    from webapp.documents import BOX_TAKES

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = int(limits().max_image_pixels ** 0.5) + 1  # a header that says more pixels than the limit
    good = (EXAMPLES_DIR / "shapes-tall.png").read_bytes()
    bad = {"fake.png": b"not a picture at all", "drawing.svg": b'<svg xmlns="http://www.w3.org/2000/svg"/>',
           "cut.png": good[:len(good) // 2],
           "huge.png": b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")}
    (tmp_path / "notes.txt").write_text("hello")
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    chips = "#chat-box .thumbnail-item"
    line_says = """(name) => { const line = document.querySelector('#chat-left-out');
                               return !!line && line.offsetParent !== null && line.innerText.includes(name); }"""
    with browser_page(height=1400) as page:
        page.goto(app_url)
        box = page.locator("#chat-box textarea")
        box.fill("What shape is this?")
        page.locator("#chat-box input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(f"() => document.querySelectorAll('{chips}').length == 1")
        for name in [*bad, "notes.txt"]:
            page.locator("#chat-box input[type=file]").set_input_files(str(tmp_path / name))
            toast_says(page, name)
            texts = page.locator("[data-testid='toast-body']").all_inner_texts()
            assert len(texts) == 1 and name in texts[0], texts
            if name != "notes.txt":  # the box's own check (Gradio refuses a .txt before the upload)
                assert BOX_TAKES in texts[0], texts
                assert "warning" in page.locator("[data-testid='toast-body']").get_attribute("class")  # it still sends
                page.wait_for_function(line_says, arg=name)
                assert BOX_TAKES in page.locator("#chat-left-out").inner_text()
            else:
                assert "image, .pdf" in texts[0], texts
            page.wait_for_function(f"() => document.querySelectorAll('{chips}').length == 1")
            assert box.input_value() == "What shape is this?"
            close_toasts(page)
        page.screenshot(path=str(shots / "ux-chat-refused-picture.png"), full_page=True)
        assert page.evaluate(line_says, "huge.png")  # the last server-side refusal is still in sight
        box.focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelectorAll(\"[data-testid='bot']\").length == 1", timeout=120_000)
        assert not page.locator("[data-testid='toast-body']").count()
        assert not page.locator("#chat-left-out").is_visible()  # sent: the line has done its job


def test_a_refused_tiling_upload_leaves_no_badge_and_no_old_result(app_url, tmp_path, shots):
    """A file that is not a picture, uploaded in Tiling after a good one: one toast; no "Error" badge
    over the outputs, no broken picture in the box, no previous result; a good picture then works."""
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture at all")
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Tiling").click()
        upload = page.locator("#tiling-image input[type=file]")
        upload.set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")
        page.locator("#tiling-image input[type=file]").set_input_files(str(fake))
        toast_says(page, "fake.png is not an image")
        page.wait_for_function("() => !document.querySelector('#tiling-overlay img')"
                               " && !document.querySelector('#tiling-image img')")
        page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "ux-tiling-refused-upload.png"), full_page=True)
        for box in ("#tiling-image", "#tiling-overlay", "#tiling-token-view", "#tiling-token-index", "#tiling-token-info"):
            assert not page.evaluate(BADGE_SHOWN, box), box
        assert page.inner_text("#tiling-token-info").strip() == ""
        close_toasts(page)
        page.locator("#tiling-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")


@pytest.mark.parametrize("tab, prefix, button, output", [
    ("Deepstack", "deepstack", "#deepstack-run", "#deepstack-norms"),
    ("LoRA", "lora", "text=Run side by side", "#lora-left-answer"),
    ("Attribution", "attribution", "#attribution-run", "#attribution-report"),
])
def test_a_refused_run_leaves_no_badge_over_its_outputs(app_url, tmp_path, tab, prefix, button, output):
    """A file that is not a picture is taken out of the box at upload, with one toast (no broken
    picture left there); a Run after it leaves no "Error" badge over the outputs."""
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture at all")
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name=tab).click()
        page.locator(f"#{prefix}-image input[type=file]").set_input_files(str(fake))
        toast_says(page, "fake.png is not an image")
        page.wait_for_function(f"() => !document.querySelector('#{prefix}-image img')")
        assert not page.evaluate(BADGE_SHOWN, f"#{prefix}-image")
        close_toasts(page)
        page.locator(button).click()
        page.wait_for_timeout(1500)
        assert not page.evaluate(BADGE_SHOWN, output)


def test_the_port_box_takes_out_a_file_that_is_not_a_picture(app_url, tmp_path):
    """The vLLM port tab's box too (its Compare needs vLLM, so only the upload is checked here)."""
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture at all")
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="vLLM port").click()
        page.locator("#port-image input[type=file]").set_input_files(str(fake))
        toast_says(page, "fake.png is not an image")
        page.wait_for_function("() => !document.querySelector('#port-image img')")
        assert not page.evaluate(BADGE_SHOWN, "#port-image")
        close_toasts(page)
        page.locator("#port-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#port-image")


def test_refused_picks_and_settings_leave_no_badge_and_the_results_in_place(app_url):
    """Found by a fresh-eyed walk: a token index out of range (Tiling), an answer token past the
    answer (Attribution) and a seed past its range (Chat) are each one toast; the pictures, report
    and chat stay as they were, with no "Error" badge over them."""
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Tiling").click()
        page.locator("#tiling-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")
        page.locator("#tiling-token-index input").fill("99999999")
        page.locator("#tiling-token-index input").press("Enter")
        toast_says(page, "token index 99999999 is out of range")
        page.wait_for_timeout(1000)
        for box in ("#tiling-overlay", "#tiling-token-view", "#tiling-token-info"):
            assert not page.evaluate(BADGE_SHOWN, box), box
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")
        close_toasts(page)

        page.get_by_role("tab", name="Attribution").click()
        page.locator("#attribution-image input[type=file]").set_input_files(EXAMPLE)
        page.locator("#attribution-token input").fill("99999999")
        page.locator("#attribution-run").click()
        toast_says(page, "answer token 99999999 does not exist")
        page.wait_for_timeout(1000)
        assert not page.evaluate(BADGE_SHOWN, "#attribution-report")
        close_toasts(page)

        page.get_by_role("tab", name="Chat").click()
        page.get_by_text("Sampling").click()
        seed = page.get_by_label("Seed (-1 = random)")
        # The accordion's boxes mount as it opens; a number typed while they do can be put back to
        # the box's value (seen once, in CI), so the number is typed again until it holds.
        for _ in range(10):
            seed.fill("99999999999")
            seed.press("Tab")  # the number is committed before the message goes
            if seed.input_value() == "99999999999":
                break
            page.wait_for_timeout(200)
        assert seed.input_value() == "99999999999"
        page.locator("#chat-box textarea").fill("What shape is green?")
        page.locator("#chat-box textarea").press("Enter")
        toast_says(page, "seed must be -1 (a fresh one each time) or a whole number from 0 to 4294967295, got 99999999999")
        page.wait_for_timeout(1500)
        assert not page.evaluate(BADGE_SHOWN, "#chatbot")
        assert page.locator("#chat-box textarea").input_value() == "What shape is green?"
