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
from g4v.tiling.view import token_to_show
from webapp.tiling import TilingBoxes, make_handlers

#: The tab's boxes, made outside a page: the handlers return their values by box.
BOXES = TilingBoxes(overlay=gr.Image(), table=gr.Dataframe(), plan=gr.State(), regions=gr.State(),
                    token_index=gr.Number(), token_view=gr.Image(), token_info=gr.Markdown(), analysed=gr.State(),
                    unmarked=gr.State(), shown=gr.State())


def shown(values: dict, *names: str) -> tuple:
    """The values a handler returned for the boxes ``names`` (TilingBoxes' fields)."""
    return tuple(values[getattr(BOXES, name)] for name in names)


ANALYSED = ("overlay", "table", "plan", "regions", "token_index", "token_view", "token_info", "analysed", "unmarked")
PICKED = ("token_view", "token_info", "overlay")


@pytest.fixture(scope="module")
def handlers():
    return make_handlers(load_config(BUNDLED_MODEL_DIR), BOXES)


@pytest.mark.parametrize("size", [(1, 8000), (3, 600), (8000, 1), (1, 1), (300, 500)])
def test_analyse_selects_a_token_for_every_shape(size, handlers, tmp_path):
    analyse, select_index = handlers[:2]
    height, width = size
    path = tmp_path / "picture.png"
    make_image(width, height, seed=1).save(path)

    overlay, rows, plan, regions, first, view, info, analysed, unmarked = shown(analyse(str(path)), *ANALYSED)
    assert first == token_to_show(plan) == shown(analyse(str(path)), "shown")[0]
    assert view.size == display_size(width, height) and f"Token **{first}**" in info
    count = plan.num_image_tokens

    view, info, _ = shown(select_index(str(path), plan, analysed, regions, unmarked, count - 1), *PICKED)
    assert f"Token **{count - 1}** of {count}" in info


def test_token_for_a_changed_image_is_refused(handlers, tmp_path):
    analyse, select_index = handlers[:2]
    analysed, other = tmp_path / "analysed.png", tmp_path / "other.png"
    make_image(500, 300).save(analysed)
    make_image(8000, 1).save(other)
    _, _, plan, regions, _, _, _, fingerprint, unmarked = shown(analyse(str(analysed)), *ANALYSED)
    with pytest.raises(gr.Error, match="the image changed since it was analysed") as caught:
        select_index(str(other), plan, fingerprint, regions, unmarked, 0)
    assert str(tmp_path) not in str(caught.value)
    with pytest.raises(gr.Error, match=f"out of range: this image has tokens 0-{plan.num_image_tokens - 1}"):
        select_index(str(analysed), plan, fingerprint, regions, unmarked, 5000)
    with pytest.raises(gr.Error, match="token index must be a whole number, got 3.5"):
        select_index(str(analysed), plan, fingerprint, regions, unmarked, 3.5)


def test_a_different_picture_of_the_same_size_is_refused(handlers, tmp_path):
    """The size alone cannot tell two pictures apart; the file's fingerprint does."""
    from PIL import Image

    analyse, select_index = handlers[:2]
    green, blue = tmp_path / "green.png", tmp_path / "blue.png"
    Image.new("RGB", (200, 200), (0, 200, 0)).save(green)
    Image.new("RGB", (200, 200), (0, 0, 200)).save(blue)
    _, _, plan, regions, _, _, _, fingerprint, unmarked = shown(analyse(str(green)), *ANALYSED)
    with pytest.raises(gr.Error, match="the image changed since it was analysed"):
        select_index(str(blue), plan, fingerprint, regions, unmarked, 5)
    view, info, _ = shown(select_index(str(green), plan, fingerprint, regions, unmarked, 5), *PICKED)
    assert "Token **5**" in info


def canvas_in_overlay(overlay) -> tuple[float, float, float, float]:
    """Where the overlay draws the padded canvas, found from its pixels alone: the canvas is framed
    by black lines, the only long straight black runs in the picture's left part above the legend
    (the base view lies to its right, the legend below)."""
    import numpy as np

    pixels = np.asarray(overlay.convert("RGB")).astype(int)
    height, width = pixels.shape[:2]
    black = pixels[: int(0.92 * height), : int(0.7 * width)].max(axis=-1) < 40

    def long_runs(lines) -> list[int]:  # the lines holding a black run of at least 25 pixels
        found = []
        for number, line in enumerate(lines):
            edges = np.diff(np.concatenate([[0], line.astype(int), [0]]))
            if ((np.nonzero(edges == -1)[0] - np.nonzero(edges == 1)[0]) >= 25).any():
                found.append(number)
        return found

    rows, cols = long_runs(black), long_runs(black.T)
    return float(min(cols)), float(min(rows)), float(max(cols)), float(max(rows))


def overlay_spot(plan, canvas, token) -> tuple[float, float]:
    """The overlay pixel showing the centre of ``token``'s box: original pixel -> resized and padded
    canvas (the plan's resize and padding) -> the canvas as found in the overlay."""
    left, top, right, bottom = canvas
    height, width = plan.image_size
    (best_height, best_width), (resized_height, resized_width) = plan.best_resolution, plan.resized_size
    box = token.box
    canvas_x = (box[0] + box[2]) / 2 * resized_width / width + plan.padding.left
    canvas_y = (box[1] + box[3]) / 2 * resized_height / height + plan.padding.top
    return left + canvas_x * (right - left) / best_width, top + canvas_y * (bottom - top) / best_height


@pytest.mark.parametrize("size", [(300, 500), (242, 117), (1000, 1600)])
def test_a_click_on_the_overlay_picks_the_token_under_it(size, handlers, tmp_path):
    """Tile tokens first, middle and last: a click at the centre of each one's box (found on the
    overlay through its drawn tile borders) selects it; the base view's centre gives the base token
    that holds the image's centre; a click on the title selects nothing."""
    from PIL import Image

    analyse, select_on_overlay = handlers[0], handlers[3]
    height, width = size
    path = tmp_path / "picture.png"
    make_image(width, height, seed=2).save(path)
    _, _, plan, regions, _, _, _, analysed, overlay = shown(analyse(str(path)), *ANALYSED)
    canvas = canvas_in_overlay(overlay)
    tiles = [token for token in plan.tokens if token.kind == "tile"]
    for token in (tiles[0], tiles[len(tiles) // 2], tiles[-1]):
        x, y = overlay_spot(plan, canvas, token)
        index, view, info = shown(select_on_overlay(str(path), plan, analysed, regions, overlay,
                                                    gr.SelectData(None, {"index": [x, y], "value": None})),
                                  "token_index", "token_view", "token_info")
        assert index == token.index and f"Token **{token.index}**" in info and isinstance(view, Image.Image)
    left, top, right, bottom = regions["base"]
    index, = shown(select_on_overlay(str(path), plan, analysed, regions, overlay,
                                     gr.SelectData(None, {"index": [(left + right) / 2, (top + bottom) / 2], "value": None})),
                   "token_index")
    centre = plan.token(index)
    assert centre.kind == "base" and centre.box[0] <= width / 2 <= centre.box[2] and centre.box[1] <= height / 2 <= centre.box[3]
    assert select_on_overlay(str(path), plan, analysed, regions, overlay,
                             gr.SelectData(None, {"index": [5, 5], "value": None})) == gr.skip()  # every box keeps its value


def marked_frame(before, after) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) pixel span of what a mark changed on the overlay."""
    import numpy as np

    changed = np.abs(np.asarray(after, dtype=int) - np.asarray(before, dtype=int)).max(axis=-1) > 0
    rows, cols = np.nonzero(changed.any(axis=1))[0], np.nonzero(changed.any(axis=0))[0]
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


@pytest.mark.parametrize("size", [(300, 500), (1000, 1600)])
def test_the_picked_token_is_framed_on_the_overlay(size, handlers, tmp_path):
    """After a click on the overlay, the overlay comes back with the picked token framed: the only
    pixels that changed form a frame a few pixels around the token's feature cell, located from the
    drawn canvas (its black frame) and the plan's cell size, not from the code's own regions; the
    next pick frames the next token only (the first mark is gone); the base view's token is framed
    in the base view."""
    height, width = size
    path = tmp_path / "picture.png"
    make_image(width, height, seed=3).save(path)
    analyse, select_on_overlay = handlers[0], handlers[3]
    framed, _, plan, regions, first, _, _, analysed, overlay = shown(analyse(str(path)), *ANALYSED)
    assert framed.size == overlay.size and framed.tobytes() != overlay.tobytes()  # the first token is framed too
    canvas = canvas_in_overlay(overlay)
    left, top, right, bottom = canvas
    cell = plan.tile_size / plan.view_feature_grid[0]
    per_pixel = ((right - left) / plan.best_resolution[1], (bottom - top) / plan.best_resolution[0])
    tiles = [token for token in plan.tokens if token.kind == "tile"]
    for token in (tiles[len(tiles) // 3], tiles[-2]):
        x, y = overlay_spot(plan, canvas, token)
        index, marked = shown(select_on_overlay(str(path), plan, analysed, regions, overlay,
                                                gr.SelectData(None, {"index": [x, y], "value": None})),
                              "token_index", "overlay")
        assert index == token.index
        frame_left, frame_top, frame_right, frame_bottom = marked_frame(overlay, marked)
        column = plan.unpadded_cols[0] + token.col  # the cell in the whole tile-feature grid
        row = plan.unpadded_rows[0] + token.row
        cell_left, cell_top = left + column * cell * per_pixel[0], top + row * cell * per_pixel[1]
        cell_right, cell_bottom = cell_left + cell * per_pixel[0], cell_top + cell * per_pixel[1]
        for drawn, expected in ((frame_left, cell_left), (frame_top, cell_top), (frame_right, cell_right),
                                (frame_bottom, cell_bottom)):
            assert abs(drawn - expected) <= 6, (token.index, (frame_left, frame_top, frame_right, frame_bottom),
                                                (cell_left, cell_top, cell_right, cell_bottom))
    base_left, base_top, base_right, base_bottom = regions["base"]
    centre = ((base_left + base_right) / 2, (base_top + base_bottom) / 2)
    marked, = shown(select_on_overlay(str(path), plan, analysed, regions, overlay,
                                      gr.SelectData(None, {"index": list(centre), "value": None})), "overlay")
    frame = marked_frame(overlay, marked)
    assert base_left - 6 <= frame[0] <= centre[0] <= frame[2] <= base_right + 6
    assert base_top - 6 <= frame[1] <= centre[1] <= frame[3] <= base_bottom + 6
