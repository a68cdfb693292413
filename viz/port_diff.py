"""Pictures of the vLLM port inspector (``g4v.port_diff``): plain numbers and boxes in, PIL images out.

* :func:`level_bars_figure`: max absolute difference per level (log scale) against the tolerance;
* :func:`diff_heatmaps_figure`: per level, each image token's max absolute difference painted over
  the picture through the tiling token boxes (tile view and base view);
* :func:`trajectory_compare_figure`: transformers' and vLLM's mean residual norms per LLM layer
  (image and text tokens), with the relative difference on a second axis;
* :func:`port_diff_figure`: all of them stacked into one PNG.

Inputs are the plain dicts of the JSON summary, so a saved summary can be redrawn without a model.
No torch here.
"""

import math

from matplotlib.figure import Figure
from PIL import Image

from viz.deepstack import figure_to_image, floats_or_nan, token_heatmap_grid


def level_bars_figure(levels: list[dict], atol: float) -> Image.Image:
    names = [f"{row['name']}\nLLM {row['llm_layer']}" for row in levels]
    values = [row["max_abs_diff"] if row["max_abs_diff"] is not None else math.nan for row in levels]
    floor = min([v for v in values if v and v > 0] + [atol]) / 10
    shown = [max(v, floor) if v == v else floor for v in values]
    colours = ["#2ca02c" if row["ok"] else "#d62728" for row in levels]
    fig = Figure(figsize=(max(6.0, 1.0 * len(levels) + 2), 3.6))
    ax = fig.add_subplot()
    ax.bar(range(len(levels)), shown, color=colours)
    ax.axhline(atol, color="#7f7f7f", linestyle="--", linewidth=1, label=f"tolerance {atol:g}")
    for i, row in enumerate(levels):
        if row["max_abs_diff"] is None:
            ax.annotate("missing", (i, floor), ha="center", va="bottom", fontsize=7, color="#d62728")
    ax.set_yscale("log")
    ax.set_xticks(range(len(levels)), names, fontsize=8)
    ax.set_ylabel("max |vLLM - transformers|")
    ax.set_title("Per-level feature difference (green: within tolerance)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)


def diff_heatmaps_figure(image: Image.Image, tokens: list[tuple[str, tuple]], diff_by_level: dict[str, list[float]],
                         view: str = "tile") -> Image.Image:
    """One panel per level: each ``view`` token's max absolute difference over the image, one shared
    (log) colour scale so levels compare."""
    log_diffs = {name: [math.log10(max(d, 1e-12)) for d in diffs] for name, diffs in diff_by_level.items()}
    return token_heatmap_grid(
        image, tokens, log_diffs, view,
        cmap="magma", alpha=0.65, colorbar_label="log10 max |vLLM - transformers|",
        panel_title=lambda name, peak: f"{name}  (max 1e{peak:.1f})",
        title=f"Per-token feature difference ({view} view)", empty_range=(-12.0, 0.0),
    )


def trajectory_compare_figure(trajectory: dict) -> Image.Image:
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    layers = trajectory["layers"]
    for side, style in (("transformers", "-"), ("vllm", "--")):
        run = trajectory.get(side)
        if not run:
            continue
        ax.plot(layers, floats_or_nan(run["image_norm"]), style, color="#d62728", marker=".", label=f"image tokens ({side})")
        ax.plot(layers, floats_or_nan(run["text_norm"]), style, color="#1f77b4", marker=".", label=f"text tokens ({side})")
    for layer, name in trajectory.get("injection_layers", {}).items():
        ax.axvline(int(layer), color="#9467bd", alpha=0.25, linewidth=1)
        ax.annotate(name, (int(layer), 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    va="top", ha="right", color="#9467bd")
    ax.set_xlabel("LLM layer (residual stream entering it; last point: last layer's output)")
    ax.set_ylabel("mean L2 norm")
    if trajectory.get("max_token_rel_diff"):
        twin = ax.twinx()
        twin.semilogy(layers, [max(v, 1e-12) for v in trajectory["max_token_rel_diff"]], ":", color="#7f7f7f",
                      label="max per-token relative difference")
        twin.axhline(trajectory["rtol"], color="#7f7f7f", linewidth=0.8, alpha=0.5)
        twin.set_ylabel("relative difference")
        twin.legend(fontsize=7, loc="upper left")
    ax.set_title("Residual-stream norm: transformers (solid) vs vLLM (dashed)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


def stack_vertically(images: list[Image.Image]) -> Image.Image:
    width = max(image.width for image in images)
    height = sum(image.height for image in images)
    sheet = Image.new("RGB", (width, height), "white")
    y = 0
    for image in images:
        sheet.paste(image, ((width - image.width) // 2, y))
        y += image.height
    return sheet


def port_diff_figure(image: Image.Image, tokens: list[tuple[str, tuple]], summary: dict,
                     diff_by_level: dict[str, list[float]]) -> Image.Image:
    """The whole report as one picture (what ``--png`` saves)."""
    parts = []
    if summary.get("levels"):
        parts.append(level_bars_figure(summary["levels"], summary["atol"]))
    if diff_by_level:
        parts.append(diff_heatmaps_figure(image, tokens, diff_by_level, view="tile"))
        parts.append(diff_heatmaps_figure(image, tokens, diff_by_level, view="base"))
    if summary.get("trajectory") and summary["trajectory"].get("transformers"):
        parts.append(trajectory_compare_figure(summary["trajectory"]))
    if not parts:
        fig = Figure(figsize=(8, 1.5))
        fig.text(0.02, 0.5, summary.get("message", "nothing to draw"), fontsize=8, wrap=True)
        parts.append(figure_to_image(fig))
    return stack_vertically(parts)
