"""``python -m g4v attribute --image IMG --prompt P [--target TEXT] [--method gradxinput|ig] --out DIR``:
which image tokens, through which of the 8 levels, an answer token relied on; whether that map beats
random removal (the deletion test); and the logit lens at the image positions.

Writes ``summary.json``, the PNGs and ``attribution.safetensors`` into ``DIR``.
"""

import dataclasses
import json
from pathlib import Path

from g4v.attribution.settings import AttributionSettings
from g4v.commands.common import add_model_flags, output_folder
from g4v.commands.inputs import add_picture_flags, open_single
from g4v.errors import G4VError
from g4v.settings.flags import add_settings_flags, settings_from_args


#: AttributionSettings fields that are no flag: the deletion test's fractions are the library's.
_NOT_FLAGS = ("fractions",)
#: The fields that cannot go together: a contrast (--against) explains the whole answer, not a token.
_EXCLUSIVE = ("token", "against")


def add_parser(subparsers):
    parser = subparsers.add_parser("attribute", help="per-level attribution, deletion test and logit lens")
    add_model_flags(parser)
    add_picture_flags(parser)
    parser.add_argument("--out", required=True, type=output_folder, metavar="DIR", help="folder for summary.json, PNGs, tensors")
    others = tuple(field.name for field in dataclasses.fields(AttributionSettings) if field.name not in _EXCLUSIVE)
    add_settings_flags(parser.add_mutually_exclusive_group(), AttributionSettings, exclude=others)
    add_settings_flags(parser, AttributionSettings, exclude=_NOT_FLAGS + _EXCLUSIVE)
    return parser


def run(args) -> int:
    image = open_single(args.image, args.pages, args.dpi)  # checked before the (slow) model load
    if not args.prompt.strip():
        raise G4VError("the prompt is empty")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise G4VError(f"--out is a file, not a folder: {out.name}")
    settings = settings_from_args(AttributionSettings, args, exclude=_NOT_FLAGS).checked()

    from tqdm import tqdm

    from g4v.attribution.deletion import describe_area
    from g4v.attribution.run import run_attribution
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import default_model

    engine = TransformersEngine(args.model or default_model(), device=args.device, dtype=args.dtype)
    bar = tqdm(total=100, unit="%", leave=False)

    def progress(fraction: float, text: str) -> None:
        bar.set_description(text)
        bar.update(round(100 * fraction) - bar.n)

    try:
        report = run_attribution(engine, image, args.prompt, settings, out_dir=out, progress=progress)
    finally:
        bar.close()
        engine.close()
    answer, attribution = report.answer, report.attribution
    print(f"explained: {answer.describe()} ({answer.measure} {attribution.target_logprob:.4g})")
    for name, total in attribution.level_totals().items():
        print(f"  {name:<12} {total:+.4g}")
    print(describe_area(report.deletion, answer.measure))
    print(f"wrote {report.export_dir}")
    return 0


def demo_pointing_cases(n: int, pictures: str = "held-out") -> list:
    """The first ``n`` demo pictures with 2 or 3 shapes, asked "What colour is the <shape>?" about
    their first shape (drawn as 1 in the picture's mask). ``pictures``: "held-out" (the demo's
    evaluation set, for reporting) or "validation" (its own seed, for choosing methods and settings)."""
    from g4v.attribution.pointing import PICTURE_SETS, PointingCase
    from g4v.demo import shapes

    if pictures not in PICTURE_SETS:
        raise G4VError(f"unknown picture set {pictures!r}: use {' or '.join(PICTURE_SETS)}")
    draw = shapes.eval_set if pictures == "held-out" else shapes.validation_set
    cases, start = [], 0
    while len(cases) < n:
        for picture in draw(start + 4 * n)[start:]:
            if len(picture.shapes) >= 2:
                qa = shapes.question("colour", picture.shapes, 0)
                box = picture.mask.point(lambda v: 255 if v == 1 else 0).getbbox()
                rivals = tuple(colour for colour in shapes.COLOURS if colour != qa.answer)
                cases.append(PointingCase(picture.image, qa.question, qa.answer, box, rivals))
        start += 4 * n
    return cases[:n]


def run_pointing_game(args) -> int:
    """``python -m g4v bench attribute --pointing-game N``: the game on N demo pictures."""
    from tqdm import tqdm

    from g4v.attribution.pointing import pointing_game
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import TRAINED_MODEL_DIR

    if args.pointing_game < 1:
        raise G4VError(f"--pointing-game needs at least 1 picture, got {args.pointing_game}")
    cases = demo_pointing_cases(args.pointing_game, args.pointing_set)
    engine = TransformersEngine(args.pointing_model or str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    with tqdm(total=len(cases), unit="picture", leave=False) as bar:
        result = pointing_game(engine, cases, method=args.pointing_method, target=args.pointing_target,
                               progress=lambda done, total: bar.update(done - bar.n))
    print(f"pointing game ({result.method}, {result.target}) on {result.pictures} {args.pointing_set} pictures: top tile token on "
          f"the named shape {result.hit_rate:.0%} by its own score, {result.region_hit_rate:.0%} by region score "
          f"(both views; target >= 80%), top base-view token {result.base_hit_rate:.0%}, "
          f"deletion beats random {result.beats_random_rate:.0%} (target >= 90%)")
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 0
