"""``python -m g4v precision [--model M] --image IMG --prompt P [--dtype D] [--quant int8]
[--no-quant-vision] [--json]``: how far bfloat16, float16 or int8 weights move the model from
float32 on one picture, level by level.

Loads the checkpoint twice, in float32 (the reference) and in the candidate precision
(:class:`g4v.model.precision.Precision`, whose fields are the flags), runs one instrumented forward
pass of each and prints, per injection level, the relative error and cosine of what the candidate
injects against float32, then the next-token KL and both top tokens. Over a dataset, the same
numbers come from ``python -m g4v eval --a hf --b hf:dtype=bfloat16`` (``docs/precision.md``).
"""

import json

from g4v.commands.inputs import add_picture_flags
from g4v.errors import G4VError
from g4v.settings.flags import add_settings_flags, settings_from_args

COLUMNS = ("level", "LLM", "rel error", "max token rel", "cosine", "min cosine", "max |diff|")
WIDTHS = (12, 4, 11, 15, 11, 11, 11)


def add_parser(subparsers):
    from g4v.model.precision import Precision

    parser = subparsers.add_parser("precision", help="per-level drift of bf16 / fp16 / int8 weights against float32")
    parser.add_argument("--model", default=None,
                        help="model folder or hub id (default: $G4V_MODEL, else the bundled checkpoint)")
    add_picture_flags(parser)
    add_settings_flags(parser, Precision)
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    return parser


def run(args) -> int:
    from g4v.commands.inputs import open_single
    from g4v.conversation import Message, validate_conversation
    from g4v.engines import create_engine
    from g4v.model.precision import Precision, check_precision, precision_drift, require_quant_library

    typed = settings_from_args(Precision, args)
    if typed.quant is None and not typed.quant_vision:  # it was taken, and meant nothing
        raise G4VError("--no-quant-vision says what --quant does to the vision part: give --quant int8 with it")
    candidate = check_precision(typed.dtype or (None if typed.quant else "bfloat16"), typed.quant,
                                typed.quant_vision if typed.quant else None)
    require_quant_library(candidate.quant)
    picture = open_single(args.image, args.pages, args.dpi)  # bad input is refused before a model loads
    messages = [Message("user", args.prompt, [picture])]
    validate_conversation(messages)
    reference = create_engine("hf", args.model, dtype="float32")
    other = create_engine("hf", args.model, dtype=candidate.dtype or "float32", quant=candidate.quant,
                          quant_vision=candidate.quant_vision)
    try:
        result = precision_drift(reference, other, messages, Precision("float32"), candidate)
    finally:
        other.close()
        reference.close()
    print(json.dumps(result.to_dict(), indent=2) if args.json else report(result.to_dict()))
    return 0


def report(data: dict) -> str:
    """The per-level table, then the next token: what ``--json`` holds, in lines."""
    lines = [f"{data['candidate']['label']} against {data['reference']['label']}"
             + (f" ({data['quantized_layers']} linear layers in int8)" if data["quantized_layers"] else ""),
             "".join(f"{name:<{width}}" for name, width in zip(COLUMNS, WIDTHS)).rstrip()]
    for level in data["levels"]:
        cells = [level["name"], str(level["llm_layer"]), f"{level['rel_error']:.3g}",
                 f"{level['max_token_rel_error']:.3g}", f"{level['cosine']:.6f}", f"{level['min_cosine']:.6f}",
                 f"{level['max_abs_diff']:.3g}"]
        lines.append("".join(f"{cell:<{width}}" for cell, width in zip(cells, WIDTHS)).rstrip())
    if not data["levels"]:
        lines.append("(no image tokens: nothing is injected)")
    same = "same" if data["argmax_agrees"] else "DIFFERENT"
    lines.append(f"next token: KL(float32 || candidate) {data['next_token_kl']:.3g} nats; top token "
                 f"{data['reference_token']!r} in float32, {data['candidate_token']!r} in the candidate ({same})")
    return "\n".join(lines)
