"""``python -m g4v tiling [--model M | --config FILE] IMAGE [--json] [--png OUT.png]``.

Shows how one image becomes image tokens: chosen pinpoint, tiles, padding, unpadding and the token
budget; ``--json`` prints the full plan with every token's kind and pixel box. Reads only the config,
never the weights.
"""

import sys
from pathlib import Path

from g4v.commands.common import output_file
from g4v.commands.inputs import add_page_flags, open_single
from g4v.errors import G4VError


def add_parser(subparsers):
    parser = subparsers.add_parser("tiling", help="show the anyres tiling and image-token layout of an image")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", default=None,
                        help="model folder or hub id whose config to use (default: $G4V_MODEL, else the bundled checkpoint)")
    source.add_argument("--config", default=None, metavar="FILE", help="a config.json file (or a folder holding one)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (every token with kind and box)")
    parser.add_argument("--png", default=None, type=output_file, metavar="OUT.png", help="write the overlay picture here")
    parser.add_argument("image", help="the image, or a PDF (one page: --pages)")
    add_page_flags(parser)
    return parser


def run(args) -> int:
    from g4v.loading import load_config
    from g4v.paths import default_model
    from g4v.tiling import plan_tiling

    image = open_single(args.image, args.pages, args.dpi)
    png_path = _checked_png_path(args.png) if args.png else None
    config = load_config(args.config or args.model or default_model())
    plan = plan_tiling((image.height, image.width), config)

    if png_path is not None:
        from viz.tiling import save_tiling_overlay

        save_tiling_overlay(image, plan.to_dict(), png_path)
    if args.json:
        print(plan.to_json())
    else:
        print(_summary(plan))
    if png_path is not None:
        print(f"wrote {png_path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _checked_png_path(text: str) -> Path:
    path = Path(text).expanduser()
    if path.suffix.lower() != ".png":
        raise G4VError(f"--png must name a .png file, got {text}")
    if not path.parent.is_dir():
        raise G4VError(f"folder for --png does not exist: {path.parent}")
    return path


def _summary(plan) -> str:
    """Sizes width first, grids as "W wide x H tall" (:func:`g4v.tiling.across`)."""
    from g4v.tiling import across, pixels

    height, width = plan.image_size
    best_height, best_width = plan.best_resolution
    resized_height, resized_width = plan.resized_size
    rows, cols = plan.grid
    pad = plan.padding
    lines = [
        f"image            {pixels(width, height)}",
        f"best resolution  {pixels(best_width, best_height)}: tiles of {plan.tile_size} px, {across(cols, rows)}",
        f"resized to       {pixels(resized_width, resized_height)}, padding top {pad.top} bottom {pad.bottom} "
        f"left {pad.left} right {pad.right}",
        f"features         {across(plan.view_feature_grid[1], plan.view_feature_grid[0])} per view; "
        f"tile grid {across(plan.tile_feature_grid[1], plan.tile_feature_grid[0])} -> unpadded "
        f"{across(plan.unpadded_grid[1], plan.unpadded_grid[0])}",
        "",
    ]
    for part, layout, count in plan.budget_rows():
        lines.append(f"{part:<10} {count:>6}  {layout}")
    return "\n".join(lines)
