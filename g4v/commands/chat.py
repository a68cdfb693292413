"""``python -m g4v chat [--model M] [--adapter A] --image PATH ... "PROMPT"``: stream one answer to stdout."""

import sys

from g4v.commands.common import add_adapters_dir_flag, add_backend_flag, add_model_flags
from g4v.commands.engine_flags import add_engine_flags, engine_options
from g4v.commands.inputs import add_page_flags, open_inputs
from g4v.commands.tasks import add_task_flags, report, task_prompt
from g4v.conversation import MAX_IMAGES_PER_MESSAGE, MAX_NEW_TOKENS, Message, SamplingSettings, validate_conversation
from g4v.documents.pdf import DEFAULT_DPI
from g4v.errors import G4VError
from g4v.settings.flags import add_settings_flags, settings_from_args


def add_parser(subparsers):
    parser = subparsers.add_parser("chat", help="answer a prompt about zero or more images")
    add_model_flags(parser)
    add_backend_flag(parser)
    add_engine_flags(parser)
    parser.add_argument("--image", action="append", default=[], metavar="PATH",
                        help=f"an image or a PDF (repeatable, at most {MAX_IMAGES_PER_MESSAGE} pictures)")
    add_page_flags(parser)
    add_task_flags(parser)
    parser.add_argument("--adapter", default=None,
                        help="answer with this LoRA adapter (a name or folder inside the adapter folders)")
    add_adapters_dir_flag(parser)
    add_settings_flags(parser, SamplingSettings)
    parser.add_argument("prompt", nargs="?", default=None, help="the question (leave out with a --task)")
    return parser


def open_images(paths: list[str], pages: str = "1", dpi=DEFAULT_DPI) -> list:
    """The ``--image`` files (PDFs as their ``--pages``), opened and checked; no more than one message
    may carry in the app."""
    if len(paths) > MAX_IMAGES_PER_MESSAGE:
        raise G4VError(f"too many images: {len(paths)} in one message (--image), the limit is {MAX_IMAGES_PER_MESSAGE}")
    return open_inputs(paths, pages, dpi)


def run(args) -> int:
    # Check everything the user typed before the (slow) model load.
    prompt = task_prompt(args)
    messages = [Message("user", prompt, open_images(args.image, args.pages, args.dpi))]
    validate_conversation(messages)
    settings = settings_from_args(SamplingSettings, args).validated(MAX_NEW_TOKENS)
    if args.adapter is not None:
        from g4v.lora.folders import adapter_dirs, resolve_adapter

        resolve_adapter(args.adapter, adapter_dirs(args.adapters_dir))
        from g4v.lora.choices import base_warning
        from g4v.paths import default_model

        warn_about_base(base_warning(args.adapter, args.adapters_dir, args.model or default_model()))

    from g4v.engines import create_engine

    engine = create_engine(args.backend, args.model, **engine_options(args))
    print(engine.info.details["choice"], file=sys.stderr)
    if "vision_lora" in engine.info.details:
        print(engine.info.details["vision_lora"], file=sys.stderr)
    try:
        adapter = _activate(engine, args.adapter, args.adapters_dir)
        pieces = []
        for piece in engine.stream(messages, settings, adapter=adapter):
            pieces.append(piece)
            if not args.json:  # --json prints the whole answer once, inside its JSON object
                sys.stdout.write(piece)
                sys.stdout.flush()
        if not args.json:
            sys.stdout.write("\n")
        report(args, prompt, "".join(pieces))
    finally:
        engine.close()
    return 0


def warn_about_base(line: str) -> None:
    """An adapter made for another base runs; the user is told so once, on stderr."""
    if line:
        print(line, file=sys.stderr)


def _activate(engine, choice: str | None, adapters_dir) -> str | None:
    """The engine's name for the ``--adapter`` (checked against its model), or None for the base."""
    if choice is None:
        return None
    from g4v.lora.activation import activate_adapter

    spec = activate_adapter(engine, choice, adapters_dir)
    print(f"adapter: {spec.name}", file=sys.stderr)
    return spec.name
