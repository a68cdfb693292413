"""The one exception type that carries a message meant for a person, and the one reading of a
number a person typed."""

import argparse
import math
import re


class G4VError(Exception):
    """A problem with what the user asked for, explained in one line.

    The CLI prints it to stderr and exits 1, the app shows it as ``gr.Error``; neither shows a
    traceback. Raise it for bad input (a missing image, an empty prompt, an unknown model) and for
    environment problems the user can fix; let real bugs raise their own exceptions.
    """

    def __init__(self, message: str):
        # Keep it to one line, whatever the caller built.
        super().__init__(" ".join(str(message).split()))


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (or its type name), for a one-line G4VError."""
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:limit]


def quoted(value, limit: int = 40) -> str:
    """``value`` as an error message quotes what a user typed: its repr, cut short (a typed value
    may be of any size); a long string keeps its quotes around the part that is shown."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit] + "...")
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_fields(settings) -> None:
    """Run each field's own check (``metadata["check"]``: a function of the value that raises
    ``ValueError`` with what is wrong) on a settings dataclass; the first failure is one line that
    names the field (``max_new_tokens must be ...``). The command line runs the same functions on
    the values typed, naming the flag (:mod:`g4v.settings.flags`)."""
    import dataclasses

    for field in dataclasses.fields(settings):
        check = field.metadata.get("check")
        if check is not None:
            check_value(field.name, getattr(settings, field.name), check)


def whole_number(low: int, high: int | None = None, optional: bool = False):
    """A field's check (``metadata["check"]``): a whole number from ``low`` (to ``high``), in one
    wording for every such setting; ``optional``: None passes (the setting is left to a default)."""
    bounds = f"from {low} to {high}" if high is not None else f">= {low}"

    def check(value) -> None:
        if value is None and optional:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            raise ValueError(f"must be a whole number {bounds}, got {quoted(value)}")

    return check


def check_value(name: str, value, check) -> None:
    """``check(value)`` for a value that is no settings field (a function's argument), its
    complaint one line naming ``name``, as :func:`check_fields` names a field."""
    try:
        check(value)
    except ValueError as err:
        raise G4VError(f"{name} {err}") from None


def share(up_to_one: bool = False, optional: bool = False, example: str = "", smallest: float | None = None):
    """A field's check: a number above 0 and below 1 (``up_to_one``: 1 allowed; ``smallest``: at
    least that), in one wording for every such setting; ``example`` is added after the range
    (``" (0.02 = 2 points)"``)."""
    low = f"of at least {smallest:g}" if smallest is not None else "above 0"
    bounds = f"{low} and up to 1" if up_to_one else "between 0 and 1" if smallest is None else f"{low} and below 1"

    def check(value) -> None:
        if value is None and optional:
            return
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (0 < value <= 1 if up_to_one else 0 < value < 1) or (smallest is not None and value < smallest)):
            raise ValueError(f"must be a number {bounds}{example}, got {quoted(value)}")

    return check


class PromptTooLong(G4VError):
    """The prompt and the tokens asked for do not fit the model's context window. Engines raise it
    before anything streams, so a chat can drop its oldest turns and try again."""


#: A number as a person types it, in every box, flag and list of the app and the CLI: ASCII digits
#: and an optional sign; a decimal one may have one point and an exponent of at most three digits
#: (``1e999`` is read, as infinity, and refused as not finite). ``int`` and ``float`` would also take
#: "٣", "１" and "1_0", and ``str.isdigit`` passes "²", which ``int`` then refuses with a ValueError.
WHOLE_TEXT = re.compile(r"[+-]?[0-9]+")
DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
#: The longest number text read; a longer one is refused before it is read.
MAX_NUMBER_CHARS = 40


class NumberError(ValueError, argparse.ArgumentTypeError):
    """A typed number refused in one line; argparse prints it after the flag's name as it is."""


def read_whole(text, signed: bool = True) -> int:
    """``text`` (a ``str``; an ``int`` passes) as a whole number, or :class:`NumberError` saying
    what is wrong. ``signed``: a ``+`` or ``-`` is allowed."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    typed = _typed(text)
    if not WHOLE_TEXT.fullmatch(typed) or (not signed and typed[0] in "+-"):
        raise NumberError(f"must be a whole number written with the digits 0-9, got {quoted(text)}")
    return int(typed)


def _typed(text) -> str:
    """A number's text, stripped, or :class:`NumberError` for no text or one too long to be a number."""
    if not isinstance(text, str):
        raise NumberError(f"must be a number written with the digits 0-9, got {quoted(text)}")
    if len(text.strip()) > MAX_NUMBER_CHARS:
        raise NumberError(f"is too long to be a number: {len(text.strip()):,} characters (at most {MAX_NUMBER_CHARS})")
    return text.strip()


def read_decimal(text) -> float:
    """``text`` (a ``str``; an ``int`` or ``float`` passes) as a finite number, or :class:`NumberError`."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text) if abs(text) < 1e308 else math.inf
    else:
        typed = _typed(text)
        if not DECIMAL_TEXT.fullmatch(typed):
            raise NumberError(f"must be a number written with the digits 0-9 (such as 0.5 or 2e-3), got {quoted(text)}")
        value = float(typed)
    if not math.isfinite(value):
        raise NumberError(f"must be a finite number, got {quoted(text)}")
    return value


def parse_whole(name: str, text, signed: bool = True) -> int:
    """:func:`read_whole`, its refusal a :class:`G4VError` naming ``name``."""
    try:
        return read_whole(text, signed)
    except NumberError as err:
        raise G4VError(f"{name} {err}") from None


def parse_decimal(name: str, text) -> float:
    """:func:`read_decimal`, its refusal a :class:`G4VError` naming ``name``."""
    try:
        return read_decimal(text)
    except NumberError as err:
        raise G4VError(f"{name} {err}") from None
