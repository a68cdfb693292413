"""Anyres tiling: which image token comes from which part of the picture.

Granite 4 Vision turns one image into a run of image tokens in five steps (LLaVA-NeXT "anyres"):

1. pick the best grid pinpoint (a canvas of ``rows x cols`` tiles) for the image's size;
2. resize the image to fit that canvas, keeping its aspect ratio, and pad it (centred) with black;
3. encode a *base view* (the whole image squashed to one tile) plus one view per tile;
4. downsample each view's ``side x side`` patch grid to ``feat x feat`` features (window Q-Former,
   ``downsample_rate``), lay the tile features out as one big grid and cut off the rows or columns
   that are only padding ("unpadding");
5. pack: base features row by row, then the unpadded tile features row by row with one
   image-newline feature after each row.

:func:`plan_tiling` (:mod:`g4v.tiling.plan`) computes all of it from a config, without weights or
torch, and maps every image token to the pixel box it covers in the original image. That map is
computed there and nowhere else: token counts, the CLI, the overlay, heatmaps and ablations all read
:attr:`TilingPlan.tokens`.

Coordinates: sizes are ``(height, width)`` like transformers' ``image_sizes``; boxes are
``(left, top, right, bottom)`` in pixels like PIL, as floats because resizing makes them fractional.
What people read says width first, in words (:func:`across`, :func:`pixels`): "512 x 600 px (width x
height)", "2 wide x 3 tall"; the JSON names the sides of ``image_size`` (``{"width": W, "height": H}``,
:func:`~g4v.images.named_size`) and keeps transformers' [height, width] for the other pairs
(``best_resolution``, ``grid``...).

:mod:`g4v.tiling.view` draws a plan over the image it was made for (the CLI's ``--png`` and the
Tiling tab).
"""

from g4v.tiling.plan import (TOKEN_KINDS, Box, ImageToken, Padding, Size, Tile, TilingPlan, across, first_token_to_show,
                             pixels, plan_tiling, resized_size, select_best_resolution, token_at)

__all__ = ["TOKEN_KINDS", "Box", "ImageToken", "Padding", "Size", "Tile", "TilingPlan", "across", "first_token_to_show",
           "pixels", "plan_tiling", "resized_size", "select_best_resolution", "token_at"]
