"""Pictures of the deepstack / spatial injections: plain numbers and boxes in, PIL images out.

* :func:`norms_figure`: per level, the injected features' mean norm beside the residual stream's
  mean norm at the image tokens just before and just after the injection;
* :func:`trajectory_figure`: mean residual norm at every LLM layer, image vs text tokens, with the
  injection layers marked (and, optionally, a modified run drawn dashed over it);
* :func:`heatmaps_figure`: per level, the injected norm of each image token painted over the
  original picture through the tiling token boxes.

Inputs are the inspection's typed parts, read by attribute (:class:`g4v.model.capture.LevelCapture`
per level, :class:`g4v.model.capture.Trajectory`), and plain lists of numbers. No torch here;
matplotlib draws off-screen (no pyplot state).
Every picture stays within ``viz.figures.MAX_PICTURE_SIDE`` pixels on a side, whatever the image.
"""

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from viz.figures import figure_to_image, floats_or_nan, mark_injection_layers, text_points, token_heatmap_grid


def norms_figure(levels: list, title: str = "Injected vs residual norms (image tokens)") -> Image.Image:
    """Grouped bars per level (a ``LevelCapture`` each): injected, residual before, residual after
    (mean L2 norms over the image tokens)."""
    names = [f"{row.level.name}\nLLM {row.level.llm_layer}" for row in levels]
    series = [
        ("injected", "injected_norm_mean", "#d62728"),
        ("residual before", "residual_norm_before_image", "#7f7f7f"),
        ("residual after", "residual_norm_after_image", "#1f77b4"),
    ]
    x = np.arange(len(levels))
    width = 0.27
    fig = Figure(figsize=(max(6.0, 1.1 * len(levels) + 2), 4.6), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    for i, (label, key, colour) in enumerate(series):
        values = [float(getattr(row, key)) for row in levels]
        ax.bar(x + (i - 1) * width, values, width, label=label, color=colour)
    if any(row.scale != 1.0 for row in levels):
        for xi, row in zip(x, levels):
            if row.scale != 1.0:
                ax.annotate(f"x{row.scale:g}", (xi, 0), xytext=(0, -28), textcoords="offset points",
                            ha="center", fontsize=small, color="#d62728")
    ax.set_xticks(x, names, fontsize=small)
    ax.set_ylabel("mean L2 norm")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncol=3, fontsize=small)  # below the bars, never over them
    ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)


def trajectory_figure(trajectory, modified=None, title: str = "Residual-stream norm by LLM layer") -> Image.Image:
    """Mean residual norm entering each layer (last point: the last layer's output), image and
    text tokens; injection layers as labelled vertical lines; ``modified`` dashed, if given (each a
    ``Trajectory``)."""
    layers = trajectory.layers
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    runs = [(trajectory, "-", "")] + ([(modified, "--", " (modified)")] if modified else [])
    for run, style, suffix in runs:
        ax.plot(layers, floats_or_nan(run.image_norm), style, color="#d62728", marker=".", label="image tokens" + suffix)
        ax.plot(layers, floats_or_nan(run.text_norm), style, color="#1f77b4", marker=".", label="text tokens" + suffix)
    mark_injection_layers(ax, trajectory.injection_layers, small)
    ax.set_xlabel("LLM layer (residual stream entering it, after its injection)")
    ax.set_ylabel("mean L2 norm")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncol=4 if modified else 2, fontsize=small)  # never over the lines
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


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


