"""The region picker of the Circuits tab's reverse view: the picture with the region framed and the
rest dimmed. The region is the text in its box, typed, pasted, or set by two clicks on the picture
(the first marks one corner, the second the opposite one); the picker draws whatever the box holds,
so a run reads what the visitor sees framed."""

import math

import gradio as gr
from PIL import Image

from g4v.circuits.reverse import parse_region
from g4v.errors import WHOLE_TEXT, G4VError
from g4v.images import open_image
from viz.circuits import picker_size, region_overlay
from viz.figures import original_point
from webapp.common import QUIET_INPUT, shows_errors
from webapp.runs import without_error_badges


def first_corner(region) -> tuple[int, int] | None:
    """The corner ``region`` names when it holds two whole numbers, as the first click writes it
    ("x,y"); ``None`` for anything else."""
    parts = [part.strip() for part in (region or "").replace(" ", ",").split(",") if part.strip()]
    if len(parts) != 2 or not all(WHOLE_TEXT.fullmatch(part) and len(part) <= 9 and part[0] not in "+-"
                                  for part in parts):
        return None
    return int(parts[0]), int(parts[1])


@shows_errors
def show_region(image_path, region):
    """The picker after Enter in the region's box: the picture with the region framed (nothing
    framed while the box is empty); a region that is not one is refused in one line."""
    if not image_path:
        return None
    picture = open_image(image_path)
    box = parse_region(region, picture.width, picture.height) if (region or "").strip() else None
    return region_overlay(picture, box)


def show_new_picture(image_path, region):
    """The picker for a new picture and after each change of the region's box (a keystroke, a paste,
    a click's own text): framed as :func:`show_region` does, a first corner marked as the click that
    wrote it marked it, and never refused. A file that is no picture is the upload's own toast; a
    region typed for the picture before, or half typed, is framed once it fits, the picture shown
    unframed until then: Enter or a run says what is wrong."""
    if not image_path:
        return None
    try:
        picture = open_image(image_path)
    except G4VError:
        return None
    corner = first_corner(region)
    if corner is not None and corner[0] < picture.width and corner[1] < picture.height:
        return region_overlay(picture, point=corner)
    try:
        box = parse_region(region, picture.width, picture.height) if (region or "").strip() else None
    except G4VError:
        box = None
    return region_overlay(picture, box)


@shows_errors
def pick_corner(image_path, region, evt: gr.SelectData) -> tuple[str, Image.Image]:
    """A click on the region picker: the first click sets one corner, the second the opposite one
    (the region's text and the picker's picture)."""
    if not image_path:
        raise G4VError("upload a picture first")
    picture = open_image(image_path)
    # the click is in the shown picture's pixels (Gradio's index); the picture pixel under the
    # centre of the one clicked
    x, y = original_point(evt.index[0] + 0.5, evt.index[1] + 0.5, picture.size, picker_size(picture.size))
    x, y = min(max(0, math.floor(x)), picture.width - 1), min(max(0, math.floor(y)), picture.height - 1)
    first = first_corner(region)
    if first is not None:
        box = (min(first[0], x), min(first[1], y), max(first[0], x) + 1, max(first[1], y) + 1)
        return ",".join(map(str, box)), region_overlay(picture, box)
    return f"{x},{y}", region_overlay(picture, point=(x, y))


def wire_region_picker(image: gr.Image, region: gr.Textbox, picker: gr.Image) -> None:
    """The picker follows the picture and the region's box. ``.change`` and not ``.input``: a paste
    or a browser's autofill changes the box without the keystrokes Gradio counts as input, and the
    clicks' own text draws what the click drew (the last change drawn last); Enter says what is
    wrong with the region; a click sets a corner."""
    for event, show in ((image.change, show_new_picture), (region.change, show_new_picture),
                        (region.submit, show_region)):
        without_error_badges(event(show, [image, region], picker, api_visibility="private", trigger_mode="always_last",
                                   **QUIET_INPUT), [picker])

    def corner(image_path, typed, evt: gr.SelectData):
        text, shown = pick_corner(image_path, typed, evt)
        return {region: text, picker: shown}

    without_error_badges(picker.select(corner, [image, region], [region, picker], api_visibility="private",
                                       **QUIET_INPUT), [region, picker])
