"""``python -m g4v merge-lora [--model M] [--adapter A] --out DIR``: write a merged full checkpoint."""

from g4v.commands.common import add_adapters_dir_flag
from g4v.paths import default_model


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "merge-lora", help="merge a LoRA adapter into the weights (W += scaling * B @ A), saved in float32"
    )
    parser.add_argument("--model", default=None,
                        help="base model folder or hub id (default: $G4V_MODEL, else the bundled checkpoint)")
    parser.add_argument("--adapter", default=None,
                        help="adapter name or folder inside the adapter folders (leave out to merge the model's own "
                             "vision LoRA only; it is merged first in any case)")
    parser.add_argument("--out", required=True, help="new (or empty) output folder")
    add_adapters_dir_flag(parser)
    return parser


def run(args) -> int:
    from g4v.lora.merge import merge_lora

    result = merge_lora(args.model or default_model(), args.adapter, args.out, adapters_dir=args.adapters_dir)
    print(
        f"wrote {result.out}: {result.merged_layers} layers of adapter {result.adapter} merged "
        f"(scaling {result.scaling:g}), weights in {result.dtype}"
    )
    return 0
