"""``python -m g4v lora-diff [--adapter A] [--left M] [--right M] --image IMG --prompt P``: where an adapter's answer departs from the base
model's, token by token (transformers backend)."""

import dataclasses
import json
import sys

from g4v.commands.chat import open_images, warn_about_base
from g4v.commands.common import add_adapters_dir_flag, add_model_flags, output_file
from g4v.commands.engine_flags import add_vision_lora_flag
from g4v.commands.inputs import add_page_flags
from g4v.conversation import Message, validate_conversation
from g4v.errors import G4VError
from g4v.lora.models import ADAPTER
from g4v.lora.settings import LoraDiffSettings
from g4v.settings.flags import add_settings_flags, settings_from_args

#: Width of the token column of the report: a token's quoted text, shortened to fit, quotes kept.
TOKEN_WIDTH = 16


def add_parser(subparsers):
    parser = subparsers.add_parser("lora-diff", help="compare two models' answers token by token (default: the "
                                                    "model Chat runs vs the same with the adapter the LoRA tab "
                                                    "preselects, or --adapter)",
                                   description="Where one model's answer departs from another's, token by token: "
                                               "the base language model, the vision model (what Chat runs) or it "
                                               "with the adapter; a checkpoint without a vision LoRA has only the "
                                               "model and the adapter. --png saves the highlighted answers, --plot "
                                               "the per-token plot.")
    add_model_flags(parser)
    add_settings_flags(parser, LoraDiffSettings)  # --adapter, --left, --right, --max-new-tokens
    add_vision_lora_flag(parser)
    parser.add_argument("--image", action="append", required=True, metavar="PATH",
                        help="an image or a PDF (repeatable)")
    add_page_flags(parser)
    parser.add_argument("--prompt", required=True, help="the question")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--png", default=None, type=output_file, metavar="PATH", help="also save the highlighted answers as a PNG")
    parser.add_argument("--plot", default=None, type=output_file, metavar="PATH", help="also save the per-token plot as a PNG")
    add_adapters_dir_flag(parser)
    return parser


def run(args) -> int:
    # Check everything the user typed before the (slow) model load.
    messages = [Message("user", args.prompt, open_images(args.image, args.pages, args.dpi))]
    validate_conversation(messages)
    settings = settings_from_args(LoraDiffSettings, args)
    sampling = settings.sampling()
    from g4v.lora.choices import base_warning
    from g4v.lora.folders import adapter_dirs, resolve_adapter
    from g4v.paths import default_model

    if ADAPTER in (settings.left, settings.right):
        if not settings.adapter:
            settings = dataclasses.replace(settings, adapter=default_adapter(args.model or default_model(),
                                                                             args.adapters_dir))
        resolve_adapter(settings.adapter, adapter_dirs(args.adapters_dir))

    from g4v.engines.hf import TransformersEngine
    from g4v.lora.models import resolve_sides
    from g4v.lora.token_diff import lora_diff

    warn_about_base(base_warning(settings.adapter, args.adapters_dir, args.model or default_model()))

    engine = TransformersEngine(args.model or default_model(), device=args.device, dtype=args.dtype,
                                vision_lora=args.vision_lora)
    if "vision_lora" in engine.info.details:
        print(engine.info.details["vision_lora"], file=sys.stderr)
    left, right = resolve_sides(engine, settings.left, settings.right, settings.adapter, args.adapters_dir)
    diff = lora_diff(engine, messages, right.adapter, sampling, left.adapter, (left.label, right.label))
    _save_pictures(diff, args.png, args.plot)
    print(json.dumps(diff.to_dict(), indent=2) if args.json else _report(diff))
    return 0


def default_adapter(model: str, adapters_dir=None) -> str:
    """The adapter compared when ``--adapter`` is left out: the one the LoRA tab preselects (the
    first made for ``model``, by name), said on stderr; none made for it is one line."""
    from g4v.lora.choices import preselected_adapter

    name = preselected_adapter(adapters_dir, model)
    if name is None:
        raise G4VError("--adapter is needed to compare the adapter: no adapter in the adapter folders is made for "
                       "this model (or choose --left and --right among base, vision)")
    print(f"adapter: {name} (the first made for this model; --adapter chooses another)", file=sys.stderr)
    return name


def _save_pictures(diff, png: str | None, plot: str | None) -> None:
    from viz.figures import figure_to_image
    from viz.lora import diff_plot, diff_png

    if png:
        diff_png(diff).save(png)
    if plot:
        figure_to_image(diff_plot(diff)).save(plot)


def _report(diff) -> str:
    first = diff.first_divergence
    lines = [
        f"adapter: {diff.adapter}",
        f"left:    {diff.labels[0]}: {diff.base.text!r}",
        f"right:   {diff.labels[1]}: {diff.tuned.text!r}",
        f"first divergence: {'none' if first is None else 'token ' + str(first)}",
    ]
    for answer, title in ((diff.base, "base answer"), (diff.tuned, "adapter answer")):
        lines.append(f"\n{title}:  pos  token              logp_base  logp_adapter     delta        KL")
        for t in answer.tokens:
            lines.append(
                f"  {t.position:4d}  {_quoted(t.text):<{TOKEN_WIDTH}} {t.logprob_base:10.3f} {t.logprob_adapter:13.3f} "
                f"{t.delta:+9.3f} {t.kl:9.4f}"
            )
    return "\n".join(lines)


def _quoted(text: str, width: int = TOKEN_WIDTH) -> str:
    """``repr(text)`` in at most ``width`` characters: a long token loses its end (marked with an
    ellipsis), never its closing quote (cutting the repr itself dropped it)."""
    if len(repr(text)) <= width:
        return repr(text)
    while text and len(repr(text + "…")) > width:
        text = text[:-1]
    return repr(text + "…")
