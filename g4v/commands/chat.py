"""``python -m g4v chat [--model M] --image PATH ... "PROMPT"``: stream one answer to stdout."""

import sys

from g4v.commands.common import add_backend_flag, add_model_flags
from g4v.commands.engine_flags import add_engine_flags, engine_options
from g4v.conversation import Message, SamplingSettings, validate_conversation
from g4v.images import open_image


def add_parser(subparsers):
    parser = subparsers.add_parser("chat", help="answer a prompt about zero or more images")
    add_model_flags(parser)
    add_backend_flag(parser)
    add_engine_flags(parser)
    parser.add_argument("--image", action="append", default=[], metavar="PATH", help="an image (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("prompt", help="the question")
    return parser


def run(args) -> int:
    # Check everything the user typed before the (slow) model load.
    images = [open_image(path) for path in args.image]
    messages = [Message("user", args.prompt, images)]
    validate_conversation(messages)
    settings = SamplingSettings(args.max_new_tokens, args.temperature, args.top_p, args.seed).validated()

    from g4v.engines import create_engine

    engine = create_engine(args.backend, args.model, **engine_options(args))
    print(engine.info.details["choice"], file=sys.stderr)
    try:
        for piece in engine.stream(messages, settings):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    finally:
        engine.close()
    return 0
