"""The Tiling panel's pictures: a tiling plan drawn over the image it was made for.

The plan itself (:mod:`g4v.tiling`) is pure geometry computed from a config; this module opens the
image, checks it against the plan and hands plain data to :mod:`viz.tiling` to draw. The CLI
(``python -m g4v tiling --png``) and the app's Tiling tab both draw through here.
"""

from pathlib import Path

from g4v.images import open_image
from g4v.loading import load_config
from g4v.tiling import ImageToken, TilingPlan, first_token_to_show, plan_tiling, token_at
from viz.tiling import highlight_box, outline_box, tiling_overlay


def tiling_report(image, config):
    """``(overlay, table_rows, plan, regions)`` for an image (PIL image, path or bytes) and a config
    (object, or a model folder / config file to load): the overlay as a PIL image, the token budget
    as [part, layout, tokens] rows, the :class:`TilingPlan`, and where the overlay shows the canvas
    and the base view (for :func:`token_at_overlay`)."""
    image = open_image(image)
    if isinstance(config, (str, Path)):
        config = load_config(config)
    plan = plan_tiling((image.height, image.width), config)
    overlay, regions = tiling_overlay(image, plan.to_dict())
    return overlay, plan.budget_rows(), plan, regions


def token_to_show(plan: TilingPlan) -> int:
    """The token to select right after analysing: the tile token at the picture's centre (the first
    tile token, at the top-left corner, sat under the picture's label and its own tag), else the
    base token there (a strip so thin that unpadding keeps no tile feature has none)."""
    height, width = plan.image_size
    token = token_at(plan, width / 2, height / 2) or token_at(plan, width / 2, height / 2, kind="base")
    return token.index if token is not None else first_token_to_show(plan)


def token_at_overlay(plan: TilingPlan, regions: dict, x: float, y: float) -> ImageToken | None:
    """The token under pixel (x, y) of the overlay: on the padded canvas, the tile token whose feature
    cell holds the point; on the base view, the base token there. None elsewhere (titles, margins)
    and on canvas cells that unpadding cut off (padding only: no token)."""
    for view, (left, top, right, bottom) in regions.items():
        if left <= x < right and top <= y < bottom:
            across, down = (x - left) / (right - left), (y - top) / (bottom - top)
            if view == "base":
                height, width = plan.image_size
                return token_at(plan, across * width, down * height, kind="base")
            return _tile_token_in_cell(plan, down * plan.best_resolution[0], across * plan.best_resolution[1])
    return None


def _tile_token_in_cell(plan: TilingPlan, canvas_y: float, canvas_x: float) -> ImageToken | None:
    """Tile tokens follow the base tokens row by row over the kept cells, a newline after each row."""
    cell = plan.tile_size / plan.view_feature_grid[0]
    row, col = int(canvas_y // cell), int(canvas_x // cell)
    (row_start, row_stop), (col_start, col_stop) = plan.unpadded_rows, plan.unpadded_cols
    if not (row_start <= row < row_stop and col_start <= col < col_stop):
        return None
    return plan.token(plan.base_tokens + (row - row_start) * (col_stop - col_start + 1) + col - col_start)


def overlay_box(plan: TilingPlan, regions: dict, token: ImageToken) -> tuple[float, float, float, float]:
    """Where the overlay shows ``token`` (the inverse of :func:`token_at_overlay`), in the overlay's
    pixels: a base token's cell of the base view; a tile token's feature cell of the canvas; for a
    newline token, which has no cell of its own, the row of kept cells it ends."""
    if token.kind == "base":
        (left, top, right, bottom), (rows, cols) = regions["base"], plan.view_feature_grid
        width, height = (right - left) / cols, (bottom - top) / rows
        return left + token.col * width, top + token.row * height, left + (token.col + 1) * width, top + (token.row + 1) * height
    (left, top, right, bottom), (best_height, best_width) = regions["canvas"], plan.best_resolution
    cell = plan.tile_size / plan.view_feature_grid[0]
    row = plan.unpadded_rows[0] + token.row  # the token's cell in the whole tile-feature grid
    if token.kind == "newline":
        first, last = plan.unpadded_cols
    else:
        first = plan.unpadded_cols[0] + token.col
        last = first + 1
    across, down = (right - left) / best_width * cell, (bottom - top) / best_height * cell
    return left + first * across, top + row * down, left + last * across, top + (row + 1) * down


def mark_token(overlay, plan: TilingPlan, regions: dict, token_index):
    """The overlay with token ``token_index`` framed where it shows (see :func:`overlay_box`)."""
    return outline_box(overlay, overlay_box(plan, regions, plan.token(token_index)))


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
