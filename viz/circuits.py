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
