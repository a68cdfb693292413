"""Pictures of the deepstack / spatial injections: plain numbers and boxes in, PIL images out.

* :func:`norms_figure`: per level, the injected features' mean norm beside the residual stream's
  mean norm at the image tokens just before and just after the injection;
* :func:`trajectory_figure`: mean residual norm at every LLM layer, image vs text tokens, with the
  injection layers marked (and, optionally, a modified run drawn dashed over it);
* :func:`heatmaps_figure`: per level, the injected norm of each image token painted over the
  original picture through the tiling token boxes.

Inputs are the plain dicts of ``summary.json`` (``levels`` rows, the ``trajectory``) so that an export
can be redrawn without the model. No torch here; matplotlib draws off-screen (no pyplot state).
Every picture stays within ``viz.tiling.MAX_PICTURE_SIDE`` pixels on a side, whatever the image.
"""

import io
import math

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from viz.tiling import MAX_PICTURE_SIDE, display_size

HEATMAP_MAX_SIDE = 384  # heatmap panels show the image at most this many pixels on a side
HEATMAP_MIN_SIDE = 96  # and at least this many: a very thin image is stretched to aspect 1:4 at most
PANEL_INCHES = 3.2  # a heatmap panel's width in a row of 4


def figure_to_image(fig: Figure, dpi: int = 100) -> Image.Image:
    """The figure as an RGB picture, never more than ``MAX_PICTURE_SIDE`` pixels on a side: a figure
    too large in inches is shrunk first (its text keeps its size, so it stays readable), and what
    the tight bounding box still adds is scaled away (so PIL's decompression-bomb guard never sees a
    huge PNG)."""
    largest_inches = max(fig.get_size_inches())
    if largest_inches * dpi > MAX_PICTURE_SIDE:
        fig.set_size_inches(fig.get_size_inches() * (MAX_PICTURE_SIDE / dpi / largest_inches))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    buffer.seek(0)
    picture = Image.open(buffer).convert("RGB")
    if max(picture.size) > MAX_PICTURE_SIDE:
        picture.thumbnail((MAX_PICTURE_SIDE, MAX_PICTURE_SIDE))
    return picture


def norms_figure(levels: list[dict], title: str = "Injected vs residual norms (image tokens)") -> Image.Image:
    """Grouped bars per level: injected, residual before, residual after (mean L2 norms)."""
    names = [f"{row['name']}\nLLM {row['llm_layer']}" for row in levels]
    series = [
        ("injected", "injected_norm_mean", "#d62728"),
        ("residual before", "residual_norm_before_mean", "#7f7f7f"),
        ("residual after", "residual_norm_after_mean", "#1f77b4"),
    ]
    x = np.arange(len(levels))
    width = 0.27
    fig = Figure(figsize=(max(6.0, 1.1 * len(levels) + 2), 4.2))
    ax = fig.add_subplot()
    for i, (label, key, colour) in enumerate(series):
        values = [float(row[key]) for row in levels]
        ax.bar(x + (i - 1) * width, values, width, label=label, color=colour)
    if any("scale" in row and row["scale"] != 1.0 for row in levels):
        for xi, row in zip(x, levels):
            if row.get("scale", 1.0) != 1.0:
                ax.annotate(f"x{row['scale']:g}", (xi, 0), xytext=(0, -28), textcoords="offset points",
                            ha="center", fontsize=8, color="#d62728")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("mean L2 norm")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)


def trajectory_figure(trajectory: dict, modified: dict | None = None,
                      title: str = "Residual-stream norm by LLM layer") -> Image.Image:
    """Mean residual norm entering each layer (last point: the last layer's output), image and
    text tokens; injection layers as labelled vertical lines; ``modified`` dashed, if given."""
    layers = trajectory["layers"]
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    runs = [(trajectory, "-", "")] + ([(modified, "--", " (modified)")] if modified else [])
    for run, style, suffix in runs:
        ax.plot(layers, floats_or_nan(run["image_norm"]), style, color="#d62728", marker=".", label="image tokens" + suffix)
        ax.plot(layers, floats_or_nan(run["text_norm"]), style, color="#1f77b4", marker=".", label="text tokens" + suffix)
    for layer, name in trajectory.get("injection_layers", {}).items():
        colour = "#2ca02c" if name.startswith("spatial") else "#9467bd"
        ax.axvline(int(layer), color=colour, alpha=0.35, linewidth=1)
        ax.annotate(name, (int(layer), 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    va="top", ha="right", color=colour)
    ax.set_xlabel("LLM layer (residual stream entering it, after its injection)")
    ax.set_ylabel("mean L2 norm")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


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


def heatmaps_figure(image: Image.Image, tokens: list[tuple[str, tuple]], norms_by_level: dict[str, list[float]],
                    view: str = "tile", title: str | None = None) -> Image.Image:
    """One panel per level: the injected norm of each ``view`` token ("tile" or "base") over the image.

    ``tokens``: ``(kind, box)`` per image token in packing order, ``box`` = (left, top, right, bottom)
    in original-image pixels; ``norms_by_level``: level name -> one norm per image token (same order).
    All panels share one colour scale, so levels can be compared.
    """
    return token_heatmap_grid(
        image, tokens, norms_by_level, view,
        cmap="inferno", alpha=0.6, colorbar_label="injected L2 norm",
        panel_title=lambda name, peak: f"{name}  (max {peak:.3g})",
        title=title or f"Injected norm per {view} token",
    )


def token_heatmap_grid(image: Image.Image, tokens: list[tuple[str, tuple]], values_by_level: dict[str, list[float]],
                       view: str, cmap: str, alpha: float, colorbar_label: str, panel_title, title: str,
                       empty_range: tuple[float, float] = (0.0, 1.0)) -> Image.Image:
    """A grid of panels, one per level, each painting one value per ``view`` token over the image
    with a shared colour scale. ``values_by_level``: level -> one value per image token (NaN to
    leave a token unpainted); ``panel_title(name, peak)`` names each panel.

    The image is shown at :func:`viz.tiling.display_size` with the heatmap bounds, so a panel is
    never a 1-pixel line, and the figure's size in inches depends only on the panels' shape."""
    shown_width, shown_height = display_size(image.width, image.height, HEATMAP_MAX_SIDE, HEATMAP_MIN_SIDE)
    scale_x, scale_y = shown_width / image.width, shown_height / image.height
    shown = image.convert("RGB").resize((shown_width, shown_height))
    picked = [i for i, (kind, _) in enumerate(tokens) if kind == view]
    boxes = [(left * scale_x, top * scale_y, right * scale_x, bottom * scale_y)
             for left, top, right, bottom in (tokens[i][1] for i in picked)]
    maps = {name: paint_token_values(shown.size, boxes, [values[i] if i < len(values) else math.nan for i in picked])
            for name, values in values_by_level.items()}
    finite = [m[np.isfinite(m)] for m in maps.values()]
    finite = np.concatenate(finite) if finite else np.zeros(0)
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else empty_range
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
    axes = fig.subplots(rows, cols, squeeze=False)
    mappable = None
    for ax, (name, heat) in zip(axes.flat, maps.items()):
        ax.imshow(shown)
        mappable = ax.imshow(heat, cmap=cmap, alpha=alpha, vmin=vmin, vmax=vmax)
        peak = float(np.nanmax(heat)) if np.isfinite(heat).any() else math.nan
        ax.set_title(_fit_title(panel_title(name, peak), panel_width), fontsize=8)
        ax.axis("off")
    for ax in list(axes.flat)[len(maps):]:
        ax.axis("off")
    if mappable is not None:
        fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.8, label=colorbar_label)
    fig.suptitle(title, fontsize=10)
    return figure_to_image(fig)


def _fit_title(text: str, panel_width: float) -> str:
    """A panel title such as ``"deepstack0  (max 1.2)"`` on two lines when the panel is too narrow
    (in inches) for one, so neighbouring titles do not run into each other."""
    return text.replace("  (", "\n(", 1) if panel_width < 2.5 else text
