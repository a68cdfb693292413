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
* a ``list`` or ``tuple`` field with ``metadata["repeat"]`` takes one value a flag, repeatable
  (``--data-dir a --data-dir b``: ``action="append"``, after the values it starts with);
* a ``list`` or ``tuple`` field with ``metadata["nargs"]`` takes one or more values, repeatable
  (``--ablate deepstack0 spatial_TL --ablate 3``: ``action="extend"``, each value of the
  element type; a tuple field gets a tuple back);
* any other ``dict`` or ``list`` field takes JSON (``metavar`` JSON);
* any other field takes its type (``int``, ``float``, ``str``; ``X | None`` reads as ``X``), or
  ``metadata["parse"]``: a function of the text that returns the value or raises ``ValueError``
  with the line argparse prints (a library's own check, with no argparse in it);
* ``metadata["check"]``: the dataclass's own check of a value (the one its validation runs,
  :func:`g4v.errors.check_fields`), run on the value read from the text: its ``ValueError`` is
  the line argparse prints after the flag's name, so a bad value is refused like a bad type;
* ``metadata["choices"]`` and ``metadata["metavar"]`` go to ``add_argument`` as they are; the
  help does not state the default: ``python -m g4v``'s help formatter appends every flag's
  (:class:`g4v.cli.DefaultsShown`).

A field may also name its environment variable, ``metadata["env"]`` (a name, or several: the
first that is set wins, as ``G4V_HOST`` before Spaces' ``GRADIO_SERVER_NAME``).
:func:`environment_values` reads them, when called (at start, never at import), each as its flag
reads its text, or through ``metadata["from_env"]`` (a function of the text, such as a list
separated by ``:``); a bad value is one :class:`~g4v.errors.G4VError` line that names the
variable. The app's flags start at these values (``add_settings_flags(..., defaults=...)``), and
:mod:`g4v.settings.limits` is read from them alone.

Pure ``argparse`` and ``dataclasses`` (and :mod:`g4v.errors`), so every command can use it.
"""

import argparse
import dataclasses
import json
import os
import types
import typing

from g4v.errors import G4VError, read_decimal, read_whole


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


def add_settings_flags(parser, cls, exclude: tuple[str, ...] = (), defaults: dict | None = None) -> None:
    """Add one flag per field of the dataclass ``cls`` (but those in ``exclude``) to ``parser``
    (a parser or an argument group). Each flag's ``dest`` is the field's name; its default is the
    field's, or ``defaults[name]`` where given (the values :func:`environment_values` read)."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for field in flagged_fields(cls, exclude):
        default = defaults[field.name] if field.name in defaults else default_of(field)
        if isinstance(default, tuple):
            default = list(default)  # argparse's "extend" appends to it; settings_from_args makes it a tuple again
        parser.add_argument(flag_of(field), dest=field.name, default=default, help=_help(field),
                            **_parsing(field, hints[field.name]))


def settings_from_args(cls, args: argparse.Namespace, exclude: tuple[str, ...] = (), **given):
    """``cls`` built from the parsed flags of :func:`add_settings_flags` (same ``exclude``); the
    keywords in ``given`` set fields directly (an excluded field not in ``given`` keeps its
    default)."""
    values = {}
    for field in flagged_fields(cls, exclude):
        if field.name not in given:
            value = getattr(args, field.name)  # a tuple field's list (argparse's "extend" needs one) back as a tuple
            values[field.name] = tuple(value) if isinstance(default_of(field), tuple) else value
    return cls(**values, **given)


def env_names(field: dataclasses.Field) -> tuple[str, ...]:
    """The environment variables a field is read from, first to last (none: the field has none)."""
    names = field.metadata.get("env", ())
    return (names,) if isinstance(names, str) else tuple(names)


def environment_values(cls, environ=None) -> dict:
    """``{field name: value}`` for each field of ``cls`` whose environment variable is set in
    ``environ`` (default ``os.environ``, read now). Read as the field's flag reads its text (its
    type, ``metadata["check"]``), or by ``metadata["from_env"]``; a bad value raises
    :class:`~g4v.errors.G4VError` with one line that names the variable."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        name = next((name for name in env_names(field) if name in environ), None)
        if name is not None:
            values[field.name] = _environment_value(field, hints[field.name], name, environ[name])
    return values


def _environment_value(field: dataclasses.Field, hint, name: str, text: str):
    kind = _plain_type(hint)
    read = field.metadata.get("from_env") or field.metadata.get("parse") or NUMBER_READERS.get(kind, kind)
    try:
        value = read(text)
    except ValueError as err:  # a reader's line says what is wrong: "must be a whole number ..., got 'abc'"
        raise G4VError(f"{name} {err}") from None
    choices = field.metadata.get("choices")
    if choices is not None and value not in choices:
        raise G4VError(f"{name} must be one of {', '.join(map(str, choices))}, not {text[:40]!r}")
    try:
        if "check" in field.metadata:
            field.metadata["check"](value)
    except ValueError as err:
        raise G4VError(f"{name}: {err}") from None
    return value


def _help(field: dataclasses.Field) -> str | None:
    """The field's help, with the environment variables it is read from."""
    helped, names = field.metadata.get("help"), env_names(field)
    if not names:
        return helped
    read_from = "$" + " or $".join(names)
    return f"{helped} ({read_from})" if helped else read_from


def _parsing(field: dataclasses.Field, hint) -> dict:
    """``add_argument`` keywords that read the field's type."""
    given = {key: field.metadata[key] for key in ("choices", "metavar") if key in field.metadata}
    kind = _plain_type(hint)
    if kind is bool:
        if "flag" in field.metadata:
            return {"action": "store_false" if field.default is True else "store_true"}
        return {"action": argparse.BooleanOptionalAction}
    if kind in (list, tuple) and field.metadata.get("repeat"):
        element = (typing.get_args(_unwrapped(hint)) or (str,))[0]
        return {"action": "append", "type": NUMBER_READERS.get(element, element), **given}
    if kind in (list, tuple) and "nargs" in field.metadata:
        element = (typing.get_args(_unwrapped(hint)) or (str,))[0]
        return {"nargs": field.metadata["nargs"], "action": "extend", "type": NUMBER_READERS.get(element, element), **given}
    if "parse" in field.metadata:
        return {"type": _checked_reader(field.metadata["parse"], field.metadata.get("check")), **given}
    if kind in (dict, list):
        return {"type": _json_reader(kind), "metavar": "JSON", **given}
    kind = NUMBER_READERS.get(kind, kind)
    if "check" in field.metadata:
        return {"type": _checked_reader(kind, field.metadata["check"]), **given}
    return {"type": kind, **given}


#: How a flag reads a number: as every box of the app does (:func:`g4v.errors.read_whole`), ASCII
#: digits only, in one line (``int`` would take "٣", and "²" passes ``str.isdigit``).
NUMBER_READERS = {int: read_whole, float: read_decimal}


def _checked_reader(parse, check=None):
    """``parse`` (then ``check``, when given) as an argparse type: a ``ValueError`` of either is
    the line argparse prints after the flag's name. ``parse`` is a type such as ``int``, whose own
    ``ValueError`` is argparse's usual "invalid int value" line, or a field's ``metadata["parse"]``."""
    def read(text: str):
        try:
            value = parse(text)
        except ValueError as err:
            if isinstance(parse, type):
                raise  # argparse words it: "invalid int value: 'x'"
            raise argparse.ArgumentTypeError(str(err)) from None
        try:
            if check is not None:
                check(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value

    read.__name__ = getattr(parse, "__name__", "value")
    return read


def _unwrapped(hint):
    """``X`` for ``X``, ``X | None`` and ``Optional[X]``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(options) != 1:
            raise TypeError(f"no single flag type for {hint}")
        hint = options[0]
    return hint


def _plain_type(hint):
    """``X`` for ``X``, ``X | None`` and ``Optional[X]``; ``dict`` for ``dict[str, str]``."""
    hint = _unwrapped(hint)
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
