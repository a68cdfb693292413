"""The Tiling panel's pictures: a tiling plan drawn over the image it was made for.

The plan itself (:mod:`g4v.tiling`) is pure geometry computed from a config; this module opens the
image, checks it against the plan and hands plain data to :mod:`viz.tiling` to draw. The CLI
(``python -m g4v tiling --png``) and the app's Tiling tab both draw through here.
"""

from pathlib import Path

from g4v.images import open_image
from g4v.loading import load_config
from g4v.tiling import TilingPlan, plan_tiling
from viz.tiling import highlight_box, render_tiling_overlay


def tiling_report(image, config):
    """``(overlay, table_rows, plan)`` for an image (PIL image, path or bytes) and a config (object, or
    a model folder / config file to load): the overlay as a PIL image, the token budget as
    [part, layout, tokens] rows, and the :class:`TilingPlan`."""
    image = open_image(image)
    if isinstance(config, (str, Path)):
        config = load_config(config)
    plan = plan_tiling((image.height, image.width), config)
    return render_tiling_overlay(image, plan.as_dict()), plan.budget_rows(), plan


def highlight_token(image, plan: TilingPlan, token_index):
    """The original image with token ``token_index``'s box (and its tile, for a tile token) drawn.

    Checks, each as one line: the index is a whole number in range, and ``image`` has the size the
    plan was made for (else the box would describe another picture)."""
    token = plan.token(token_index)
    image = open_image(image)
    plan.check_matches((image.height, image.width))
    label = f"#{token.index} {token.kind} r{token.row} c{token.col}"
    tile_box = plan.tiles[token.tile].box if token.tile is not None else None
    return highlight_box(image, token.box, label=label, context_box=tile_box)
