"""The Circuits tab's events as a visitor meets them, on the bundled checkpoint: each event of the
tab as built is played here as Gradio plays it (its listeners in the order they were registered,
a refusal's ``.failure`` steps after it), over the boxes' values. A refused run leaves the results
on show, marked as the previous run's; another region marks the reverse results instead of
emptying them; a new picture A empties every view's results; a picture B of another size works, or
is refused in one line when its tiling differs."""

import gradio as gr
import pytest
from PIL import Image

from g4v.paths import EXAMPLES_DIR
from g4v.tiling import plan_tiling
from webapp.circuits import circuits_tab
from webapp.common import PREVIOUS_RUN
from webapp.sessions import SessionStores

EXAMPLE = str(EXAMPLES_DIR / "shapes-wide.png")
#: Each view's run button, its report, and its other result boxes (elem_id).
VIEWS = {"attention": ("circuits-attention-run", "circuits-attention-report",
                       ["circuits-share", "circuits-tiles", "circuits-base", "circuits-attention-export"]),
         "reverse": ("circuits-reverse-run", "circuits-reverse-report",
                     ["circuits-reverse-picture", "circuits-reverse-export"]),
         "knockout": ("circuits-knockout-run", "circuits-knockout-report", ["circuits-knockout-export"]),
         "patch": ("circuits-patch-run", "circuits-patch-report",
                   ["circuits-patch-table", "circuits-patch-picture", "circuits-patch-export"])}
#: A bad value for a box each view reads: the run is refused before the model runs.
REFUSED = {"attention": ("circuits-token", "first"), "reverse": ("circuits-region", "10,10,9999,90"),
           "knockout": ("circuits-window", "wide"), "patch": ("circuits-levels", "no-such-level")}


class Page:
    """The tab's boxes' values by elem_id, and its events played over them."""

    def __init__(self, blocks: gr.Blocks):
        self.blocks = blocks
        self.values = {block.elem_id: getattr(block, "value", None) for block in blocks.blocks.values()
                       if getattr(block, "elem_id", None)}
        self.refusals: list[str] = []

    def fire(self, elem_id: str, event: str) -> None:
        [source] = [block for block in self.blocks.blocks.values() if getattr(block, "elem_id", None) == elem_id]
        for function in list(self.blocks.fns.values()):
            if (source._id, event) in function.targets:
                self.play(function)

    def set(self, elem_id: str, value) -> None:
        """A visitor's edit: the box takes ``value`` and its change fires."""
        self.values[elem_id] = value
        self.fire(elem_id, "change")

    def play(self, function) -> None:
        try:
            shown = function.fn(*[self.values.get(box.elem_id) for box in function.inputs])
            failed = False
        except gr.Error as refusal:
            self.refusals.append(refusal.message)
            failed = True
        if not failed:
            self.show(function.outputs, shown)
        for after in list(self.blocks.fns.values()):
            if after.trigger_after != function._id:
                continue
            if after.trigger_only_on_failure == failed or not (after.trigger_only_on_failure
                                                               or after.trigger_only_on_success):
                self.play(after)  # .failure after a refusal, .success after a run, .then after both

    def show(self, outputs, shown) -> None:
        if isinstance(shown, dict) and all(isinstance(key, gr.components.Component) for key in shown):
            pairs = [(box, shown[box]) for box in outputs if box in shown]
        elif len(outputs) == 1:
            pairs = [(outputs[0], shown)]
        else:
            pairs = list(zip(outputs, shown, strict=True))
        for box, value in pairs:
            if not (isinstance(value, dict) and value.get("__type__") == "update"):  # gr.skip(): keeps what it shows
                self.values[box.elem_id] = value


@pytest.fixture
def page(hf_engine, tmp_path):
    (tmp_path / "sessions").mkdir()
    sessions = SessionStores(tmp_path / "sessions", {"inspect": 8})
    with gr.Blocks() as blocks:
        circuits_tab(hf_engine, gr.State(None), sessions)
    shown = Page(blocks)
    shown.values.update({"circuits-image": EXAMPLE, "circuits-image-b": EXAMPLE, "circuits-layers": "2-3",
                         "circuits-region": "10,10,120,90", "circuits-answer-tokens": 2, "circuits-new-tokens": 2,
                         "circuits-patch-tokens": 2, "circuits-levels": "0"})
    yield shown
    sessions.close()


def results(page: Page, view: str) -> list:
    _, report, others = VIEWS[view]
    return [page.values[report], *(page.values[box] for box in others)]


def run(page: Page, view: str) -> None:
    page.fire(VIEWS[view][0], "click")


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.slow  # about 5 s on a quiet 2-core machine
def test_a_refused_run_keeps_the_results_marked_as_the_previous_runs(page, view):
    run(page, view)
    assert not page.refusals
    report, *others = before = results(page, view)
    assert report and not report.startswith(PREVIOUS_RUN) and all(value is not None for value in others)
    box, bad = REFUSED[view]
    page.set(box, bad)
    run(page, view)
    assert len(page.refusals) == 1 and "\n" not in page.refusals[0]
    after = results(page, view)
    assert after[0] == f"{PREVIOUS_RUN}\n\n{report}"  # marked once, the old report under it
    assert after[1:] == before[1:]  # the rest as it was
    page.set(box, {"attention": "", "reverse": "10,10,120,90", "knockout": "", "patch": "0"}[view])
    run(page, view)  # a good run again: its own results, unmarked
    assert not results(page, view)[0].startswith(PREVIOUS_RUN)


def test_another_region_marks_the_reverse_results_instead_of_emptying_them(page):
    run(page, "reverse")
    report, picture, files = results(page, "reverse")
    page.set("circuits-region", "0,0,30,30")
    assert results(page, "reverse") == [f"{PREVIOUS_RUN}\n\n{report}", picture, files]


@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_a_new_picture_a_empties_every_views_results(page):
    for view in VIEWS:
        run(page, view)
    assert not page.refusals and all(results(page, view)[0] for view in VIEWS)
    page.set("circuits-image", str(EXAMPLES_DIR / "shapes-square.png"))
    for view in VIEWS:
        assert all(value in (None, "", []) for value in results(page, view)), view


def test_picture_b_of_another_size_patches_or_is_one_line(page, hf_engine, tmp_path):
    """B a few pixels smaller than A with A's tiling: patched (both directions); B with another
    tiling: one line naming both layouts, A's results kept."""
    config = hf_engine.model.config
    a = Image.open(EXAMPLE)
    smaller = a.resize((a.width - 9, a.height - 7))
    assert plan_tiling((smaller.height, smaller.width), config).grid == plan_tiling((a.height, a.width), config).grid
    smaller.save(tmp_path / "smaller.png")
    page.set("circuits-image-b", str(tmp_path / "smaller.png"))
    run(page, "patch")
    assert not page.refusals
    rows = page.values["circuits-patch-table"]
    assert {row[0] for row in rows} == {"A with B's features", "B with A's features"}
    tall = str(EXAMPLES_DIR / "shapes-tall.png")
    assert plan_tiling(Image.open(tall).size[::-1], config).grid != plan_tiling((a.height, a.width), config).grid
    page.set("circuits-image-b", tall)
    run(page, "patch")
    [refusal] = page.refusals
    assert "\n" not in refusal and refusal.startswith("pictures A and B do not share a token layout (A tiles")
