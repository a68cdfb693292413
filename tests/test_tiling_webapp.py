"""The Tiling tab's handlers on strips and stamps, and on an image that changed after analysing.

Runs webapp.tiling's real handlers (no server) with the bundled config. Which token comes first is
checked against transformers in test_tiling.py; here the handlers must not fail on any shape.
"""

import gradio as gr
import pytest

from tests.conftest import make_image
from viz.figures import display_size
from g4v.paths import BUNDLED_MODEL_DIR
from g4v.loading import load_config
from g4v.tiling import first_token_to_show
from webapp.tiling import make_handlers


@pytest.fixture(scope="module")
def handlers():
    return make_handlers(load_config(BUNDLED_MODEL_DIR))


@pytest.mark.parametrize("size", [(1, 8000), (3, 600), (8000, 1), (1, 1), (300, 500)])
def test_analyse_selects_a_token_for_every_shape(size, handlers, tmp_path):
    analyse, select_index, _ = handlers
    height, width = size
    path = tmp_path / "picture.png"
    make_image(width, height, seed=1).save(path)

    overlay, rows, plan, first, view, info, analysed = analyse(str(path))
    assert first == first_token_to_show(plan)
    assert view.size == display_size(width, height) and f"Token **{first}**" in info
    count = plan.num_image_tokens

    view, info = select_index(str(path), plan, analysed, count - 1)
    assert f"Token **{count - 1}** of {count}" in info


def test_token_for_a_changed_image_is_refused(handlers, tmp_path):
    analyse, select_index, _ = handlers
    analysed, other = tmp_path / "analysed.png", tmp_path / "other.png"
    make_image(500, 300).save(analysed)
    make_image(8000, 1).save(other)
    plan, fingerprint = analyse(str(analysed))[2], analyse(str(analysed))[6]
    with pytest.raises(gr.Error, match="the image changed since it was analysed") as caught:
        select_index(str(other), plan, fingerprint, 0)
    assert str(tmp_path) not in str(caught.value)
    with pytest.raises(gr.Error, match=f"out of range: this image has tokens 0-{plan.num_image_tokens - 1}"):
        select_index(str(analysed), plan, fingerprint, 5000)
    with pytest.raises(gr.Error, match="token index must be a whole number, got 3.5"):
        select_index(str(analysed), plan, fingerprint, 3.5)


def test_a_different_picture_of_the_same_size_is_refused(handlers, tmp_path):
    """The size alone cannot tell two pictures apart; the file's fingerprint does."""
    from PIL import Image

    analyse, select_index, _ = handlers
    green, blue = tmp_path / "green.png", tmp_path / "blue.png"
    Image.new("RGB", (200, 200), (0, 200, 0)).save(green)
    Image.new("RGB", (200, 200), (0, 0, 200)).save(blue)
    _, _, plan, _, _, _, fingerprint = analyse(str(green))
    with pytest.raises(gr.Error, match="the image changed since it was analysed"):
        select_index(str(blue), plan, fingerprint, 5)
    view, info = select_index(str(green), plan, fingerprint, 5)
    assert "Token **5**" in info
