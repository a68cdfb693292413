"""Pictures of the vLLM port inspector (``g4v.port``): plain numbers and boxes in, PIL images out.

* :func:`level_bars_figure`: per level, the share of the tolerance its worst element uses (log
  scale; 1 is the limit), with the tolerance rule and its numbers in the title;
* :func:`diff_heatmaps_figure`: per level, each image token's max absolute difference painted over
  the picture through the tiling token boxes (tile view and base view);
* :func:`trajectory_compare_figure`: transformers' and vLLM's mean residual norms per LLM layer
  (image and text tokens), with the relative difference on a second axis;
* :func:`port_diff_figure`: all of them stacked into one PNG.

Inputs are the summary's typed parts, read by attribute (``g4v.port.summary.PortDiffSummary``, read
back from a saved JSON summary with its ``from_dict`` to redraw it without a model), and plain
lists of numbers. No torch here.
"""

import math

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from PIL import Image

from viz.figures import (figure_to_image, floats_or_nan, mark_injection_layers, stack_vertically, text_points,
                         token_heatmap_grid)

#: the trajectory's line style and legend name of each stack (the trajectory's attributes)
STACK_STYLES = {"transformers": ("-", "transformers"), "vllm": ("--", "vLLM")}


def level_bars_figure(levels: list, tolerance) -> Image.Image:
    """Bars of ``share_of_tolerance_used`` (max |diff| / what the tolerance allows there), not of the raw
    difference: the tolerance scales with each element's magnitude, so one line at 1 is the limit
    for every level. Each bar is labelled with its max absolute difference. ``levels``: the
    summary's ``LevelDiff`` rows; ``tolerance``: its ``Tolerance`` (None: unknown)."""
    names = [f"{row.name}\nLLM {row.llm_layer}" for row in levels]
    values = [_number_or_nan(row.share_of_tolerance_used) for row in levels]
    finite = [v for v in values if math.isfinite(v)]
    floor = min([v for v in finite if v > 0] + [1.0]) / 10
    ceiling = max(finite + [1.0]) * 10  # where an infinite share (zero tolerance) is drawn
    shown = [min(max(v, floor), ceiling) if v == v else floor for v in values]
    colours = ["#2ca02c" if row.ok else "#d62728" for row in levels]
    fig = Figure(figsize=(max(6.0, 1.0 * len(levels) + 2), 4.2), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    ax.bar(range(len(levels)), shown, color=colours)
    ax.axhline(1.0, color="#7f7f7f", linestyle="--", linewidth=1, label="tolerance (1 = limit)")
    for i, row in enumerate(levels):
        if row.max_abs_diff is None:
            label, colour = "missing", "#d62728"
        else:
            label, colour = f"{row.max_abs_diff:.1e}", "#333333"
        ax.annotate(label, (i, shown[i]), ha="center", va="bottom", fontsize=small, color=colour)
    ax.set_yscale("log")
    ax.set_xticks(range(len(levels)), names, fontsize=small)
    ax.set_ylabel("max |diff| / allowed")
    rule = f"{tolerance.rule} ({tolerance.source})" if tolerance else "tolerance unknown"
    ax.set_title(f"Per-level feature difference, share of the tolerance (green: within)\n{rule}", fontsize=small + 1)
    fig.legend(loc="outside lower center", fontsize=small)  # under the bars, never over them
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


def trajectory_compare_figure(trajectory) -> Image.Image:
    """Colour says which tokens, line style which stack (solid transformers, dashed vLLM): the
    legend under the plot shows both, never over the lines. ``trajectory``: the summary's
    ``TrajectoryDiff``."""
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    layers = trajectory.layers
    for side, (style, _) in STACK_STYLES.items():
        run = getattr(trajectory, side)
        if not run:
            continue
        ax.plot(layers, floats_or_nan(run.image_norm), style, color="#d62728", marker=".")
        ax.plot(layers, floats_or_nan(run.text_norm), style, color="#1f77b4", marker=".")
    mark_injection_layers(ax, trajectory.injection_layers, small)
    ax.set_xlabel("LLM layer (residual stream entering it; last point: last layer's output)")
    ax.set_ylabel("mean L2 norm")
    handles = [Line2D([], [], color="#d62728", marker=".", label="image tokens"),
               Line2D([], [], color="#1f77b4", marker=".", label="text tokens")]
    handles += [Line2D([], [], color="black", linestyle=style, label=name) for style, name in STACK_STYLES.values()]
    if trajectory.max_token_rel_diff:
        twin = ax.twinx()
        twin.semilogy(layers, [max(v, 1e-12) for v in trajectory.max_token_rel_diff], ":", color="#7f7f7f")
        twin.axhline(trajectory.rtol, color="#7f7f7f", linewidth=0.8, alpha=0.5)
        twin.set_ylabel("relative difference")
        handles.append(Line2D([], [], color="#7f7f7f", linestyle=":", label="max per-token relative difference"))
    fig.suptitle("Residual-stream norm: transformers (solid) vs vLLM (dashed)", fontsize=small + 2)
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=small)
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


def port_diff_figure(image: Image.Image, tokens: list[tuple[str, tuple]], summary,
                     diff_by_level: dict[str, list[float]]) -> Image.Image:
    """The whole report as one picture (what ``--png`` saves); ``summary``: a ``PortDiffSummary``."""
    parts = []
    if summary.levels:
        parts.append(level_bars_figure(summary.levels, summary.tolerance))
    if diff_by_level:
        parts.append(diff_heatmaps_figure(image, tokens, diff_by_level, view="tile"))
        parts.append(diff_heatmaps_figure(image, tokens, diff_by_level, view="base"))
    if summary.trajectory and summary.trajectory.transformers:
        parts.append(trajectory_compare_figure(summary.trajectory))
    if not parts:
        fig = Figure(figsize=(8, 1.5))
        fig.text(0.02, 0.5, summary.message or "nothing to draw", fontsize=8, wrap=True)
        parts.append(figure_to_image(fig))
    return stack_vertically(parts)
