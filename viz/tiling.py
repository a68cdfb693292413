"""Pictures of an anyres tiling plan: the padded canvas with its tiles and the base view.

Input is plain data: a PIL image and the plan as the dict ``g4v.tiling.TilingPlan.to_dict()`` returns
(the same JSON ``python -m g4v tiling --json`` prints). Boxes are ``(left, top, right, bottom)``.

Every picture stays within ``viz.figures.MAX_PICTURE_SIDE`` pixels on a side, whatever the image.
The token budget is no part of the picture: the tab shows it as a table and the CLI prints it, so
a reader finds it once.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import numpy as np  # noqa: E402
from matplotlib import patches as mpatches  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from viz.figures import MAX_PICTURE_SIDE, display_size, figure_to_image, shown_picture, text_points  # noqa: E402

TILE_COLOUR = "#ffd400"
CELL_COLOUR = "#ffffff"
PADDING_COLOUR = "#7f7f7f"
DROPPED_COLOUR = "#e6194b"
UNPADDED_COLOUR = "#00e5ff"
#: A highlighted token's label: this share of the picture's longer side, at least this many pixels.
LABEL_SHARE, LABEL_MIN_PX = 1 / 28, 14
#: The picked token's colour, on the token view (filled) and on the overlay (outlined).
PICKED_COLOUR = (230, 25, 75)
#: The overlay's size in inches (drawn at 100 dpi: 1300 x 650 pixels).
OVERLAY_INCHES = (13, 6.5)


def render_tiling_overlay(image: Image.Image, plan: dict, dpi: int = 100) -> Image.Image:
    """One RGB picture: the padded canvas as the model sees it (tiles, feature cells, padding, the
    unpadded region, the cut-off features) and the base view beside it, the legend below.
    The figure has a fixed size in inches, whatever the image; ``dpi`` is capped to keep it within
    ``MAX_PICTURE_SIDE``."""
    return tiling_overlay(image, plan, dpi)[0]


def tiling_overlay(image: Image.Image, plan: dict, dpi: int = 100) -> tuple[Image.Image, dict]:
    """:func:`render_tiling_overlay`'s picture, and where its two views lie in it, so a click on the
    picture can be mapped to a token: ``{"canvas": box, "base": box}``, each ``(left, top, right,
    bottom)`` in the picture's pixels, spanning the padded canvas and the base view exactly."""
    dpi = min(dpi, MAX_PICTURE_SIDE / max(OVERLAY_INCHES))
    figure = Figure(figsize=OVERLAY_INCHES, dpi=dpi, facecolor="white")
    grid = figure.add_gridspec(1, 2, width_ratios=[3, 1], wspace=0.08, left=0.03, right=0.97, top=0.9, bottom=0.12)
    views = {"canvas": figure.add_subplot(grid[0, 0]), "base": figure.add_subplot(grid[0, 1])}
    small = text_points(OVERLAY_INCHES[0])
    _draw_canvas(views["canvas"], image, plan, small)
    _draw_base_view(views["base"], image, plan, small)
    picture = figure_to_image(figure, dpi=dpi, tight=False)
    width, height = picture.size
    regions = {}
    for name, axes in views.items():  # drawn by now: the positions are the aspect-adjusted ones
        box = axes.get_position()  # figure fractions, origin at the bottom left
        regions[name] = tuple(float(v) for v in (box.x0 * width, (1 - box.y1) * height, box.x1 * width,
                                                  (1 - box.y0) * height))
    return picture, regions


def save_tiling_overlay(image: Image.Image, plan: dict, path: str | Path) -> Path:
    path = Path(path)
    render_tiling_overlay(image, plan).save(path, format="PNG")
    return path


def overlay_title(plan: dict) -> str:
    """The overlay's title: sizes width first and grids in words, as the CLI writes them."""
    width, height = plan["image_size"]["width"], plan["image_size"]["height"]
    best_height, best_width = plan["best_resolution"]
    rows, cols = plan["grid"]
    unpadded_rows, unpadded_cols = plan["unpadded_grid"]
    return (f"image {width} x {height} px (width x height) -> canvas {best_width} x {best_height}, "
            f"tiles {cols} wide x {rows} tall, tile tokens kept {unpadded_cols} wide x {unpadded_rows} tall")


def padded_canvas(image: Image.Image, plan: dict) -> Image.Image:
    """The image resized and padded with black exactly as the processor does, before tiling."""
    best_height, best_width = plan["best_resolution"]
    resized_height, resized_width = plan["resized_size"]
    canvas = Image.new("RGB", (best_width, best_height), (0, 0, 0))
    resized = shown_picture(image, (resized_width, resized_height))
    canvas.paste(resized, (plan["padding"]["left"], plan["padding"]["top"]))
    return canvas


def _draw_canvas(axes, image: Image.Image, plan: dict, small: float) -> None:
    best_height, best_width = plan["best_resolution"]
    axes.imshow(np.asarray(padded_canvas(image, plan)), extent=(0, best_width, best_height, 0))

    # Padding: everything outside the resized image.
    left, top, right, bottom = plan["content_box"]
    for box in [(0, 0, best_width, top), (0, bottom, best_width, best_height),
                (0, top, left, bottom), (right, top, best_width, bottom)]:
        _rectangle(axes, box, facecolor=PADDING_COLOUR, alpha=0.55, hatch="//", edgecolor="none")

    # Feature cells that unpadding cuts off (they never become tokens).
    feature_rows, feature_cols = plan["tile_feature_grid"]
    cell = plan["tile_size"] / plan["view_feature_grid"][0]
    row_start, row_stop = plan["unpadded_rows"]
    col_start, col_stop = plan["unpadded_cols"]
    for box in [(0, 0, best_width, row_start * cell), (0, row_stop * cell, best_width, best_height),
                (0, 0, col_start * cell, best_height), (col_stop * cell, 0, best_width, best_height)]:
        if box[2] > box[0] and box[3] > box[1]:
            _rectangle(axes, box, facecolor=DROPPED_COLOUR, alpha=0.25, edgecolor="none")

    # Feature cells: one image token each (inside the unpadded region).
    line_width = 0.4 if max(feature_rows, feature_cols) <= 64 else 0.2
    for r in range(1, feature_rows):
        axes.plot([0, best_width], [r * cell, r * cell], color=CELL_COLOUR, linewidth=line_width, alpha=0.5)
    for c in range(1, feature_cols):
        axes.plot([c * cell, c * cell], [0, best_height], color=CELL_COLOUR, linewidth=line_width, alpha=0.5)

    for tile in plan["tiles"]:
        _rectangle(axes, tile["canvas_box"], facecolor="none", edgecolor=TILE_COLOUR, linewidth=2.5)
        tile_left, tile_top = tile["canvas_box"][:2]
        axes.text(tile_left + 0.03 * plan["tile_size"], tile_top + 0.1 * plan["tile_size"],
                  f"tile {tile['index']}", color="black", fontsize=small,
                  bbox={"facecolor": TILE_COLOUR, "edgecolor": "none", "pad": 1.5})
    _rectangle(axes, plan["unpadded_canvas_box"], facecolor="none", edgecolor=UNPADDED_COLOUR,
               linewidth=2, linestyle="--")

    axes.set_xlim(0, best_width)
    axes.set_ylim(best_height, 0)
    axes.set_title(overlay_title(plan), fontsize=small + 1)
    axes.figure.legend(handles=[
        mpatches.Patch(facecolor="none", edgecolor=TILE_COLOUR, linewidth=2, label="tile"),
        mpatches.Patch(facecolor=PADDING_COLOUR, alpha=0.55, hatch="//", label="padding"),
        mpatches.Patch(facecolor="none", edgecolor=UNPADDED_COLOUR, linestyle="--", label="unpadded (kept)"),
        mpatches.Patch(facecolor=DROPPED_COLOUR, alpha=0.25, label="cut by unpadding"),
    ], loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=small, frameon=False)
    axes.set_xticks([])
    axes.set_yticks([])


def _draw_base_view(axes, image: Image.Image, plan: dict, small: float) -> None:
    """The whole image squashed to one tile, with its feature cells (one base token each)."""
    size = plan["tile_size"]
    feat_rows, feat_cols = plan["view_feature_grid"]
    base = shown_picture(image, (size, size))
    axes.imshow(np.asarray(base), extent=(0, size, size, 0))
    for r in range(1, feat_rows):
        axes.plot([0, size], [r * size / feat_rows] * 2, color=CELL_COLOUR, linewidth=0.5, alpha=0.6)
    for c in range(1, feat_cols):
        axes.plot([c * size / feat_cols] * 2, [0, size], color=CELL_COLOUR, linewidth=0.5, alpha=0.6)
    axes.set_xlim(0, size)
    axes.set_ylim(size, 0)
    axes.set_title(f"base view {size}x{size}: {feat_rows}x{feat_cols} tokens", fontsize=small + 1)
    axes.set_xticks([])
    axes.set_yticks([])


def _rectangle(axes, box, **style) -> None:
    left, top, right, bottom = box
    axes.add_patch(mpatches.Rectangle((left, top), right - left, bottom - top, **style))


def outline_box(picture: Image.Image, box) -> Image.Image:
    """A copy of ``picture`` with ``box`` (``(left, top, right, bottom)`` in its pixels) framed in
    :data:`PICKED_COLOUR`, inside a thin white frame so the mark shows on dark cells too. The frame
    lies just outside the box, so the cell it marks stays visible however small it is."""
    marked = picture.convert("RGB")  # a copy (convert always copies)
    draw = ImageDraw.Draw(marked)
    line = max(2, round(max(picture.size) / 500))
    left, top, right, bottom = box
    draw.rectangle((left - line - 1, top - line - 1, right + line, bottom + line), outline=(255, 255, 255), width=1)
    draw.rectangle((left - line, top - line, right + line - 1, bottom + line - 1), outline=PICKED_COLOUR, width=line)
    return marked


def highlight_box(image: Image.Image, box, label: str | None = None, context_box=None,
                  colour=PICKED_COLOUR) -> Image.Image:
    """A copy of ``image`` with ``box`` filled and outlined (and ``context_box``, e.g. its tile,
    outlined in yellow); the rest dimmed a little so a small box stands out. Boxes are in the
    image's own pixels. The copy has the image's size unless that is beyond the picture bounds:
    then it is :func:`display_size` (map points on it back with :func:`viz.figures.original_point`)."""
    original_width, original_height = image.size
    width, height = display_size(original_width, original_height)
    base = shown_picture(image, (width, height))
    scale_x, scale_y = width / original_width, height / original_height

    def shown(original_box):
        left, top, right, bottom = original_box
        return _pixel_box((left * scale_x, top * scale_y, right * scale_x, bottom * scale_y), width, height)

    line = max(2, round(min(width, height) / 150))
    overlay = Image.new("RGBA", base.size, (0, 0, 0, 70))  # dim everything
    draw = ImageDraw.Draw(overlay)
    left, top, right, bottom = shown(box)
    draw.rectangle((left, top, right, bottom), fill=(*colour, 90))
    if context_box is not None:
        draw.rectangle(shown(context_box), outline=(255, 212, 0, 255), width=line)
    draw.rectangle((left, top, right, bottom), outline=(*colour, 255), width=line)
    if label:  # a font in proportion to the picture, which the page shows about 420 px tall
        font = ImageFont.load_default(size=max(LABEL_MIN_PX, round(max(width, height) * LABEL_SHARE)))
        text_height = draw.textbbox((0, 0), label, font=font)[3] + 2
        text_x = min(left + 2, max(0, width - draw.textlength(label, font=font) - 4))
        text_y = top - text_height if top >= text_height else min(bottom + 2, height - text_height)
        text_box = draw.textbbox((text_x, text_y), label, font=font)
        draw.rectangle((text_box[0] - 2, text_box[1] - 1, text_box[2] + 2, text_box[3] + 1), fill=(0, 0, 0, 200))
        draw.text((text_x, text_y), label, fill=(255, 255, 255, 255), font=font)
    return Image.alpha_composite(base.convert("RGBA"), overlay).convert("RGB")


def _pixel_box(box, width: int, height: int) -> tuple[int, int, int, int]:
    """Float box -> inclusive integer pixel rectangle for PIL, at least one pixel, inside the image."""
    left, top, right, bottom = box
    x0 = min(max(int(np.floor(left)), 0), width - 1)
    y0 = min(max(int(np.floor(top)), 0), height - 1)
    x1 = min(max(int(np.ceil(right)) - 1, x0), width - 1)
    y1 = min(max(int(np.ceil(bottom)) - 1, y0), height - 1)
    return x0, y0, x1, y1
