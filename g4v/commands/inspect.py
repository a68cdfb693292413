"""``python -m g4v inspect --image IMG --prompt P --out DIR [--ablate LEVEL ...] [--scale LEVEL=F ...]``:
what each deepstack / spatial injection carries and what zeroing or scaling it changes.

Writes ``summary.json``, the PNGs and ``capture.safetensors`` into ``DIR``.
"""

from pathlib import Path

from g4v.commands.common import add_model_flags, output_folder
from g4v.commands.inputs import add_picture_flags, open_single
from g4v.errors import G4VError
from g4v.inspect.settings import InspectSettings
from g4v.settings.flags import add_settings_flags, settings_from_args


def add_parser(subparsers):
    parser = subparsers.add_parser("inspect", help="deepstack and spatial activation inspector")
    add_model_flags(parser)
    add_picture_flags(parser)
    parser.add_argument("--out", required=True, type=output_folder, metavar="DIR", help="folder for summary.json, PNGs, capture")
    add_settings_flags(parser, InspectSettings)  # --ablate, --scale, --full, --max-new-tokens
    return parser


def run(args) -> int:
    # Everything the user typed is checked before the (slow) model load.
    settings = settings_from_args(InspectSettings, args)
    image = open_single(args.image, args.pages, args.dpi)
    if not args.prompt.strip():
        raise G4VError("the prompt is empty")
    scale = settings.scales()
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise G4VError(f"--out is a file, not a folder: {out}")
    _check_levels_early(args.model, settings.ablate, scale)

    from g4v.engines.hf import TransformersEngine
    from g4v.inspect.run import run_inspection
    from g4v.paths import default_model

    engine = TransformersEngine(args.model or default_model(), device=args.device, dtype=args.dtype)
    try:
        result = run_inspection(engine, image, args.prompt, ablate=settings.ablate, scale=scale, full=settings.full,
                                max_new_tokens=settings.max_new_tokens, out_dir=out, make_zip=False)
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
    for cap in result.capture.levels:
        level = cap.level
        print(f"{level.name:<12} {level.kind:<9} {level.vision_layer:>6} {level.llm_layer:>4} "
              f"{cap.injected_norm_mean:>9.3f} {cap.residual_norm_before_image:>8.3f} "
              f"{cap.residual_norm_after_image:>8.3f}")
    ablation, unchanged = result.ablation, result.unchanged_levels
    if unchanged:
        rerun = "" if ablation else ", so there was no second run"
        print(f"a factor of 1 leaves {', '.join(unchanged)} unchanged{rerun}")
    if ablation:
        print(f"scaled {ablation.scales}: KL(before || after) = {ablation.kl_divergence:.4g} nats")
        print(f"  before: {ablation.before.continuation!r}")
        print(f"  after:  {ablation.after.continuation!r}")
    print(f"wrote {result.export_dir}")
