"""What every picture of the workbench shares: bounded sizes, one figure-to-picture helper, and
per-token heatmaps painted over an image through the tiling token boxes.

Every picture stays within ``MAX_PICTURE_SIDE`` pixels on a side, whatever the input image: a
1 x 20000 image must not turn into a 100000-pixel-tall PNG (slow to draw, huge in memory, refused by
PIL's decompression-bomb guard when read back). Images are shown at :func:`display_size`, which
also stretches very thin images to ``MIN_PICTURE_SIDE`` so they stay visible; a photo is shrunk
before anything is drawn over it (:func:`shown_picture`). Text is sized for the width the page shows
a picture at (:func:`text_points`: at least ``MIN_TEXT_PX`` pixels there), and legends sit beside
the data, never over it. Plain numbers and boxes in, PIL images out; matplotlib draws off-screen
(no pyplot state).
"""

import io
import itertools
import math
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

MAX_PICTURE_SIDE = 2400  # pixels: no picture drawn here is wider or taller
MIN_PICTURE_SIDE = 64  # pixels: an image is never shown thinner than this
HEATMAP_MAX_SIDE = 384  # heatmap panels show the image at most this many pixels on a side
HEATMAP_MIN_SIDE = 96  # and at least this many: a very thin image is stretched to aspect 1:4 at most
PANEL_INCHES = 2.8  # a heatmap panel's width in a row of 4: the row fits the page's width
DPI = 100  # figures are drawn at this many dots per inch (figure_to_image's default)
PAGE_WIDTH_PX = 1200  # the app shows a full-width picture at about this many CSS pixels (Gradio's page)
HALF_PAGE_PX = 580  # and each picture of a row of two at about this many (the Evaluate tab's plots)
MIN_TEXT_PX = 11  # and no text in a picture is smaller than this once shown there


def display_size(width: int, height: int, max_side: int = MAX_PICTURE_SIDE,
                 min_side: int = MIN_PICTURE_SIDE) -> tuple[int, int]:
    """``(width, height)`` to show an image at: shrunk, keeping its aspect ratio, until neither side
    exceeds ``max_side``; then a side thinner than ``min_side`` is widened to it (distorting the
    aspect ratio on purpose: a 1-pixel line would show nothing)."""
    scale = min(1.0, max_side / max(width, height, 1))
    return (min(max_side, max(min_side, round(width * scale))),
            min(max_side, max(min_side, round(height * scale))))


def shown_picture(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image`` at ``size`` (width, height) in RGB, resized before anything else: a 40-megapixel
    picture is never copied or converted at full size (PIL reduces it on the way), so what is drawn
    over it stays as small as the picture shown."""
    if image.size != tuple(size):
        image = image.resize(tuple(size), Image.Resampling.BICUBIC, reducing_gap=3.0)
    return image if image.mode == "RGB" else image.convert("RGB")


#: How far towards white a heatmap's backdrop is lightened, once in greys.
BACKDROP_LIGHTEN = 0.35


def muted(picture: Image.Image) -> Image.Image:
    """``picture`` in light greys, to paint values over: the colours of a heatmap (or of the logit
    lens's top tokens) then read as the colour scale's own inside a strongly coloured object too,
    where over the picture's own colours a red object made every value look high and a blue one
    low, and the picture's shapes still show through."""
    grey = picture.convert("L").convert("RGB")
    return Image.blend(grey, Image.new("RGB", grey.size, "white"), BACKDROP_LIGHTEN)


def heatmap_picture(image: Image.Image) -> tuple[Image.Image, float, float]:
    """The picture a heatmap panel paints over (at most ``HEATMAP_MAX_SIDE`` on a side, at least
    ``HEATMAP_MIN_SIDE``) and the x and y scales from original-image pixels to it."""
    width, height = display_size(image.width, image.height, HEATMAP_MAX_SIDE, HEATMAP_MIN_SIDE)
    return shown_picture(image, (width, height)), width / image.width, height / image.height


def fitted_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``(width, height)`` scaled, up or down, so that the longer side is ``side`` pixels (then
    :func:`display_size`'s bounds): a small picture fills the box the page shows it in instead of
    sitting at its own few pixels in a corner of it."""
    scale = side / max(width, height, 1)
    return display_size(max(1, round(width * scale)), max(1, round(height * scale)))


def original_point(x: float, y: float, image_size: tuple[int, int],
                   shown_size: tuple[int, int] | None = None) -> tuple[float, float]:
    """A point of a picture shown at ``shown_size`` (default :func:`display_size`; e.g. a click on
    :func:`highlight_box`'s output) -> the same point in the original image of ``image_size``
    (width, height)."""
    width, height = image_size
    shown_width, shown_height = shown_size or display_size(width, height)
    return x * width / shown_width, y * height / shown_height


def ellipsized(text: str, chars: int) -> str:
    """``text`` cut to at most ``chars`` characters, a cut one ending in "…": a tick label cut bare
    reads as another token (``<|start_of_r``, ``<|end_of_tex``)."""
    return text if len(text) <= chars else text[: chars - 1] + "…"


def text_points(width_inches: float, shown_px: int = PAGE_WIDTH_PX) -> float:
    """The font size (points) of the smallest text of a figure ``width_inches`` wide: at least
    ``MIN_TEXT_PX`` pixels tall once the page shows the picture at most ``shown_px`` wide (the
    page's width, or ``HALF_PAGE_PX`` for a picture beside another; a tenth more for what a tight
    bounding box adds to the width)."""
    shown = min(1.0, shown_px / (width_inches * DPI))
    return 1.1 * MIN_TEXT_PX * 72 / DPI / shown


def figure_to_image(fig: Figure, dpi: int = DPI, tight: bool = True) -> Image.Image:
    """The figure as an RGB picture, never more than ``MAX_PICTURE_SIDE`` pixels on a side: a figure
    too large in inches is shrunk first (its text keeps its size, so it stays readable), and what
    the tight bounding box still adds is scaled away (so PIL's decompression-bomb guard never sees a
    huge PNG). ``tight=False`` keeps the figure's own size and margins."""
    largest_inches = max(fig.get_size_inches())
    if largest_inches * dpi > MAX_PICTURE_SIDE:
        fig.set_size_inches(fig.get_size_inches() * (MAX_PICTURE_SIDE / dpi / largest_inches))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    buffer.seek(0)
    picture = Image.open(buffer).convert("RGB")
    if max(picture.size) > MAX_PICTURE_SIDE:
        picture.thumbnail((MAX_PICTURE_SIDE, MAX_PICTURE_SIDE))
    return picture


def stack_vertically(images: list[Image.Image]) -> Image.Image:
    width = max(image.width for image in images)
    height = sum(image.height for image in images)
    sheet = Image.new("RGB", (width, height), "white")
    y = 0
    for image in images:
        sheet.paste(image, ((width - image.width) // 2, y))
        y += image.height
    return sheet


def mark_injection_layers(ax, injection_layers: dict, fontsize: float) -> None:
    """Each injection layer (``{"layer": level name}``) as a faint vertical line, named on a top axis
    above the frame: names drawn inside the plot ran into its top edge and had the lines through them."""
    colour_of = lambda name: "#2ca02c" if name.startswith("spatial") else "#9467bd"
    layers = {int(layer): name for layer, name in injection_layers.items()}
    for layer, name in layers.items():
        ax.axvline(layer, color=colour_of(name), alpha=0.35, linewidth=1)
    top = ax.secondary_xaxis("top")
    top.set_xticks(list(layers), list(layers.values()), rotation=90, fontsize=fontsize)
    for label, name in zip(top.get_xticklabels(), layers.values()):
        label.set_color(colour_of(name))


def floats_or_nan(values) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def paint_token_values(size_wh: tuple[int, int], boxes: list[tuple], values: list[float]) -> np.ndarray:
    """A (height, width) float array: each box (left, top, right, bottom, in the array's pixels)
    holds its value (the mean where boxes overlap); uncovered pixels are nan."""
    width, height = size_wh
    total = np.zeros((height, width))
    count = np.zeros((height, width))
    for (left, top, right, bottom), value in zip(boxes, values):
        x0, y0 = int(round(left)), int(round(top))
        x1, y1 = max(int(round(right)), x0 + 1), max(int(round(bottom)), y0 + 1)
        if right <= left or bottom <= top:  # an empty box covers only padding
            continue
        total[y0:y1, x0:x1] += value
        count[y0:y1, x0:x1] += 1
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def token_heatmap_grid(image: Image.Image, tokens: list[tuple[str, tuple]], values_by_level: dict[str, list[float]],
                       view: str, cmap: str, alpha: float, colorbar_label: str, panel_title, title: str,
                       empty_range: tuple[float, float] = (0.0, 1.0), symmetric: bool = False,
                       per_panel: bool = False) -> Image.Image:
    """A grid of panels, one per level, each painting one value per ``view`` token over the image
    with a shared colour scale. ``values_by_level``: level -> one value per image token (NaN to
    leave a token unpainted); ``panel_title(name, peak)`` names each panel. ``symmetric``: limits
    ``-m..m`` (``m`` the largest magnitude), so that 0 sits in the middle of a diverging colormap
    and the sign of a signed score reads off the colour. ``per_panel`` (with ``symmetric``): each
    panel on its own scale, its values divided by its largest magnitude (the colour bar runs -1..1;
    the titles give each panel's magnitude), so that a level whose scores are a hundredth of the
    combined panel's is not painted plain grey.

    The image is shown at :func:`display_size` with the heatmap bounds, so a panel is
    never a 1-pixel line, and the figure's size in inches depends only on the panels' shape; it is
    drawn :func:`muted`, so the values read the same over any colour of the picture."""
    shown, scale_x, scale_y = heatmap_picture(image)
    shown_width, shown_height = shown.size
    picked = [i for i, (kind, _) in enumerate(tokens) if kind == view]
    if not picked:
        return note_figure(title, f"This image has no {view} tokens: nothing to paint. (A strip this thin "
                                  f"keeps no {view} feature once padding is cut off.)")
    boxes = [(left * scale_x, top * scale_y, right * scale_x, bottom * scale_y)
             for left, top, right, bottom in (tokens[i][1] for i in picked)]
    maps = {name: paint_token_values(shown.size, boxes, [values[i] if i < len(values) else math.nan for i in picked])
            for name, values in values_by_level.items()}
    # the panel's largest value, or its largest magnitude on a scale centred on zero
    peaks = {name: float(np.nanmax(np.abs(heat) if symmetric else heat)) if np.isfinite(heat).any() else math.nan
             for name, heat in maps.items()}
    if per_panel and symmetric:
        maps = {name: heat / peaks[name] if peaks[name] > 0 else heat for name, heat in maps.items()}
    finite = [m[np.isfinite(m)] for m in maps.values()]
    finite = np.concatenate(finite) if finite else np.zeros(0)
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else empty_range
    if symmetric:
        vmax = max(abs(vmin), abs(vmax))
        vmin = -vmax
    if vmax <= vmin:
        vmax = vmin + 1e-6

    # 4 panels a row; 8 narrower ones for a tall image, 2 wider ones for a wide image, so that a row
    # is always 4 * PANEL_INCHES wide and, with the aspect ratio bounded, 8 panels stay under about
    # 8.5 inches of height in all.
    aspect = shown_height / shown_width  # between 1/4 and 4, by display_size's bounds
    per_row = 8 if aspect > 1.25 else 2 if aspect < 1 / 3 else 4
    cols = min(max(1, len(maps)), per_row)
    rows = max(1, math.ceil(len(maps) / cols))
    panel_width = PANEL_INCHES * 4 / per_row
    panel_height = panel_width * aspect
    fig = Figure(figsize=(panel_width * cols + 0.8, panel_height * rows + 0.9), layout="constrained")
    small = text_points(fig.get_figwidth())
    axes = fig.subplots(rows, cols, squeeze=False)
    mappable = None
    backdrop = muted(shown)
    for ax, (name, heat) in zip(axes.flat, maps.items()):
        ax.imshow(backdrop)
        mappable = ax.imshow(heat, cmap=cmap, alpha=alpha, vmin=vmin, vmax=vmax)
        ax.set_title(_fit_title(panel_title(name, peaks[name]), panel_width, small), fontsize=small)
        ax.axis("off")
    for ax in list(axes.flat)[len(maps):]:
        ax.axis("off")
    if mappable is not None:
        bar = fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label(colorbar_label, fontsize=small)
        bar.ax.tick_params(labelsize=small)
    fig.suptitle(title, fontsize=small + 2)
    return figure_to_image(fig)


def note_figure(title: str, note: str, shown_px: int = PAGE_WIDTH_PX) -> Image.Image:
    """A small picture that says why there is nothing to draw, in place of empty panels (its text
    sized for a picture shown ``shown_px`` wide, see :func:`text_points`). The title is wrapped to
    the picture's width: at a half page's text size a long one ran off both sides ("agree entire")."""
    width = 8
    fig = Figure(figsize=(width, 1.6 if shown_px >= PAGE_WIDTH_PX else 2.4))
    ax = fig.add_subplot()
    ax.axis("off")
    small = text_points(width, shown_px)
    ax.text(0.5, 0.45, note, ha="center", va="center", wrap=True, fontsize=small + 1)
    fig.suptitle(wrapped(title, width, small + 2), fontsize=small + 2)
    return figure_to_image(fig)


def wrapped(text: str, inches: float, points: float) -> str:
    """``text`` broken between words into lines that fit ``inches`` at ``points`` (an average
    character is taken as 0.6 em wide, with a margin)."""
    return "\n".join(textwrap.wrap(text, max(10, int(inches * 72 * 0.9 / (0.6 * points))))) or text


def _fit_title(text: str, panel_width: float, points: float) -> str:
    """A panel title such as ``"deepstack0  (max |x| 2.8e-05 nats)"`` on as few lines as fit the
    panel's width (inches) at ``points``: the name, then what follows its two spaces, each broken
    where its lines come out most even. Neighbouring titles must not run into each other: in a row
    of 8 narrow panels "(max |x| 2.8e-05 nats)" and "layer 0 (deepstack0)" were each wider than
    their panel."""
    room = panel_width * 72 * 0.8  # points: the layout draws panels about a tenth narrower (the colour bar), and a gap
    if _points_wide(text, points) <= room:
        return text
    return "\n".join(line for part in text.split("  ", 1) for line in _even_lines(part.split(), points, room))


def _even_lines(words: list[str], points: float, room: float) -> list[str]:
    """``words`` on the fewest lines no wider than ``room`` (points) where they can be, cut where
    the widest line is narrowest (a word wider than ``room`` alone stays whole)."""
    width = lambda line: _points_wide(line, points)  # noqa: E731
    for count in range(1, len(words) + 1):
        splits = ([" ".join(words[a:b]) for a, b in zip((0, *cuts), (*cuts, len(words)))]
                  for cuts in itertools.combinations(range(1, len(words)), count - 1))
        lines = min(splits, key=lambda parts: max(map(width, parts)))
        if max(map(width, lines)) <= room:
            return lines
    return words


def _points_wide(text: str, points: float) -> float:
    """How wide ``text`` is drawn at ``points`` (in points), in matplotlib's default font."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    return text_to_path.get_text_width_height_descent(text, FontProperties(size=points), ismath=False)[0]
