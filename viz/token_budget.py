"""The token-budget curve: accuracy and KL from the plain arm against the kept fraction of image
tokens, one line per policy, 95 % intervals as error bars (Wilson for accuracy, normal for the
mean KL). Input is the plain data of ``budget.json`` (:class:`g4v.evaluate.budget.BudgetCurve`'s
``to_dict``), so a finished sweep redraws without the model. One full-width picture, two panels.
"""

import math

from matplotlib.figure import Figure
from PIL import Image

from viz.figures import figure_to_image, note_figure, text_points

#: A colour and marker per policy, random (the control) in grey and dashed.
POLICY_STYLE = {"norm": ("#1f77b4", "o", "-"), "attention": ("#ff7f0e", "s", "-"),
                "attribution": ("#2ca02c", "^", "-"), "random": ("#7f7f7f", "x", "--")}
#: Kept percentage points between two policies' markers at the same K.
DODGE = 1.2


def _bars(values, intervals) -> list[list[float]]:
    below, above = [], []
    for value, interval in zip(values, intervals):
        ok = interval and not math.isnan(value)
        below.append(max(0.0, value - interval[0]) if ok else 0.0)
        above.append(max(0.0, interval[1] - value) if ok else 0.0)
    return [below, above]


def budget_figure(curve: dict) -> Image.Image:
    """Accuracy (left) and mean KL(plain || budget) (right) against the kept % of image tokens."""
    title = f"Token budget: {curve.get('arm', 'hf')} keeping K% of image tokens (bars: 95% intervals)"
    points = curve.get("points") or []
    if not points:
        return note_figure(title, "No finished budget run to draw yet.")
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    small = text_points(fig.get_figwidth())
    axes = fig.subplots(1, 2)
    policies = curve.get("policies", [])
    for number, policy in enumerate(policies):
        mine = sorted((p for p in points if p["policy"] == policy), key=lambda p: p["keep"])
        if not mine:
            continue
        colour, marker, line = POLICY_STYLE.get(policy, ("#000000", "o", "-"))
        dodge = DODGE * (number - (len(policies) - 1) / 2)  # side by side, so equal points stay visible
        keeps = [p["keep"] + dodge for p in mine]
        for ax, value, interval in ((axes[0], "accuracy", "ci95"), (axes[1], "kl_mean", "kl_ci95")):
            values = [math.nan if p[value] is None else p[value] for p in mine]
            ax.errorbar(keeps, values, yerr=_bars(values, [p[interval] for p in mine]), color=colour, marker=marker,
                        linestyle=line, capsize=3, label=policy + (" (control)" if policy == "random" else ""))
    for ax, label in ((axes[0], "accuracy"), (axes[1], "mean KL(plain || budget), nats")):
        ax.set_xlabel("image tokens kept (%)", fontsize=small)
        ax.set_ylabel(label, fontsize=small)
        ax.set_xticks(sorted(curve.get("keeps") or {p["keep"] for p in points}))
        ax.invert_xaxis()  # fewer tokens to the right: the curve reads as the budget shrinks
        ax.tick_params(labelsize=small)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylim(bottom=0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=small, loc="outside right center")
    fig.suptitle(title, fontsize=small + 2)
    return figure_to_image(fig)
