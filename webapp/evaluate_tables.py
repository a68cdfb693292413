"""The Evaluate tab's tables and status line, from a run's summary (:class:`~g4v.evaluate.summary.RunSummary`) and its typed rows
(:class:`~g4v.evaluate.SampleResult`, as ``run_eval`` returns them; lists of cells out), and the
check of the tab's whole-number boxes."""

import math

from g4v.errors import G4VError, quoted, read_decimal
from g4v.evaluate import SampleResult
from g4v.evaluate.stats import worst_rows
from g4v.evaluate.summary import ArmScore, Block, RunSummary
from webapp.common import markdown_code

AGGREGATE_HEADERS = ["group", "n", "errors", "A accuracy [95% CI]", "B accuracy [95% CI]",
                     "right: both / A only / B only / neither", "McNemar p", "same answer", "KL mean", "KL q99",
                     "blank same: A / B"]
#: The per-sample table's columns in their order, each a header and how a row fills it: the short
#: verdicts come before the free text, so a 1280-pixel window shows them without a sideways scroll
#: (after the answers, 7 of the 14 columns showed and nothing said the rest were there).
SAMPLE_COLUMNS = (
    ("row", lambda row: row.index), ("id", lambda row: row.sample_id), ("category", lambda row: row.category or ""),
    ("A right", lambda row: _flag(row.correct_a)), ("B right", lambda row: _flag(row.correct_b)),
    ("agree", lambda row: _flag(row.agree)),
    ("first diff", lambda row: "" if row.first_divergence is None else row.first_divergence),
    ("KL mean", lambda row: _number(row.kl_mean)), ("prompt", lambda row: row.prompt),
    ("reference", lambda row: row.reference or ""), ("answer A", lambda row: row.answer_a),
    ("answer B", lambda row: row.answer_b), ("image tokens", lambda row: row.image_tokens or ""),
    ("error", lambda row: row.error or ""),
)
SAMPLE_HEADERS = [header for header, _ in SAMPLE_COLUMNS]

#: Columns of free text (the sample table's prompt and answers), given room to read.
TEXT_COLUMNS = {"prompt", "reference", "answer A", "answer B", "error"}
#: Columns of short names (ids such as ``p000-count``, categories), wide enough for a name of
#: ``NAME_CHARS`` characters: sized for the header alone, the bundled ids (`p000-position`) broke
#: at their hyphen.
NAME_COLUMNS, NAME_CHARS = {"id", "category", "level"}, 16
#: Pixels per character of a header's longest word (the table's bold monospace), and the cell's own
#: padding and menu button.
HEADER_CHAR_PX, HEADER_EXTRA_PX, TEXT_COLUMN_PX = 9.5, 44, 220
#: A long header's line, in characters: "right: both / A only / B only / neither" on two lines took
#: 229 px, and the 11 aggregate columns then ran past a 1280-pixel window's table (the last one cut).
HEADER_LINE_CHARS = 13
#: Columns of numbers, wide enough for ``NUMBER_CHARS`` header characters whatever their header: a
#: small KL in e-notation ("1.49e-06", 8 of the cells' narrower digits) broke at its hyphen at
#: 1280 pixels in a column sized for "KL mean" alone. (The share of same answers is headed "same
#: answer", not "agreement": that word's width paid for the KL columns within a 1280-pixel window.)
NUMBER_COLUMNS, NUMBER_CHARS = {"McNemar p", "same answer", "KL mean", "KL q99", "rel err mean", "rel err max",
                                "cosine mean", "cosine min"}, 5.5
#: Joins an exponent's sign to its digits (U+2060 WORD JOINER, invisible): a number is never broken
#: at its hyphen in a narrow window.
WORD_JOINER = "\u2060"


def column_widths(headers: list[str]) -> list[str]:
    """A width for each column wide enough for its header's longest word and for half the header
    (at most :data:`HEADER_LINE_CHARS` a line), and a name column for a short name, so headers wrap
    between words only, on two or three lines (Gradio sizes the columns to the cells and then breaks
    header words anywhere)."""
    widths = []
    for header in headers:
        characters = max(max(len(word) for word in header.split()), min(len(header) / 2, HEADER_LINE_CHARS),
                         NAME_CHARS if header in NAME_COLUMNS else 0, NUMBER_CHARS if header in NUMBER_COLUMNS else 0)
        widths.append(round(HEADER_CHAR_PX * characters + HEADER_EXTRA_PX))
    return [f"{max(width, TEXT_COLUMN_PX if header in TEXT_COLUMNS else 0)}px" for width, header in zip(widths, headers)]


def unbroken(number: str) -> str:
    """``number`` with its exponent's sign joined to the digits around it (``1.49e-06`` drawn whole)."""
    return number.replace("e-", f"e{WORD_JOINER}-{WORD_JOINER}").replace("e+", f"e{WORD_JOINER}+{WORD_JOINER}")


def _number(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    return unbroken(f"{value:.{digits}g}") if abs(value) < 1e-3 and value else f"{value:.{digits}f}"


def _accuracy(arm: ArmScore) -> str:
    """``0.750 [0.58, 0.87] (n=24)``; a dash when the arm has no scored answers."""
    if arm.accuracy is None:
        return "–"
    interval = f" [{arm.ci95[0]:.2f}, {arm.ci95[1]:.2f}]" if arm.ci95 else ""
    return f"{arm.accuracy:.3f}{interval} (n={arm.n_scored})"


def _group_row(name: str, block: Block) -> list:
    paired, kl, blank = block.paired, block.kl, block.blank_same
    outcomes = " / ".join(str(count) for count in (paired.both_right, paired.a_only, paired.b_only, paired.both_wrong))
    return [name, block.n, block.n_errors, _accuracy(block.arms.a), _accuracy(block.arms.b),
            outcomes, unbroken(f"{paired.mcnemar_p:.3g}"), _number(block.agreement),
            _number(kl.mean if kl else None), _number(kl.q99 if kl else None),
            f"{_number(blank.a)} / {_number(blank.b)}"]


def aggregate_rows(summary: RunSummary) -> list[list]:
    """One row for the whole run, then one per category (by name)."""
    rows = [_group_row("all", summary)]
    rows += [_group_row(str(name), block) for name, block in sorted(summary.by_category.items())]
    return rows


def worst_first(rows: list[SampleResult]) -> list[SampleResult]:
    """All rows, those most worth a look first (the run summary's own ranking), then by row."""
    ranked = worst_rows(rows, limit=len(rows))
    by_index = {row.index: row for row in rows}
    rest = sorted(set(by_index) - set(ranked))
    return [by_index[index] for index in [*ranked, *rest]]


def _flag(value) -> str:
    return "–" if value is None else "yes" if value else "no"


def sample_rows(rows: list[SampleResult]) -> list[list]:
    """The per-sample table: one list of cells per row (``RunResult.rows``), worst first, in
    :data:`SAMPLE_COLUMNS`' order."""
    return [[cell(row) for _, cell in SAMPLE_COLUMNS] for row in worst_first(rows)]


def run_status(summary: RunSummary, label_a: str, label_b: str) -> str:
    """One paragraph: how much of the run is done and its headline numbers."""
    done = "Finished" if summary.complete else "Stopped (press Run again to continue where it stopped)"
    parts = [f"**{done}**: {summary.n} sample(s), {summary.n_errors} with errors. "
             f"A = {markdown_code(label_a)}, B = {markdown_code(label_b)}."]
    if summary.agreement is not None:
        parts.append(f"The greedy answers agree on {summary.agreement:.1%}.")
    arms = summary.arms
    if arms.a.accuracy is not None and arms.b.accuracy is not None:
        parts.append(f"Accuracy A {arms.a.accuracy:.1%}, B {arms.b.accuracy:.1%} "
                     f"(exact McNemar p = {summary.paired.mcnemar_p:.3g}).")
    return " ".join(parts)


#: The rows and seed boxes' names, as their labels begin and as a refusal names them.
ROWS_NAME, SEED_NAME = "Rows", "Shuffle seed"
#: What each box's "none" value (0 rows, seed -1) stands for, as its label and its refusal say it.
ALL_ROWS, DATASET_ORDER = "all", "dataset order"


def whole_or_none(value, name: str, smallest: int, means_none: int, none_reads: str) -> int | None:
    """A whole-number box (a number box cannot be empty): ``means_none`` or empty is None, else a
    whole number >= ``smallest``. ``none_reads``: what ``means_none`` stands for, as the box's label
    says it ("Rows (0: all)")."""
    if value is None or value == "":
        return None
    try:  # typed (an API client's text): the digits 0-9 only, as every box reads a number
        number = read_decimal(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if number == means_none and not isinstance(value, bool):  # "0" as well as 0
        return None
    if isinstance(value, bool) or not math.isfinite(number) or not number.is_integer() or number < smallest:
        raise G4VError(f"{name} must be {means_none} ({none_reads}) or a whole number of at least {smallest}, "
                       f"got {quoted(value)}")
    return int(number)
