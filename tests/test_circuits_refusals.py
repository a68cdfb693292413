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
from webapp.runs import PREVIOUS_RUN
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


def key(block):
    """A box's key in :attr:`Page.values`: its elem_id, or for a state (which has none) its id."""
    return getattr(block, "elem_id", None) or block._id


class Page:
    """The tab's boxes' values by elem_id (states by id), and its events played over them."""

    def __init__(self, blocks: gr.Blocks):
        self.blocks = blocks
        self.values = {key(block): getattr(block, "value", None) for block in blocks.blocks.values()}
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

    def type(self, elem_id: str, value) -> None:
        """A visitor typing ``value`` into a box, Enter not pressed: its change, then its input fire
        (Gradio's order for an edit by hand; a value set by an event fires only the change)."""
        self.set(elem_id, value)
        self.fire(elem_id, "input")

    def play(self, function) -> None:
        try:
            shown = function.fn(*[self.values.get(key(box)) for box in function.inputs])
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
                self.values[key(box)] = value


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


def test_the_picker_frames_the_region_a_run_reads_typed_without_enter(page):
    """Two clicks framed 48,25,108,89; 20,20,100,100 typed over it, Enter not pressed, and the run:
    the report names 20,20,100,100 and the picker frames it, pixel for pixel as the picker's own
    drawing of that region (it kept the clicked box: only Enter or a click redrew it). Half typed
    or reaching past the edge, the picture is shown unframed, with no toast: the run says why."""
    import numpy as np

    from g4v.images import open_image
    from viz.circuits import region_overlay

    picture = open_image(EXAMPLE)
    drawn = lambda box=None: np.asarray(region_overlay(picture, box))  # noqa: E731
    page.values.update({"circuits-region": "48,25,108,89", "circuits-region-picker": region_overlay(picture,
                                                                                                    (48, 25, 108, 89))})
    page.type("circuits-region", "20,20,100,1")
    assert np.array_equal(np.asarray(page.values["circuits-region-picker"]), drawn()) and not page.refusals
    page.type("circuits-region", "20,20,100,100")
    run(page, "reverse")
    assert not page.refusals
    assert page.values["circuits-reverse-report"].startswith("**Region** 20,20,100,100: ")
    assert np.array_equal(np.asarray(page.values["circuits-region-picker"]), drawn((20, 20, 100, 100)))
    assert not np.array_equal(drawn((20, 20, 100, 100)), drawn((48, 25, 108, 89)))
    page.type("circuits-region", "0,0,200,200")
    assert np.array_equal(np.asarray(page.values["circuits-region-picker"]), drawn()) and not page.refusals


def test_the_picker_dims_all_around_the_region_evenly():
    """The picker dims what lies outside the region; its four veils overlapped on their edge rows,
    which drew darker lines across the whole picture at the region's top and bottom. Now a grey
    picture is one grey outside the frame (the grey under black at 90/255) and its own inside."""
    import numpy as np

    from viz.circuits import picker_size, region_overlay

    grey = 200
    shown = np.asarray(region_overlay(Image.new("RGB", (400, 300), (grey,) * 3), (100, 100, 200, 200))).astype(int)
    width, height = picker_size((400, 300))
    scale = width / 400
    ys, xs = np.mgrid[:height, :width]
    near = lambda a, b: (a >= b[0] * scale - 6) & (a <= b[1] * scale + 6)  # noqa: E731
    # the red frame and a few pixels either side of it: the frame's own sides, not whole rows
    frame = ((near(xs, (100, 100)) | near(xs, (200, 200))) & near(ys, (100, 200))) | \
            ((near(ys, (100, 100)) | near(ys, (200, 200))) & near(xs, (100, 200)))
    inside = (xs > 100 * scale) & (xs < 200 * scale) & (ys > 100 * scale) & (ys < 200 * scale)
    dimmed = round(grey * (1 - 90 / 255))
    assert np.unique(shown[~inside & ~frame]).tolist() == pytest.approx([dimmed], abs=1)
    assert np.unique(shown[inside & ~frame]).tolist() == [grey]


@pytest.mark.parametrize("box, said", [("0,0,200,200", "reaches past"), ("0,0,99999,99999", "reaches past"),
                                       ("239,0,300,50", "is outside"), ("-20,-20,0,0", "is outside")])
def test_a_region_past_the_edge_is_named_as_such_in_one_line(page, box, said):
    """shapes-wide.png is 239 x 127 px: a region that overlaps it but reaches past its edge is refused
    as reaching past it (it was called outside the picture, which it is not), one that misses it
    as outside it, each naming the picture's size, on Enter and on a run, as patching's boxes are."""
    line = f"the region {box} {said} the picture, which is 239 x 127 px (width x height)"
    page.type("circuits-region", box)
    page.fire("circuits-region", "submit")
    run(page, "reverse")
    assert page.refusals == [line, line]


def test_patchings_boxes_follow_the_same_rule():
    """One rule for both views' boxes (g4v.circuits.common.check_on_picture): past picture A's edge,
    or off it."""
    from g4v.circuits.patching import region_tokens
    from g4v.errors import G4VError
    from g4v.loading import load_config
    from g4v.paths import BUNDLED_MODEL_DIR

    plan = plan_tiling((127, 239), load_config(BUNDLED_MODEL_DIR))
    for box, said in (("0,0,9999,9999", "reaches past"), ("300,0,400,50", "is outside")):
        with pytest.raises(G4VError) as refusal:
            region_tokens(f"box:{box}", plan)
        assert str(refusal.value) == f"the box {box} {said} picture A, which is 239 x 127 px (width x height)"
