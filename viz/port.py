"""Pictures of the vLLM port inspector (``g4v.port``): plain numbers and boxes in, PIL images out.

* :func:`level_bars_figure`: per level, the share of the tolerance its worst element uses (log
  scale; 1 is the limit), with the tolerance rule and its numbers in the title;
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

from viz.figures import figure_to_image, floats_or_nan, stack_vertically, token_heatmap_grid


def level_bars_figure(levels: list[dict], tolerance: dict) -> Image.Image:
    """Bars of ``share_of_tolerance_used`` (max |diff| / what the tolerance allows there), not of the raw
    difference: the tolerance scales with each element's magnitude, so one line at 1 is the limit
    for every level. Each bar is labelled with its max absolute difference."""
    names = [f"{row['name']}\nLLM {row['llm_layer']}" for row in levels]
    values = [_number_or_nan(row.get("share_of_tolerance_used")) for row in levels]
    finite = [v for v in values if math.isfinite(v)]
    floor = min([v for v in finite if v > 0] + [1.0]) / 10
    ceiling = max(finite + [1.0]) * 10  # where an infinite share (zero tolerance) is drawn
    shown = [min(max(v, floor), ceiling) if v == v else floor for v in values]
    colours = ["#2ca02c" if row["ok"] else "#d62728" for row in levels]
    fig = Figure(figsize=(max(6.0, 1.0 * len(levels) + 2), 3.8))
    ax = fig.add_subplot()
    ax.bar(range(len(levels)), shown, color=colours)
    ax.axhline(1.0, color="#7f7f7f", linestyle="--", linewidth=1, label="tolerance (1 = limit)")
    for i, row in enumerate(levels):
        if row.get("max_abs_diff") is None:
            label, colour = "missing", "#d62728"
        else:
            label, colour = f"{row['max_abs_diff']:.1e}", "#333333"
        ax.annotate(label, (i, shown[i]), ha="center", va="bottom", fontsize=7, color=colour)
    ax.set_yscale("log")
    ax.set_xticks(range(len(levels)), names, fontsize=8)
    ax.set_ylabel("max |diff| / allowed")
    rule = f"{tolerance.get('rule')} ({tolerance.get('source')})" if tolerance else "tolerance unknown"
    ax.set_title(f"Per-level feature difference, share of the tolerance (green: within)\n{rule}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)


def _number_or_nan(value) -> float:
    """None (no comparison) -> NaN; inf (anything over a zero tolerance) stays, clipped when drawn."""
    return math.nan if value is None else float(value)


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


def port_diff_figure(image: Image.Image, tokens: list[tuple[str, tuple]], summary: dict,
                     diff_by_level: dict[str, list[float]]) -> Image.Image:
    """The whole report as one picture (what ``--png`` saves)."""
    parts = []
    if summary.get("levels"):
        parts.append(level_bars_figure(summary["levels"], summary.get("tolerance")))
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
