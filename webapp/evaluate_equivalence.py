"""The Evaluate tab's "can it say no change" parts: the margin and discordance boxes, the
detectable difference shown before a run, and after it the Equivalence block, the per-field
table and, for a precision pair, the per-level drift table (the numbers come from
:mod:`g4v.evaluate.equivalence`, :mod:`g4v.evaluate.fields` and :func:`g4v.model.precision.drift_rows`,
which the CLI prints too)."""

import gradio as gr

from g4v.errors import G4VError, check_value, read_decimal
from g4v.evaluate import EvalConfig
from g4v.evaluate.run import MIN_MARGIN, check_margin, check_share
from g4v.evaluate.equivalence import plan_line, summary_lines
from g4v.evaluate.fields import FIELD_HEADERS, field_rows
from g4v.evaluate.stats import detectable
from g4v.evaluate.summary import RunSummary
from g4v.model.precision import DRIFT_HEADERS, drift_rows, drift_title
from webapp.evaluate_tables import ALL_ROWS, ROWS_NAME, column_widths, whole_or_none


#: The boxes' names, as their labels begin and as a refusal names them.
MARGIN_NAME, DISCORDANCE_NAME = "Equivalence margin", "Assumed share of rows right in one arm only"


def equivalence_boxes() -> tuple[gr.Number, gr.Number]:
    """The equivalence margin and the share of discordant rows assumed before a run."""
    with gr.Row():
        margin = gr.Number(value=EvalConfig.margin, label=f"{MARGIN_NAME} (0.02 = ±2 points of accuracy)",
                           elem_id="eval-margin")
        discordance = gr.Number(value=EvalConfig.discordance, elem_id="eval-discordance",
                                label=f"{DISCORDANCE_NAME} (for the detectable difference)")
    return margin, discordance


def checked_share(value, name: str, check=check_share) -> float:
    """A margin or discordance box's value, strictly between 0 and 1 (the margin at least
    :data:`~g4v.evaluate.run.MIN_MARGIN`: ``check=check_margin``), or one line naming the box (in
    the command line's words: :data:`g4v.evaluate.run.check_share`)."""
    check_value(name, value, check)
    return value


def plan_view(rows: int | None, limit: int) -> tuple[gr.State, gr.Markdown]:
    """The dataset's row count (set as a dataset is chosen) and the line that shows the
    detectable difference for the rows a run will cover."""
    text = plan_text(rows, limit, EvalConfig.discordance, EvalConfig.margin)
    return gr.State(rows), gr.Markdown(text, elem_id="eval-plan")


def wire_plan(row_count, limit, discordance, margin, planned) -> None:
    """The line follows the dataset, the rows box, the discordance box and the margin box."""
    for source in (row_count, limit, discordance, margin):
        source.change(plan_text, [row_count, limit, discordance, margin], planned, api_visibility="private",
                      queue=False)


def _share(value, smallest: float = 0.0) -> float | None:
    """A box's share strictly between 0 and 1 (and at least ``smallest``), else None."""
    try:
        share = read_decimal(value)
    except (TypeError, ValueError):
        return None
    return share if not isinstance(value, bool) and 0 < share < 1 and share >= smallest else None


def plan_text(rows, limit, discordance, margin=EvalConfig.margin) -> str:
    """Before a run: the detectable difference for the rows it will cover (the dataset's, cut to
    the limit), and when they are too few for the margin, how many would do; empty while the
    boxes hold no valid numbers (Run names the problem)."""
    try:
        cut = whole_or_none(limit, ROWS_NAME, smallest=1, means_none=0, none_reads=ALL_ROWS)
    except G4VError:
        return ""
    share, points = _share(discordance), _share(margin, MIN_MARGIN)
    if not rows or share is None or points is None:
        return ""
    return "Before the run: " + plan_line(detectable(min(rows, cut or rows), share, margin=points)) + "."


#: The Equivalence block's line for a run without structured references (the per-field table
#: stays hidden: an empty table under its headers read as "no field moved").
NO_FIELDS = "per-field scores: none, this dataset has no key-value or table references"


#: The drift table's label before a run names one (a run sets its own, with its arms and rows).
DRIFT_LABEL = "Per-level drift of B against A (a precision pair: the same model in two precisions)"


def result_views() -> tuple[gr.Markdown, gr.Dataframe, gr.Dataframe]:
    """The Equivalence block, the per-field table and the per-level drift table, filled after a
    run; each table shows only when the run has its numbers (per-field scores; ``level_drift``)."""
    block = gr.Markdown(elem_id="eval-equivalence")
    table = gr.Dataframe(headers=FIELD_HEADERS, label="Per-field scores (key-value and table answers), most moved first",
                         interactive=False, elem_id="eval-fields", wrap=True, max_height=320, visible=False,
                         column_widths=column_widths(FIELD_HEADERS))
    drift = gr.Dataframe(headers=DRIFT_HEADERS, label=DRIFT_LABEL, interactive=False, elem_id="eval-drift",
                         wrap=True, visible=False, column_widths=column_widths(DRIFT_HEADERS))
    return block, table, drift


def result_values(summary: RunSummary) -> tuple[str, dict, dict]:
    """What :func:`result_views` show for a run: the block's text, and each table's rows as an
    update that hides it when there are none."""
    rows = field_rows(summary.fields)
    return equivalence_text(summary), gr.update(value=rows, visible=bool(rows)), drift_value(summary)


def drift_value(summary: RunSummary) -> dict:
    """The drift table of a precision pair (the summary's ``level_drift``: the CLI's rows, its
    title as the label), hidden for any other run."""
    drift = summary.level_drift
    if not drift:
        return gr.update(value=[], visible=False, label=DRIFT_LABEL)
    label = f"{drift_title(drift)}; B = {drift.of}, A = {drift.against}"
    return gr.update(value=drift_rows(drift), visible=True, label=label)


def equivalence_text(summary: RunSummary) -> str:
    """The Equivalence block: the TOST verdict, the detectable difference, the noise floor, and
    a line when the run has no per-field scores."""
    lines = summary_lines(summary) + ([] if summary.fields else [NO_FIELDS])
    return "\n".join(["**Equivalence**", "", *(f"- {line}" for line in lines)])
