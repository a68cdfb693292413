"""``python -m g4v circuits attention|knockout --image IMG --prompt P ...``: where the language model
reads the picture, and what blocking that reading changes.

* ``attention``: the share of the query token's attention (default: the last prompt token, which
  produces the first answer token) that goes to the image tokens at each layer, injection layers
  marked; ``--json`` prints the whole result (per head, per image token, with the tiling plan's boxes).
* ``reverse``: which text tokens (the prompt's and the first greedy answer tokens) attend to a
  ``--region`` of the picture (x0,y0,x1,y1 in its pixels), per layer, averaged over heads.
* ``knockout``: the answer positions may not attend to the image tokens at ``--layers`` or within
  ``--window`` of every injection layer; the first answer token's log-probability and the greedy
  continuation, before and after.
* ``patch``: picture A (``--image``) run with one level's injected features from picture B
  (``--other``), for each level, and every level at once as the bound; the log-odds of B's first
  answer token against A's, the share of the way moved, the greedy continuation; and the reverse.
  ``--out`` writes ``patching.json`` and a bar chart per direction.

The flags come from :class:`g4v.circuits.common.CircuitSettings`; layers and the window are checked
against the model's config before the weights load.
"""

import json
from pathlib import Path

from g4v.circuits.exports import FILES
from g4v.commands.common import add_model_flags, output_folder
from g4v.commands.inputs import add_page_flags, open_single
from g4v.errors import G4VError
from g4v.settings.flags import add_settings_flags, settings_from_args

#: Settings fields each verb leaves out (the others become its flags).
PATCH_FIELDS = ("levels", "direction", "complement", "region")
EXCLUDED = {"attention": ("window", "max_new_tokens", "box", *PATCH_FIELDS), "reverse": ("window", "token", *PATCH_FIELDS),
            "knockout": ("token", "box", *PATCH_FIELDS), "patch": ("layers", "window", "token", "box")}


def add_parser(subparsers):
    from g4v.circuits.common import CircuitSettings

    parser = subparsers.add_parser("circuits", help="attention over image tokens, the reverse view, attention knockout, "
                                   "two-picture patching")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))
    helps = {"attention": "attention from a text token to every image token, per layer and head",
             "reverse": "which text tokens attend to a region of the picture, per layer",
             "knockout": "block the answer's attention to the image at chosen layers",
             "patch": "run picture A with each level's injected features from picture B"}
    for verb, excluded in EXCLUDED.items():
        sub = verbs.add_parser(verb, help=helps[verb])
        add_model_flags(sub)
        sub.add_argument("--image", required=True, metavar="PATH",
                         help=("picture A" if verb == "patch" else "the image") + ", or a PDF (one page: --pages)")
        if verb == "patch":
            sub.add_argument("--other", required=True, metavar="PATH",
                             help="picture B (same tiling grid and token count as A), or a PDF (the same --pages)")
        add_page_flags(sub)
        sub.add_argument("--prompt", required=True, help="the question")
        add_settings_flags(sub, CircuitSettings, exclude=excluded)
        sub.add_argument("--json", action="store_true", help="print the whole result as JSON instead of a table")
        if verb in FILES:
            sub.add_argument("--out", default=None, type=output_folder, metavar="DIR",
                             help=f"also write the result and its pictures ({', '.join(FILES[verb])})")
    return parser


def run(args) -> int:
    from g4v.circuits.common import CircuitSettings

    settings = settings_from_args(CircuitSettings, args, exclude=EXCLUDED[args.verb])
    image = open_single(args.image, args.pages, args.dpi)
    other = open_single(args.other, args.pages, args.dpi) if args.verb == "patch" else None
    if not args.prompt.strip():
        raise G4VError("the prompt is empty")
    out = Path(args.out) if getattr(args, "out", None) else None
    if out is not None and out.exists() and not out.is_dir():
        raise G4VError(f"--out is a file, not a folder: {out.name}")
    if args.verb == "reverse":
        from g4v.circuits.reverse import parse_region

        parse_region(settings.box, image.width, image.height)
    _check_layers_early(args.model, args.verb, settings)

    from g4v.circuits.attention import image_attention
    from g4v.circuits.knockout import attention_knockout
    from g4v.circuits.patching import patch_levels
    from g4v.circuits.reverse import region_attention
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import default_model

    engine = TransformersEngine(args.model or default_model(), device=args.device, dtype=args.dtype)
    try:
        if args.verb == "patch":
            result = patch_levels(engine, image, other, args.prompt, settings)
        else:
            work = {"attention": image_attention, "reverse": region_attention, "knockout": attention_knockout}[args.verb]
            result = work(engine, image, args.prompt, settings)
    finally:
        engine.close()
    if out is not None:
        from g4v.circuits.exports import draw, write_view

        write_view(out, args.verb, result, draw(args.verb, image, result))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        printers = {"attention": _print_attention, "reverse": _print_reverse, "knockout": _print_knockout,
                    "patch": _print_patching}
        printers[args.verb](result)
    return 0


#: What ``attention --out`` writes: file name -> what it shows.
ATTENTION_FILES = FILES["attention"]
#: What ``patch --out`` writes.
PATCHING_FILES = FILES["patch"]


def _check_layers_early(model: str | None, verb: str, settings) -> None:
    """Layers and windows come from the config; a local model folder lets us check them without weights."""
    from g4v.circuits.common import check_new_tokens, parse_layers
    from g4v.circuits.knockout import knockout_layers
    from g4v.circuits.patching import check_patch_settings
    from g4v.loading import load_config
    from g4v.paths import default_model

    source = Path(model or default_model()).expanduser()
    if source.is_dir():
        config = load_config(source)
        if verb == "knockout":
            knockout_layers(config, settings)
        elif verb == "patch":
            check_patch_settings(config, settings)
        else:
            parse_layers(settings.layers, config.text_config.num_hidden_layers)
        if verb in ("knockout", "reverse"):
            check_new_tokens(settings.max_new_tokens)


def _print_attention(attention) -> None:
    print(f"query: position {attention.query_position} {attention.query_token!r}; "
          f"{attention.num_image_tokens} image tokens, {attention.num_heads} heads")
    print(f"{'layer':>5} {'image share':>11} {'base':>6} {'tiles':>6} {'newline':>7}  injected here")
    kinds, shares = attention.share_by_kind(), attention.image_share.tolist()
    for i, layer in enumerate(attention.layers):
        level = attention.injection_layers.get(layer, "")
        print(f"{layer:>5} {shares[i]:>11.3f} {kinds['base'][i]:>6.3f} {kinds['tile'][i]:>6.3f} "
              f"{kinds['newline'][i]:>7.3f}  {level}")


def _print_reverse(region) -> None:
    kinds = [token.kind for token in region.region_tokens]
    print(f"region {','.join(map(str, region.region))}: {kinds.count('tile')} tile and {kinds.count('base')} "
          f"base-view tokens; layers {region.layers[0]}-{region.layers[-1]}")
    print(f"{'position':>8} {'part':>6} {'mean attention':>14}  token")
    for token in region.top_text_tokens:
        print(f"{token.position:>8} {region.part(token.position):>6} {token.mean_attention:>14.4f}  {token.text!r}")


def _print_knockout(knockout) -> None:
    from g4v.circuits.knockout import WHY_LITTLE_CHANGES

    print(f"knocked out at layers {knockout.layers} (from position {knockout.answer_position} on)")
    print(f"first answer token {knockout.answer_token!r}: log-probability {knockout.logprob_before:.4f} -> "
          f"{knockout.logprob_after:.4f} ({knockout.logprob_change:+.4f}); "
          f"top token after: {knockout.top_token_after!r}")
    print(f"  before: {knockout.continuation_before!r}")
    print(f"  after:  {knockout.continuation_after!r}")
    if knockout.barely_changed:
        print(WHY_LITTLE_CHANGES)


def _print_patching(patching) -> None:
    print(f"{patching.num_patched_tokens} of {patching.num_image_tokens} image tokens patched "
          f"(region {patching.region}); log-odds of the donor's first answer token against the receiver's")
    for direction in patching.directions:
        receiver, donor = direction.receiver, direction.donor
        print(f"{receiver} with {donor}'s features: {receiver} answers {direction.receiver_continuation!r} "
              f"(log-odds {direction.logodds_receiver:+.3f}), {donor} answers {direction.donor_continuation!r} "
              f"(log-odds {direction.logodds_donor:+.3f})" + ("; same first token, nothing to move"
                                                             if direction.same_first_token else ""))
        print(f"  {'levels patched':<18} {'log-odds':>9} {'moved':>7}  continuation")
        for run in direction.runs:
            moved = "" if run.moved is None else f"{run.moved:.3f}"
            print(f"  {run.label:<18} {run.logodds:>+9.3f} {moved:>7}  {run.continuation!r}")
