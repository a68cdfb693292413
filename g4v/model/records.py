"""Typed results and their plain form, written once: a :class:`Record` is a dataclass whose fields
are the JSON's keys, in the JSON's order; ``to_dict()`` derives the plain data (what ``--json`` and
``summary.json`` write) from the fields, and ``from_dict()`` reads it back (a port-diff summary
crosses from the vLLM environment's process as JSON; a saved export can be redrawn).

The fronts (tabs, commands, figures) read a result by attribute, never by key: a renamed field is
then an error where it is read, not a ``KeyError`` (or a silent ``.get`` default) at run time.

A field that the JSON leaves out when it has no value (a key only some results carry) is declared
with :func:`optional`; any other field is always written, ``None`` as ``null``. A field's value
may be a record, a list or dict of them, or anything with its own ``to_dict()`` (a part of a result
that holds tensors, such as :class:`g4v.model.capture.LevelCapture`); those are written through it.
The records more than one panel's results hold are here too (:class:`TokenProb`). No torch here.
"""

import dataclasses
import types
import typing

#: The metadata of a field that the plain form leaves out while it is None.
OMITTED_WHEN_NONE = "omitted when None"


def optional(default=None):
    """A field that ``to_dict()`` leaves out while it is None (its key is absent from the JSON)."""
    return dataclasses.field(default=default, metadata={OMITTED_WHEN_NONE: True})


def plain(value):
    """``value`` as JSON-ready data: records and other typed parts through their ``to_dict()``, other
    dataclasses field by field, lists, tuples and dicts item by item."""
    if isinstance(value, type):
        return value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value):  # a plain dataclass of plain values (a token and its probability)
        return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


class Record:
    """Base of a typed result's dataclasses (see the module's docstring)."""

    def to_dict(self) -> dict:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.metadata.get(OMITTED_WHEN_NONE):
                continue
            out[field.name] = plain(value)
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The record ``to_dict()`` wrote ``data`` from (nested records rebuilt from their field
        types; keys the record does not know are ignored, so an older reader takes a newer file)."""
        hints = typing.get_type_hints(cls)
        known = {field.name for field in dataclasses.fields(cls) if field.init}
        return cls(**{name: _read(hints[name], value) for name, value in data.items() if name in known})


def _read(hint, value):
    """``value`` (plain data) as the field type ``hint`` wants it: records rebuilt, the rest as is."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        return _read(inner[0], value) if len(inner) == 1 else value
    if origin is list and args:
        return [_read(args[0], item) for item in value]
    if origin is dict and len(args) == 2:
        return {key: _read(args[1], item) for key, item in value.items()}
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value)
    return value


@dataclasses.dataclass
class TokenProb(Record):
    """One of a next-token distribution's top tokens (Deepstack's before and after, the port's two
    sides): :func:`g4v.model.scoring.top_tokens`."""

    token_id: int
    text: str
    prob: float
