"""The one exception type that carries a message meant for a person."""


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
    the values typed, naming the flag (:mod:`g4v.commands.settings_flags`)."""
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


def share(up_to_one: bool = False, optional: bool = False, example: str = ""):
    """A field's check: a number above 0 and below 1 (``up_to_one``: 1 allowed), in one wording for
    every such setting; ``example`` is added after the range (``" (0.02 = 2 points)"``)."""
    bounds = "above 0 and up to 1" if up_to_one else "between 0 and 1"

    def check(value) -> None:
        if value is None and optional:
            return
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (0 < value <= 1 if up_to_one else 0 < value < 1)):
            raise ValueError(f"must be a number {bounds}{example}, got {quoted(value)}")

    return check


class PromptTooLong(G4VError):
    """The prompt and the tokens asked for do not fit the model's context window. Engines raise it
    before anything streams, so a chat can drop its oldest turns and try again."""
