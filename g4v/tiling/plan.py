"""The tiling plan of one image (see :mod:`g4v.tiling` for the five steps and the coordinates): the
grid and padding chosen, every view's feature grid, and every image token's box in the original
picture, computed from a config without weights or torch."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass
from fractions import Fraction

from g4v.errors import G4VError, quoted
from g4v.images import named_size

Box = tuple[float, float, float, float]  # (left, top, right, bottom) in pixels
Size = tuple[int, int]  # (height, width)

TOKEN_KINDS = ("base", "tile", "newline")


def across(width: int, height: int) -> str:
    """A grid (of tiles or features) for a reader: ``"2 wide x 3 tall"``."""
    return f"{width} wide x {height} tall"


def pixels(width: int, height: int) -> str:
    """A size in pixels for a reader: ``"512 x 600 px (width x height)"``."""
    return f"{width} x {height} px (width x height)"


@dataclass(frozen=True)
class ImageToken:
    """One image token, in the order the model packs its features.

    ``row``/``col``: for a base token, its cell in the base view's feature grid; for a tile token, its
    cell in the *unpadded* tile-feature grid; for a newline token, ``row`` is the unpadded row it ends
    and ``col`` the number of unpadded columns (it sits just after the last one).
    ``tile``: for a tile token, the index of its tile in row-major order (0 = top left), else None.
    ``box``: the pixels of the ORIGINAL image the token covers; a newline token gets its row's box.
    A cell that only covers padding gets an empty box (zero width or height) on the image's edge.
    """

    index: int
    kind: str  # "base" | "tile" | "newline"
    row: int
    col: int
    box: Box
    tile: int | None = None


@dataclass(frozen=True)
class Tile:
    """One anyres tile: where it sits in the padded canvas and what part of the original it shows."""

    index: int  # row-major, 0 = top left
    row: int
    col: int
    canvas_box: Box  # in the padded best-resolution canvas
    box: Box  # in the original image, clipped to it (empty if the tile is only padding)


@dataclass(frozen=True)
class Padding:
    """Black borders added around the resized image to fill the best-resolution canvas, in pixels."""

    top: int
    bottom: int
    left: int
    right: int


@dataclass(frozen=True)
class TilingPlan:
    """Everything about how one image becomes image tokens. Build it with :func:`plan_tiling`."""

    image_size: Size  # original (height, width)
    tile_size: int  # each view is tile_size x tile_size pixels (vision_config.image_size)
    patch_size: int  # vision patch side in pixels
    downsample_rate: str  # e.g. "4/8": window Q-Former queries per window side / window side
    best_resolution: Size  # the chosen grid pinpoint, (height, width) in pixels
    resized_size: Size  # the image after the aspect-preserving resize, before padding
    padding: Padding
    content_box: Box  # where the resized image sits in the padded canvas
    grid: tuple[int, int]  # (rows, cols) of tiles
    tiles: list[Tile]  # row-major
    base_view_size: Size  # (tile_size, tile_size): the whole image squashed to one tile
    view_feature_grid: tuple[int, int]  # (rows, cols) of features per view after downsampling
    tile_feature_grid: tuple[int, int]  # (rows, cols) of all tile features before unpadding
    unpadded_rows: tuple[int, int]  # [start, stop) of the tile-feature rows that are kept
    unpadded_cols: tuple[int, int]  # [start, stop) of the tile-feature columns that are kept
    unpadded_canvas_box: Box  # the kept feature cells, in canvas pixels
    unpadded_box: Box  # the kept feature cells, in original pixels (clipped)
    newline_positions: list[int]  # token indices of the image-newline tokens
    base_tokens: int
    tile_tokens: int
    newline_tokens: int
    num_image_tokens: int
    tokens: list[ImageToken]  # exactly the model's packing order; tokens[i].index == i

    @property
    def unpadded_grid(self) -> tuple[int, int]:
        """(rows, cols) of the unpadded tile-feature grid; each row ends with a newline token."""
        return (self.unpadded_rows[1] - self.unpadded_rows[0], self.unpadded_cols[1] - self.unpadded_cols[0])

    @property
    def num_tiles(self) -> int:
        return self.grid[0] * self.grid[1]

    def check_matches(self, image_size_hw: Size) -> None:
        """Refuse an image of another size than the one this plan was made for.

        A plan's token boxes only mean something for its own image: the app keeps the plan between
        events, and the image box can change under it (a new upload, an API call with another file).
        """
        height, width = image_size_hw
        if (height, width) != self.image_size:
            raise G4VError(f"the image changed since it was analysed ({self.image_size[1]} x {self.image_size[0]} "
                           f"px, now {width} x {height}, width x height): analyse it again")

    def token(self, token_index) -> ImageToken:
        """The token at ``token_index`` (an int, or a whole float such as a Number box sends); a bad
        type or an index outside ``0 .. num_image_tokens - 1`` is a one-line G4VError."""
        index = _whole_number(token_index, "token index")
        if not 0 <= index < self.num_image_tokens:
            raise G4VError(f"token index {index} is out of range: "
                           f"this image has tokens 0-{self.num_image_tokens - 1}")
        return self.tokens[index]

    def budget_rows(self) -> list[list]:
        """The token budget as table rows: [part, layout, tokens]."""
        view_rows, view_cols = self.view_feature_grid
        rows, cols = self.unpadded_grid
        tile_rows, tile_cols = self.grid
        return [
            ["base view", f"features {across(view_cols, view_rows)}", self.base_tokens],
            ["tiles", f"tiles {across(tile_cols, tile_rows)} -> unpadded features {across(cols, rows)}",
             self.tile_tokens],
            ["newlines", f"one after each of {rows} rows", self.newline_tokens],
            ["total", "", self.num_image_tokens],
        ]

    def to_dict(self) -> dict:
        """Plain JSON-ready data (lists, numbers, strings); boxes rounded to 1/100 pixel."""
        return {
            "image_size": named_size(width=self.image_size[1], height=self.image_size[0]),
            "tile_size": self.tile_size,
            "patch_size": self.patch_size,
            "downsample_rate": self.downsample_rate,
            "best_resolution": list(self.best_resolution),
            "resized_size": list(self.resized_size),
            "padding": asdict(self.padding),
            "content_box": _round_box(self.content_box),
            "grid": list(self.grid),
            "num_tiles": self.num_tiles,
            "tiles": [
                {"index": t.index, "row": t.row, "col": t.col,
                 "canvas_box": _round_box(t.canvas_box), "box": _round_box(t.box)}
                for t in self.tiles
            ],
            "base_view_size": list(self.base_view_size),
            "view_feature_grid": list(self.view_feature_grid),
            "tile_feature_grid": list(self.tile_feature_grid),
            "unpadded_rows": list(self.unpadded_rows),
            "unpadded_cols": list(self.unpadded_cols),
            "unpadded_grid": list(self.unpadded_grid),
            "unpadded_canvas_box": _round_box(self.unpadded_canvas_box),
            "unpadded_box": _round_box(self.unpadded_box),
            "newline_positions": list(self.newline_positions),
            "base_tokens": self.base_tokens,
            "tile_tokens": self.tile_tokens,
            "newline_tokens": self.newline_tokens,
            "num_image_tokens": self.num_image_tokens,
            "budget": self.budget_rows(),
            "tokens": [
                {"index": t.index, "kind": t.kind, "row": t.row, "col": t.col, "tile": t.tile,
                 "box": _round_box(t.box)}
                for t in self.tokens
            ],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# ── Geometry, step by step (each mirrors one transformers function; tests check parity) ─────────────


def select_best_resolution(image_size: Size, pinpoints: list) -> Size:
    """The pinpoint that keeps the most of the image's pixels, then wastes the fewest.

    Same rule as ``transformers.image_processing_utils.select_best_resolution``; ties keep the first.
    """
    height, width = image_size
    best, best_effective, best_wasted = None, 0, math.inf
    for pin_height, pin_width in pinpoints:
        scale = min(pin_width / width, pin_height / height)
        down_width, down_height = int(width * scale), int(height * scale)
        effective = min(down_width * down_height, width * height)
        wasted = pin_width * pin_height - effective
        if effective > best_effective or (effective == best_effective and wasted < best_wasted):
            best, best_effective, best_wasted = (int(pin_height), int(pin_width)), effective, wasted
    return best


def resized_size(image_size: Size, target: Size) -> Size:
    """Aspect-preserving resize that fits ``target`` (LLaVA-NeXT's ``get_patch_output_size``)."""
    height, width = image_size
    target_height, target_width = target
    scale_width, scale_height = target_width / width, target_height / height
    if scale_width < scale_height:
        return min(math.ceil(height * scale_width), target_height), target_width
    return target_height, min(math.ceil(width * scale_height), target_width)


def centred_padding(inner: Size, outer: Size) -> Padding:
    """Padding that centres ``inner`` in ``outer``; an odd remainder goes to the bottom / right."""
    top, extra_y = divmod(outer[0] - inner[0], 2)
    left, extra_x = divmod(outer[1] - inner[1], 2)
    return Padding(top=top, bottom=top + extra_y, left=left, right=left + extra_x)


def view_feature_side(tile_size: int, patch_size: int, downsample_rate: str) -> int:
    """Features per view side: the patch grid side times the downsample rate (24 * 4/8 = 12)."""
    return int((tile_size // patch_size) * Fraction(downsample_rate))


def unpadded_span(image_size: Size, feature_grid: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rows and columns of the tile-feature grid that survive unpadding, as [start, stop) pairs.

    Mirrors ``llava_next.modeling_llava_next.unpad_image`` (same float expressions, same rounding):
    the padded direction loses ``(current - new) // 2`` features on each side.
    """
    height, width = image_size
    current_height, current_width = feature_grid
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        cut = (current_height - new_height) // 2
        return (cut, current_height - cut), (0, current_width)
    new_width = int(round(width * (current_height / height), 7))
    cut = (current_width - new_width) // 2
    return (0, current_height), (cut, current_width - cut)


# ── The plan ──────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Geometry:
    """The config values tiling needs, read and checked once."""

    tile_size: int
    patch_size: int
    downsample_rate: str
    pinpoints: list


def _read_geometry(config) -> _Geometry:
    vision = getattr(config, "vision_config", None)
    tile_size = getattr(vision, "image_size", None)
    patch_size = getattr(vision, "patch_size", None)
    rate = getattr(config, "downsample_rate", None)
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if not isinstance(tile_size, int) or not isinstance(patch_size, int) or tile_size < 1 or patch_size < 1:
        raise G4VError("config has no usable vision_config.image_size / patch_size")
    if not rate:
        raise G4VError("config has no downsample_rate (not a Granite 4 Vision config?)")
    try:
        if Fraction(rate) <= 0:
            raise ValueError
    except (ValueError, ZeroDivisionError):
        raise G4VError(f"config has an unreadable downsample_rate {rate!r}") from None
    if not pinpoints:
        raise G4VError("config has no image_grid_pinpoints")
    strategy = getattr(config, "vision_feature_select_strategy", "full")
    if strategy != "full":
        raise G4VError(f"tiling supports vision_feature_select_strategy 'full' only, not {strategy!r}")
    return _Geometry(tile_size, patch_size, str(rate), [tuple(p) for p in pinpoints])


def plan_tiling(image_size_hw: tuple[int, int], config) -> TilingPlan:
    """Tile layout and token map of an image of ``image_size_hw`` = (height, width) under ``config``.

    ``config`` is a Granite4VisionConfig (or anything with the same attributes); no weights, no torch.
    """
    height, width = _check_size(image_size_hw)
    geo = _read_geometry(config)
    tile = geo.tile_size

    best = select_best_resolution((height, width), geo.pinpoints)
    resized = resized_size((height, width), best)
    padding = centred_padding(resized, best)
    content_box = (padding.left, padding.top, padding.left + resized[1], padding.top + resized[0])
    rows, cols = best[0] // tile, best[1] // tile

    to_original = _CanvasToOriginal((height, width), resized, padding, tile)
    tiles = [
        Tile(index=r * cols + c, row=r, col=c, canvas_box=box, box=to_original(box))
        for r in range(rows) for c in range(cols)
        for box in [(c * tile, r * tile, (c + 1) * tile, (r + 1) * tile)]
    ]

    feat = view_feature_side(tile, geo.patch_size, geo.downsample_rate)
    cell = tile / feat  # canvas pixels per tile feature
    (row_start, row_stop), (col_start, col_stop) = unpadded_span((height, width), (rows * feat, cols * feat))
    unpadded_canvas_box = (col_start * cell, row_start * cell, col_stop * cell, row_stop * cell)

    tokens = _base_tokens((height, width), feat)
    tokens += _tile_and_newline_tokens(len(tokens), (row_start, row_stop), (col_start, col_stop), feat, cols,
                                       to_original)
    newline_positions = [token.index for token in tokens if token.kind == "newline"]

    base_count = feat * feat
    newline_count = len(newline_positions)
    return TilingPlan(
        image_size=(height, width), tile_size=tile, patch_size=geo.patch_size, downsample_rate=geo.downsample_rate,
        best_resolution=best, resized_size=resized, padding=padding, content_box=content_box,
        grid=(rows, cols), tiles=tiles, base_view_size=(tile, tile), view_feature_grid=(feat, feat),
        tile_feature_grid=(rows * feat, cols * feat),
        unpadded_rows=(row_start, row_stop), unpadded_cols=(col_start, col_stop),
        unpadded_canvas_box=unpadded_canvas_box, unpadded_box=to_original(unpadded_canvas_box),
        newline_positions=newline_positions,
        base_tokens=base_count, tile_tokens=len(tokens) - base_count - newline_count, newline_tokens=newline_count,
        num_image_tokens=len(tokens), tokens=tokens,
    )


def _base_tokens(image_size: Size, feat: int) -> list[ImageToken]:
    """The base view squashes the whole image to one tile, so its feat x feat cells split it evenly."""
    height, width = image_size
    cell_height, cell_width = height / feat, width / feat
    return [
        ImageToken(index=r * feat + c, kind="base", row=r, col=c,
                   box=(c * cell_width, r * cell_height, (c + 1) * cell_width, (r + 1) * cell_height))
        for r in range(feat) for c in range(feat)
    ]


def _tile_and_newline_tokens(first_index: int, kept_rows: tuple[int, int], kept_cols: tuple[int, int], feat: int,
                             tile_cols: int, to_original) -> list[ImageToken]:
    """The unpadded tile features row by row, each row followed by its newline token.

    ``kept_rows``/``kept_cols`` are [start, stop) in the full tile-feature grid (tile_cols * feat wide);
    a feature cell is ``tile_size / feat`` canvas pixels square."""
    cell = to_original.tile_size / feat
    col_start, col_stop = kept_cols
    tokens = []
    for unpadded_row, feature_row in enumerate(range(*kept_rows)):
        top, bottom = feature_row * cell, (feature_row + 1) * cell
        for unpadded_col, feature_col in enumerate(range(col_start, col_stop)):
            tokens.append(ImageToken(
                index=first_index + len(tokens), kind="tile", row=unpadded_row, col=unpadded_col,
                box=to_original((feature_col * cell, top, (feature_col + 1) * cell, bottom)),
                tile=(feature_row // feat) * tile_cols + feature_col // feat,
            ))
        tokens.append(ImageToken(
            index=first_index + len(tokens), kind="newline", row=unpadded_row, col=col_stop - col_start,
            box=to_original((col_start * cell, top, col_stop * cell, bottom)),
        ))
    return tokens


class _CanvasToOriginal:
    """Maps a box in the padded canvas to the original image: remove padding, undo the resize, clip."""

    def __init__(self, image_size: Size, resized: Size, padding: Padding, tile_size: int):
        self.height, self.width = image_size
        self.tile_size = tile_size
        self.padding = padding
        self.scale_y = image_size[0] / resized[0]  # original pixels per resized pixel
        self.scale_x = image_size[1] / resized[1]

    def __call__(self, canvas_box: Box) -> Box:
        left, top, right, bottom = canvas_box
        x = lambda v: min(max((v - self.padding.left) * self.scale_x, 0.0), float(self.width))  # noqa: E731
        y = lambda v: min(max((v - self.padding.top) * self.scale_y, 0.0), float(self.height))  # noqa: E731
        return (x(left), y(top), x(right), y(bottom))


def _check_size(image_size_hw) -> Size:
    try:
        height, width = (int(v) for v in image_size_hw)
        if (height, width) != tuple(image_size_hw):
            raise ValueError
    except (TypeError, ValueError):
        raise G4VError(f"image size must be two whole numbers (height, width), got {image_size_hw!r}") from None
    if height < 1 or width < 1:
        raise G4VError(f"image has no pixels ({height}x{width})")
    return height, width


def _whole_number(value, what: str) -> int:
    """``value`` as an int if it is a whole number (``3``, ``3.0``, ``numpy.int64(3)``), else a
    G4VError. Strings, booleans, NaN, infinities and fractions are refused rather than guessed at."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise G4VError(f"{what} must be a whole number, got {quoted(value)}")


def _round_box(box: Box) -> list[float]:
    return [round(float(v), 2) for v in box]


# ── Queries on a plan (the Tiling tab's token picking) ─────────────────────────────────────────────


def first_token_to_show(plan: TilingPlan) -> int:
    """The token to select right after analysing: the first tile token, because tiles are what the
    tiling view is about. A strip so thin that unpadding keeps no tile feature (a 1 x 8000 line)
    has none; the base view always has tokens, so then its first one."""
    return next((token.index for token in plan.tokens if token.kind == "tile"), 0)


def token_at(plan: TilingPlan, x: float, y: float, kind: str = "tile") -> ImageToken | None:
    """The first token of ``kind`` whose box contains original pixel (x, y) (for click-to-select).

    None when no token of that kind covers the pixel: padding-only cells, or a strip with no tile
    tokens at all. Base tokens split the whole image, so ``kind="base"`` finds one for every pixel."""
    for token in plan.tokens:
        left, top, right, bottom = token.box
        if token.kind == kind and left <= x < right and top <= y < bottom:
            return token
    return None
