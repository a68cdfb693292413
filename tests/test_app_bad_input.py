"""Bad and unusual input through the app's API: clear one-line refusals, answers for what is
supported, and an app that keeps serving."""

import re

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
    ("too many images", "All of them?", ["ok.png"] * 5, {}, "too many images"),
    # Gradio's sliders check their own ranges first ("Value 0 is less than minimum value 1.").
    ("zero new tokens", "Hi", [], {"max_new_tokens": 0}, "max_new_tokens|minimum value"),
    ("too many new tokens", "Hi", [], {"max_new_tokens": 100000}, "max_new_tokens|maximum value"),
    ("negative temperature", "Hi", [], {"temperature": -1.0}, "temperature|minimum value"),
    ("top_p of zero", "Hi", [], {"top_p": 0.0}, "top_p|minimum value"),
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
    message = str(err.value)
    assert re.search(words, message), message
    assert "Traceback" not in message and "\n" not in message.strip()


@pytest.mark.parametrize("case, names", ANSWERED, ids=[c[0] for c in ANSWERED])
def test_unusual_but_valid_images_are_answered(client, files, case, names):
    answer = send(client, "What is in this picture?", names, files)
    assert isinstance(answer, str)


def test_app_still_serves_after_bad_input(client, files):
    assert send(client, "Still there?", ["ok.png"], files, max_new_tokens=4) is not None
