"""One command-line flag per field of a settings dataclass, and the dataclass back from the flags.

A settings class (the demo's ``TrainSettings`` and ``AdapterSettings``, the vLLM engine's
``VLLMSettings``) is the one place where a setting's name, type, default and help are written;
the flags are derived from it here, so a new field is a new flag and a changed default changes
the flag's default too. Writing each flag out by hand beside the class, and again where the
parsed arguments build the class, had let the three copies drift apart.

For each field (``dataclasses.fields`` order):

* the flag is ``--`` + the field's name in kebab case, or ``metadata["flag"]``;
* the default is the field's default (the dataclass stays the one place for it);
* the help is ``metadata["help"]`` (``field(default=..., metadata={"help": "..."})``);
* a ``bool`` field takes ``--name/--no-name`` (``BooleanOptionalAction``); with its own
  ``metadata["flag"]`` it is a plain switch instead: ``store_false`` when the default is True
  (``--no-lora`` for ``enable_lora``), ``store_true`` otherwise;
* a ``dict`` or ``list`` field takes JSON (``metavar`` JSON);
* any other field takes its type (``int``, ``float``, ``str``; ``X | None`` reads as ``X``).

Pure ``argparse`` and ``dataclasses``: no g4v import, so every command can use it.
"""

import argparse
import dataclasses
import json
import types
import typing


def flag_of(field: dataclasses.Field) -> str:
    """The command-line flag of one settings field."""
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def flagged_fields(cls, exclude: tuple[str, ...] = ()) -> list[dataclasses.Field]:
    """The fields of ``cls`` that get a flag: all but those named in ``exclude``."""
    return [field for field in dataclasses.fields(cls) if field.name not in exclude]


def default_of(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def add_settings_flags(parser, cls, exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per field of the dataclass ``cls`` (but those in ``exclude``) to ``parser``
    (a parser or an argument group). Each flag's ``dest`` is the field's name."""
    hints = typing.get_type_hints(cls)
    for field in flagged_fields(cls, exclude):
        parser.add_argument(flag_of(field), dest=field.name, default=default_of(field),
                            help=field.metadata.get("help"), **_parsing(field, hints[field.name]))


def settings_from_args(cls, args: argparse.Namespace, exclude: tuple[str, ...] = (), **given):
    """``cls`` built from the parsed flags of :func:`add_settings_flags` (same ``exclude``); the
    keywords in ``given`` set fields directly (an excluded field not in ``given`` keeps its
    default)."""
    values = {field.name: getattr(args, field.name) for field in flagged_fields(cls, exclude)
              if field.name not in given}
    return cls(**values, **given)


def _parsing(field: dataclasses.Field, hint) -> dict:
    """``add_argument`` keywords that read the field's type."""
    kind = _plain_type(hint)
    if kind is bool:
        if "flag" in field.metadata:
            return {"action": "store_false" if field.default is True else "store_true"}
        return {"action": argparse.BooleanOptionalAction}
    if kind in (dict, list):
        return {"type": _json_reader(kind), "metavar": "JSON"}
    return {"type": kind}


def _plain_type(hint):
    """``X`` for ``X``, ``X | None`` and ``Optional[X]``; ``dict`` for ``dict[str, str]``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) != 1:
            raise TypeError(f"no single flag type for {hint}")
        hint = options[0]
    return typing.get_origin(hint) or hint


def _json_reader(kind: type):
    def read(text: str):
        try:
            value = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {'object' if kind is dict else 'array'}, got {text!r}")
        return value

    read.__name__ = f"json_{kind.__name__}"
    return read
