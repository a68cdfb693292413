"""The app's document handlers (webapp.documents) called as Gradio calls them: the picker renders the
pages the model will see, a preset fills the box, and the structured panel shows the newest answer
sanitised, as a table, or as-is with its parse error. The browser test drives the same in Chromium."""

import json
import uuid
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from PIL import Image

from g4v.documents.examples import REPORT_PDF
from g4v.documents.pdf import THUMBNAIL_WIDTH, render_pages
from g4v.documents.presets import build_prompt
from g4v.errors import G4VError
from webapp import documents


def test_picked_pages_are_lossless_pngs_of_the_rendered_pages():
    files = documents.page_files(str(REPORT_PDF), "2,1", 72, limit=4)
    assert len(files) == 2 and all(f.endswith(".png") for f in files)
    expected = render_pages(REPORT_PDF, [2, 1], 72)
    for path, image in zip(files, expected):
        assert list(Image.open(path).convert("RGB").getdata()) == list(image.getdata())


def test_the_picker_refuses_in_one_line():
    with pytest.raises(G4VError) as caught:
        documents.page_files(str(REPORT_PDF), "1-2", 72, limit=1)
    assert "too many pages: 2 chosen" in str(caught.value)
    with pytest.raises(G4VError) as caught:
        documents.page_files(None, "1", 72, limit=1)
    assert "upload a PDF first" in str(caught.value)


def test_thumbnails_for_an_upload():
    thumbnails, page = documents.show_thumbnails(str(REPORT_PDF))
    assert page == "1" and [label for _, label in thumbnails] == ["page 1", "page 2"]


@pytest.mark.parametrize("make, words", [
    ("self_drawing_pdf", "page 1 of hostile.pdf needs more memory or time than a page may take to render"),
    ("page_tree_cycle_pdf", "page 2 of hostile.pdf is corrupt or unreadable"),
])
def test_hostile_pdfs_in_the_picker_are_one_line_and_the_next_one_works(tmp_path, make, words):
    """Choosing the file renders its thumbnails: the toast is one line, and the picker still works."""
    from tests import test_documents_pdf

    path = tmp_path / "hostile.pdf"
    path.write_bytes(getattr(test_documents_pdf, make)())
    with pytest.raises(gr.Error) as caught:
        documents.show_thumbnails(str(path))
    assert caught.value.message.startswith(words) and "\n" not in caught.value.message
    assert len(documents.show_thumbnails(str(REPORT_PDF))[0]) == 2


def test_a_preset_fills_the_box_and_keeps_the_attachments():
    box = {"text": "", "files": ["/tmp/page.png"]}
    value, schema = documents.fill_prompt("chart2csv", "", box)
    assert value == {"text": "<chart2csv>", "files": ["/tmp/page.png"]} and schema["visible"] is False
    value, schema = documents.fill_prompt("kvp", documents.EXAMPLE_SCHEMA, box)
    assert value["text"] == build_prompt("kvp", schema_text=documents.EXAMPLE_SCHEMA)
    assert schema["visible"] is True
    with pytest.raises(gr.Error) as caught:  # a broken schema is one line, and the box stays as it was
        documents.fill_prompt("kvp", "{", box)
    assert "not valid JSON" in str(caught.value)


def test_a_preset_replaces_only_a_presets_own_text():
    """Typed text stays whatever the preset; a tag or a key-value prompt (any schema) is replaced,
    and a free or document question empties it."""
    files = ["/tmp/page.png"]
    kvp = build_prompt("kvp", schema_text='{"type": "object"}')
    for typed in ("How many bars?", "<chart2csv> and more", kvp[:-1] + " please"):
        assert documents.fill_prompt("tables_html", "", {"text": typed, "files": files})[0] == gr.update()
    for previous in ("<chart2csv>", kvp, "  <tables_otsl>\n"):
        box = {"text": previous, "files": files}
        assert documents.fill_prompt("tables_html", "", box)[0] == {"text": "<tables_html>", "files": files}
        assert documents.fill_prompt("", "", box)[0] == {"text": "", "files": files}
        assert documents.fill_prompt("qa", "", box)[0] == {"text": "", "files": files}


def test_the_structured_panel_renders_a_hostile_table_safely():
    answer = '<table><tr><th>Item</th><th onclick="x()">Price</th></tr><tr><td>Pen<script>a()</script></td>' \
             '<td><img src="http://e/x.png">1</td></tr></table>'
    html, table, notes = documents.structured_view("tables_html", "", answer)
    assert "<script" not in html and "onclick" not in html and "<img" not in html and "<table" in html
    assert table["headers"] == ["Item", "Price"] and table["value"] == [["Pen", "1"]] and table["visible"]
    assert notes == "Read as HTML."


def test_the_structured_panel_shows_a_malformed_answer_with_its_error():
    html, table, notes = documents.structured_view("chart2csv", "", "Sales went <b>up</b>.")
    assert "Could not read the answer as CSV:** `not CSV: the first line has no comma-separated columns`" in notes
    assert "&lt;b&gt;up&lt;/b&gt;" in html and table["visible"] is False


def test_the_structured_panel_is_empty_before_the_first_answer_and_reads_an_empty_one():
    """A new or cleared chat has nothing to read; an answer that is empty is an error to show."""
    assert documents.structured_view("chart2csv", "", None) == ("", {"__type__": "update", "value": None,
                                                                     "visible": False}, "")
    _, _, notes = documents.structured_view("chart2csv", "", "")
    assert notes == "**Could not read the answer as CSV:** `the answer is empty`"


def test_the_structured_panel_lists_schema_problems():
    schema = '{"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total", "date"]}'
    _, _, notes = documents.structured_view("kvp", schema, '{"total": "12"}')
    assert "- `$.date`: expected `a required field`, got `nothing`" in notes
    assert '- `$.total`: expected `type "number"`, got `"12"`' in notes


# ── the picker in a browser (a page of its own, served in process; Chromium as in tests/browser.py) ──


@contextmanager
def served(build):
    """The page ``build()`` renders, in a Blocks of its own, served in process: its address, and
    its Blocks (whose events a client calls by number)."""
    from tests.conftest import free_port

    with gr.Blocks() as demo:
        build()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", demo=demo)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def picker():
    """A page with one image input and its "From a PDF" picker, as every image tab builds it."""
    def beside_its_picture():  # the picker beside the picture, as the tabs place it
        with gr.Row():
            image = gr.Image(type="filepath", elem_id="picked")
            with gr.Column():
                documents.document_picker(image, elem_id="t-doc")

    with served(beside_its_picture) as page:
        yield page


#: Each thumbnail's natural size, its drawn size (``object-fit`` inside its box) and its box's
#: place inside the scrolling strip, measured in the page.
THUMBNAIL_GEOMETRY = """() => [...document.querySelectorAll('#t-doc-thumbnails img')].map(img => {
  const box = img.getBoundingClientRect(), strip = img.closest('.grid-wrap').getBoundingClientRect();
  const fit = getComputedStyle(img).objectFit;
  const scale = {'contain': Math.min(box.width / img.naturalWidth, box.height / img.naturalHeight),
                 'scale-down': Math.min(1, box.width / img.naturalWidth, box.height / img.naturalHeight),
                 'none': 1}[fit] ?? Math.max(box.width / img.naturalWidth, box.height / img.naturalHeight);
  return {natural: [img.naturalWidth, img.naturalHeight], shown: [img.naturalWidth * scale, img.naturalHeight * scale],
          box: [box.width, box.height], fit, inside: box.top >= strip.top && box.bottom <= strip.bottom
          && box.left >= strip.left && box.right <= strip.right}})"""


@pytest.mark.parametrize("pages", [1, 2, 7])
def test_thumbnails_show_at_about_their_own_size_and_whole(picker, tmp_path, pages):
    """A 2-page PDF gave two 580-px squares (each 160x227 thumbnail blown up 2.5 times, cut off by
    the 220-px strip). Now every thumbnail of the first row is drawn within 1.5x of its natural size,
    never cropped by its box (object-fit keeps it whole) nor by the strip."""
    from tests.browser import browser_page, pick_pdf_pages
    from tests.test_documents_pdf import BLACK_BOX, minimal_pdf, page

    path = REPORT_PDF if pages == 2 else tmp_path / "letters.pdf"
    if pages != 2:  # US Letter portrait pages, or one landscape page
        size = (612, 792) if pages > 1 else (200, 100)
        path.write_bytes(minimal_pdf([page(*size, content_object=99)] * pages, {99: BLACK_BOX}))
    with browser_page() as tab:
        tab.goto(picker.url)
        pick_pdf_pages(tab, "t", path, thumbnails=pages, use=False)
        thumbnails = tab.evaluate(THUMBNAIL_GEOMETRY)
    first_row = thumbnails[:documents.TAB_COLUMNS]
    for thumbnail in first_row:
        assert thumbnail["fit"] in ("contain", "scale-down"), thumbnail  # "cover"/"fill" crop or distort
        for natural, shown in zip(thumbnail["natural"], thumbnail["shown"]):
            assert natural / 1.5 <= shown <= natural * 1.5, thumbnail
        assert thumbnail["inside"], thumbnail
    assert all(t["natural"][0] == THUMBNAIL_WIDTH for t in thumbnails)


def test_a_corrupt_pdf_is_its_toast_and_leaves_no_error_badge(picker, tmp_path):
    """A corrupt PDF (its header, then junk) gave the right toast but left an "Error" badge on the
    page box and on the thumbnail strip until the file was removed; now the toast alone."""
    from tests.browser import browser_page
    from tests.test_browser_ux import BADGE_SHOWN, toast_says

    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 4)
    with browser_page() as tab:
        tab.goto(picker.url)
        tab.locator("#t-doc-picker").click()
        tab.locator("#t-doc-pdf input[type=file]").set_input_files(str(bad))
        toast_says(tab, "bad.pdf is corrupt or unreadable as a PDF")
        tab.wait_for_timeout(1500)
        assert [box for box in ("#t-doc-pages", "#t-doc-thumbnails") if tab.evaluate(BADGE_SHOWN, box)] == []


@pytest.fixture(scope="module")
def tabs_url():
    """The Chat and Attribution tabs as the app builds them; their pickers render PDFs, and nothing
    here asks the model (engine None: no model call is made by these tests)."""
    from tests.conftest import free_port
    from webapp.attribution import attribution_tab
    from webapp.chat import chat_tab

    with gr.Blocks() as demo:
        last_chat_image = gr.State(None)
        with gr.Tab("Chat"):
            chat_tab(None, last_chat_image, [])
        with gr.Tab("Attribution"):
            attribution_tab(None, None, last_chat_image, None)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def test_the_attribution_tab_takes_a_pdf_page_like_the_other_image_tabs(tabs_url):
    from tests.browser import browser_page, pick_pdf_pages

    with browser_page(height=1400) as tab:
        tab.goto(tabs_url)
        tab.get_by_role("tab", name="Attribution").click()
        pick_pdf_pages(tab, "attribution", REPORT_PDF, thumbnails=2, pages="2")
        tab.wait_for_function("() => { const i = document.querySelector('#attribution-image img');"
                              " return i && i.complete && i.naturalWidth > 0 }")
        width = tab.evaluate("() => document.querySelector('#attribution-image img').naturalWidth")
    assert width == render_pages(REPORT_PDF, "2")[0].width  # page 2 at the default resolution


def test_a_pdf_attached_with_the_chat_paperclip_opens_the_pdf_picker(tabs_url, tmp_path):
    """The box took pictures only; a PDF attached there now leaves the box (a picture attached with it
    stays) and opens the picker with its page thumbnails, for its pages to be chosen."""
    from tests.browser import browser_page
    from tests.conftest import make_image

    picture = tmp_path / "shape.png"
    make_image(64, 48).save(picture)
    with browser_page(height=1400) as tab:
        tab.goto(tabs_url)
        tab.locator("#chat-box input[type=file]").set_input_files([str(picture), str(REPORT_PDF)])
        tab.wait_for_function("() => document.querySelectorAll('#chat-doc-thumbnails img').length == 2")
        tab.wait_for_function("() => document.querySelectorAll('#chat-box [aria-label=\"File thumbnail\"]').length == 1")
        assert "report.pdf" in tab.locator("#chat-doc-pdf").inner_text().replace("\n", "")
        assert tab.locator("#chat-box img").count() == 1  # the one left is the picture


def test_a_corrupt_pdf_after_a_good_one_leaves_none_of_the_good_ones_pages_in_the_picker(tabs_url, tmp_path):
    """A corrupt PDF attached with the Chat paperclip after a good one stood in the picker above the
    good one's page thumbnails, page 2 still typed: its refusal now empties the strip and puts the
    page box back at 1, so no page of another PDF is offered under its name."""
    from tests.browser import browser_page
    from tests.test_browser_ux import toast_says

    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 4)
    with browser_page(height=1400) as tab:
        tab.goto(tabs_url)
        tab.locator("#chat-box input[type=file]").set_input_files([str(REPORT_PDF)])
        tab.wait_for_function("() => document.querySelectorAll('#chat-doc-thumbnails img').length == 2")
        tab.locator("#chat-doc-pages textarea, #chat-doc-pages input").first.fill("2")
        tab.locator("#chat-box input[type=file]").set_input_files([str(bad)])
        toast_says(tab, "bad.pdf is corrupt or unreadable as a PDF")
        tab.wait_for_function("() => document.querySelectorAll('#chat-doc-thumbnails img').length == 0")
        assert "bad.pdf" in tab.locator("#chat-doc-pdf").inner_text().replace("\n", "")
        assert tab.locator("#chat-doc-pages textarea, #chat-doc-pages input").first.input_value() == "1"


def call_event(app, fn_name: str, data: list) -> dict:
    """Call one of the page's events by number, as the browser does (queue/join, then its event
    stream): a client can send any value, even for an event the API does not list."""
    import httpx

    dependencies = app.demo.config["dependencies"]
    index = next(i for i, d in enumerate(dependencies) if app.demo.fns[i].name == fn_name)
    session = uuid.uuid4().hex
    httpx.post(app.url + "gradio_api/queue/join", timeout=30, json={
        "data": data, "fn_index": index, "session_hash": session, "event_data": None,
        "trigger_id": dependencies[index]["targets"][0][0]}).raise_for_status()
    with httpx.stream("GET", app.url + "gradio_api/queue/data", params={"session_hash": session}, timeout=60) as events:
        for line in events.iter_lines():
            if "process_completed" in line:
                return json.loads(line.removeprefix("data:"))
    raise AssertionError("no answer")


@pytest.mark.parametrize("dpi, words", [
    ("abc", "render resolution must be a number of dots per inch, not 'abc'"),
    (None, "render resolution must be a number of dots per inch, not None"),
    (1000, "render resolution must be between 36 and 300 dpi, not 1000"),
])
def test_a_bad_resolution_sent_by_a_client_is_one_line(picker, dpi, words):
    """Gradio's slider check failed on a text or a null: a multi-line "could not preprocess" in the
    server log and a bare "Error" in the page."""
    done = call_event(picker, "use_pages", [None, "1", dpi, None])
    assert done["success"] is False and done["output"]["error"] == words


@pytest.mark.slow  # about 12 s on a quiet 2-core machine
def test_rendered_pages_live_in_the_apps_own_folder_which_goes_with_the_app(tmp_path):
    """No shared /tmp/g4v-pages: the picker's pages are in a folder named with the server's process
    id, deleted at exit; a folder that a killed server left behind goes when the next one starts,
    and a running server's stays."""
    import os
    import subprocess
    import sys

    from g4v.paths import REPO_ROOT

    script = ("import os, sys; from webapp import documents; from g4v.documents.examples import REPORT_PDF\n"
              "print(os.getpid(), documents.page_files(str(REPORT_PDF), '1', 36, 1)[0], flush=True)\n"
              "os.kill(os.getpid(), 9) if sys.argv[1] == 'killed' else None")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}

    def start(how: str) -> Path:
        run = subprocess.run([sys.executable, "-c", script, how], env=env, capture_output=True, text=True,
                             cwd=REPO_ROOT, timeout=120)
        assert run.returncode == (-9 if how == "killed" else 0), run.stderr[-2000:]
        pid, page = run.stdout.split()
        page = Path(page)
        assert page.parent.name == "pages" and page.parent.parent.parent == tmp_path
        assert page.parent.parent.name.startswith(f"g4v-app-{pid}-")
        return page

    live = tmp_path / f"g4v-app-{os.getpid()}-running"  # this test's own process: alive
    live.mkdir()
    left = start("killed")
    assert left.is_file()  # SIGKILL: no exit handler ran
    ended = start("ended")
    assert not ended.parent.parent.exists()  # a normal exit removes the app's folder
    assert not left.parent.parent.exists()  # the second start removed the dead server's folder
    assert live.is_dir()
    assert not (tmp_path / "g4v-pages").exists()


def test_a_csv_answer_is_shown_once_in_the_grid():
    """The CSV's rows fill the table; an HTML copy of the same rows above it would show them twice."""
    html, table, notes = documents.structured_view("chart2csv", "", "label,value\nred,1\nblue,5")
    assert html == "" and table["visible"] and table["headers"] == ["label", "value"]
    assert table["value"] == [["red", "1"], ["blue", "5"]] and notes == "Read as CSV."
    html, table, _ = documents.structured_view("chart2csv", "", "no table here")
    assert "no table here" in html and not table["visible"]  # a malformed answer is still shown as-is


def test_the_chat_box_takes_out_what_open_image_refuses_and_says_why(tmp_path):
    """An attachment that is not a picture leaves the box (text, good pictures and the PDF handling
    as before); the refusal to show is open_image's own line, and the line under the box says the
    same. The box's change event came twice for one upload: the refusal still on show is not said
    again (one toast, not "Warning (2)"), but it is once the line went; a picture attached after it
    takes the line away (it no longer describes the message)."""
    from g4v.images import open_image
    from tests.conftest import make_image

    good, other, fake = tmp_path / "good.png", tmp_path / "other.png", tmp_path / "fake.png"
    make_image(32, 24).save(good)
    make_image(24, 32).save(other)
    fake.write_bytes(b"not a picture")
    with pytest.raises(G4VError) as refused:
        open_image(fake)
    boxes = documents.BoxSorting(box=gr.MultimodalTextbox(), document=gr.File(), accordion=gr.Accordion(),
                                 refusal=gr.JSON(), left_out=gr.Markdown())
    box = {"text": "What is this?", "files": [{"path": str(good)}, {"path": str(fake)}, str(REPORT_PDF)]}
    sorted_out = documents.pdf_to_picker(boxes, box)
    kept, pdf, refusal, line = (sorted_out[b] for b in (boxes.box, boxes.document, boxes.refusal, boxes.left_out))
    assert kept == {"text": "What is this?", "files": [str(good)]} and pdf == str(REPORT_PDF)
    assert refusal["text"] == f"{refused.value}: removed from the message ({documents.BOX_TAKES})"
    assert line["visible"] and rendered_text(line["value"]) == "⚠️ " + refusal["text"]
    again = documents.pdf_to_picker(boxes, box, refusal, line["value"])  # the same upload's second change event
    assert boxes.refusal not in again and boxes.left_out not in again and again[boxes.box] == kept
    after_sending = documents.pdf_to_picker(boxes, box, refusal, "")  # the line went: said again
    assert after_sending[boxes.refusal] == refusal and after_sending[boxes.left_out]["visible"]
    with pytest.warns(UserWarning, match="fake.png is not an image"):  # outside an event: a warning, not a toast
        documents.show_refusal(refusal)
    documents.show_refusal(None)  # nothing to say: no toast
    assert documents.pdf_to_picker(boxes, kept, refusal, line["value"]) == gr.skip()  # typing: the line stays
    more = {"text": "What is this?", "files": [str(good), str(other)]}
    assert documents.pdf_to_picker(boxes, more, refusal, line["value"]) == {boxes.left_out: documents.left_out_line()}


def rendered_text(markdown: str) -> str:
    """What a Markdown text shows on the page (markdown-it, as Gradio's front end reads CommonMark)."""
    import html
    import re

    from markdown_it import MarkdownIt

    return html.unescape(re.sub(r"<[^>]+>", "", MarkdownIt().render(markdown))).strip()


def test_the_line_under_the_chat_box_shows_file_names_as_they_are():
    """File names with Markdown's signs in them show as typed, not as emphasis, links or code; no
    text hides the line."""
    for text in ["*bold*.png is not an image", "a_b_.png: [link](http://x) `code` <b>x</b> # 1. - + ! | ~",
                 "back\\slash\\.png"]:
        line = documents.left_out_line(text)
        assert line["visible"] and rendered_text(line["value"]) == "⚠️ " + text, line["value"]
    assert documents.left_out_line(None)["visible"] is False


def test_without_a_task_preset_the_panel_says_what_it_is_for():
    """No preset: the panel (as built, while an answer streams, and after it) says a preset fills it,
    rather than standing open and empty; with a preset and no answer yet it stays empty."""
    import gradio as gr

    from webapp.chat import chat_tab

    assert documents.structured_view("", "", "Sales went up.")[2] == documents.IDLE_NOTE
    assert documents.pending_view("")[2] == documents.IDLE_NOTE
    assert documents.pending_view("chart2csv")[2] == documents.PENDING_NOTE
    assert documents.structured_view("chart2csv", "", None)[2] == ""
    with gr.Blocks() as page:
        chat_tab(None, gr.State(None), [])
    notes = [block for block in page.blocks.values() if getattr(block, "elem_id", None) == "chat-structured-notes"]
    assert [block.value for block in notes] == [documents.IDLE_NOTE]


@pytest.fixture(scope="module")
def chat_page():
    """The Chat tab as the app builds it (no model: nothing here asks one), served in process."""
    from webapp.chat import chat_tab

    with served(lambda: chat_tab(None, gr.State(None), [])) as page:
        yield page


def test_the_structured_panel_checks_the_servers_answer_not_a_history_a_client_sends(chat_page):
    """The red team sent the panel's event a chat history of its own (12,000 objects against
    uniqueItems: 160 s, every other visitor's panel waiting). The panel reads the answer this
    session's model wrote, a state the server keeps: a session with no answer shows nothing,
    whatever history comes with the call, and at once."""
    import time

    from tests.test_documents_structured import MANY_OBJECTS

    def history(answer: str) -> list:  # as the page sends a chat history
        return [{"role": "user", "content": [{"type": "text", "text": "<kvp>"}]},
                {"role": "assistant", "content": [{"type": "text", "text": answer}]}]

    done = call_event(chat_page, "structured_view", ["kvp", documents.EXAMPLE_SCHEMA, history('{"total": 1}')])
    assert done["success"], done
    assert done["output"]["data"][0] == "" and done["output"]["data"][2] == ""  # no answer of this session yet
    started = time.monotonic()
    done = call_event(chat_page, "structured_view", ["kvp", '{"type": "array", "uniqueItems": true}',
                                                     history(json.dumps(MANY_OBJECTS))])
    assert time.monotonic() - started < 5.0
    assert done["success"] and done["output"]["data"][2] == "", done
