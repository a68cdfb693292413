"""Both views on the same pixels: a tile token's score with the base view's share of its region added.

Granite 4 Vision sees the picture twice, as a low-resolution base view and as high-resolution
tiles, and either view can carry what an answer relies on (the trained demo checkpoint reads
colours mostly through its base view). A tile token's own score says only what came through the
tiles. Spreading each token's score evenly over the pixels it covers and adding the views up gives
one map of the picture; a tile token's *region score* is that map summed over its box:

``region[t] = score[t] + sum_b score[b] * area(box_t & box_b) / area(box_b)`` for base tokens ``b``.

It answers "which part of the picture" rather than "which token of which view"; the tile-only map
stays available beside it.
"""

import torch

from g4v.tiling import Box, TilingPlan


def _has_area(box: Box) -> bool:
    return box[2] > box[0] and box[3] > box[1]


def overlap_shares(boxes: list[Box], sources: list[Box]) -> torch.Tensor:
    """(len(boxes), len(sources)): the share of each source box's area that lies inside each box.
    Pure geometry; a source without area shares nothing."""
    out = torch.zeros(len(boxes), len(sources), dtype=torch.float64)
    for j, source in enumerate(sources):
        area = (source[2] - source[0]) * (source[3] - source[1])
        if area <= 0:
            continue
        for i, box in enumerate(boxes):
            width = min(box[2], source[2]) - max(box[0], source[0])
            height = min(box[3], source[3]) - max(box[1], source[1])
            if width > 0 and height > 0:
                out[i, j] = width * height / area
    return out


def region_scores(plan: TilingPlan, scores: torch.Tensor) -> torch.Tensor:
    """(num_image_tokens,) token scores -> (num_image_tokens,) float32: each tile token's region
    score (its own score plus the base view's share of its box); NaN for every other token and for
    tile tokens that only cover padding, so a heatmap leaves them unpainted."""
    tiles = [t for t in plan.tokens if t.kind == "tile" and _has_area(t.box)]
    bases = [t for t in plan.tokens if t.kind == "base"]
    out = torch.full((len(plan.tokens),), float("nan"))
    if not tiles:
        return out
    shares = overlap_shares([t.box for t in tiles], [t.box for t in bases])  # (tiles, bases)
    base_scores = scores[[t.index for t in bases]].double()  # (bases,)
    own = scores[[t.index for t in tiles]].double()  # (tiles,)
    out[[t.index for t in tiles]] = (own + shares @ base_scores).float()
    return out
