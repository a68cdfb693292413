"""A model's answer to a document task, read for display: tables rendered, JSON checked, code
highlighted. :func:`read_answer` never raises on what the model wrote: a malformed answer comes back
as-is with the parse error, so a view never breaks on output.

Nothing in an answer runs: HTML is sanitised (:func:`g4v.documents.tables.sanitize_html`), code is
only tokenised by Pygments for colours, JSON is parsed with the standard library.
"""

import contextvars
import html
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from g4v.documents import tables
from g4v.errors import quoted

#: What each answer kind is read as. "text" answers (summaries, questions) are shown escaped.
KINDS = ("csv", "html", "otsl", "json", "code", "text")
#: At most this many schema problems are listed (a wrong answer can break every field).
MAX_PROBLEMS = 50


@dataclass(frozen=True)
class Problem:
    """One way a JSON answer breaks its schema: where (``$.items[0].price``), what the schema
    expects, what the answer has, and the validator's own sentence."""

    path: str
    expected: str
    got: str
    message: str

    def line(self) -> str:
        return f"{self.path}: expected {self.expected}, got {self.got}"


@dataclass
class StructuredAnswer:
    """An answer as the app and ``chat --json`` show it.

    ``html`` is safe to put in a page (sanitised or built from escaped text); ``rows`` are the
    table's cells when the answer is a table; ``data`` is the parsed JSON; ``problems`` the schema
    violations; ``error`` the parse error when the answer could not be read (then ``html`` shows the
    raw answer escaped).
    """

    kind: str
    raw: str
    html: str = ""
    rows: list[list[str]] = field(default_factory=list)
    data: object = None
    problems: list[Problem] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems

    def to_dict(self) -> dict:
        return asdict(self)


def read_answer(kind: str, answer: str, schema: dict | None = None) -> StructuredAnswer:
    """Read ``answer`` as ``kind`` (one of :data:`KINDS`); ``schema`` checks a JSON answer."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}")  # a caller's bug, not the model's output
    result = StructuredAnswer(kind=kind, raw=answer)
    try:
        if kind in ("csv", "html", "otsl"):
            table = {"csv": tables.parse_csv, "html": tables.parse_html_table, "otsl": tables.parse_otsl}[kind](answer)
            result.rows, result.html = table.rows, table.html
        elif kind == "json":
            result.data = parse_json(answer)
            result.html = pre(json.dumps(result.data, indent=2, ensure_ascii=False))
            if schema is not None:
                result.problems = schema_problems(result.data, schema)
        elif kind == "code":
            result.html = highlight_python(tables.strip_fence(answer))
        else:
            result.html = pre(answer)
    except (tables.TableError, ValueError, RecursionError) as err:
        result.error = " ".join(str(err).split())[:300] or type(err).__name__
        result.html = pre(answer)
        result.rows = []
    return result


def pre(text: str) -> str:
    """Text shown as-is in a page: escaped, in a ``<pre>`` that keeps its lines."""
    return f'<pre style="white-space: pre-wrap">{html.escape(text)}</pre>'


def parse_json(answer: str):
    """The JSON value in an answer (one code fence allowed around it); one-line ValueError if none."""
    body = tables.strip_fence(answer)
    if not body:
        raise ValueError("the answer is empty")
    try:
        return json.loads(body)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None


def schema_problems(data, schema: dict) -> list[Problem]:
    """Every place ``data`` breaks ``schema`` (JSON Schema, the draft the schema names), by path.

    Only references inside the schema (``#/...``) and to the JSON Schema meta-schemas are followed:
    nothing is fetched, so a ``$ref`` to a URL or a server file is named as a problem, not read.
    The schema's regular expressions run with a time limit (:func:`_search`).
    """
    from jsonschema import validators
    from jsonschema_specifications import REGISTRY  # the meta-schemas only; it retrieves nothing
    from referencing.exceptions import Unresolvable

    if untimed_patterns(schema):
        raise ValueError(UNTIMED)
    validator = _time_limited(validators.validator_for(schema))(schema, registry=REGISTRY)
    deadline = _DEADLINE.set(time.monotonic() + CHECK_SECONDS)
    try:
        errors = sorted(validator.iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    except Unresolvable as err:
        ref = getattr(err, "ref", None) or getattr(getattr(err, "_wrapped", None), "ref", None) or str(err)
        raise ValueError(f"the schema's $ref {quoted(str(ref), 80)} cannot be resolved inside the "
                         "schema (nothing outside it is fetched)") from None
    except _TooSlow as err:
        if err.pattern is not None:
            raise ValueError(f"the schema's pattern {quoted(err.pattern, 80)} took over {PATTERN_SECONDS} s on the "
                             "answer, so it was not checked (a pattern like (a+)+ backtracks without end)") from None
        raise ValueError(f"checking the answer against the schema took over {CHECK_SECONDS} s, so it was stopped "
                         "(the schema asks for too much work: slow patterns, or $refs that fan out)") from None
    finally:
        _DEADLINE.reset(deadline)
    return [_problem(error) for error in errors[:MAX_PROBLEMS]]


#: The longest one of the schema's regular expressions may run on one string of the answer, and
#: the longest a whole check may take (a schema can ask for many searches, or fan out through $refs).
PATTERN_SECONDS = 0.5
CHECK_SECONDS = 2.0
#: When the check under way must stop (``time.monotonic``), set by :func:`schema_problems`.
_DEADLINE = contextvars.ContextVar("schema_check_deadline", default=None)


class _TooSlow(Exception):
    def __init__(self, pattern: str | None = None):
        self.pattern = pattern


def _seconds_left() -> float:
    """Seconds until the check's deadline; :class:`_TooSlow` once it has passed."""
    deadline = _DEADLINE.get()
    left = math.inf if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise _TooSlow()
    return left


def _search(pattern, text: str) -> bool:
    """``re.search`` as JSON Schema's ``pattern`` means it, with a time limit (the ``regex``
    package's): the schema is user input and the answer model output, and a backtracking pattern
    such as ``^(a+)+$`` takes time exponential in the answer's length under ``re``, which cannot be
    interrupted and would hold the server."""
    import regex

    if not isinstance(pattern, str):
        raise ValueError(f"the schema's pattern must be a string, not {type(pattern).__name__}")
    problem = pattern_problem(pattern)  # before regex compiles it: compiling is not time-limited
    if problem:
        raise ValueError(problem)
    left = _seconds_left()
    try:
        return regex.search(pattern, text, timeout=min(PATTERN_SECONDS, left)) is not None
    except TimeoutError:
        raise _TooSlow(pattern if left > PATTERN_SECONDS else None) from None  # this search, or the check
    except regex.error as err:  # check_schema compiled it with re; the two dialects differ at the edges
        raise ValueError(f"the schema's pattern {quoted(pattern, 80)} cannot be used: {err}") from None


#: Why a schema is refused by :func:`untimed_patterns`.
UNTIMED = ("the JSON schema uses unevaluatedProperties together with patternProperties, which is not "
           "checked (those patterns could not be time-limited); use additionalProperties instead")


def untimed_patterns(schema) -> bool:
    """Whether ``schema`` uses both ``unevaluatedProperties`` and ``patternProperties`` as keywords
    (not as property names or values): for ``unevaluatedProperties`` the library matches the
    patterns itself, with ``re`` and no time limit, so such a schema is refused rather than checked
    slowly."""
    return {"unevaluatedProperties", "patternProperties"} <= {key for key, _ in _keywords(schema)}


def _keywords(schema):
    """Every ``(keyword, value)`` of ``schema`` and its subschemas, never a property name or data."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                yield key, value
                if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
                    stack.extend(value.values())  # {name: subschema}: the names are data
                elif key not in _DATA_KEYWORDS:
                    stack.append(value)


#: A pattern's counted repetitions multiplied through their nesting (``(a{10}){20}`` is 200 letters),
#: summed, at most this. The ``regex`` package compiles ``a{n}`` into n copies, before and outside
#: its time limit: ``((a{1000}){1000}){1000}`` (25 characters) took 17 GB; 100,000 takes about 30 MB.
MAX_PATTERN_SIZE = 100_000


def schema_pattern_problem(schema) -> str | None:
    """The first of the schema's regular expressions (``pattern`` values, ``patternProperties``
    keys) that :func:`pattern_problem` refuses, in one line; None when all can be compiled."""
    for key, value in _keywords(schema):
        patterns = [value] if key == "pattern" else list(value) if key == "patternProperties" else []
        for pattern in patterns:
            if isinstance(pattern, str) and (problem := pattern_problem(pattern)):
                return problem
    return None


@lru_cache(maxsize=256)
def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is too large to compile (see :data:`MAX_PATTERN_SIZE`), or None. Sized from
    Python's own parse of it, which is cheap: nothing is expanded."""
    import re._parser as parser  # the standard library's own parser of regular expressions

    try:
        size = _pattern_size(parser.parse(pattern), parser)
    except (re.error, OverflowError) as err:  # OverflowError: a count such as a{99999999999}
        return f"the schema's pattern {quoted(pattern, 80)} cannot be used: {err}"
    except RecursionError:
        return f"the schema's pattern {quoted(pattern, 80)} is nested too deeply"
    if size > MAX_PATTERN_SIZE:
        return (f"the schema's pattern {quoted(pattern, 80)} repeats too much to be compiled: its counted "
                f"repetitions come to {size:,} (the limit is {MAX_PATTERN_SIZE:,})")
    return None


def _pattern_size(items, parser) -> int:
    """Characters and classes count 1; a repetition counts its content times its largest bounded
    count (its smallest when unbounded: ``a{3,}`` is compiled as three then a loop)."""
    repeats = {parser.MAX_REPEAT, parser.MIN_REPEAT, getattr(parser, "POSSESSIVE_REPEAT", None)}
    total = 0
    for op, argument in items:
        if op in repeats:
            low, high, content = argument
            total += max(low if high == parser.MAXREPEAT else high, 1) * _pattern_size(content, parser)
        else:
            inner = [part for part in _nested(argument) if isinstance(part, parser.SubPattern)]
            total += sum(_pattern_size(part, parser) for part in inner) if inner else 1
    return total


def _nested(argument):
    """The values inside a parsed item's argument (groups, branches, lookarounds hold sub-patterns)."""
    if isinstance(argument, (tuple, list)):
        for part in argument:
            yield part
            if isinstance(part, (tuple, list)):
                yield from _nested(part)


#: Keywords whose value maps names to subschemas, and keywords whose value is data, not schema.
_NAMED_SUBSCHEMAS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_DATA_KEYWORDS = {"const", "enum", "default", "examples"}


@lru_cache(maxsize=None)
def _time_limited(validator_class):
    """``validator_class`` with the three keywords that match regular expressions (``pattern`` on
    strings, ``patternProperties`` and ``additionalProperties`` on keys) rewritten around
    :func:`_search`, ``uniqueItems`` in linear time (:func:`_all_unique`), and every keyword
    checking the check's deadline before it runs (a schema's ``$ref``s can fan out into millions of
    evaluations); otherwise the library's own keywords, each linear in the answer for a given
    schema node, so that no keyword runs long between two readings of the deadline."""
    from jsonschema import ValidationError, validators

    def on_the_clock(keyword):
        def checked(validator, value, instance, schema):
            _seconds_left()
            yield from keyword(validator, value, instance, schema) or ()
        return checked

    def pattern(validator, regexp, instance, schema):
        if validator.is_type(instance, "string") and not _search(regexp, instance):
            yield ValidationError(f"{instance!r} does not match {regexp!r}")

    def pattern_properties(validator, patterns, instance, schema):
        if validator.is_type(instance, "object"):
            for regexp, subschema in patterns.items():
                for key, value in instance.items():
                    if _search(regexp, key):
                        yield from validator.descend(value, subschema, path=key, schema_path=regexp)

    def additional_properties(validator, allowed, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        named, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        extras = sorted(key for key in instance
                        if key not in named and not any(_search(regexp, key) for regexp in patterns))
        if validator.is_type(allowed, "object"):
            for key in extras:
                yield from validator.descend(instance[key], allowed, path=key)
        elif not allowed and extras:
            error = ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} "
                                    f"{'was' if len(extras) == 1 else 'were'} unexpected)")
            error.unexpected = extras  # for the problem line: a key may hold any character, "(" too
            yield error

    def unique_items(validator, unique, instance, schema):
        if unique and validator.is_type(instance, "array") and not _all_unique(instance):
            yield ValidationError(f"{_short(instance)} has non-unique elements")

    rewritten = {"pattern": pattern, "patternProperties": pattern_properties,
                 "additionalProperties": additional_properties, "uniqueItems": unique_items}
    keywords = {**validator_class.VALIDATORS, **rewritten}
    return validators.extend(validator_class, {name: on_the_clock(keyword) for name, keyword in keywords.items()})


def _all_unique(items: list) -> bool:
    """Whether no two of ``items`` are equal as JSON Schema means it, in one pass over a set.

    The library compares items pairwise when they do not sort (objects never do): 12,000 objects
    took 160 s, with the check's deadline read only between keywords. Here each item becomes a
    hashable value (:func:`_canonical`, linear in its size), and the deadline is read as they come."""
    seen = set()
    for position, item in enumerate(items):
        if position % 256 == 255:
            _seconds_left()
        key = _canonical(item)
        if key in seen:
            return False
        seen.add(key)
    return True


def _canonical(value):
    """``value`` as a hashable that is equal exactly where JSON Schema's equality holds: ``1`` and
    ``1.0`` alike, ``true`` and ``1`` not, objects whatever their key order, arrays in order."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _canonical(item)) for key, item in value.items()))
    return ("string", value)  # json.loads makes nothing else


def _problem(error) -> Problem:
    """A jsonschema ValidationError in field / expected / got terms."""
    path = "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    if error.validator == "required" and isinstance(error.validator_value, bool):
        return Problem(path, "a required field", "nothing", error.message)  # draft 3: the path names the field
    if error.validator == "required":
        # jsonschema reports one missing key per error, as "<key's repr> is a required property".
        missing = next((key for key in error.validator_value if error.message == f"{key!r} is a required property"),
                       error.message)
        return Problem(f"{path}.{missing}", "a required field", "nothing", error.message)
    if error.validator == "additionalProperties":
        unexpected = ", ".join(map(_short, getattr(error, "unexpected", [])))
        return Problem(path, "no other fields", unexpected or error.message, error.message)
    expected = f"{error.validator} {_short(error.validator_value)}"
    return Problem(path, expected, _short(error.instance), error.message[:300])


def _short(value) -> str:
    """A JSON value as a problem line quotes it: compact JSON, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else quoted(text, 60)


def highlight_python(code: str) -> str:
    """Python source coloured by Pygments (inline colours only, every character escaped); never run."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))
