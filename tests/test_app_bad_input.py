"""Bad and unusual input through the app's API: clear one-line refusals, answers for what is
supported, and an app that keeps serving."""

import json
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from tests.conftest import make_image


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    paths = {}

    def save(name, image, **kwargs):
        paths[name] = folder / name
        image.save(paths[name], **kwargs)

    (folder / "notes.png").write_text("this is not a picture"); paths["notes.png"] = folder / "notes.png"
    save("ok.png", make_image(200, 150))
    (folder / "truncated.png").write_bytes(paths["ok.png"].read_bytes()[:300]); paths["truncated.png"] = folder / "truncated.png"
    save("huge.png", Image.new("1", (9000, 6000)))  # 54 M pixels: a few KB on disk
    save("one-pixel.png", Image.new("RGB", (1, 1), (200, 10, 10)))
    save("one-by-8000.png", make_image(8000, 1))
    save("cmyk.jpg", make_image(160, 120).convert("CMYK"))
    sixteen = (np.arange(120 * 160, dtype=np.uint16).reshape(120, 160) * 3)
    save("sixteen-bit.png", Image.fromarray(sixteen, mode="I;16"))
    save("palette.png", make_image(160, 120).convert("P", palette=Image.ADAPTIVE, colors=16))
    rotated = make_image(160, 90)
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise when shown
    save("exif-rotated.jpg", rotated, exif=exif)
    save("rgba.png", make_image(100, 100).convert("RGBA"))
    return paths


def send(client, text, names=(), files=None, max_new_tokens=8, temperature=0.0, top_p=1.0):
    message = {"text": text, "files": [handle_file(str(files[n])) for n in names]}
    return client.predict(message, max_new_tokens, temperature, top_p, 0, api_name="/chat")


REFUSED = [
    ("non-image file", "What is it?", ["notes.png"], {}, "not an image"),
    ("truncated png", "What is it?", ["truncated.png"], {}, "corrupt or truncated"),
    ("huge pixel count", "What is it?", ["huge.png"], {}, "too large"),
    ("empty prompt", "   ", ["ok.png"], {}, "prompt is empty"),
    ("over-long prompt", "shape " * 5000, [], {}, "too long"),
    ("4 MB prompt", "a " * 2_000_000, [], {}, "4,000,000 characters"),  # refused before tokenizing (issue 31, H1)
    ("too many images", "All of them?", ["ok.png"] * 5, {}, "too many images"),
    # A slider's range, named as the endpoint names the value (Gradio's own words were "Value 0 is
    # less than minimum value 1.", which named no value).
    ("zero new tokens", "Hi", [], {"max_new_tokens": 0}, r"^max_new_tokens must be from 1 to 1024, got 0$"),
    ("too many new tokens", "Hi", [], {"max_new_tokens": 100000}, r"^max_new_tokens must be from 1 to 1024, got 100000$"),
    ("negative temperature", "Hi", [], {"temperature": -1.0}, r"^temperature must be from 0 to 2, got -1\.0$"),
    ("top_p of zero", "Hi", [], {"top_p": 0.0}, r"^top_p must be from 0\.05 to 1, got 0\.0$"),
    ("typed image placeholder", "What is <image> here?", [], {}, "image placeholder"),
    ("fractional max_new_tokens", "Hi", [], {"max_new_tokens": 8.5}, "max_new_tokens must be a whole number"),
]

ANSWERED = [
    ("1x1 image", ["one-pixel.png"]),
    ("1x8000 image", ["one-by-8000.png"]),
    ("CMYK JPEG", ["cmyk.jpg"]),
    ("16-bit PNG", ["sixteen-bit.png"]),
    ("palette PNG", ["palette.png"]),
    ("EXIF-rotated JPEG", ["exif-rotated.jpg"]),
    ("RGBA PNG", ["rgba.png"]),
]


@pytest.mark.parametrize("case, text, names, settings, words", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_one_clear_line(client, files, case, text, names, settings, words):
    with pytest.raises(Exception) as err:
        send(client, text, names, files, **settings)
    assert_one_clean_line(str(err.value), words)


def assert_one_clean_line(message: str, words: str) -> None:
    """One line that names the problem, without tracebacks, server paths or library internals."""
    assert re.search(words, message), message
    assert "Traceback" not in message and "\n" not in message.strip(), message
    assert "/tmp" not in message and "gradio" not in message.lower() and "site-packages" not in message, message


def engine_answer(engine, text, names, files, max_new_tokens=8) -> str:
    """The model's own greedy answer to this one message (a fresh API session has no history)."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.images import open_image

    message = Message("user", text, [open_image(files[n]) for n in names])
    return engine.generate([message], SamplingSettings(max_new_tokens=max_new_tokens)).text


@pytest.mark.parametrize("case, names", ANSWERED, ids=[c[0] for c in ANSWERED])
def test_unusual_but_valid_images_are_answered(app_url, hf_engine, files, case, names):
    answer = send(Client(app_url, verbose=False), "What is in this picture?", names, files)
    assert answer == engine_answer(hf_engine, "What is in this picture?", names, files)


def test_app_still_serves_after_bad_input(app_url, client, hf_engine, files):
    answer = send(Client(app_url, verbose=False), "Still there?", ["ok.png"], files, max_new_tokens=4)
    assert answer == engine_answer(hf_engine, "Still there?", ["ok.png"], files, max_new_tokens=4)


def raw_call(app_url: str, api_name: str, body: str) -> str:
    """Gradio's REST API with a hand-written JSON body: what a non-Python client can send and
    gradio_client cannot (a lone surrogate as ``\\udc80``, ``NaN``). Returns the event stream."""
    import httpx

    started = httpx.post(f"{app_url}gradio_api/call/{api_name}", content=body,
                         headers={"Content-Type": "application/json"}, timeout=30)
    started.raise_for_status()
    return httpx.get(f"{app_url}gradio_api/call/{api_name}/{started.json()['event_id']}", timeout=120).text


RAW_REFUSED = [  # (case, JSON body for /chat, words)
    ("lone surrogate", '{"data": [{"text": "broken \\udc80 text", "files": []}, 8, 0.0, 1.0, 0]}', "not valid Unicode"),
    ("null message", '{"data": [null, 8, 0.0, 1.0, 0]}', "message is empty"),
    ("NaN max_new_tokens", '{"data": [{"text": "Hi", "files": []}, NaN, 0.0, 1.0, 0]}', "max_new_tokens must be a finite number"),
    ("NaN temperature", '{"data": [{"text": "Hi", "files": []}, 8, NaN, 1.0, 0]}', "temperature must be a finite number"),
    # What Gradio itself refused in several lines of its internals (a component's index, a pydantic
    # report, the components' objects), named as the endpoint names the value.
    ("max_new_tokens as text", '{"data": [{"text": "Hi", "files": []}, "abc", 0.0, 1.0, 0]}',
     r"^max_new_tokens must be a number, got 'abc'$"),
    ("a list for a number", '{"data": [{"text": "Hi", "files": []}, 8, 0.0, [1], 0]}', r"^top_p must be a number, got \[1\]$"),
    ("message as plain text", '{"data": ["hello", 8, 0.0, 1.0, 0]}',
     r'^message is not in the form this input takes \{"text": \.\.\., "files": \[\.\.\.\]\}$'),
    ("files that are not files", '{"data": [{"text": "Hi", "files": "abc"}, 8, 0.0, 1.0, 0]}', "^message is not in the form"),
    ("one value of five", '{"data": [{"text": "Hi", "files": []}]}',
     r"^too few values: this takes message, max_new_tokens, temperature, top_p, seed$"),
    ("a file whose meta is no object", '{"data": [{"text": "Hi", "files": [{"path": "x", "meta": "y"}]}, 8, 0.0, 1.0, 0]}',
     "^message is not in the form"),
    ("a billion new tokens", '{"data": [{"text": "Hi", "files": []}, 1e9, 0.0, 1.0, 0]}',
     r"^max_new_tokens must be from 1 to 1024, got 1000000000\.0$"),
]


@pytest.mark.parametrize("case, body, words", RAW_REFUSED, ids=[c[0] for c in RAW_REFUSED])
def test_raw_api_values_are_refused_in_one_line(app_url, case, body, words):
    events = raw_call(app_url, "chat", body)
    assert "event: error" in events, events
    said = json.loads(events.split("event: error", 1)[1].split("data:", 1)[1].strip().splitlines()[0])
    assert_one_clean_line(said["error"] if isinstance(said, dict) else said, words)


IMAGE_ENDPOINTS = {  # endpoint -> its arguments around the image
    "/tiling": lambda image: (image,),
    "/inspect": lambda image: (image, "What colour is it?", [], "", False),
    "/lora_side_by_side": lambda image: ("demo-lora", image, "What colour is it?", 4, 0.0, 0),
    "/lora_diff": lambda image: ("demo-lora", image, "What colour is it?", 4),
}
BAD_FILES = [("notes.png", "notes.png is not an image"), ("truncated.png", "truncated.png is corrupt"),
             ("huge.png", "huge.png is too large")]


@pytest.mark.parametrize("endpoint", sorted(IMAGE_ENDPOINTS))
@pytest.mark.parametrize("name, words", BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_image_tabs_refuse_bad_files_by_name_without_server_paths(client, files, endpoint, name, words):
    """The file is checked by the workbench (the pixel limit from the header, before decoding),
    not by Gradio's preprocessing, and the error names the file, not where the server keeps it."""
    with pytest.raises(Exception) as err:
        client.predict(*IMAGE_ENDPOINTS[endpoint](handle_file(str(files[name]))), api_name=endpoint)
    assert_one_clean_line(str(err.value), words)


def test_an_adapter_name_of_5000_characters_is_refused_in_one_line(client, files):
    with pytest.raises(Exception) as err:
        client.predict("a" * 5000, handle_file(str(files["ok.png"])), "What colour is it?", 4, 0.0, 0,
                       api_name="/lora_side_by_side")
    assert_one_clean_line(str(err.value), "adapter")
    assert "a" * 300 not in str(err.value)


def test_uploads_over_the_size_limit_are_refused(client, tmp_path):
    from g4v.settings.limits import limits

    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * (int(limits().max_upload_size.removesuffix("mb")) * 1024 * 1024 + 1))
    with pytest.raises(Exception) as err:
        client.predict(handle_file(str(big)), api_name="/tiling")
    assert "size" in str(err.value).lower() or "413" in str(err.value), str(err.value)


def test_a_long_image_conversation_keeps_being_answered(app_url, files):
    """One API session sends more picture turns than fit the context window (about 14 on this
    checkpoint) and the conversation limit; the oldest turns are dropped and every turn answers."""
    session = Client(app_url, verbose=False)
    for turn in range(16):
        answer = send(session, f"Turn {turn}: what colour is it?", ["ok.png"], files, max_new_tokens=4)
        assert isinstance(answer, str), turn


def test_telemetry_is_off_and_only_examples_are_served(app_url, tmp_path):
    import httpx

    from g4v.paths import BUNDLED_MODEL_DIR

    assert httpx.get(f"{app_url}config", timeout=10).json()["analytics_enabled"] is False
    for private in ("config.json", "model.safetensors"):
        response = httpx.get(f"{app_url}gradio_api/file={BUNDLED_MODEL_DIR / private}", timeout=10)
        assert response.status_code in (403, 404), private
    # Another program's file in the shared Gradio cache folder is not this app's to serve.
    shared = Path(tempfile.gettempdir()) / "gradio" / f"g4v-test-{tmp_path.name}"
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "secret.txt").write_text("someone else's")
    try:
        response = httpx.get(f"{app_url}gradio_api/file={shared / 'secret.txt'}", timeout=10)
        assert response.status_code in (403, 404) and "someone else" not in response.text
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ── issue 31 M3: what a visitor uploads is shown as text, never as HTML ────────────────────────


@contextmanager
def listener():
    """A local HTTP server that counts the requests it gets: the address an injected tag would call."""
    import http.server
    import threading

    hits = []

    class Count(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Count)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_column_names_with_html_show_as_text_in_one_toast(app_url, tmp_path, output_dir):
    """An uploaded table whose column names are an <img> and a login link, none of them guessed: the
    line under the dataset that asks for the picture column's name, and the toast of a Run before
    it is named, show them as text (no element, no request to their address), name the app's own
    control, and the toast comes once."""
    from tests.browser import browser_page

    with listener() as (address, hits):
        image, link = f"<img src={address}/x.png>", f'<a href="{address}/login">login</a>'
        table = tmp_path / "data.jsonl"
        table.write_text(json.dumps({image: "a.png", link: "what is it?"}) + "\n")
        with browser_page() as page:
            page.goto(app_url)
            page.get_by_role("tab", name="Evaluate").click()
            page.locator("#eval-upload input[type=file]").set_input_files(str(table))
            page.wait_for_function("() => /No image column guessed/.test(document.querySelector('#eval-dataset-info')"
                                   ".innerText)", timeout=60_000)
            line = page.inner_text("#eval-dataset-info")
            assert image in line and link in line and "'image column'" in line, line
            assert page.locator("#eval-dataset-info").locator("img, a, input").count() == 0
            page.locator("#eval-run").click()
            page.wait_for_selector("[data-testid='toast-body']", timeout=60_000)
            page.wait_for_timeout(3000)  # a second toast for the same upload would be here by now
            toasts = page.locator("[data-testid='toast-body']")
            texts = [text.replace("\u2060", "") for text in toasts.all_inner_texts()]  # the invisible joiner after <
            page.screenshot(path=str(output_dir / "evaluate-toast-escaped.png"))
            assert len(texts) == 1, texts
            assert image in texts[0] and link in texts[0], texts[0]
            assert "--columns" not in texts[0] and "'image column'" in texts[0]
            assert toasts.first.locator("img, a, input").count() == 0
        assert hits == []


def test_a_refusal_becomes_one_toast_in_the_apps_wording_safe_in_html_and_plain_for_the_api():
    """shows_errors is the one place a refusal becomes a toast (Gradio's own gr.Error passes through
    as it is), CLI flags replaced by the app's own control. The toast is HTML to the page and text
    to an API client: no entities (``x0 &lt; x1`` was what a client read), and no tag either: a
    ``<`` that would open one has an invisible word joiner after it."""
    import gradio as gr

    from g4v.errors import G4VError
    from webapp.common import shows_errors

    @shows_errors
    def refuse(message):
        raise G4VError(message)

    @shows_errors
    def plain():
        raise gr.Error("send the image as an uploaded file")

    with pytest.raises(gr.Error) as shown:
        refuse("no image column found (columns: <b>x</b> & 'y'); name it with --columns image=COLUMN")
    assert shown.value.message == ("no image column found (columns: <\u2060b>x<\u2060/b> & 'y'); "
                                   "type its name in the box 'image column' (Column mapping)")
    with pytest.raises(gr.Error) as shown:
        refuse("the region must have x0 < x1 & y0 < y1")
    assert shown.value.message == "the region must have x0 < x1 & y0 < y1"
    with pytest.raises(gr.Error) as shown:
        plain()
    assert shown.value.message == "send the image as an uploaded file"


@pytest.mark.parametrize("named", ["file:///etc/passwd", "/etc/passwd", "../../etc/passwd", "app.py"])
def test_a_file_named_instead_of_sent_is_one_line_without_the_servers_folder(app_url, named):
    """A client that names a file as a file input's value (the red team's ``{"path":
    "file:///etc/passwd"}``) got Gradio's "Cannot move <the app's working folder>/file:/etc/passwd
    to the gradio cache dir": now the app's one line, with no server path."""
    from g4v.paths import REPO_ROOT
    from tests.test_evaluate_disconnect import Visitor, completed
    from webapp.intake import NOT_UPLOADED

    visitor = Visitor(app_url)
    visitor.join("tiling", [{"path": named, "meta": {"_type": "gradio.FileData"}}])
    done = completed(visitor, 60)
    assert done["success"] is False and done["output"]["error"] == NOT_UPLOADED, done
    assert str(REPO_ROOT) not in json.dumps(done)
