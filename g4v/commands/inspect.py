"""``python -m g4v inspect --image IMG --prompt P --out DIR [--ablate LEVEL ...] [--scale LEVEL=F ...]``:
what each deepstack / spatial injection carries and what zeroing or scaling it changes.

Writes ``summary.json``, the PNGs and ``capture.safetensors`` into ``DIR``.
"""

from pathlib import Path

from g4v.commands.common import add_model_flags
from g4v.commands.inputs import add_picture_flags, open_single
from g4v.errors import G4VError


def add_parser(subparsers):
    from g4v.inspect.ablation import CONTINUATION_TOKENS  # torch: the command needs it anyway

    parser = subparsers.add_parser("inspect", help="deepstack and spatial activation inspector")
    add_model_flags(parser)
    add_picture_flags(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for summary.json, PNGs, capture")
    parser.add_argument("--ablate", nargs="+", action="extend", default=[], metavar="LEVEL",
                        help="zero these levels (name such as deepstack0 or spatial_TL, or index 0-7)")
    parser.add_argument("--scale", nargs="+", action="extend", default=[], metavar="LEVEL=F",
                        help="multiply a level's features by F")
    parser.add_argument("--full", action="store_true", help="keep full tensors in capture.safetensors")
    parser.add_argument("--max-new-tokens", type=int, default=CONTINUATION_TOKENS,
                        help=f"greedy continuation length (default {CONTINUATION_TOKENS}; 0: none)")
    return parser


def run(args) -> int:
    from g4v.model.levels import parse_scale_specs

    # Everything the user typed is checked before the (slow) model load.
    image = open_single(args.image, args.pages, args.dpi)
    if not args.prompt.strip():
        raise G4VError("the prompt is empty")
    scale = parse_scale_specs(args.scale)
    if args.max_new_tokens < 0:
        raise G4VError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise G4VError(f"--out is a file, not a folder: {out}")
    _check_levels_early(args.model, args.ablate, scale)

    from g4v.engines.hf import TransformersEngine
    from g4v.inspect.run import run_inspection
    from g4v.paths import default_model

    engine = TransformersEngine(args.model or default_model(), device=args.device, dtype=args.dtype)
    try:
        result = run_inspection(engine, image, args.prompt, ablate=args.ablate, scale=scale, full=args.full,
                                max_new_tokens=args.max_new_tokens, out_dir=out, make_zip=False)
    finally:
        engine.close()
    _print_report(result)
    return 0


def _check_levels_early(model: str | None, ablate: list[str], scale: dict) -> None:
    """Level names come from the config; a local model folder lets us check them without weights."""
    if not ablate and not scale:
        return
    from g4v.model.levels import describe_levels, level_scales
    from g4v.paths import default_model
    from g4v.loading import load_config

    source = Path(model or default_model()).expanduser()
    if source.is_dir():
        level_scales(describe_levels(load_config(source)), ablate, scale)


def _print_report(result) -> None:
    print(f"{'level':<12} {'kind':<9} {'vision':>6} {'llm':>4} {'injected':>9} {'before':>8} {'after':>8}")
    for row in result.summary["levels"]:
        print(f"{row['name']:<12} {row['kind']:<9} {row['vision_layer']:>6} {row['llm_layer']:>4} "
              f"{row['injected_norm_mean']:>9.3f} {row['residual_norm_before_mean']:>8.3f} "
              f"{row['residual_norm_after_mean']:>8.3f}")
    ablation = result.summary["ablation"]
    unchanged = result.summary["unchanged_levels"]
    if unchanged:
        rerun = "" if ablation else ", so there was no second run"
        print(f"a factor of 1 leaves {', '.join(unchanged)} unchanged{rerun}")
    if ablation:
        print(f"scaled {ablation['scales']}: KL(before || after) = {ablation['kl_divergence']:.4g} nats")
        print(f"  before: {ablation['continuation_before']!r}")
        print(f"  after:  {ablation['continuation_after']!r}")
    print(f"wrote {result.export_dir}")
