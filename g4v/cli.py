"""``python -m g4v COMMAND ...``: the command-line twin of every panel.

Each command lives in its own module under :mod:`g4v.commands` with two functions:
``add_parser(subparsers)`` and ``run(args) -> int``. A :class:`~g4v.errors.G4VError` anywhere
becomes one line on stderr and exit status 1; bad flags become one line and exit status 2.

Python decodes command-line bytes that are not UTF-8 into lone surrogates (``\\udcff``) instead of
failing, so such a prompt would travel until a tokenizer or a JSON writer chokes on it. The text
arguments are checked here, for every command, before anything slow starts.
"""

import argparse
import importlib
import re
import sys

from g4v.commands.panels import command_modules
from g4v.errors import G4VError

#: Command modules, in the order ``--help`` lists them: each panel's, in its tab's order
#: (:data:`g4v.commands.panels.PANELS`), then ``precision`` and ``bench``.
COMMANDS = command_modules()
#: Arguments that are text, not file names (which may hold any bytes), by argparse ``dest``.
TEXT_ARGUMENTS = {"prompt": "the prompt", "adapter": "--adapter"}


#: A help text that already says its default ("default: $G4V_MODEL", not "--default-mm-loras").
_STATES_DEFAULT = re.compile(r"(?<![-\w])default\b")


class DefaultsShown(argparse.HelpFormatter):
    """Every flag's help ends with its default, where it has one its help does not already state."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        shown = action.option_strings and action.nargs != 0  # a switch's default is its absence
        if not shown or _STATES_DEFAULT.search(text) or default is None or default is argparse.SUPPRESS:
            return text
        if isinstance(default, (list, tuple)):  # as it is typed: "bundled larger", not a Python list
            value = " ".join(map(str, default)) or "none"
        else:
            value = "%(default)s"
        return f"{text} (default: {value})" if text else f"default: {value}"


class OneLineParser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; users get one line that names the problem.
    Help lists each flag's default (:class:`DefaultsShown`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("action", Commands)
        return super().add_subparsers(**kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class Commands(argparse._SubParsersAction):
    """The commands' subparsers: a command's one-line ``help`` in the list is also the description
    its own ``--help`` starts with."""

    def add_parser(self, name, **kwargs):
        kwargs.setdefault("description", kwargs.get("help"))
        return super().add_parser(name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m g4v", description="Granite 4 Vision workbench")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        module = importlib.import_module(f"g4v.commands.{name}")
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse a text argument that holds bytes that are not UTF-8, naming it and the first bad byte."""
    for dest, shown in TEXT_ARGUMENTS.items():
        value = getattr(args, dest, None)
        problem = utf8_problem(value) if isinstance(value, str) else None
        if problem:
            raise G4VError(f"{shown} is not valid UTF-8 text ({problem})")


def utf8_problem(text: str) -> str | None:
    """Where ``text`` stops being encodable as UTF-8, in words; None when it is fine."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "a lone surrogate"
        return f"{what} at character {err.start + 1}"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_text_arguments(args)
        return args.run(args)
    except G4VError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
