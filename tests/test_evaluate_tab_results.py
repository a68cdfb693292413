"""The Evaluate tab's results from a run's typed rows (no model: the rows are built here): the
sample table ranks ``SampleResult`` rows worst first with each row's own values in its cells, and
``show_result`` fills every result box by name, in the order the ``/evaluate`` endpoint keeps."""

from dataclasses import asdict, replace

import gradio as gr
import numpy as np
import pytest

from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, RunResult, SampleResult
from g4v.evaluate.data import EvalSample
from g4v.errors import G4VError
from g4v.evaluate.run import error_row
from viz.evaluate import divergence_histogram, kl_histogram
from webapp.evaluate import EvalWorkspace, ResultBoxes, show_result
from webapp.evaluate_choices import BUNDLED, ArmChoice
from webapp.evaluate_runs import eval_config
from webapp.evaluate_tables import SAMPLE_HEADERS, sample_rows

#: The ``/evaluate`` endpoint's outputs, in the order API clients unpack them (the State last,
#: which the API does not return).
ENDPOINT_ORDER = ["status", "aggregate", "equivalence", "field_table", "drift_table", "accuracy_plot", "paired_plot",
                  "kl_plot", "divergence_plot", "samples", "export", "summary", "run_state"]


def row(index: int, *, agree: bool, correct: tuple = (None, None), kl: float | None = None,
        error: str | None = None, category: str = "colour") -> SampleResult:
    """A finished row: answers "x" and "x" or "y", the given scores; an ``error`` row as the run keeps one."""
    sample = EvalSample(index, f"id-{index}", [], f"prompt {index}", "x", category)
    if error:
        return error_row(sample, error)
    return replace(error_row(sample, "unused"), answer_a="x", answer_b="x" if agree else "y", agree=agree,
                   correct_a=correct[0], correct_b=correct[1], first_divergence=None if agree else 0, kl_mean=kl,
                   kl_max=None if kl is None else 2 * kl, image_tokens=52, error=None)


def rows() -> list[SampleResult]:
    return [row(0, agree=True, correct=(True, True), kl=0.0),  # nothing to look at
            row(1, agree=False, correct=(False, False), kl=0.3),  # both wrong, disagreeing
            row(2, agree=False, correct=(True, False), kl=0.1),  # one arm right: split
            row(3, agree=True, correct=(True, True), kl=0.05),  # agreeing, a little KL
            row(4, agree=False, correct=(False, True), kl=0.2),  # split, more KL than row 2
            row(5, agree=True, error="picture cannot be opened"),
            row(6, agree=True, correct=(False, False), kl=0.0, category="shape")]


def test_the_sample_table_ranks_typed_rows_worst_first():
    """The summary's ranking in words: errors, then split disagreements by KL, then other
    disagreements, then agreeing rows with KL; the rest by row number."""
    table = sample_rows(rows())
    assert [cells[0] for cells in table] == [5, 4, 2, 1, 3, 0, 6]
    by_index = {cells[0]: dict(zip(SAMPLE_HEADERS, cells)) for cells in table}
    assert len(table[0]) == len(SAMPLE_HEADERS)
    assert by_index[4] == {"row": 4, "id": "id-4", "category": "colour", "prompt": "prompt 4", "reference": "x",
                           "answer A": "x", "answer B": "y", "A right": "no", "B right": "yes", "agree": "no",
                           "first diff": 0, "KL mean": "0.200", "image tokens": 52, "error": ""}
    assert by_index[5]["error"] == "picture cannot be opened" and by_index[5]["A right"] == "–"
    assert by_index[5]["KL mean"] == "–" and by_index[5]["image tokens"] == ""
    assert by_index[6]["category"] == "shape" and by_index[6]["first diff"] == ""


def test_show_result_fills_every_box_by_name_in_the_endpoints_order(tmp_path):
    config = EvalConfig(a=ArmSpec("hf", label="base"), b=ArmSpec("hf", adapter="demo", label="adapter"),
                        data=str(BUNDLED_DATASET))
    finished = rows()
    result = RunResult(tmp_path, finished, config.summarise(finished, complete=True))
    with gr.Blocks():
        boxes = ResultBoxes(status=gr.Markdown(), aggregate=gr.Dataframe(), equivalence=gr.Markdown(),
                            field_table=gr.Dataframe(), drift_table=gr.Dataframe(), accuracy_plot=gr.Image(),
                            paired_plot=gr.Image(), kl_plot=gr.Image(), divergence_plot=gr.Image(),
                            samples=gr.Dataframe(), export=gr.File(), summary=gr.JSON(), run_state=gr.State())
    assert boxes.components() == [getattr(boxes, name) for name in ENDPOINT_ORDER]
    shown = show_result(boxes, result, config, tmp_path / "evaluation.zip")
    assert list(shown) == boxes.components()  # every box, nothing else
    assert shown[boxes.status].startswith("**Finished**: 7 sample(s), 1 with errors. A = `base`, B = `adapter`.")
    assert [cells[0] for cells in shown[boxes.aggregate]] == ["all", "colour", "shape"]
    assert shown[boxes.equivalence].startswith("**Equivalence**")
    assert not shown[boxes.field_table]["visible"] and not shown[boxes.drift_table]["visible"]
    assert shown[boxes.samples] == sample_rows(finished)
    assert shown[boxes.export] == str(tmp_path / "evaluation.zip")
    assert shown[boxes.summary] == result.summary.to_dict() and shown[boxes.summary]["n"] == 7
    assert shown[boxes.run_state] == {"source": str(BUNDLED_DATASET), "columns": {role: None for role in (
        "image", "prompt", "reference", "category", "id")}, "adapters": [None, "demo"], "out_dir": str(tmp_path)}
    for box, draw in ((boxes.kl_plot, kl_histogram), (boxes.divergence_plot, divergence_histogram)):
        assert np.array_equal(np.asarray(shown[box]), np.asarray(draw(finished)))  # each picture in its own box


@pytest.mark.parametrize("box, value, shown_as", [("limit", 2.5, "Rows"), ("limit", -3, "Rows"),
                                                  ("seed", 1.5, "Shuffle seed"), ("margin", 2, "Equivalence margin"),
                                                  ("discordance", 0, "Assumed share of rows right in one arm only")])
def test_a_refused_number_is_named_as_its_box_is_labelled(box, value, shown_as):
    """The run's numbers are checked before any model loads, each refusal naming the box by the
    words its label begins with, not by the field the settings keep it in."""
    choices = [ArmChoice("app", "hf (the app's model)", ArmSpec("hf", label="hf"))]
    given = {"limit": 2, "seed": -1, "margin": 0.02, "discordance": 0.1, box: value}
    with pytest.raises(G4VError) as refused:
        eval_config(EvalWorkspace(sessions=None), choices, None, "app", "app", BUNDLED, None, ("",) * 5,
                    given["limit"], given["seed"], 16, False, False, given["margin"], given["discordance"])
    assert str(refused.value).startswith(f"{shown_as} must be "), refused.value


def test_a_full_accuracy_bar_ends_inside_the_frame():
    """A bar at 1.00 (the top one, "all") stops short of the axes' right edge and below its top
    edge, so its end and its whisker's cap show instead of running under the frame."""
    from viz.evaluate import ARM_COLOURS, accuracy_figure

    config = EvalConfig(a=ArmSpec("hf", label="base"), b=ArmSpec("hf", adapter="demo", label="adapter"),
                        data=str(BUNDLED_DATASET))
    full = [row(index, agree=True, correct=(True, True), kl=0.0) for index in range(6)]
    pixels = np.asarray(accuracy_figure(config.summarise(full, complete=True)).convert("RGB")).astype(int)
    blue = np.abs(pixels - [int(ARM_COLOURS["a"][i:i + 2], 16) for i in (1, 3, 5)]).sum(axis=2) < 30
    dark = pixels.sum(axis=2) < 150
    spines_x = np.flatnonzero(dark.sum(axis=0) > 0.5 * pixels.shape[0])  # the frame's left and right sides
    spines_y = np.flatnonzero(dark.sum(axis=1) > 0.5 * pixels.shape[1])  # its top and bottom
    bar_rows, bar_columns = np.nonzero(blue)
    assert spines_x.max() - bar_columns.max() >= 8 and bar_rows.min() - spines_y.min() >= 8


def test_the_export_label_names_the_one_zip_and_what_it_holds(tmp_path):
    """The download is one zip: the box's label names that file and each file inside it."""
    import zipfile

    import g4v.evaluate.store as store
    from g4v.evaluate import open_dataset, run_eval
    from webapp.evaluate import EXPORT_LABEL
    from webapp.sessions import SessionStores

    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(BUNDLED_DATASET), limit=2)
    out = tmp_path / "run"
    store.prepare(out, asdict(config))
    writer = store.RowWriter(out)  # rows that failed: a finished run without a model
    writer.write([error_row(open_dataset(config.data).sample(index), "unreadable") for index in range(2)])
    writer.close()
    run_eval(config, out)
    (tmp_path / "sessions").mkdir()
    sessions = SessionStores(tmp_path / "sessions", {"files": 2})
    with sessions.using("visitor") as visitor:
        zipped = EvalWorkspace(sessions).export(out, visitor, "bundled")
    with zipfile.ZipFile(zipped) as archive:
        held = archive.namelist()
    sessions.close()
    assert f"Export: {zipped.name}, one zip of " in EXPORT_LABEL
    assert len(held) == 5 and all(name in EXPORT_LABEL for name in held), (held, EXPORT_LABEL)


@pytest.mark.parametrize("value", [0, 0.0, "0", "", None])
def test_the_rows_box_reads_zero_as_all_however_it_is_sent(value):
    """"Rows (0: all)": an API client's "0" (a number box without precision passes text on) is all
    the rows, as 0 is, never refused as "must be 0 (all) or ..."; any other value is a whole number."""
    from webapp.evaluate_tables import whole_or_none

    assert whole_or_none(value, "Rows", smallest=1, means_none=0, none_reads="all") is None
    assert whole_or_none("12", "Rows", smallest=1, means_none=0, none_reads="all") == 12
    with pytest.raises(G4VError, match=r"^Rows must be 0 \(all\) or a whole number of at least 1, got '-0.5'$"):
        whole_or_none("-0.5", "Rows", smallest=1, means_none=0, none_reads="all")
