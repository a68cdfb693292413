"""``python -m g4v COMMAND ...``: the command-line twin of every panel.

Each command lives in its own module under :mod:`g4v.commands` with two functions:
``add_parser(subparsers)`` and ``run(args) -> int``. A :class:`~g4v.errors.G4VError` anywhere
becomes one line on stderr and exit status 1; bad flags become one line and exit status 2.
"""

import argparse
import importlib
import sys

from g4v.errors import G4VError

#: Command modules, in the order ``--help`` lists them.
COMMANDS = ["chat", "tiling", "inspect", "merge_lora", "lora_diff", "port_diff", "bench"]


class OneLineParser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; users get one line that names the problem."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m g4v", description="Granite 4 Vision workbench")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        module = importlib.import_module(f"g4v.commands.{name}")
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except G4VError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
