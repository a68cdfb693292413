"""Pictures of a training run's 8 levels: plain numbers in, PIL images out.

* :func:`curves_figure`: each level's curves over the steps (the injected / residual ratio, the
  injected norm, the share of image tokens it dominates, the projector's gradient and update
  norms, a LoRA's update norms, the loss), warnings marked where they were raised;
* :func:`steps_figure`: two steps side by side, level by level.

Inputs are the plain dicts of ``python -m g4v training --json`` (``RunCurves.to_dict()``,
``StepView.to_dict()``), so a saved report can be redrawn without the model. No torch here.
"""

import math

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from viz.figures import figure_to_image, note_figure, text_points

#: (metric, axis label, log scale) of each panel, top to bottom; a panel whose numbers are all
#: missing (gradients of a measured checkpoint) is left out.
PANELS = (
    ("ratio", "injected / residual norm", True),
    ("injected_norm", "injected norm", True),
    ("dominant_share", "share of image tokens\nwhere it dominates", False),
    ("grad_norm", "projector gradient norm", True),
    ("update_norm", "projector update norm\nsince the last record", True),
)
COLLAPSE_COLOUR, EXPLOSION_COLOUR = "#1f77b4", "#d62728"
#: deepstack levels in warm colours, spatial ones in cool ones (as in the Deepstack tab).
LEVEL_COLOURS = ("#d62728", "#ff7f0e", "#bcbd22", "#8c564b", "#1f77b4", "#17becf", "#2ca02c", "#9467bd")


def _series(records: list[dict], level: str, metric: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        row = next((lv for lv in record["levels"] if lv["name"] == level), None)
        value = row.get(metric) if row else None
        drawable = value is not None and math.isfinite(value) and (value > 0 or metric == "dominant_share")
        if drawable:  # a log scale has no place for 0; a share of 0 is drawn
            steps.append(record["step"])
            values.append(value)
    return steps, values


def curves_figure(run: dict, title: str | None = None) -> Image.Image:
    """The run's curves, one panel per metric with a line per level; warnings as markers (collapse
    pointing down, explosion up) and faint vertical lines at their steps."""
    records = run["records"]
    if not records:
        return note_figure(title or "Training run", "This run has no Deepstack records to draw.")
    levels = run["levels"]
    panels = [p for p in PANELS if any(_series(records, level, p[0])[0] for level in levels)]
    lora_groups = sorted({group for record in records for group in record.get("lora", {})})
    loss = {int(step): value for step, value in run.get("loss", {}).items()}
    extra = bool(lora_groups) + bool(loss)
    fig = Figure(figsize=(10, 2.3 * (len(panels) + extra) + 1.2), layout="constrained")
    small = text_points(fig.get_figwidth())
    axes = fig.subplots(len(panels) + extra, 1, sharex=True, squeeze=False)[:, 0]
    alerts = run.get("alerts", [])
    for ax, (metric, label, log_scale) in zip(axes, panels):
        for colour, level in zip(LEVEL_COLOURS * 2, levels):
            steps, values = _series(records, level, metric)
            ax.plot(steps, values, color=colour, marker="." if len(steps) < 60 else None, linewidth=1.3,
                    label=level)
        if log_scale:
            ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=small)
        _mark_alerts(ax, alerts, records, metric)
    row = len(panels)
    if lora_groups:
        ax = axes[row]
        for group in lora_groups:
            steps = [r["step"] for r in records if group in r.get("lora", {})]
            ax.plot(steps, [r["lora"][group] for r in records if group in r.get("lora", {})], label=f"LoRA {group}")
        ax.set_yscale("log")
        ax.set_ylabel("LoRA update norm", fontsize=small)
        ax.legend(fontsize=small, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        row += 1
    if loss:
        ax = axes[row]
        ax.plot(sorted(loss), [loss[s] for s in sorted(loss)], color="#333333", linewidth=1)
        ax.set_ylabel("training loss", fontsize=small)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=small)
    axes[-1].set_xlabel("optimizer step", fontsize=small)
    handles, labels = axes[0].get_legend_handles_labels()
    markers = [axes[0].plot([], [], "v", color=COLLAPSE_COLOUR)[0], axes[0].plot([], [], "^", color=EXPLOSION_COLOUR)[0]]
    fig.legend(handles + markers, labels + ["collapse warning", "explosion warning"], loc="outside lower center",
               ncol=5, fontsize=small)
    fig.suptitle(title or f"{run.get('run', 'run')}: the 8 levels while training ({run.get('source', '')})",
                 fontsize=small + 2)
    return figure_to_image(fig)


def _mark_alerts(ax, alerts: list[dict], records: list[dict], metric: str) -> None:
    for alert in alerts:
        colour = COLLAPSE_COLOUR if alert["kind"] == "collapse" else EXPLOSION_COLOUR
        ax.axvline(alert["step"], color=colour, alpha=0.25, linewidth=1)
        record = next((r for r in records if r["step"] == alert["step"]), None)
        row = next((lv for lv in record["levels"] if lv["name"] == alert["level"]), None) if record else None
        value = row.get(metric) if row else None
        if value is not None and math.isfinite(value) and value > 0:
            ax.plot([alert["step"]], [value], "v" if alert["kind"] == "collapse" else "^", color=colour,
                    markersize=9, markeredgecolor="black", zorder=5)


def steps_figure(views: list[dict], run: str = "") -> Image.Image:
    """Two steps side by side: per level, the injected norm and its ratio to the residual stream."""
    if len(views) != 2:
        return note_figure("Two steps side by side", "Choose two steps that have checkpoints.")
    names = [lv["name"] for lv in views[0]["levels"]]
    x = np.arange(len(names))
    fig = Figure(figsize=(10, 4.4), layout="constrained")
    small = text_points(fig.get_figwidth())
    axes = fig.subplots(1, 2)
    width = 0.38
    for ax, (metric, label) in zip(axes, (("injected_norm", "injected norm"), ("ratio", "injected / residual norm"))):
        for i, (view, colour) in enumerate(zip(views, ("#7f7f7f", "#d62728"))):
            values = [lv.get(metric) or 0.0 for lv in view["levels"]]
            ax.bar(x + (i - 0.5) * width, values, width, color=colour, label=f"step {view['step']}")
        ax.set_xticks(x, names, rotation=45, ha="right", fontsize=small)
        ax.set_title(label, fontsize=small + 1)
        ax.tick_params(labelsize=small)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=small)
    fig.suptitle(f"{run}: step {views[0]['step']} and step {views[1]['step']}".strip(": "), fontsize=small + 2)
    return figure_to_image(fig)
