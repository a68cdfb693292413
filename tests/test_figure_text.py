"""Every picture's text is readable at the page's width (issue 31, item 4): the logit-lens legend
was about 4 pixels tall, panel titles sat under Gradio's labels, the LoRA plot's legends covered its
data and its x axis showed token numbers. What matplotlib really draws is watched (its renderer's
text calls, the legends' and axes' boxes), and the size each text has once the page shows the
picture at most ``PAGE_WIDTH_PX`` wide is computed from the drawn size and the picture's width."""

import math
from dataclasses import asdict, fields, replace

import gradio as gr
import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from g4v.attribution.deletion import DeletionCurve
from g4v.circuits.attention import ImageAttention
from g4v.circuits.reverse import RegionAttention
from g4v.attribution.lens import LensView
from g4v.evaluate import SampleResult
from g4v.evaluate.equivalence import tost_paired
from g4v.evaluate.stats import detectable, summarise
from g4v.evaluate.summary import RunSummary
from g4v.loading import load_config
from g4v.lora.token_diff import LoraDiff, ScoredAnswer, TokenScore
from g4v.model.capture import LevelCapture, Trajectory
from g4v.model.levels import Level
from g4v.port.compare import LevelDiff, SideNorms, Tolerance, TrajectoryDiff
from g4v.paths import BUNDLED_MODEL_DIR
from g4v.tiling import plan_tiling
from tests.conftest import make_image
from viz import attribution as va
from viz import deepstack as vd
from viz import lora as vl
from viz import port as vp
from viz import evaluate as ve
from viz import circuits as vc
from viz.figures import MIN_TEXT_PX, PAGE_WIDTH_PX, figure_to_image


@pytest.fixture()
def drawn(monkeypatch):
    """What the next savefig draws: every text's pixel height and the canvas width, and the figure."""
    record = {"texts": [], "figures": []}
    real_text, real_save = RendererAgg.draw_text, Figure.savefig

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if str(s).strip():
            record["texts"].append((id(self), self.width, prop.get_size_in_points() * self.dpi / 72, str(s)))
        return real_text(self, gc, x, y, s, prop, angle, ismath, mtext)

    def savefig(self, *args, **kwargs):
        record["figures"].append(self)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(RendererAgg, "draw_text", draw_text)
    monkeypatch.setattr(Figure, "savefig", savefig)
    return record


def smallest_shown_text(record, shown_px: int = PAGE_WIDTH_PX) -> tuple[float, str]:
    """The smallest text of the last picture drawn, in pixels at the width the page shows it
    (its own width, or ``shown_px`` where it is wider: the page's, or half of it for a picture
    beside another), and that text."""
    last = record["texts"][-1][0]  # a tight bounding box draws twice: the last canvas is the picture
    texts = [t for t in record["texts"] if t[0] == last]
    return min((px * min(1.0, shown_px / width), text) for _, width, px, text in texts)


def legends_clear_of_the_data(figure: Figure) -> None:
    """No legend over an axes' data, nor over its tick labels and axis labels (the LoRA plot's
    legends, beside its axes, covered the right-hand KL axis's labels)."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend()]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in figure.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), f"a legend covers the axes {ax.get_title()!r}"
            labels = ax.get_tightbbox(renderer, bbox_extra_artists=[])  # the axes with its ticks and labels
            assert not box.overlaps(labels), f"a legend covers the labels of the axes {ax.get_title()!r}"


GRADIO_BUTTONS_PX = (120, 48)  # the width and height Gradio's fullscreen and download buttons cover,
# at a picture's top-right corner, in page pixels


def clear_of_the_buttons(figure: Figure, artists=None, shown_px: int = PAGE_WIDTH_PX) -> None:
    """None of ``artists`` (default: the legends) under the buttons Gradio draws over a picture's
    top-right corner, once the page shows the picture (the figure's tight bounding box) at most
    ``shown_px`` wide."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    picture = figure.get_tightbbox(renderer).padded(0.1).transformed(figure.dpi_scale_trans)
    shown = min(1.0, shown_px / picture.width)
    corner_left = picture.x1 - GRADIO_BUTTONS_PX[0] / shown
    corner_bottom = picture.y1 - GRADIO_BUTTONS_PX[1] / shown
    if artists is None:
        artists = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend()]
    for artist in artists:
        box = artist.get_window_extent(renderer)
        assert box.x1 <= corner_left or box.y1 <= corner_bottom, f"{artist} sits under Gradio's corner buttons"


def legends_clear_of_the_buttons(figure: Figure) -> None:
    clear_of_the_buttons(figure)


@pytest.fixture(scope="module")
def picture_and_tokens():
    image = make_image(400, 300, seed=4)
    plan = plan_tiling((image.height, image.width), load_config(BUNDLED_MODEL_DIR))
    return image, [(t.kind, t.box) for t in plan.tokens]


def lens_views(count: int, tokens) -> list[LensView]:
    return [LensView(f"layer {n}", [i % 10 for i in range(len(tokens))], [0.5] * len(tokens)) for n in range(count)]


LONG_NAMES = {i: f"token number {i:02d} of ten" for i in range(10)}  # cut to 24 characters in the legend
LEVELS = ["deepstack0", "deepstack1", "deepstack2", "deepstack3", "spatial_TL", "spatial_TR", "spatial_BL", "spatial_BR"]


def figures(image, tokens) -> dict:
    scores = {name: [math.sin(i + n) for i in range(len(tokens))] for n, name in enumerate(LEVELS + ["combined"])}
    curve = DeletionCurve(level=None, ranking="positive", fractions=[0, 0.1, 0.5, 1], random=[[-1, -1.5, -2, -3]] * 2,
                          random_mean=[-1, -1.5, -2, -3], attributed=[-1, -2.5, -4, -3], area_between=1.2)
    levels = level_captures(LEVELS)
    trajectory = Trajectory(list(range(41)), [1.0 + i / 10 for i in range(41)], [1.0 + i / 20 for i in range(41)],
                            {n * 3: name for n, name in enumerate(LEVELS)})
    return {
        "attribution tiles": lambda: va.attribution_figure(image, tokens, scores, "tile"),
        "deletion": lambda: va.deletion_figure(curve, measure="log-odds"),
        "lens": lambda: va.lens_figure(image, tokens, lens_views(4, tokens), LONG_NAMES),
        "lens levels": lambda: va.lens_figure(image, tokens, lens_views(8, tokens), LONG_NAMES),
        "norms": lambda: vd.norms_figure(levels),
        "trajectory": lambda: vd.trajectory_figure(trajectory, modified=trajectory),
        "heatmaps": lambda: vd.heatmaps_figure(image, tokens, scores, "base"),
        "port trajectory": lambda: vp.trajectory_compare_figure(port_trajectory(trajectory)),
        "circuits share": lambda: vc.image_share_figure(circuits_attention(image)),
        "circuits reverse": lambda: vc.region_attention_figure(image, circuits_region(image)),
        "port levels": lambda: vp.level_bars_figure(
            [LevelDiff(name, n, "deepstack", True, 1e-3, 1e-4, 1e-4, 1.0, None, share_of_tolerance_used=0.1 * (n + 1))
             for n, name in enumerate(LEVELS)], Tolerance(1e-5, 5e-2, "bfloat16 defaults")),
    }


def level_captures(names: list[str]) -> list[LevelCapture]:
    """What the norms figure reads of each level (a capture's means; no tensors needed)."""
    return [LevelCapture(Level(n, name, "spatial" if name.startswith("spatial") else "deepstack", -1, 27, n),
                         1.0, torch.zeros(0), 2.0, 3.0, 3.5, 1.0, 1.0) for n, name in enumerate(names)]


#: The circuits figures' layers: 40 with the 8 levels injected every third, as on the real model.
CIRCUIT_LAYERS = list(range(40))
CIRCUIT_INJECTIONS = {n * 3: name for n, name in enumerate(LEVELS)}


def circuits_attention(image) -> ImageAttention:
    """What the circuits share figure reads: 40 layers, 32 heads over the picture's image tokens,
    the query at position 71."""
    plan = plan_tiling((image.height, image.width), load_config(BUNDLED_MODEL_DIR))
    count = plan.num_image_tokens
    return ImageAttention(query_position=71, query_token=" word", layers=CIRCUIT_LAYERS,
                          injection_layers=CIRCUIT_INJECTIONS, image_positions=list(range(10, 10 + count)),
                          per_head=torch.full((40, 32, count), 0.5 / count), text_per_head=torch.full((40, 32), 0.5),
                          plan=plan)


def circuits_region(image, texts=None) -> RegionAttention:
    """What the reverse figure reads: a 60-token prompt with a 12-token answer (or ``texts``, all
    prompt) reading a region's first base and tile tokens, 40 layers."""
    plan = plan_tiling((image.height, image.width), load_config(BUNDLED_MODEL_DIR))
    texts = texts or [f" word{i}" for i in range(72)]
    chosen = [token.index for token in plan.tokens[:30] if token.kind != "newline"]
    return RegionAttention(region=(10, 10, 200, 150), layers=CIRCUIT_LAYERS, injection_layers=CIRCUIT_INJECTIONS,
                           region_token_indices=chosen, region_positions=chosen, text_positions=list(range(len(texts))),
                           text_tokens=texts, answer_start=60 if len(texts) == 72 else len(texts),
                           weights=torch.tensor([[0.1 * (i % 7) for i in range(len(texts))]] * 40),
                           by_kind={}, plan=plan)


def port_trajectory(trajectory: Trajectory) -> TrajectoryDiff:
    side = SideNorms(trajectory.image_norm, trajectory.text_norm)
    return TrajectoryDiff(layers=trajectory.layers, injection_layers={str(k): v for k, v in trajectory.injection_layers.items()},
                          transformers=side, vllm=side, max_token_rel_diff=[1e-3] * len(trajectory.layers), rtol=1e-2)


@pytest.mark.parametrize("name", ["attribution tiles", "deletion", "lens", "lens levels", "norms", "trajectory",
                                  "heatmaps", "port trajectory", "port levels", "circuits share", "circuits reverse"])
def test_picture_text_is_readable_at_the_pages_width(picture_and_tokens, drawn, name):
    figures(*picture_and_tokens)[name]()
    size, text = smallest_shown_text(drawn)
    assert size >= MIN_TEXT_PX, f"{name}: {text!r} is {size:.1f} px at the page's width"
    legends_clear_of_the_data(drawn["figures"][-1])
    legends_clear_of_the_buttons(drawn["figures"][-1])


def scored(texts: list[str], shift: float = 0.0, diverge_at: int | None = None) -> ScoredAnswer:
    """An answer whose tokens are ``texts``, scored as the pictures read it."""
    return ScoredAnswer("base", "".join(texts), [
        TokenScore(i, i, text, -1.0 - (i % 3), -1.0 - shift * (i % 2), 0.5, 0.1 * (i % 4), 1, 2 if i == diverge_at else 1)
        for i, text in enumerate(texts)])


def lora_diff(count: int, labels=("base", "adapter")) -> LoraDiff:
    texts = [f" w{i}" for i in range(count)]
    return LoraDiff("french", scored(texts, 0, diverge_at=2), scored(texts, 1), labels)


@pytest.mark.parametrize("count, names", [(12, None), (300, None),
                                           (12, ("base language model (vision LoRA off)", "vision model + a-long-adapter-name"))])
def test_lora_plot_names_its_tokens_and_keeps_legends_off_the_data(drawn, count, names):
    figure = vl.diff_plot(lora_diff(count, names or ("base", "adapter")))
    figure_to_image(figure)
    size, text = smallest_shown_text(drawn)
    assert size >= MIN_TEXT_PX, f"{text!r} is {size:.1f} px at the page's width"
    legends_clear_of_the_data(figure)
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    expected = [f" w{i}" for i in range(count)][::max(1, -(-count // vl.MAX_TOKEN_LABELS))]
    assert labels == expected


@pytest.mark.parametrize("tab", ["attribution", "deepstack", "circuits"])
def test_result_pictures_have_no_gradio_label_over_their_titles(tab):
    """Gradio draws a picture's label over its top-left corner, where the titles are: the result
    pictures carry their own titles and show no label."""
    from webapp.attribution import attribution_tab
    from webapp.deepstack import deepstack_tab

    from webapp.circuits import circuits_tab

    with gr.Blocks() as page:
        if tab == "circuits":
            circuits_tab(None, gr.State(), None)
        else:
            {"attribution": attribution_tab, "deepstack": deepstack_tab}[tab](None, load_config(BUNDLED_MODEL_DIR),
                                                                              gr.State(), None)
    outputs = [b for b in page.blocks.values() if type(b) is gr.Image]  # the input is an ImageFile
    assert len(outputs) >= 4 and not [b.label for b in outputs if b.show_label]


def test_lens_legend_names_a_partial_utf8_piece_by_its_bytes():
    """A byte-level BPE piece that is not valid UTF-8 alone decodes to U+FFFD, which names nothing:
    the lens legend shows its bytes instead (and a whole character as itself)."""
    from transformers import AutoTokenizer

    from g4v.attribution.lens import token_text

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL_DIR)
    first_byte = tokenizer.convert_tokens_to_ids("\u00e2")  # GPT-2's byte-to-character map: 0xE2 is "â"
    assert tokenizer.decode([first_byte]) == "\ufffd"
    assert token_text(tokenizer, first_byte) == f"<0x{'€'.encode()[0]:02X}>"
    word = tokenizer.encode("a", add_special_tokens=False)[0]
    assert token_text(tokenizer, word) == tokenizer.decode([word])


@pytest.mark.parametrize("distinct", [3, 12])
def test_the_lens_legend_names_every_colour_it_paints_and_no_token_is_grey(picture_and_tokens, drawn, distinct):
    """The lens painted the tokens past its most frequent ones grey, and named no grey in its legend;
    and tab10's own grey was one of its token colours, so one top token looked like those. Now every
    named token has a colour that is no grey, and grey is named "other tokens" when it is painted."""
    import matplotlib.colors as mc

    image, tokens = picture_and_tokens
    views = [LensView(f"layer {n}", [i % distinct for i in range(len(tokens))], [0.5] * len(tokens)) for n in range(4)]
    va.lens_figure(image, tokens, views, {i: f"t{i}" for i in range(distinct)})
    legend = drawn["figures"][-1].legends[0]
    entries = {text.get_text(): mc.to_rgb(patch.get_facecolor()) for text, patch in zip(legend.get_texts(),
                                                                                        legend.get_patches())}
    named = {label: colour for label, colour in entries.items() if label != va.OTHER_TOKENS[1]}
    assert len(named) == min(distinct, va.LENS_COLOURS) and len(set(named.values())) == len(named)
    assert all(max(colour) - min(colour) > 0.1 for colour in named.values()), named  # no grey among them
    assert (va.OTHER_TOKENS[1] in entries) == (distinct > va.LENS_COLOURS)
    if distinct > va.LENS_COLOURS:
        assert entries[va.OTHER_TOKENS[1]] == pytest.approx(va.OTHER_TOKENS[0])


def test_each_attribution_panel_has_its_own_scale_and_says_its_magnitude(picture_and_tokens, drawn):
    """Issue 31's walk: 8 level panels whose scores reach 0.002-0.02 shared the combined panel's
    +-0.58 scale and looked plain grey. Each panel now reaches the ends of its own colour scale,
    and its title gives its largest magnitude."""
    image, tokens = picture_and_tokens
    tile = [i for i, (kind, _) in enumerate(tokens) if kind == "tile"]
    peaks = {name: 0.002 * (n + 1) for n, name in enumerate(LEVELS)} | {"combined": 0.58}
    scores = {name: [peak * math.sin(i) for i in range(len(tokens))] for name, peak in peaks.items()}
    va.attribution_figure(image, tokens, scores, "tile")
    panels = [ax for ax in drawn["figures"][-1].axes if len(ax.images) == 2]
    assert len(panels) == len(peaks)
    for ax, (name, peak) in zip(panels, peaks.items()):
        largest = max(abs(scores[name][i]) for i in tile)
        heat = ax.images[1]
        low, high = heat.get_clim()
        assert float(np.nanmax(np.abs(heat.get_array()))) == pytest.approx(high) and low == -high, name
        assert f"{largest:.2g}" in ax.get_title(), ax.get_title()


@pytest.mark.parametrize("name", ["trajectory", "port trajectory"])
def test_level_names_sit_above_the_plot_clear_of_its_lines_and_title(picture_and_tokens, drawn, name):
    """The residual-stream plots named each injection layer inside the frame, against its top edge,
    with the lines drawn through the names: now each name sits above the frame, clear of the title."""
    figures(*picture_and_tokens)[name]()
    figure = drawn["figures"][-1]
    renderer = FigureCanvasAgg(figure).get_renderer()
    texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text()]
    names = [t for t in texts if t.get_text() in LEVELS]
    assert sorted(t.get_text() for t in names) == sorted(LEVELS)
    plot = figure.axes[0].get_window_extent(renderer)
    titles = [t for t in texts if t.get_text().startswith("Residual-stream norm")]
    assert titles
    for label in names:
        box = label.get_window_extent(renderer)
        assert box.y0 >= plot.y1, f"{label.get_text()!r} is inside the plot's frame"
        assert not any(box.overlaps(t.get_window_extent(renderer)) for t in titles), f"{label.get_text()!r} meets the title"


def test_port_legend_shows_which_stack_is_dashed(picture_and_tokens, drawn):
    """The title says vLLM is dashed: the legend draws it so (and transformers solid)."""
    figures(*picture_and_tokens)["port trajectory"]()
    legend = drawn["figures"][-1].legends[0]
    styles = {text.get_text(): line.get_linestyle() for text, line in zip(legend.get_texts(), legend.get_lines())}
    assert styles["transformers"] == "-" and styles["vLLM"] == "--"


def test_lora_plot_shortens_long_tokens_with_an_ellipsis(drawn):
    """The x axis showed ``<|end_of_te…`` for ``<|end_of_text|>``: the tokenizer's special tokens are
    shown whole; a longer token ends in "…"; a short one is whole; and every label, as drawn, lies
    inside the saved picture."""
    texts = [" the", "<|end_of_text|>", "\n", " internationalisation", "twelve chars"]
    answer = scored(texts, diverge_at=1)
    figure = vl.diff_plot(LoraDiff("french", answer, answer))
    picture = figure_to_image(figure)
    labels = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert labels == [" the", "<|end_of_text|>", "⏎", " internationali…", "twelve chars"]  # written out by hand
    renderer = FigureCanvasAgg(figure).get_renderer()
    whole = figure.get_tightbbox(renderer).transformed(figure.dpi_scale_trans)
    for label in figure.axes[0].get_xticklabels():
        box = label.get_window_extent(renderer)
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0, label.get_text()
    assert picture.width >= whole.width - 2


def test_reverse_axis_shortens_long_tokens_with_an_ellipsis(picture_and_tokens, drawn):
    """The walk of the Circuits tab: reverse.png's axis showed ``<|start_of_r`` for
    ``<|start_of_role|>``. A long token ends in "…" (as the LoRA plot's do), a short one is whole."""
    image, tokens = picture_and_tokens
    texts = ["<|start_of_role|>", "user", "\n", " internationalisation", "twelve chars"]
    region = replace(circuits_region(image, texts), weights=torch.tensor([[0.1 * i for i in range(len(texts))]] * 40))
    vc.region_attention_figure(image, region)
    heat_ax = drawn["figures"][-1].axes[1]
    labels = [label.get_text() for label in heat_ax.get_xticklabels()]
    assert labels == ["<|start_of_…", "user", "\\n", " internatio…", "twelve chars"]  # written out by hand


def test_the_reverse_pictures_title_stays_clear_of_the_heatmaps_labels(drawn):
    """On one line, the title over the picture ("region 1000,100,2000,1200: 132 tile, 32 base
    tokens") ran up to the heatmap's labels beside it (4 px apart): for a wide picture and a region
    written with four-digit numbers, and began 24 px left of the picture's edge, cut off: the
    title lies inside the picture and ends at least 12 px before any of the labels begins."""
    image = make_image(2390, 1270, seed=4)
    region = replace(circuits_region(image), region=(1000, 100, 2000, 1200))
    vc.region_attention_figure(image, region)
    figure = drawn["figures"][-1]
    renderer = FigureCanvasAgg(figure).get_renderer()
    picture_ax, heat_ax = figure.axes[:2]
    heat_texts = [heat_ax.yaxis.label, *heat_ax.get_yticklabels()]
    title = picture_ax.title.get_window_extent(renderer)
    assert "1000,100,2000,1200" in picture_ax.get_title()
    assert title.x0 >= 0 and min(t.get_window_extent(renderer).x0 for t in heat_texts) - title.x1 >= 12


#: The Evaluate tab shows its pictures two a row: each gets about half the page, measured in the
#: served page at a 1280-pixel window (two 590-pixel picture boxes), less their padding.
EVALUATE_PICTURE_PX = 580


def evaluate_run(categories: int) -> tuple[RunSummary, list[SampleResult]]:
    """A run's summary and typed rows as ``g4v.evaluate`` returns them, with long category names."""
    def block(n, shift):
        arms = {arm: {"label": f"arm {arm} with a long label", "accuracy": 0.5 + shift * sign, "ci95": [0.3, 0.8],
                      "n_scored": n} for arm, sign in (("a", 1), ("b", -1))}
        return {"n": n, "n_errors": 0, "arms": arms,
                "paired": {"both_right": 3, "a_only": 2, "b_only": 1, "both_wrong": 4, "mcnemar_p": 0.62 + shift},
                "equivalence": tost_paired(2, 1, 10).to_dict(), "agreement": None, "kl": None,
                "blank_same": {"a": None, "b": None}}
    summary = RunSummary.from_dict(block(40, 0.1) | {
        "complete": True, "by_category": {f"category number {i} of the set": block(10, i / 50) for i in range(categories)},
        "worst": [], "detectable": asdict(detectable(40)), "noise_floor": None, "fields": None})
    empty = dict.fromkeys(field.name for field in fields(SampleResult))  # what the pictures do not read
    rows = [SampleResult(**{**empty, "index": i, "kl_mean": 10 ** (-3 + i / 10), "kl_max": 10 ** (-2 + i / 10),
                            "first_divergence": i % 7, "agree": i % 3 == 0}) for i in range(40)]
    return summary, rows


@pytest.mark.parametrize("name", ["accuracy", "paired", "kl", "divergence"])
@pytest.mark.parametrize("categories", [3, 20])
def test_evaluate_pictures_are_readable_at_half_the_pages_width(drawn, name, categories):
    """Issue 31's walk: the "Paired outcomes" figure's text was 7-8 pixels tall where the tab shows
    it (half the page); every Evaluate picture now meets the same minimum as the other panels'."""
    summary, rows = evaluate_run(categories)
    draw = {"accuracy": lambda: ve.accuracy_figure(summary), "paired": lambda: ve.paired_figure(summary),
            "kl": lambda: ve.kl_histogram(rows), "divergence": lambda: ve.divergence_histogram(rows)}[name]
    picture = draw()
    size, text = smallest_shown_text(drawn, EVALUATE_PICTURE_PX)
    assert size >= MIN_TEXT_PX, f"{name}: {text!r} is {size:.1f} px at half the page's width ({picture.size})"
    if name != "divergence":  # which has no legend
        legends_clear_of_the_data(drawn["figures"][-1])


@pytest.mark.parametrize("name", ["accuracy", "paired", "kl", "divergence"])
def test_evaluate_titles_stay_clear_of_the_picture_buttons(drawn, name):
    """A browser walk saw "Accuracy per category (whiskers: 95% confidence inte" end under the
    buttons Gradio draws over the top right corner: each title now ends left of them, or below."""
    summary, rows = evaluate_run(20)
    draw = {"accuracy": lambda: ve.accuracy_figure(summary), "paired": lambda: ve.paired_figure(summary),
            "kl": lambda: ve.kl_histogram(rows), "divergence": lambda: ve.divergence_histogram(rows)}[name]
    draw()
    figure = drawn["figures"][-1]
    titles = [text for ax in figure.axes for text in (ax.title, ax._left_title, ax._right_title) if text.get_text()]
    assert titles, name
    clear_of_the_buttons(figure, titles, EVALUATE_PICTURE_PX)


@pytest.mark.parametrize("indices", [[0, 0, 0, 0], [3], [0, 2, 9, 17]])
def test_the_first_difference_axis_ticks_whole_token_indices_from_zero(drawn, indices):
    """Every first difference at index 0 drew one bar across the plot over ticks -0.4 ... 0.4."""
    empty = dict.fromkeys(field.name for field in fields(SampleResult))
    ve.divergence_histogram([SampleResult(**{**empty, "index": i, "first_divergence": at, "agree": False})
                             for i, at in enumerate(indices)])
    ax = drawn["figures"][-1].axes[0]
    low, high = ax.get_xlim()
    shown = [tick for tick in ax.get_xticks() if low <= tick <= high]
    assert low < 0 and min(shown) == 0 and high > max(indices)
    assert all(float(tick).is_integer() and tick >= 0 for tick in shown), shown
    assert len(shown) >= 3 and set(indices) <= set(range(int(high) + 1))


def test_evaluate_notes_are_readable_at_half_the_pages_width(drawn):
    ve.paired_figure(summarise([], "a", "b"))  # a run without rows: the note instead of bars
    size, text = smallest_shown_text(drawn, EVALUATE_PICTURE_PX)
    assert size >= MIN_TEXT_PX, f"{text!r} is {size:.1f} px"


def test_heatmaps_and_the_lens_paint_over_the_picture_in_greys(picture_and_tokens, drawn):
    """Over a strongly coloured object a heatmap's own colours were lost (a red shape under the red
    and blue attribution map read as "high" wherever it was; the lens's token colours mixed with the
    picture's): the picture under every panel is drawn in greys, so one value paints one hue inside
    a red shape and beside it (lighter or darker with the grey, never redder)."""
    from PIL import Image, ImageDraw

    _, tokens = picture_and_tokens
    red = Image.new("RGB", (400, 300), "white")
    ImageDraw.Draw(red).rectangle((100, 80, 300, 220), fill=(230, 20, 20))
    scores = {name: [0.7] * len(tokens) for name in ("deepstack0", "combined")}
    for draw in (lambda: va.attribution_figure(red, tokens, scores, "tile"),
                 lambda: va.lens_figure(red, tokens, lens_views(2, tokens), LONG_NAMES),
                 lambda: vd.heatmaps_figure(red, tokens, scores, "tile")):
        draw()
        panels = [ax for ax in drawn["figures"][-1].axes if len(ax.images) == 2]
        assert panels
        for ax in panels:
            backdrop = np.asarray(ax.images[0].get_array(), dtype=int)[..., :3]
            assert (backdrop.max(axis=-1) - backdrop.min(axis=-1)).max() <= 1  # greys only
    figure = drawn["figures"][-1]  # the deepstack heatmap: one value everywhere
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    box = figure.axes[0].get_window_extent()

    def colour_at(x: float, y: float):  # a point of the picture, as a share of its width and height
        return pixels[int(pixels.shape[0] - (box.y1 - y * box.height)), int(box.x0 + x * box.width)]

    shift = colour_at(0.5, 0.5) - colour_at(0.9, 0.9)  # inside the red shape minus the white beside it
    assert shift.max() - shift.min() <= 12, shift  # the same hue, only darker: not reddened


def test_a_note_figure_wraps_a_long_title_inside_the_picture(drawn):
    """Evaluate's note pictures at half the page cut their titles off at both sides ("agree entire")."""
    from viz.figures import HALF_PAGE_PX, note_figure

    title = "First differing answer token (0 of 0 samples agree entirely): a long title at a half page's text size"
    note_figure(title, "Every row failed.", HALF_PAGE_PX)
    figure = drawn["figures"][-1]
    renderer = FigureCanvasAgg(figure).get_renderer()
    whole = figure.bbox
    suptitle = figure._suptitle
    box = suptitle.get_window_extent(renderer)
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1, (box, whole)
    assert "agree entirely" in suptitle.get_text().replace("\n", " ")


def test_a_run_whose_every_row_failed_says_so_in_every_picture(drawn):
    """A dataset whose pictures are missing: every row failed, and the pictures said "the dataset has
    no reference answers" and "needs both arms on local transformers". They say the rows failed, and
    the first row's error."""
    summary, rows = evaluate_run(2)
    failed = [replace(row, error="the picture red.png named in row 1 is missing") for row in rows[:12]]
    assert ve.all_failed(failed).startswith("Every row failed (12 of 12)")
    assert "red.png named in row 1 is missing" in ve.all_failed(failed)
    assert ve.all_failed(rows) is None and ve.all_failed(failed[:3] + rows[:1]) is None
    assert set(ve.run_figures(summary, failed)) == {"accuracy", "paired", "kl", "divergence"}
    notes = [" ".join(text.get_text() for ax in figure.axes for text in ax.texts) for figure in drawn["figures"]]
    assert len(notes) == 4 and all("Every row failed" in note and "red.png" in note for note in notes)
    assert not any("reference answers" in note or "local transformers" in note for note in notes)


@pytest.mark.parametrize("size", [(120, 250), (400, 300), (800, 200)], ids=["tall", "square", "wide"])
@pytest.mark.parametrize("name", ["attribution", "deepstack", "circuits"])
def test_heatmap_panel_titles_stay_apart(drawn, size, name):
    """A tall picture's attribution maps (8 narrow panels a row) had titles such as "(max |x|
    2.8e-05 nats)" wider than their panels, running into each other: each title, drawn, now ends
    before the next one in its row begins, inside the picture, with its panel's name (or its start)
    on its first line."""
    image = make_image(*size, seed=4)
    plan = plan_tiling((image.height, image.width), load_config(BUNDLED_MODEL_DIR))
    tokens = [(t.kind, t.box) for t in plan.tokens]
    scores = {level: [2.8e-5 * (n + 1) * math.sin(i + n) for i in range(len(tokens))]
              for n, level in enumerate(LEVELS + ["combined"])}
    {"attribution": lambda: va.attribution_figure(image, tokens, scores, "tile"),
     "deepstack": lambda: vd.heatmaps_figure(image, tokens, scores, "tile"),
     "circuits": lambda: vc.attention_map_figure(image, circuits_attention(image), "tile")}[name]()
    figure = drawn["figures"][-1]
    renderer = FigureCanvasAgg(figure).get_renderer()
    panels = [ax for ax in figure.axes if ax.images]
    assert len(panels) >= 8
    rows = {}
    for ax in panels:
        rows.setdefault(round(ax.get_position().y1, 3), []).append(ax)
    assert any(len(row) > 1 for row in rows.values())
    for row in rows.values():
        row.sort(key=lambda ax: ax.get_position().x0)
        for left, right in zip(row, row[1:]):
            left_title, right_title = (ax.title.get_window_extent(renderer) for ax in (left, right))
            assert left_title.x1 < right_title.x0, (left.get_title(), right.get_title())
    for ax in panels:
        title = ax.title.get_window_extent(renderer)
        assert 0 <= title.x0 and title.x1 <= renderer.width, ax.get_title()  # not cut off at the picture's edges
        assert ax.get_title().split("\n")[0].split("  ")[0] in {*LEVELS, "combined"} or ax.get_title().startswith(
            "layer"), ax.get_title()
