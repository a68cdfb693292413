"""Pictures of the circuits views: the share of attention on the picture by layer, and the
head-averaged attention on each image token painted through the tiling plan's token boxes."""

from matplotlib.figure import Figure
from PIL import Image

from viz.figures import figure_to_image, mark_injection_layers, text_points, token_heatmap_grid


def image_share_figure(summary: dict) -> Image.Image:
    """The query's attention share on the image (all, base view, tiles, newlines) by layer, injection
    layers marked. ``summary``: :meth:`g4v.circuits.attention.ImageAttention.to_dict`."""
    layers = summary["layers"]
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    small = text_points(fig.get_figwidth())
    ax = fig.add_subplot()
    ax.plot(layers, summary["image_share"], color="#d62728", marker=".", label="all image tokens")
    for kind, colour in (("base", "#1f77b4"), ("tile", "#ff7f0e"), ("newline", "#7f7f7f")):
        ax.plot(layers, summary["image_share_by_kind"][kind], "--", color=colour, marker=".", label=f"{kind} tokens")
    mark_injection_layers(ax, summary["injection_layers"], small)
    ax.set_xlabel("LLM layer")
    ax.set_ylabel("share of attention (mean over heads)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Attention from position {summary['query_position']} to the picture")
    fig.legend(loc="outside lower center", ncol=4, fontsize=small)
    ax.grid(alpha=0.3)
    return figure_to_image(fig)


def attention_map_figure(image: Image.Image, summary: dict, view: str) -> Image.Image:
    """One panel per layer: the head-averaged attention on each ``view`` token ("tile" or "base")
    over the picture, through the tiling plan's boxes, on one colour scale."""
    tokens = [(token["kind"], tuple(token["box"])) for token in summary["image_tokens"]]
    names = {layer: f"layer {layer}" + (f" ({summary['injection_layers'][str(layer)]})"
                                        if str(layer) in summary["injection_layers"] else "")
             for layer in summary["layers"]}
    values = {names[layer]: row for layer, row in zip(summary["layers"], summary["mean_attention"])}
    return token_heatmap_grid(image, tokens, values, view, cmap="viridis", alpha=0.65,
                              colorbar_label="attention weight (mean over heads)",
                              panel_title=lambda name, peak: f"{name}  (max {peak:.2g})",
                              title=f"Attention on each {view} token, by layer")


def patching_figure(summary: dict) -> Image.Image:
    """One panel per direction: the patched run's log-odds of the donor's first answer token against
    the receiver's, one bar per level patched alone and one for every level at once (the bound),
    each growing from the receiver's own log-odds towards the donor's (dashed lines); each bar names
    the share of the way it moved. ``summary``: :meth:`g4v.circuits.patching.PatchingResult.to_dict`."""
    directions = summary["directions"]
    fig = Figure(figsize=(9, 3.6 * len(directions) + 0.8), layout="constrained")
    small = text_points(fig.get_figwidth())
    for row, direction in enumerate(directions):
        ax = fig.add_subplot(len(directions), 1, row + 1)
        runs = [*direction["levels"], direction["all_levels"]]
        names = [run["label"] for run in runs]
        colours = ["#2ca02c" if "spatial" in name else "#9467bd" for name in names[:-1]] + ["#7f7f7f"]
        values = [run["logodds"] for run in runs]
        start = direction["logodds_receiver"]  # each bar grows from the receiver's own log-odds: its length is the move
        ax.bar(range(len(runs)), [value - start for value in values], bottom=start, color=colours)
        receiver, donor = direction["receiver"], direction["donor"]
        ax.axhline(direction["logodds_receiver"], color="#1f77b4", linestyle="--", linewidth=1,
                   label=f"{receiver} as it is ({direction['receiver_continuation']!r})")
        ax.axhline(direction["logodds_donor"], color="#d62728", linestyle="--", linewidth=1,
                   label=f"{donor} as it is ({direction['donor_continuation']!r})")
        for i, run in enumerate(runs):
            label = "" if run["moved"] is None else f"{run['moved']:.0%}"
            ax.annotate(label, (i, values[i]), ha="center", va="bottom" if values[i] >= start else "top", fontsize=small)
        ax.set_xticks(range(len(runs)), names, rotation=30, fontsize=small)
        ax.set_ylabel(f"log p({direction['donor_token']!r}) - log p({direction['receiver_token']!r})", fontsize=small)
        note = "; same first answer token: nothing to move" if direction["same_first_token"] else ""
        how = "all levels but one" if summary.get("complement") else "one level at a time"
        ax.set_title(f"{receiver} with {donor}'s features, {how} (share of the way moved){note}",
                     fontsize=small + 1)
        ax.axhline(0, color="#333333", linewidth=0.6)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, fontsize=small)  # under the bars
        ax.grid(axis="y", alpha=0.3)
    return figure_to_image(fig)
