"""Pictures of a dataset run: where each arm is right, where the two arms part, and by how much.

Input is plain data: the run's summary (``g4v.evaluate.summary.RunSummary``, whose ``to_dict`` is the
``summary.json`` a run writes; only its attributes are read) and the per-sample rows as ``run_eval`` returns them (``g4v.evaluate.SampleResult``, also
what ``read_results`` reads back from ``samples.jsonl``; only their attributes are read, so this
module needs no model code), so a finished run can be redrawn without the model. Every function returns one bounded PIL picture; when there is
nothing to draw (no references, no KL because an arm cannot score) the picture says why instead of
showing empty axes. Every text is sized by ``viz.figures.text_points`` for the figure's width and
the half page the tab gives each picture (two a row), as in the other panels' pictures, so it
stays readable once shown there. matplotlib draws off-screen (no pyplot state).
"""

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from viz.figures import HALF_PAGE_PX, figure_to_image, note_figure, text_points

#: Colours of arm A and arm B in every picture, so a reader matches them at a glance.
ARM_COLOURS = {"a": "#1f77b4", "b": "#ff7f0e"}
#: Categories drawn at most (the most frequent ones); more bars than this are unreadable.
MAX_CATEGORIES = 24
#: Longest category label drawn, in characters.
MAX_LABEL = 18
#: The first-difference histogram's axis reaches at least this answer-token index.
DIVERGENCE_MIN_INDEX = 5
#: Room left past an accuracy of 1 and beyond the outer bars, in axis units.
HEADROOM = 0.08
#: The four outcomes of a paired comparison, in drawing order, with their colours.
PAIRED_OUTCOMES = (("both_right", "both right", "#4caf50"), ("a_only", "only A right", ARM_COLOURS["a"]),
                   ("b_only", "only B right", ARM_COLOURS["b"]), ("both_wrong", "both wrong", "#bdbdbd"))


def _set_title(ax, title: str, fontsize: float) -> None:
    """The title at the left, its bracketed note on a second line: the tab's picture buttons
    (full screen, download, share) sit over the picture's top right corner, where a centred
    title of a half-page picture ran under them."""
    main, bracket, note = title.partition(" (")
    ax.set_title(main + (f"\n({note}" if bracket else ""), fontsize=fontsize, loc="left")


def _short(text, limit: int = MAX_LABEL) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arm_label(summary, arm: str) -> str:
    return str(summary.arms.side(arm).label or arm.upper())


def _groups(summary) -> list[tuple[str, object]]:
    """``("all", summary)`` then the categories' blocks, the largest first, at most MAX_CATEGORIES
    of them: the bars every per-category picture draws, in one order."""
    categories = sorted(summary.by_category.items(), key=lambda item: (-item[1].n, str(item[0])))
    return [("all", summary)] + [(str(name), part) for name, part in categories[:MAX_CATEGORIES]]


def _ci_whiskers(accuracy: float, ci95) -> tuple[float, float]:
    """(below, above) error-bar lengths for one accuracy; a missing interval draws none."""
    if not ci95 or ci95[0] is None or ci95[1] is None:
        return 0.0, 0.0
    return max(0.0, accuracy - ci95[0]), max(0.0, ci95[1] - accuracy)


def accuracy_figure(summary) -> Image.Image:
    """Accuracy of both arms overall and per category: a pair of bars a group, with 95% CI whiskers."""
    title = "Accuracy per category (whiskers: 95% confidence interval)"
    groups = [(name, part) for name, part in _groups(summary)
              if any(part.arms.side(arm).accuracy is not None for arm in "ab")]
    if not groups:
        return note_figure(title, "No accuracy to draw: the dataset has no reference answers "
                                  "(map a reference column to score the answers).", HALF_PAGE_PX)
    # One row per group, "all" on top, as in the paired figure: a row of two half-page pictures
    # has no room for 24 groups side by side, at any readable size.
    rows = np.arange(len(groups))[::-1]
    height = 0.38
    fig = Figure(figsize=(6.5, 0.6 * len(groups) + 2.0), layout="constrained")
    small = text_points(fig.get_figwidth(), HALF_PAGE_PX)
    ax = fig.add_subplot()
    for offset, arm in ((height / 2, "a"), (-height / 2, "b")):
        values, whiskers = [], [[], []]
        for _, part in groups:
            stats = part.arms.side(arm)
            accuracy = stats.accuracy
            values.append(math.nan if accuracy is None else accuracy)
            below, above = _ci_whiskers(accuracy, stats.ci95) if accuracy is not None else (0.0, 0.0)
            whiskers[0].append(below)
            whiskers[1].append(above)
        ax.barh(rows + offset, values, height, xerr=whiskers, capsize=3, color=ARM_COLOURS[arm],
                label=f"{arm.upper()}: {_short(_arm_label(summary, arm), 40)}")
    ax.set_yticks(rows, [f"{_short(name)} (n={part.n})" for name, part in groups], fontsize=small)
    # headroom past 1 and above the top bar: a full bar and its whisker's cap end inside the frame,
    # not under it
    ax.set_xlim(0, 1 + HEADROOM)
    ax.set_ylim(-0.5 - HEADROOM, len(groups) - 0.5 + HEADROOM)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.tick_params(axis="x", labelsize=small)
    ax.set_xlabel("accuracy", fontsize=small)
    fig.legend(fontsize=small, loc="outside lower center", ncols=2)  # under the axes, never over the bars
    _set_title(ax, title, small + 2)
    return figure_to_image(fig)


def paired_figure(summary) -> Image.Image:
    """Per category, how the samples split into both right / only A / only B / both wrong, as
    stacked shares; the McNemar p-value of each group is written beside its bar."""
    title = "Paired outcomes (p: exact McNemar test)"
    groups = [(name, part) for name, part in _groups(summary)
              if sum(getattr(part.paired, key) for key, _, _ in PAIRED_OUTCOMES) > 0]
    if not groups:
        return note_figure(title, "No paired outcomes to draw: the dataset has no reference answers.", HALF_PAGE_PX)
    fig = Figure(figsize=(6.5, 0.6 * len(groups) + 2.0), layout="constrained")
    small = text_points(fig.get_figwidth(), HALF_PAGE_PX)
    ax = fig.add_subplot()
    rows = np.arange(len(groups))[::-1]  # "all" on top
    left = np.zeros(len(groups))
    for key, label, colour in PAIRED_OUTCOMES:
        counts = np.array([getattr(part.paired, key) for _, part in groups], dtype=float)
        totals = np.array([sum(getattr(part.paired, k) for k, _, _ in PAIRED_OUTCOMES) for _, part in groups],
                          dtype=float)
        shares = counts / np.maximum(totals, 1)
        ax.barh(rows, shares, left=left, color=colour, label=label)
        left += shares
    for row, (_, part) in zip(rows, groups):
        ax.text(1.01, row, f"p = {part.paired.mcnemar_p:.3g}", va="center", fontsize=small)
    ax.set_yticks(rows, [_short(name) for name, _ in groups], fontsize=small)
    ax.set_xlim(0, 1.22)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.tick_params(axis="x", labelsize=small)
    ax.set_xlabel("share of the group's samples", fontsize=small)
    fig.legend(fontsize=small, ncols=4, loc="outside lower center")  # under the axes, never over the bars
    _set_title(ax, title, small + 2)
    return figure_to_image(fig)


def _finite(values) -> np.ndarray:
    array = np.array([math.nan if v is None else float(v) for v in values], dtype=float)
    return array[np.isfinite(array)]


def kl_histogram(rows: list) -> Image.Image:
    """How far apart the two arms' next-token distributions are, sample by sample: a histogram of
    the per-sample mean KL(A || B) on a log scale (KL spans orders of magnitude), with each
    sample's largest KL beside it. ``rows``: typed rows, their ``kl_mean`` and ``kl_max`` read."""
    title = "KL(A || B) per sample (nats, log scale)"
    means = _finite(row.kl_mean for row in rows)
    peaks = _finite(row.kl_max for row in rows)
    if not means.size:
        return note_figure(title, "No KL to draw: it needs both arms on local transformers "
                                  "(a vLLM or remote arm gives no full next-token distributions).", HALF_PAGE_PX)
    floor = 1e-6  # a KL of exactly 0 (identical arms) still gets a bar, at the floor
    low = max(floor, min(means.min(), peaks.min() if peaks.size else means.min()))
    high = max(low * 10, means.max(), peaks.max() if peaks.size else means.max())
    bins = np.logspace(math.log10(low), math.log10(high), 30)
    fig = Figure(figsize=(6.5, 3.4), layout="constrained")
    small = text_points(fig.get_figwidth(), HALF_PAGE_PX)
    ax = fig.add_subplot()
    ax.hist(np.maximum(means, floor), bins=bins, color="#6a51a3", alpha=0.8, label="mean over the answer")
    if peaks.size:
        ax.hist(np.maximum(peaks, floor), bins=bins, histtype="step", color="#d62728", linewidth=1.5,
                label="largest position")
    ax.set_xscale("log")
    ax.set_xlabel("KL (nats)", fontsize=small)
    ax.set_ylabel("samples", fontsize=small)
    ax.tick_params(labelsize=small)
    fig.legend(fontsize=small, loc="outside lower center", ncols=2)  # under the axes, never over the bars
    _set_title(ax, title, small + 2)
    return figure_to_image(fig)


def divergence_histogram(rows: list) -> Image.Image:
    """Where the two greedy answers first differ (answer token index), for the samples that
    differ at all; the share that agree entirely is in the title. ``rows``: typed rows, their
    ``error``, ``first_divergence`` and ``agree`` read."""
    scored = [row for row in rows if not row.error]
    positions = _finite(row.first_divergence for row in scored)
    agree = sum(1 for row in scored if row.agree)
    title = f"First differing answer token ({agree} of {len(scored)} samples agree entirely)"
    if not positions.size:
        note = "The two arms gave the same greedy answer on every sample." if scored else "No samples yet."
        return note_figure(title, note, HALF_PAGE_PX)
    fig = Figure(figsize=(6.5, 3.4), layout="constrained")
    small = text_points(fig.get_figwidth(), HALF_PAGE_PX)
    ax = fig.add_subplot()
    where, counts = np.unique(positions.astype(int), return_counts=True)  # token indices are whole numbers
    ax.bar(where, counts, width=0.8, color="#2ca02c")
    # From index 0, and at least to :data:`DIVERGENCE_MIN_INDEX`: with every first difference at one
    # index, the one bar filled the plot and the axis read -0.4 ... 0.4 (a single whole number in
    # range leaves MaxNLocator nothing whole to tick).
    ax.set_xlim(-0.6, max(int(where.max()), DIVERGENCE_MIN_INDEX) + 0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("answer token index of the first difference", fontsize=small)
    ax.set_ylabel("samples", fontsize=small)
    ax.tick_params(labelsize=small)
    _set_title(ax, title, small + 2)
    return figure_to_image(fig)


#: Each picture's title, for the note that replaces all four when every row failed.
FIGURE_TITLES = {"accuracy": "Accuracy per category", "paired": "Paired outcomes", "kl": "KL(A || B) per sample",
                 "divergence": "First differing answer token"}


def all_failed(rows: list) -> str | None:
    """When every row failed (a picture the dataset names is missing, an arm's server is down): the
    note every picture shows instead of a reason that does not apply ("no reference answers", "needs
    both arms on local transformers"); None while any row has answers."""
    if not rows or not all(row.error for row in rows):
        return None
    return f"Every row failed ({len(rows)} of {len(rows)}), so there is nothing to draw. The first: {rows[0].error}"


def run_figures(summary, rows: list) -> dict[str, Image.Image]:
    """Every picture of a run, by name (the Evaluate tab shows them in this order): ``summary`` is
    its ``RunSummary``, ``rows`` its typed rows (``RunResult.rows``)."""
    failed = all_failed(rows)
    if failed:
        return {name: note_figure(title, failed, HALF_PAGE_PX) for name, title in FIGURE_TITLES.items()}
    return {"accuracy": accuracy_figure(summary), "paired": paired_figure(summary),
            "kl": kl_histogram(rows), "divergence": divergence_histogram(rows)}
