"""The Circuits tab's handlers (webapp.circuits), called as Gradio calls them, on the bundled
checkpoint: each view's exported JSON equals the library's own result for the same input, the
region picker turns two clicks into a region, and bad input is one clear line each."""

import json
import re
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from g4v.circuits.attention import image_attention
from g4v.circuits.common import CircuitSettings
from g4v.circuits.knockout import WHY_LITTLE_CHANGES, KnockoutResult, attention_knockout
from g4v.circuits.patching import patch_levels
from g4v.circuits.reverse import RegionAttention, region_attention
from g4v.loading import load_config
from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR
from g4v.tiling import plan_tiling
from tests.conftest import make_image
from webapp.circuits import circuits_tab, make_handlers
from webapp.circuits_picker import pick_corner, show_region
from webapp.sessions import SessionStores

EXAMPLE = str(EXAMPLES_DIR / "shapes-wide.png")
PROMPT = "What shape is green?"


@pytest.fixture(scope="module")
def handlers(hf_engine, tmp_path_factory):
    """The four handlers on the tab's own result boxes, each giving its values as its endpoint
    does: in the order of its view's boxes, after checking it filled every box and nothing else."""
    sessions = SessionStores(tmp_path_factory.mktemp("sessions"), {"inspect": 8})
    with gr.Blocks():
        boxes = circuits_tab(None, gr.State(None), sessions)

    def in_endpoint_order(handler, view):
        def call(*arguments):
            shown = handler(*arguments)
            assert set(shown) == set(view.components()) and len(shown) == len(view.components())
            return [shown[box] for box in view.components()]
        return call

    yield [in_endpoint_order(handler, view)
           for handler, view in zip(make_handlers(hf_engine, sessions, lambda fn: fn, boxes), boxes.views(), strict=True)]
    sessions.close()


def exported(files: list[str], name: str) -> dict:
    path = next(path for path in files if path.endswith(name))
    with open(path) as handle:
        return json.load(handle)


def same_numbers(got, want) -> None:
    """Nested lists and dicts equal, numbers to 1e-6."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for key in want:
            same_numbers(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same_numbers(a, b)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-6)
    else:
        assert got == want


def test_attention_view_exports_the_library_result(handlers, hf_engine):
    attention, _, _, _ = handlers
    report, share, tiles, base, files, kept = attention(EXAMPLE, PROMPT, "2-5", "")
    expected = image_attention(hf_engine, EXAMPLE, PROMPT, CircuitSettings(layers="2-5")).to_dict()
    same_numbers(exported(files, "attention.json"), expected)
    assert sorted(path.rsplit("/", 1)[1] for path in files) == sorted(
        ["attention.json", "image_share.png", "attention_tiles.png", "attention_base.png"])
    assert f"| 2 | {expected['image_share'][0]:.3f} |" in report
    assert all(picture.width > 300 for picture in (share, tiles, base))


def test_reverse_view_exports_the_library_result(handlers, hf_engine):
    _, reverse, _, _ = handlers
    report, picture, files = reverse(EXAMPLE, PROMPT, "all", "10,10,120,90", 3)
    settings = CircuitSettings(box="10,10,120,90", max_new_tokens=3)
    expected = region_attention(hf_engine, EXAMPLE, PROMPT, settings).to_dict()
    same_numbers(exported(files, "reverse.json"), expected)
    top = expected["top_text_tokens"][0]
    assert f"| {top['position']} |" in report and picture.width > 300


def test_knockout_exports_the_library_result(handlers, hf_engine):
    _, _, knockout, _ = handlers
    report, files = knockout(EXAMPLE, PROMPT, "all", "1", 4)
    expected = attention_knockout(hf_engine, EXAMPLE, PROMPT, CircuitSettings(window=1, max_new_tokens=4))
    same_numbers(exported(files, "knockout.json"), expected.to_dict())
    assert f"{expected.logprob_after:.4f}" in report
    assert (WHY_LITTLE_CHANGES in report) == expected.barely_changed


def knockout_result(change: float, top_after: str, answer: str = "re", continuation_before: str = "red",
                    continuation_after: str | None = None, layers=tuple(range(9)), position: int = 155) -> KnockoutResult:
    after = continuation_after if continuation_after is not None else "red" if top_after == "re" else "blue"
    return KnockoutResult(layers=list(layers), injection_layers={}, answer_position=position, answer_token_id=0,
                          answer_token=answer, logprob_before=-0.0787, logprob_after=-0.0787 + change,
                          top_token_after=top_after, continuation_before=continuation_before, continuation_after=after,
                          continuation_ids_before=[], continuation_ids_after=[])


@pytest.mark.parametrize("change, top_after, said", [(0.0066, "re", True), (-0.0155, "re", True),
                                                     (-0.5, "re", False), (-0.05, "b", False), (-3.86, "b", False)])
def test_knockout_report_says_why_a_small_change_can_be(change, top_after, said):
    """9 of 10 layers knocked out, +0.0066, the same answer: the report says in one sentence that
    only the answer positions were blocked (the prompt's text tokens still read the image and carry
    it on); a knockout that moved the answer or its log-probability does not get it."""
    from webapp.circuits import knockout_report

    report = knockout_report(knockout_result(change, top_after))
    assert (WHY_LITTLE_CHANGES in report.splitlines()) == said, report


def test_the_docs_give_the_knockout_sentence_as_written():
    """docs/circuits.md gives the sentence the report and the command print, word for word."""
    from g4v.paths import REPO_ROOT

    docs = " ".join((REPO_ROOT / "docs" / "circuits.md").read_text().split())
    assert WHY_LITTLE_CHANGES in docs


@pytest.fixture(scope="module")
def pictures_ab(tmp_path_factory):
    """Two pictures of one size (so one tiling grid) and one of another, as uploaded files."""
    folder = tmp_path_factory.mktemp("pictures")
    paths = {}
    for name, (width, height, seed) in {"a": (300, 140, 1), "b": (300, 140, 2), "tall": (140, 400, 3)}.items():
        paths[name] = str(folder / f"{name}.png")
        make_image(width, height, seed).save(paths[name])
    return paths


@pytest.mark.slow  # about 9 s on a quiet 2-core machine
def test_patching_exports_the_library_result(handlers, hf_engine, pictures_ab):
    from g4v.images import open_image

    *_, patch = handlers
    report, rows, picture, files = patch(pictures_ab["a"], pictures_ab["b"], PROMPT, "deepstack0,spatial_TL",
                                         "a_from_b", "tokens:0-30", 2)
    settings = CircuitSettings(levels="deepstack0,spatial_TL", direction="a_from_b", region="tokens:0-30",
                               max_new_tokens=2)
    expected = patch_levels(hf_engine, open_image(pictures_ab["a"]), open_image(pictures_ab["b"]), PROMPT,
                            settings).to_dict()
    same_numbers(exported(files, "patching.json"), expected)
    runs = expected["directions"][0]["levels"]
    assert [row[1] for row in rows] == ["deepstack0", "spatial_TL", "all levels"]
    assert [row[2] for row in rows[:2]] == [round(run["logodds"], 3) for run in runs]
    assert "31 of" in report and picture.width > 300

    _, rows, _, files = patch(pictures_ab["a"], pictures_ab["b"], PROMPT, "deepstack0", "b_from_a", "all", 0, True)
    expected = patch_levels(hf_engine, open_image(pictures_ab["a"]), open_image(pictures_ab["b"]), PROMPT,
                            CircuitSettings(levels="deepstack0", direction="b_from_a", max_new_tokens=0,
                                            complement=True)).to_dict()
    same_numbers(exported(files, "patching.json"), expected)
    assert [row[1] for row in rows] == [run["label"] for run in expected["directions"][0]["levels"]] + ["all levels"]


def test_two_clicks_on_the_picker_make_a_region():
    """The picker shows the picture scaled to its box (580 px on the longer side; the example is
    239 x 127 px, which sat small in a corner at its own size), and a click, which Gradio gives in
    the shown picture's pixels, is the picture pixel under it."""
    from PIL import Image

    width, height = Image.open(EXAMPLE).size
    shown = show_region(EXAMPLE, "").size
    assert max(shown) == 580 and abs(shown[0] / shown[1] - width / height) < 0.01
    scale_x, scale_y = shown[0] / width, shown[1] / height
    assert scale_x > 2  # scaled up: a picture pixel is more than two shown pixels wide

    def click_on(x, y):
        """A click at the middle of picture pixel (x, y), in the shown picture's pixels."""
        return gr.SelectData(None, {"index": [int((x + 0.5) * scale_x), int((y + 0.5) * scale_y)], "value": None})

    region, picture = pick_corner(EXAMPLE, "", click_on(100, 70))
    assert region == "100,70" and picture.size == shown
    region, picture = pick_corner(EXAMPLE, region, click_on(20, 10))
    assert region == "20,10,101,71" and picture.size == shown
    assert show_region(EXAMPLE, region).size == shown
    # the edges: a click on the first and on the last shown pixel is the first and last picture pixel
    corner = lambda x, y: gr.SelectData(None, {"index": [x, y], "value": None})  # noqa: E731
    assert pick_corner(EXAMPLE, "", corner(0, 0))[0] == "0,0"
    assert pick_corner(EXAMPLE, "", corner(shown[0] - 1, shown[1] - 1))[0] == f"{width - 1},{height - 1}"
    # every picture pixel along a row is reached by a click on the shown pixel at its middle
    assert [pick_corner(EXAMPLE, "", click_on(x, 5))[0] for x in range(width)] == [f"{x},5" for x in range(width)]


def test_the_picker_draws_what_each_click_wrote_from_the_text_alone():
    """The picker redraws from the region's box on every change of it (a paste included), the
    clicks' own text too: drawn from that text alone, the picture is the one the click drew, the
    first corner marked as well as the region framed, so a click's redraw never undoes it."""
    import numpy as np

    from viz.circuits import region_overlay
    from g4v.images import open_image
    from webapp.circuits_picker import show_new_picture

    shown = show_region(EXAMPLE, "").size
    corner = lambda x, y: gr.SelectData(None, {"index": [x, y], "value": None})  # noqa: E731
    first_text, first_picture = pick_corner(EXAMPLE, "", corner(300, 200))
    region_text, region_picture = pick_corner(EXAMPLE, first_text, corner(40, 30))
    assert np.array_equal(np.asarray(show_new_picture(EXAMPLE, first_text)), np.asarray(first_picture))
    assert np.array_equal(np.asarray(show_new_picture(EXAMPLE, region_text)), np.asarray(region_picture))
    # independently: the corner's mark and the region's frame as the picture module draws them
    picture = open_image(EXAMPLE)
    x, y = map(int, first_text.split(","))
    assert np.array_equal(np.asarray(first_picture), np.asarray(region_overlay(picture, point=(x, y))))
    assert np.array_equal(np.asarray(show_new_picture(EXAMPLE, " 12, 7 ")),
                          np.asarray(region_overlay(picture, point=(12, 7))))
    # a corner past the picture, or two numbers that are no corner, show the picture unframed
    plain = np.asarray(region_overlay(picture))
    for text in ("239,5", "5,127", "-1,5", "1.5,2", "5"):
        assert np.array_equal(np.asarray(show_new_picture(EXAMPLE, text)), plain), text
    assert show_new_picture(EXAMPLE, "12,7").size == shown


def test_the_picker_frames_the_region_where_it_is():
    """The frame is drawn at the region's place in the scaled picture: the pixels just inside the
    region are undimmed and those outside are dimmed, measured against the picture scaled alone."""
    import numpy as np

    from viz.circuits import picker_size
    from viz.figures import shown_picture
    from g4v.images import open_image

    picture = open_image(EXAMPLE)
    size = picker_size(picture.size)
    plain = np.asarray(shown_picture(picture, size), dtype=float)
    framed = np.asarray(show_region(EXAMPLE, "40,30,120,90"), dtype=float)
    scale_x, scale_y = size[0] / picture.width, size[1] / picture.height
    inside = framed[round(60 * scale_y), round(80 * scale_x)] - plain[round(60 * scale_y), round(80 * scale_x)]
    outside = framed[round(10 * scale_y), round(10 * scale_x)] - plain[round(10 * scale_y), round(10 * scale_x)]
    assert np.abs(inside).max() < 1 and outside.max() < -5  # outside darkened, inside as it was


#: (view, arguments after the image and prompt, words of the one line). The image and prompt are
#: EXAMPLE and PROMPT unless the case gives its own (a leading None or text).
BAD = [
    ("attention", ["5-2", ""], "empty"),
    ("attention", ["0-10", ""], "out of range"),  # the bundled model has layers 0-9
    ("attention", ["0-99999999999999999999", ""], "out of range"),  # a huge range
    ("attention", ["9" * 5000, ""], "5,000 characters"),  # a huge number, refused by its length
    ("attention", ["two", ""], "layers are written"),
    ("attention", [7, ""], "layers must be text"),
    ("attention", ["all", "100000"], "past the prompt"),
    ("attention", ["all", "-100000"], "past the prompt"),
    ("attention", ["all", "1.5"], "token position must be a whole number"),
    ("attention", ["all", "first"], "token position must be a whole number"),
    ("reverse", ["all", "", 3], "needs a region"),
    ("reverse", ["all", "1,2,3", 3], "four numbers"),
    ("reverse", ["all", "0,0,5000,10", 3], "^the region 0,0,5000,10 reaches past the picture, which is 239 x 127 px"),
    ("reverse", ["all", "239,0,300,10", 3], "^the region 239,0,300,10 is outside the picture, which is 239 x 127 px"),
    ("reverse", ["all", "30,10,20,40", 3], "is empty"),
    ("reverse", ["all", "a,b,c,d", 3], "numbers of pixels"),
    ("reverse", ["all", "0,0,10,10", -1], "^the number of answer tokens must be a whole number >= 0, got -1$"),
    ("reverse", ["all", "0,0,10,10", 2.5], "^the number of answer tokens must be a whole number"),
    ("knockout", ["all", "1000", 4], "^a window of 1000 layers is larger than this model's 10 layers: empty the box "
                                     "'Window' and type all in 'Layers' to cover every layer$"),  # the app's wording, no flag
    ("knockout", ["all", "-1", 4], "whole number"),
    ("knockout", ["2-3", "1", 4], "not both"),
    ("knockout", ["all", "", 10**9], r"^the prompt \(\d+ tokens\) and the 1,000,000,000 new tokens asked for are too long "
                                       r"for the context window of \d[\d,]* tokens$"),
    ("knockout", ["all", "", float("nan")], "^the number of answer tokens must be a finite number"),
]
NO_PICTURE = [("attention", [None, PROMPT, "all", ""], "need an image"),
              ("knockout", [str(EXAMPLES_DIR / "examples.json"), PROMPT, "all", "", 2], "not an image"),
              ("attention", [EXAMPLE, "   ", "all", ""], "prompt is empty"),
              ("reverse", [EXAMPLE, "What is <image> here?", "all", "0,0,10,10", 2], "image placeholder"),
              ("patch", [EXAMPLE, None, PROMPT, "all", "both", "all", 2], "needs picture B"),
              ("patch", ["TALL", "A", PROMPT, "all", "both", "all", 2], "do not share a token layout"),
              ("patch", ["A", "B", PROMPT, "deepstack9", "both", "all", 2], "level"),
              ("patch", ["A", "B", PROMPT, "all", "sideways", "all", 2], "unknown direction"),
              ("patch", ["A", "B", PROMPT, "all", "both", "tokens:0-99999999999999999999", 2], "out of range"),
              ("patch", ["A", "B", PROMPT, "all", "both", "box:0,0,100000,100000", 2], "reaches past picture A"),
              ("patch", ["A", "B", PROMPT, "all", "both", "all", 2, "yes"], "complement is true or false")]


def refusal(handlers, view: str, arguments: list) -> str:
    handler = dict(zip(("attention", "reverse", "knockout", "patch"), handlers))[view]
    with pytest.raises(gr.Error) as err:
        handler(*arguments)
    return err.value.message


@pytest.mark.parametrize("view, arguments, words", BAD + NO_PICTURE,
                         ids=[f"{view}-{i}" for i, (view, _, _) in enumerate(BAD + NO_PICTURE)])
def test_bad_input_is_one_clear_line(handlers, pictures_ab, view, arguments, words):
    named = {"A": pictures_ab["a"], "B": pictures_ab["b"], "TALL": pictures_ab["tall"]}
    full = arguments if (view, arguments, words) in NO_PICTURE else [EXAMPLE, PROMPT, *arguments]
    full = [named.get(value, value) if isinstance(value, str) else value for value in full]
    message = refusal(handlers, view, full)
    assert re.search(words, message), message
    assert "\n" not in message and "Traceback" not in message and "/tmp" not in message and "/work" not in message
    assert len(message) < 300, message


def test_a_new_picture_is_shown_in_the_picker_never_refused(tmp_path):
    """A region typed for the picture before is not refused when a smaller one comes (it is framed
    once it fits); a file that is not a picture leaves the picker empty (the upload's own toast
    says why): no second toast."""
    from webapp.circuits_picker import show_new_picture

    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture")
    assert show_new_picture(str(fake), "") is None
    shown = show_new_picture(EXAMPLE, "0,0,5000,5000")
    assert shown.size == show_region(EXAMPLE, "").size
    with pytest.raises(gr.Error) as refusal:
        show_region(EXAMPLE, "0,0,5000,5000")  # typed and entered: said
    assert refusal.value.message == "the region 0,0,5000,5000 reaches past the picture, which is 239 x 127 px (width x height)"


def test_report_tables_keep_a_token_with_a_bar_in_its_cell():
    """A token such as ``<|end_of_text|>`` in a report table: its bars are escaped, so every row
    keeps its four cells (an unescaped bar had split the cell and broken the row)."""
    from webapp.circuits import knockout_report, reverse_report

    texts = ["<|end_of_text|>", "a|b", "`"]
    plan = plan_tiling((140, 300), load_config(BUNDLED_MODEL_DIR))
    tile = next(token.index for token in plan.tokens if token.kind == "tile")
    reverse = RegionAttention(region=(0, 0, 4, 4), layers=[0, 1], injection_layers={}, region_token_indices=[tile],
                              region_positions=[9], text_positions=[0, 1, 2], text_tokens=texts, answer_start=2,
                              weights=torch.full((2, 3), 0.5), by_kind={}, plan=plan)
    knockout = knockout_result(-1.0, "|", answer="<|x|>", continuation_before="a|b",
                               continuation_after="<|end_of_text|>", layers=[1], position=3)
    for report in (reverse_report(reverse), knockout_report(knockout)):
        rows = [line for line in report.splitlines() if line.startswith("|")]
        assert rows and all(len(re.split(r"(?<!\\)\|", row)) == 6 for row in rows), report


#: Each view's result boxes (elem_id), which a new input must empty.
RESULTS = {"attention": ["circuits-attention-report", "circuits-share", "circuits-tiles", "circuits-base",
                         "circuits-attention-export"],
           "reverse": ["circuits-reverse-report", "circuits-reverse-picture", "circuits-reverse-export"],
           "knockout": ["circuits-knockout-report", "circuits-knockout-export"],
           "patch": ["circuits-patch-report", "circuits-patch-table", "circuits-patch-picture", "circuits-patch-export"]}


@pytest.fixture(scope="module")
def tab(tmp_path_factory):
    """The tab as the app builds it (no handler runs the model here)."""
    sessions = SessionStores(tmp_path_factory.mktemp("tab-sessions"), {"inspect": 8})
    with gr.Blocks() as page:
        circuits_tab(None, gr.State(None), sessions)
    yield page
    sessions.close()


@pytest.mark.parametrize("view", list(RESULTS))
def test_each_endpoint_keeps_its_outputs_in_order(tab, view):
    """API clients read a view's results by position: ``/circuits_<view>`` gives its boxes in the
    order of :data:`RESULTS`, whatever order the handler fills them in (a ``gr.State`` the tab
    keeps for itself is no API result)."""
    [event] = [function for function in tab.fns.values() if function.api_name == f"circuits_{view}"]
    assert [box.elem_id for box in event.outputs if not isinstance(box, gr.State)] == RESULTS[view]


def emptied_by(page, elem_id: str, event: str) -> dict:
    """elem_id -> the value each box gets when the ``event`` of box ``elem_id`` fires (every
    listener of it called as Gradio calls one with no inputs; each value must pass the box's own
    postprocess, as Gradio sends it)."""
    [source] = [block for block in page.blocks.values() if getattr(block, "elem_id", None) == elem_id]
    values = {}
    for function in page.fns.values():
        if (source._id, event) in function.targets and not function.inputs:
            result = function.fn()  # by box, or (a single output) the value itself
            for box, value in result.items() if isinstance(result, dict) else zip(function.outputs, [result]):
                box.postprocess(value)
                values[box.elem_id] = value
    return values


def is_empty(value) -> bool:
    return value is None or value == "" or value == []


@pytest.mark.parametrize("elem_id, views", [("circuits-image", list(RESULTS)), ("circuits-image-b", ["patch"]),
                                            ("circuits-region", [])])
def test_a_new_input_empties_the_results_it_made_old(tab, elem_id, views):
    """A new picture (upload, "Use the last chat image", a PDF page: each sets the box, so its
    change fires) empties every view's results; a new picture B empties patching's only; another
    region empties none: the reverse results stay, marked as the previous run's
    (tests/test_circuits_refusals.py), so a region the run refuses does not take them away."""
    values = emptied_by(tab, elem_id, "change")
    wanted = [box for view in views for box in RESULTS[view]]
    assert sorted(box for box in values if box in sum(RESULTS.values(), [])) == sorted(wanted)
    assert all(is_empty(values[box]) for box in wanted), values


def test_the_head_picker_redraws_the_maps_for_one_head(handlers):
    """After a run the picker offers the mean and every head; a head's maps are drawn from that
    head's weights (kept from the run, no model pass), the mean's are the run's own maps."""
    from viz.circuits import attention_map_figure
    from webapp.circuits import ALL_HEADS, head_choices, head_maps
    from g4v.images import open_image

    attention, _, _, _ = handlers
    _, _, tiles, base, _, kept = attention(EXAMPLE, PROMPT, "2-3", "")
    result = kept[1]
    choices = head_choices(kept)
    assert choices["choices"] == [ALL_HEADS, *(f"head {h}" for h in range(result.num_heads))]
    picture = open_image(EXAMPLE)
    boxes = SimpleNamespace(tiles="tiles", base="base")  # the handler's results, by box
    redraw = head_maps(boxes)
    mean_tiles, mean_base = redraw(kept, ALL_HEADS)["tiles"], redraw(kept, ALL_HEADS)["base"]
    assert list(mean_tiles.getdata()) == list(tiles.getdata()) and list(mean_base.getdata()) == list(base.getdata())
    one, other = redraw(kept, "head 0")["tiles"], redraw(kept, f"head {result.num_heads - 1}")["tiles"]
    assert list(one.getdata()) == list(attention_map_figure(picture, result, "tile", 0).getdata())
    assert list(one.getdata()) != list(other.getdata()) != list(tiles.getdata())
    assert result.maps(0)[0] != result.maps()[0]  # a head is not the mean
