"""Pictures of the attribution panel: per-level maps over the image, the deletion curve, the lens.

Plain numbers and boxes in, PIL images out (no model code): ``tokens`` is ``(kind, box)`` per image
token in the model's packing order, ``box`` in original-image pixels, as ``g4v.tiling`` plans it.
"""

import math
from collections import Counter

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from viz.figures import PANEL_INCHES, figure_to_image, heatmap_picture, muted, text_points, token_heatmap_grid

LENS_COLOURS = 9  # the most frequent top tokens get a colour each (tab10 but its grey); the rest are grey
#: The colour of a token whose top token has none of its own, and what the legend calls it.
OTHER_TOKENS = ((0.5, 0.5, 0.5), "other tokens")
LENS_LEGEND_COLUMNS = 5  # the lens legend's names a row, under the panels


def attribution_figure(image: Image.Image, tokens: list[tuple[str, tuple]], scores_by_level: dict[str, list[float]],
                       view: str = "tile", title: str | None = None) -> Image.Image:
    """One panel per level and one for the combined score: each ``view`` token's attribution painted
    over the image on a colour scale centred on zero (red: the token raised the target, blue: it
    lowered it, white: no effect), since the scores are signed and a scale that starts at the
    smallest score would paint "lowered a little" and "no effect" alike. Each panel has its own
    scale (its largest magnitude in its title): a level's scores are often a hundredth of the
    combined score's, and one shared scale would paint the levels plain grey."""
    return token_heatmap_grid(
        image, tokens, scores_by_level, view, cmap="coolwarm", alpha=0.6, symmetric=True, per_panel=True,
        colorbar_label="attribution / the panel's max |x|",
        panel_title=lambda name, peak: f"{name}  (max |x| {peak:.2g} nats)",
        title=title or f"Attribution per {view} token")


def deletion_figure(curve, title: str = "Deletion test", measure: str = "log-probability") -> Image.Image:
    """The explained number (``measure``: the target's log-probability, or a contrast's log-odds) as
    the top-k% tokens by attribution are removed, against random removals (each seed thin, their
    mean dashed). The title says what its number, the area between the curves, means. ``curve``: a
    ``g4v.attribution.deletion.DeletionCurve``."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    shares = [100 * f for f in curve.fractions]
    for run in curve.random:
        ax.plot(shares, run, color="grey", alpha=0.35, linewidth=0.8)
    ax.plot(shares, curve.random_mean, color="grey", linestyle="--", label="random (mean)")
    ax.plot(shares, curve.attributed, color="tab:red", marker="o", label="top-k by attribution")
    ax.set_xlabel(f"image tokens removed (%), {curve.level or 'all levels'}")
    ax.set_ylabel(f"target {measure}")
    ax.set_title(f"{title}: area between the curves {curve.area_between:.3g}\n"
                 "(random mean minus top-k, over the share removed; above 0: the map beats chance)",
                 fontsize=small + 1)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=2, fontsize=small)  # beside the curves, never over them
    return figure_to_image(fig)


def lens_figure(image: Image.Image, tokens: list[tuple[str, tuple]], views: list, vocabulary: dict,
                view: str = "tile", title: str = "Logit lens: top token per image token") -> Image.Image:
    """One panel per lens view (a ``g4v.attribution.lens.LensView``: its ``name`` and ``top_ids``),
    each token's box coloured by its top token; the legend names the most frequent tokens over all
    panels."""
    picked = [i for i, (kind, _) in enumerate(tokens) if kind == view]
    counts = Counter(v.top_ids[i] for v in views for i in picked)
    common = [token for token, _ in counts.most_common(LENS_COLOURS)]
    palette = {token: n for n, token in enumerate(common)}
    others = len(counts) > len(palette)  # some tokens are painted grey: the legend names grey too
    shown, scale_x, scale_y = heatmap_picture(image)  # never the full-size picture: 40 Mpx would take GBs
    cols = min(4, max(1, len(views)))
    rows = max(1, math.ceil(len(views) / cols))
    aspect = shown.height / shown.width
    # The legend goes under the panels: at the top-right corner Gradio's fullscreen and download
    # buttons would hide its title; the panels keep the page's width, so its names stay readable.
    panel = PANEL_INCHES * 4 / cols if cols > 1 else PANEL_INCHES
    legend_rows = math.ceil((len(palette) + others) / LENS_LEGEND_COLUMNS)
    fig = Figure(figsize=(panel * cols + 0.4, panel * aspect * rows + 1.1 + 0.3 * legend_rows), layout="constrained")
    small = text_points(fig.get_figwidth())
    axes = fig.subplots(rows, cols, squeeze=False)
    colours = [tuple(c) for c in _tab10()]
    backdrop = muted(shown)
    for ax, lens_view in zip(axes.flat, views):
        canvas = np.zeros((shown.height, shown.width, 4), dtype=np.float32)
        for i in picked:
            box = tokens[i][1]
            left, top, right, bottom = (int(round(v)) for v in (box[0] * scale_x, box[1] * scale_y,
                                                                 box[2] * scale_x, box[3] * scale_y))
            if right <= left or bottom <= top:
                continue
            n = palette.get(lens_view.top_ids[i])
            canvas[top:bottom, left:right] = (*colours[n], 0.55) if n is not None else (*OTHER_TOKENS[0], 0.35)
        ax.imshow(backdrop)  # in greys: a token's colour is its top token's, whatever the picture's colour there
        ax.imshow(canvas)
        ax.set_title(lens_view.name, fontsize=small)
        ax.axis("off")
    for ax in list(axes.flat)[len(views):]:
        ax.axis("off")
    handles = [_patch(colours[n], repr(vocabulary.get(token, vocabulary.get(str(token), "?"))))
               for token, n in palette.items()]
    if others:  # grey was a colour without a name
        handles.append(_patch(*OTHER_TOKENS))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), LENS_LEGEND_COLUMNS),
                   fontsize=small, title="top token", title_fontsize=small)
    fig.suptitle(title, fontsize=small + 2)
    return figure_to_image(fig)


def _tab10():
    """tab10 without its grey (its 8th colour), which painted one top token as the others are."""
    from matplotlib import colormaps

    return [colormaps["tab10"](n)[:3] for n in range(10) if n != 7]


def _patch(colour, label: str):
    from matplotlib.patches import Patch

    return Patch(color=colour, label=label[:24])
