"""The words a new user reads (issue 31's walk, hardening 2): what the deletion test's number means,
and the trained checkpoints' banner, written as plain sentences. Plain functions, no model."""

from dataclasses import replace

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from g4v.attribution.deletion import DeletionCurve, area_between, describe_area

FRACTIONS = [0.0, 0.1, 0.5, 1.0]
RANDOM_MEAN = [-1.0, -1.5, -2.0, -3.0]
ATTRIBUTED = [-1.0, -2.5, -4.0, -3.0]


def curve() -> DeletionCurve:
    return DeletionCurve(level=None, ranking="positive", fractions=FRACTIONS, attributed=ATTRIBUTED,
                         random=[RANDOM_MEAN] * 2, random_mean=RANDOM_MEAN,
                         area_between=area_between(FRACTIONS, RANDOM_MEAN, ATTRIBUTED))


def test_area_between_is_the_trapezoid_area_between_the_random_mean_and_the_attributed_curve():
    # By hand: gaps 0, 1, 2, 0 over widths 0.1, 0.4, 0.5 -> 0.05 + 0.6 + 0.5
    assert curve().area_between == pytest.approx(1.15)


def test_the_deletion_result_says_what_the_area_between_means():
    """Issue 31 (hardening 2): "area between random and attributed 1.15" named no curve and no unit.
    The sentence the tab and the CLI print says what the number is and what its sign means."""
    text = describe_area(curve(), "log-probability")
    assert text == ("deletion test (all levels): area between the curves 1.15, i.e. how much further the "
                    "target's log-probability falls when the image tokens the map ranks first are removed than "
                    "when random ones are (the random mean minus the attributed curve, summed over the share "
                    "removed by the trapezoid rule); above 0 the map beats chance: here it beats random removal.")
    worse = replace(curve(), area_between=-0.2, level="deepstack1")
    assert describe_area(worse, "log-odds").endswith("here it does not beat random removal.")
    assert "(deepstack1)" in describe_area(worse, "log-odds") and "target's log-odds falls" in describe_area(worse, "log-odds")


def test_the_tab_report_says_it_in_the_same_words():
    from webapp.attribution import report_markdown

    from g4v.attribution.forward import Answer
    from g4v.attribution.gradients import Attribution
    from g4v.attribution.run import AttributionReport
    from g4v.model.levels import Level

    answer = Answer(torch.zeros(1, 3, dtype=torch.long), [7], ["red"], None)
    attribution = Attribution("gradxinput", [Level(0, "deepstack0", "deepstack", -1, 27, 0)], torch.tensor([[0.1]]), -0.5)
    report = report_markdown(AttributionReport(None, "?", (8, 8), False, answer, attribution, curve(), None, None,
                                               None, None))
    assert report.startswith("**Answer:** `red`\n\n**Explained:** the whole answer 'red', log-probability -0.5")
    assert "deepstack0 +0.1" in report
    contrast = replace(answer, alternatives=[[8]], alternative_texts=["blue"])  # with --against: a log-odds
    contrasted = report_markdown(AttributionReport(None, "?", (8, 8), False, contrast, attribution, curve(), None,
                                                   None, None, None))
    assert "log-odds -0.5" in contrasted and "log-prob" not in contrasted
    assert ("**Deletion test (all levels):** area between the curves 1.15, i.e. how much further the target's "
            "log-probability falls") in report


def test_the_deletion_figure_title_says_what_the_area_is(monkeypatch):
    from viz import attribution as va

    drawn = []
    real = va.figure_to_image
    monkeypatch.setattr(va, "figure_to_image", lambda figure, **kw: drawn.append(figure) or real(figure, **kw))
    va.deletion_figure(curve())
    figure: Figure = drawn[0]
    title = figure.axes[0].title
    assert title.get_text() == ("Deletion test: area between the curves 1.15\n(random mean minus top-k, over the "
                                "share removed; above 0: the map beats chance)")
    renderer = FigureCanvasAgg(figure).get_renderer()
    assert title.get_window_extent(renderer).width <= figure.bbox.width  # the title fits: the page shrinks nothing


def test_the_trained_checkpoints_banners_are_plain_sentences():
    """Issue 31 (hardening 2): the banner read "Its document stages, which also read ... and fills
    ..., runs with": now each checkpoint's banner says what it does in whole sentences."""
    from g4v.paths import DOCUMENTS_MODEL_DIR, TRAINED_MODEL_DIR
    from webapp.layout import banner

    trained, documents = banner(str(TRAINED_MODEL_DIR)), banner(str(DOCUMENTS_MODEL_DIR))
    assert ("It answers questions about the colour, kind, position and number of simple shapes, and little else. "
            "The same checkpoint trained further on documents also reads synthetic bar charts into CSV (the Chart "
            "to CSV task) and fills a JSON schema about the shapes (the key-value extraction task). To use it, run "
            f"`python app.py --model assets/{DOCUMENTS_MODEL_DIR.name}`. ") in trained
    assert ("It answers questions about the colour, kind, position and number of simple shapes. Its document "
            "stages taught it two more tasks: it reads synthetic bar charts into CSV (the Chart to CSV task) and "
            "fills a JSON schema about the shapes (the key-value extraction task). It does little else. ") in documents


def test_another_models_banner_names_its_folder_not_the_servers_path(tmp_path):
    """A model outside the bundled ones is named by its folder (as exports name it), a hub id as it is:
    the page never shows where the server keeps its files."""
    from webapp.layout import banner

    folder = tmp_path / "private" / "my-granite"
    folder.mkdir(parents=True)
    assert banner(str(folder)) == "Model: `my-granite`"
    assert str(tmp_path) not in banner(str(folder))
    assert banner("ibm-granite/granite-vision-4.1-4b") == "Model: `ibm-granite/granite-vision-4.1-4b`"
