"""The deepstack inspector on hostile input (issue 17): extreme aspect ratios, exports that must not
pile up, and scale factors that change nothing or overflow the model."""

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from g4v.cli import main as cli_main
from g4v.conversation import Message
from g4v.errors import G4VError
from g4v.inspect.ablation import compare_scaled, run_outcome
from g4v.model.capture import LevelCapture, Trajectory, capture_forward, instrument
from g4v.model.levels import MAX_SCALE, Level, describe_levels, level_scales
from g4v.model.sites import site
from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR, REPO_ROOT
from g4v.loading import load_config
from g4v.tiling import plan_tiling
from tests.cli import run_cli
from tests.conftest import make_image

PROMPT = "What is in the picture?"
EXTREME_SIZES = [(3, 600), (600, 3), (1, 20000), (20000, 1)]  # (width, height)


# ── item 2: every picture has a bounded size, whatever the image ─────────────────────────────────


def _assert_bounded(picture: Image.Image, what: str) -> None:
    from viz.figures import MAX_PICTURE_SIDE, MIN_PICTURE_SIDE

    assert MIN_PICTURE_SIDE <= picture.width <= MAX_PICTURE_SIDE, (what, picture.size)
    assert MIN_PICTURE_SIDE <= picture.height <= MAX_PICTURE_SIDE, (what, picture.size)


def _painted_fraction(picture: Image.Image) -> float:
    """Share of the picture's pixels that are neither near-white background nor near-grey text:
    the heat colours (and the picture under them)."""
    pixels = np.asarray(picture.convert("RGB"), dtype=np.int16)
    spread = pixels.max(axis=-1) - pixels.min(axis=-1)  # 0 for white, black and greys
    return float((spread > 40).mean())


@pytest.mark.parametrize("config_dir", [BUNDLED_MODEL_DIR, REAL_CONFIG_DIR], ids=["bundled", "real"])
@pytest.mark.parametrize("width,height", EXTREME_SIZES)
def test_every_picture_is_bounded_for_extreme_aspect_ratios(width, height, config_dir):
    from viz.deepstack import heatmaps_figure, norms_figure, trajectory_figure
    from viz.tiling import highlight_box, render_tiling_overlay

    image = make_image(width, height, seed=5)
    plan = plan_tiling((height, width), load_config(config_dir))
    tokens = [(token.kind, token.box) for token in plan.tokens]
    norms = {f"level{i}": [float((i + j) % 11) for j in range(len(tokens))] for i in range(8)}
    for view in ("tile", "base"):
        heat = heatmaps_figure(image, tokens, norms, view=view)
        _assert_bounded(heat, f"heatmap {view}")
        if not any(kind == view for kind, _ in tokens):
            continue  # a strip with no tokens of this view gets a one-line note (tested below)
        # The image panel stays visible however thin the picture: the heat colours cover a real part
        # of the figure, not a one-pixel line.
        assert _painted_fraction(heat) > 0.05, (view, heat.size)
    _assert_bounded(render_tiling_overlay(image, plan.to_dict()), "tiling overlay")
    first_tile = next((t for t in plan.tokens if t.kind == "tile"), plan.tokens[0])
    _assert_bounded(highlight_box(image, first_tile.box, label="#0"), "highlight")

    levels = [LevelCapture(Level(i, f"level{i}", "deepstack", -1, 27, i), 1e4, torch.zeros(0), 1.0 + i, 2.0, 3.0, 1.0, 1.0)
              for i in range(8)]
    _assert_bounded(norms_figure(levels), "norms")
    trajectory = Trajectory(list(range(41)), [1.0] * 41, [2.0] * 41, {i: f"level{i}" for i in range(8)})
    _assert_bounded(trajectory_figure(trajectory, modified=trajectory), "trajectory")


def test_a_huge_figure_is_scaled_down_not_refused():
    """``figure_to_image`` re-opens the PNG with PIL, whose decompression-bomb guard refuses huge
    pictures: a figure far beyond the bound comes back at the bound instead."""
    from matplotlib.figure import Figure

    from viz.figures import figure_to_image
    from viz.figures import MAX_PICTURE_SIDE

    fig = Figure(figsize=(3, 2000))  # 300 x 200000 pixels at 100 dpi
    fig.add_subplot().plot([0, 1], [0, 1])
    picture = figure_to_image(fig)
    assert max(picture.size) <= MAX_PICTURE_SIDE and min(picture.size) >= 1


def test_highlight_keeps_small_images_and_maps_clicks_back():
    from viz.figures import MAX_PICTURE_SIDE, display_size, original_point
    from viz.tiling import highlight_box

    assert highlight_box(Image.new("RGB", (500, 300)), (0, 0, 10, 10)).size == (500, 300)
    assert original_point(123, 45, (500, 300)) == (123, 45)
    shown = display_size(1, 20000)
    assert shown[1] <= MAX_PICTURE_SIDE and shown[0] > 1
    marked = np.asarray(highlight_box(Image.new("RGB", (1, 20000), (128, 128, 128)), (0, 10000, 1, 12000)))
    assert marked.shape[:2] == shown[::-1]
    # The box's middle on the shown picture is red-tinted, and maps back into the box.
    middle = (shown[0] / 2, shown[1] * 11000 / 20000)
    red, green = marked[round(middle[1]), round(middle[0])][:2].astype(int)
    assert red > green + 40
    x, y = original_point(*middle, (1, 20000))
    assert 0 <= x <= 1 and 10000 <= y < 12000


@pytest.mark.parametrize("width,height", EXTREME_SIZES)
def test_run_inspection_on_extreme_images(hf_engine, width, height, tmp_path):
    from g4v.inspect.run import FIGURE_FILES, run_inspection

    result = run_inspection(hf_engine, make_image(width, height, seed=7), PROMPT, max_new_tokens=0,
                            out_dir=tmp_path / "export", make_zip=False)
    for name, figure in result.figures.items():
        _assert_bounded(figure, name)
        with Image.open(tmp_path / "export" / FIGURE_FILES[name]) as written:
            _assert_bounded(written, FIGURE_FILES[name])


# ── item 3: exports do not pile up ──────────────────────────────────────────────────────────────


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_export_store_keeps_the_newest_and_cleans_up(hf_engine, tmp_path):
    from g4v.model.exports import ExportStore
    from g4v.inspect.run import FIGURE_FILES, run_inspection

    store = ExportStore(tmp_path, keep=2)
    assert store.root.parent == tmp_path
    image = make_image(300, 140, seed=3)
    # An inspection, another export, then an inspection: the third pushes the first out.
    first = run_inspection(hf_engine, image, PROMPT, max_new_tokens=0, exports=store)
    other = store.new_folder()
    last = run_inspection(hf_engine, image, PROMPT, max_new_tokens=0, exports=store)
    assert len(_entries(store.root)) == 2  # one folder per kept export, the zip inside it
    assert not first.export_dir.exists() and not first.export_zip.exists() and other.is_dir()
    assert last.export_dir.parent == store.root and last.export_zip.parent == last.export_dir
    names = set(zipfile.ZipFile(last.export_zip).namelist())
    assert names == {"summary.json", "capture.safetensors", *FIGURE_FILES.values()}  # not itself
    assert _entries(tmp_path) == [store.root]
    store.close()
    assert _entries(tmp_path) == []  # nothing left, and the folder we were given is still there
    assert tmp_path.is_dir()
    with pytest.raises(G4VError):
        store.new_folder()


def test_without_out_dir_exports_go_to_a_bounded_store(hf_engine):
    from g4v.model.exports import default_export_store
    from g4v.inspect.run import run_inspection

    image = make_image(300, 140, seed=3)
    store = default_export_store()
    earlier = [store.new_folder() for _ in range(store.keep)]  # a full store (each export's own folder)
    result = run_inspection(hf_engine, image, PROMPT, max_new_tokens=0)
    assert result.export_dir.parent == store.root and result.export_zip.exists()
    assert len(_entries(store.root)) == store.keep and not earlier[0].exists() and earlier[1].exists()


def test_the_export_root_is_removed_at_interpreter_exit(tmp_path):
    script = ("import sys; from g4v.model.exports import ExportStore\n"
              "store = ExportStore(sys.argv[1], keep=1)\n"
              "(store.new_folder() / 'summary.json').write_text('{}')\n"
              "print(store.root)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip())
    assert root.parent == tmp_path and not root.exists()


def test_export_store_refuses_bad_settings(tmp_path):
    from g4v.model.exports import ExportStore

    for keep in (0, -1, 1.5, "3"):
        with pytest.raises(G4VError):
            ExportStore(tmp_path, keep=keep)


# ── item 10: scale factors ──────────────────────────────────────────────────────────────────────


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "/tmp" not in text and "Traceback" not in text
    return text


def test_absurd_factors_are_refused_with_one_line(hf_engine):
    levels = describe_levels(hf_engine.model.config)
    for factor in (1e308, -1e308, 1e4 * 1.0001, float("inf")):
        with pytest.raises(G4VError) as err:
            level_scales(levels, [], {"deepstack0": factor})
        assert "deepstack0" in _one_line(err)
    assert level_scales(levels, [], {"deepstack0": -MAX_SCALE}) == {"deepstack0": -MAX_SCALE}

    from g4v.inspect.run import run_inspection

    with pytest.raises(G4VError) as err:
        run_inspection(hf_engine, make_image(300, 140), PROMPT, scale={"deepstack0": 1e308}, max_new_tokens=0)
    assert "deepstack0" in _one_line(err)


def test_overflow_in_a_scaled_run_is_an_error_not_nan(hf_engine):
    """Past the bound check (called directly), a factor that overflows gives one line naming it."""
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [make_image(300, 140, seed=3)])])
    _, logits = capture_forward(model, inputs, logits_to_keep=1)
    base = run_outcome(model, inputs, tokenizer, logits, max_new_tokens=0)
    with pytest.raises(G4VError) as err:
        compare_scaled(model, inputs, tokenizer, base, {"deepstack0": 1e308}, max_new_tokens=2)
    text = _one_line(err)
    assert "deepstack0" in text and "1e+308" in text and "non-finite" in text


def _language_model_calls(model):
    """Count the language model's forward calls with a real forward pre-hook (removed by the caller)."""
    calls = []
    handle = site(model, "language_model").register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


def test_a_factor_of_one_runs_no_second_pass(hf_engine):
    from g4v.inspect.run import run_inspection

    calls, handle = _language_model_calls(hf_engine.model)
    try:
        result = run_inspection(hf_engine, make_image(300, 140, seed=3), PROMPT, max_new_tokens=0,
                                scale={"deepstack0": 1, "spatial_TL": "1.0"}, make_zip=False)
    finally:
        handle.remove()
    assert len(calls) == 1
    assert result.ablation is None and result.to_dict()["ablation"] is None
    assert result.unchanged_levels == result.to_dict()["unchanged_levels"] == ["deepstack0", "spatial_TL"]

    levels = describe_levels(hf_engine.model.config)
    assert level_scales(levels, ["spatial_BR"], {"deepstack0": 1.0, "deepstack1": 2}) == {
        "deepstack1": 2.0, "spatial_BR": 0.0}


def test_the_cli_says_when_nothing_is_scaled(tmp_path, capsys):
    image_path = tmp_path / "in.png"
    make_image(300, 140, seed=3).save(image_path)
    code = cli_main(["inspect", "--model", str(BUNDLED_MODEL_DIR), "--device", "cpu", "--dtype", "float32",
                     "--image", str(image_path), "--prompt", PROMPT, "--out", str(tmp_path / "out"),
                     "--scale", "deepstack2=1", "--max-new-tokens", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "KL" not in out and "deepstack2" in out and "unchanged" in out
    assert (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("spec", ["deepstack0=1e308", "deepstack0=inf", "spatial_TL=-20000"])
def test_the_cli_refuses_absurd_factors_in_one_line(tmp_path, spec):
    image_path = tmp_path / "in.png"
    make_image(300, 140, seed=3).save(image_path)
    done = run_cli("inspect", "--model", str(BUNDLED_MODEL_DIR),
                   "--image", str(image_path), "--prompt", PROMPT, "--out", str(tmp_path / "out"),
                   "--scale", spec)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert spec.split("=")[0] in done.stderr and "/tmp" not in done.stderr


@pytest.mark.slow  # about 5 s on a quiet 2-core machine
def test_a_factor_just_below_the_bound_gives_the_true_kl(hf_engine):
    """KL(before || after) of the next token, computed here from our own two forward passes."""
    from g4v.inspect.run import run_inspection

    model = hf_engine.model
    image = make_image(300, 140, seed=3)
    factor = MAX_SCALE * 0.999
    result = run_inspection(hf_engine, image, PROMPT, scale={"spatial_TL": factor}, max_new_tokens=0,
                            make_zip=False)
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [image])], 0)
    with torch.inference_mode():
        plain = model(**inputs).logits[0, -1].double()
        with instrument(model, scales={"spatial_TL": factor}, record=False):
            scaled = model(**inputs).logits[0, -1].double()
    assert torch.isfinite(scaled).all()
    expected = torch.nn.functional.kl_div(torch.log_softmax(scaled, -1), torch.log_softmax(plain, -1),
                                          reduction="sum", log_target=True)
    kl = result.ablation.kl_divergence
    assert np.isfinite(kl) and kl > 0
    assert kl == pytest.approx(float(expected), rel=1e-3, abs=1e-6)


def test_a_float64_model_is_captured_like_a_float32_one(hf_engine):
    """Norms accumulate in float32, or in float64 for a float64 model (torch refuses to narrow)."""
    from transformers import Granite4VisionForConditionalGeneration

    model64 = Granite4VisionForConditionalGeneration.from_pretrained(str(BUNDLED_MODEL_DIR), dtype=torch.float64).eval()
    inputs = hf_engine.prepare_inputs([Message("user", PROMPT, [make_image(300, 140, seed=3)])])
    inputs64 = {**inputs, "pixel_values": inputs["pixel_values"].double()}
    capture32, _ = capture_forward(hf_engine.model, inputs, logits_to_keep=1)
    capture64, _ = capture_forward(model64, inputs64, logits_to_keep=1)
    assert capture64.num_image_tokens == capture32.num_image_tokens > 0
    for cap64, cap32 in zip(capture64.levels, capture32.levels, strict=True):
        assert cap64.injected_norm.dtype == torch.float32
        torch.testing.assert_close(cap64.injected_norm, cap32.injected_norm, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(capture64.trajectory.text_norm, capture32.trajectory.text_norm, rtol=1e-4)


def test_a_view_without_tokens_says_so_instead_of_empty_panels():
    """A 1 x 20000 strip keeps no tile token; its tile heatmap is a note, not panels titled 'max nan'."""
    from PIL import Image

    from viz.deepstack import heatmaps_figure

    config = load_config(BUNDLED_MODEL_DIR)
    plan = plan_tiling((1, 20000), config)
    assert plan.tile_tokens == 0 and plan.base_tokens > 0
    tokens = [(token.kind, token.box) for token in plan.tokens]
    norms = {"deepstack0": [1.0] * plan.num_image_tokens}
    image = Image.new("RGB", (20000, 1), (90, 120, 200))
    note = heatmaps_figure(image, tokens, norms, view="tile")
    painted = heatmaps_figure(image, tokens, norms, view="base")
    assert note.height < painted.height  # one line of text, not a grid of panels


@pytest.mark.parametrize("specs, words", [
    (["deepstack0=1", "deepstack0=2"], "scaled twice"),
    (["deepstack0"], "LEVEL=FACTOR"),
    (["deepstack0=0x10"], "must be a number written with the digits 0-9"),
    (["deepstack0=1_0"], "must be a number written with the digits 0-9"),  # float() reads 10 (issue 31)
    (["deepstack0=\u0661"], "must be a number written with the digits 0-9"),  # an Arabic-Indic one: float() reads 1
    (["deepstack0=\uff12"], "must be a number written with the digits 0-9"),  # a full-width two
    # read as every typed number is (docs/limits.md), echoed as typed: "must be finite, got inf" before
    (["deepstack0=1e400"], "'deepstack0=1e400': must be a finite number, got '1e400'$"),
    (["deepstack0=1e4000"], "'deepstack0=1e4000': must be a number written with the digits 0-9 .*got '1e4000'$"),
    (["deepstack0=inf"], "must be a number written with the digits 0-9"),
])
def test_scale_specs_are_refused_in_words_for_the_tab_and_the_cli(specs, words):
    from g4v.model.levels import parse_scale_specs

    with pytest.raises(G4VError, match=words) as err:
        parse_scale_specs(specs)
    assert "--scale" not in str(err.value)  # the tab has no flags
