"""Pictures of the circuits views: the share of attention on the picture by layer, and the
head-averaged attention on each image token painted through the tiling plan's token boxes."""

from matplotlib.figure import Figure
from PIL import Image

from viz.figures import (HALF_PAGE_PX, ellipsized, figure_to_image, fitted_size, mark_injection_layers,
                         text_points, token_heatmap_grid)


def image_share_figure(attention) -> Image.Image:
    """The query's attention share on the image (all, base view, tiles, newlines) by layer, injection
    layers marked. ``attention``: a :class:`g4v.circuits.attention.ImageAttention`, read by attribute."""
    layers = attention.layers
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    ax.plot(layers, attention.image_share.tolist(), color="#d62728", marker=".", label="all image tokens")
    by_kind = attention.share_by_kind()
    for kind, colour in (("base", "#1f77b4"), ("tile", "#ff7f0e"), ("newline", "#7f7f7f")):
        ax.plot(layers, by_kind[kind], "--", color=colour, marker=".", label=f"{kind} tokens")
    mark_injection_layers(ax, attention.injection_layers, small)
    ax.set_xlabel("LLM layer")
    ax.set_ylabel("share of attention (mean over heads)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Attention from position {attention.query_position} to the picture")
    fig.legend(loc="outside lower center", ncol=4, fontsize=small)
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


#: In the tile-token maps each row's newline token is painted as a strip this share of the
#: picture's width at the row's right end (its own box is the whole row, which would hide the tiles).
NEWLINE_STRIP = 0.04


def newline_strip(box) -> tuple:
    """The strip a newline token is painted in: the right end of its row's box."""
    left, top, right, bottom = box
    return max(left, right - max(1.0, NEWLINE_STRIP * (right - left))), top, right, bottom


def attention_map_figure(image: Image.Image, attention, view: str, head: int | None = None) -> Image.Image:
    """One panel per layer: the head-averaged attention (``head``: that head's) on each ``view``
    token ("tile" or "base") over the picture, through the tiling plan's boxes, on one colour
    scale. The tile maps mark each row's newline token too: a strip at the row's right end
    (:data:`NEWLINE_STRIP`). ``attention``: a :class:`g4v.circuits.attention.ImageAttention`."""
    tokens = [(token.kind, tuple(token.box)) for token in attention.image_tokens]
    if view == "tile":  # newline tokens painted with the tiles, over the right end of their row
        tokens = [("tile", newline_strip(box)) if kind == "newline" else (kind, box) for kind, box in tokens]
    names = {layer: f"layer {layer}" + (f" ({attention.injection_layers[layer]})"
                                        if layer in attention.injection_layers else "")
             for layer in attention.layers}
    values = {names[layer]: row for layer, row in zip(attention.layers, attention.maps(head))}
    return token_heatmap_grid(image, tokens, values, view, cmap="viridis", alpha=0.65,
                              colorbar_label="attention weight (" + ("mean over heads" if head is None else f"head {head}") + ")",
                              panel_title=lambda name, peak: f"{name}  (max {peak:.2g})",
                              title=f"Attention on each {view} token, by layer" + (
                                  " (newline tokens: the strip at each row's right end)" if view == "tile" else ""))


#: The reverse view names at most this many text tokens on its axis (every k-th past it).
MAX_TOKEN_LABELS = 60
#: and each at most this many characters (a longer one ends in "…"; the report's table gives it whole)
TOKEN_LABEL_CHARS = 12


def region_attention_figure(image: Image.Image, region) -> Image.Image:
    """The reverse view: the picture with the region and its image tokens framed, and beside it the
    head-averaged attention every text token puts on the region, by layer (injection layers named).
    ``region``: a :class:`g4v.circuits.reverse.RegionAttention`, read by attribute."""
    import numpy as np
    from matplotlib.patches import Rectangle

    from viz.figures import heatmap_picture

    shown, scale_x, scale_y = heatmap_picture(image)
    texts = region.readers
    values = np.array(region.weights.tolist(), dtype=float)  # (layers, text tokens)
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    small = text_points(fig.get_figwidth())
    picture_ax, heat_ax = fig.subplots(1, 2, width_ratios=[1, 3])
    picture_ax.imshow(shown)
    region_tokens = region.region_tokens
    for token in region_tokens:
        left, top, right, bottom = token.box
        picture_ax.add_patch(Rectangle((left * scale_x, top * scale_y), (right - left) * scale_x,
                                       (bottom - top) * scale_y, fill=False, linewidth=0.6,
                                       edgecolor="#1f77b4" if token.kind == "base" else "#ff7f0e"))
    x0, y0, x1, y1 = region.region
    picture_ax.add_patch(Rectangle((x0 * scale_x, y0 * scale_y), (x1 - x0) * scale_x, (y1 - y0) * scale_y,
                                   fill=False, linewidth=2.2, edgecolor="#d62728"))
    kinds = [token.kind for token in region_tokens]
    # on two lines: on one, a long region's title ran into the heatmap's axis label beside it
    picture_ax.set_title(f"region {x0},{y0},{x1},{y1}\n{kinds.count('tile')} tile, {kinds.count('base')} base tokens",
                         fontsize=small)
    picture_ax.axis("off")
    layers = region.layers
    mesh = heat_ax.imshow(values, aspect="auto", cmap="viridis", origin="lower", interpolation="nearest",
                          extent=(-0.5, len(texts) - 0.5, layers[0] - 0.5, layers[-1] + 0.5))
    step = max(1, -(-len(texts) // MAX_TOKEN_LABELS))
    ticks = list(range(0, len(texts), step))
    heat_ax.set_xticks(ticks, [ellipsized(repr(texts[i].text)[1:-1], TOKEN_LABEL_CHARS)
                                 for i in ticks], rotation=90, fontsize=small)
    for tick, i in zip(heat_ax.get_xticklabels(), ticks):
        tick.set_color("#d62728" if texts[i].part == "answer" else "black")
    heat_ax.set_yticks(layers, [str(layer) + (f" {region.injection_layers[layer]}"
                                              if layer in region.injection_layers else "")
                                for layer in layers], fontsize=small)
    heat_ax.set_ylabel("LLM layer (injection levels named)", fontsize=small)
    heat_ax.set_xlabel("text token (answer tokens in red)", fontsize=small)
    heat_ax.set_title("Attention on the region (mean over heads, summed over its tokens)", fontsize=small)
    bar = fig.colorbar(mesh, ax=heat_ax, shrink=0.9)
    bar.ax.tick_params(labelsize=small)
    return figure_to_image(fig)


#: The region picker shows the picture this many pixels on its longer side: the width of its box,
#: one of a row of two (at its own size a 239 x 127 picture sat small in a corner of the box).
PICKER_SIDE = HALF_PAGE_PX


def picker_size(image_size: tuple[int, int]) -> tuple[int, int]:
    """The size (width, height) :func:`region_overlay` shows a picture of ``image_size`` at."""
    return fitted_size(*image_size, PICKER_SIDE)


def region_overlay(image: Image.Image, box=None, point=None) -> Image.Image:
    """``image`` at :func:`picker_size` with the region ``box`` (picture pixels) framed and the
    rest dimmed, or the first corner ``point`` marked: the app's region picker (map a click on it
    back with :func:`viz.figures.original_point` and that size)."""
    from PIL import ImageDraw

    from viz.figures import shown_picture

    width, height = picker_size(image.size)
    shown = shown_picture(image, (width, height)).copy()
    scale_x, scale_y = width / image.width, height / image.height
    line = max(2, round(min(width, height) / 120))
    draw = ImageDraw.Draw(shown, "RGBA")
    if box is not None:
        left, top, right, bottom = box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y
        # the rest dimmed in one pass through a mask: four veils around the region, each drawn with
        # its edge rows included, darkened the rows they shared into lines across the whole picture
        veil = Image.new("L", shown.size, 90)
        ImageDraw.Draw(veil).rectangle((left, top, right, bottom), fill=0)
        shown.paste((0, 0, 0), (0, 0, width, height), mask=veil)
        draw.rectangle((left, top, right, bottom), outline="#d62728", width=line)
    if point is not None:
        x, y = (point[0] + 0.5) * scale_x, (point[1] + 0.5) * scale_y  # the pixel's centre
        radius = 3 * line
        draw.line((x - radius, y, x + radius, y), fill="#d62728", width=line)
        draw.line((x, y - radius, x, y + radius), fill="#d62728", width=line)
    return shown


def patching_figure(patching) -> Image.Image:
    """One panel per direction: the patched run's log-odds of the donor's first answer token against
    the receiver's, one bar per level patched alone and one for every level at once (the bound),
    each growing from the receiver's own log-odds towards the donor's (dashed lines); each bar names
    the share of the way it moved. ``patching``: a :class:`g4v.circuits.patching.PatchingResult`, read
    by attribute."""
    directions = patching.directions
    fig = Figure(figsize=(9, 3.6 * len(directions) + 0.8), layout="constrained")
    small = text_points(fig.get_figwidth())
    for row, direction in enumerate(directions):
        ax = fig.add_subplot(len(directions), 1, row + 1)
        runs = direction.runs
        names = [run.label for run in runs]
        colours = ["#2ca02c" if "spatial" in name else "#9467bd" for name in names[:-1]] + ["#7f7f7f"]
        values = [run.logodds for run in runs]
        start = direction.logodds_receiver  # each bar grows from the receiver's own log-odds: its length is the move
        ax.bar(range(len(runs)), [value - start for value in values], bottom=start, color=colours)
        receiver, donor = direction.receiver, direction.donor
        ax.axhline(direction.logodds_receiver, color="#1f77b4", linestyle="--", linewidth=1,
                   label=f"{receiver} as it is ({direction.receiver_continuation!r})")
        ax.axhline(direction.logodds_donor, color="#d62728", linestyle="--", linewidth=1,
                   label=f"{donor} as it is ({direction.donor_continuation!r})")
        for i, run in enumerate(runs):
            label = "" if run.moved is None else f"{run.moved:.0%}"
            ax.annotate(label, (i, values[i]), ha="center", va="bottom" if values[i] >= start else "top", fontsize=small)
        ax.set_xticks(range(len(runs)), names, rotation=30, fontsize=small)
        ax.set_ylabel(f"log p({direction.donor_token!r}) - log p({direction.receiver_token!r})", fontsize=small)
        note = "; same first answer token: nothing to move" if direction.same_first_token else ""
        how = "all levels but one" if patching.complement else "one level at a time"
        ax.set_title(f"{receiver} with {donor}'s features, {how} (share of the way moved){note}",
                     fontsize=small + 1)
        ax.axhline(0, color="#333333", linewidth=0.6)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, fontsize=small)  # under the bars
        ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)
