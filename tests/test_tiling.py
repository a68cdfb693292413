"""The tiling plan against transformers: token counts, packing order, pixel boxes, drawing, CLI.

Every expected value comes from transformers' own code (the Granite 4 Vision processor's placeholder
insertion, the model's ``pack_image_features``, the LLaVA-NeXT image processor's pixels) or from the
bundled model's features, never from numbers g4v.tiling produced.
"""

import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, Granite4VisionProcessor
from transformers.image_processing_utils import get_patch_output_size
from transformers.image_utils import ChannelDimension
from transformers.models.granite4_vision.modeling_granite4_vision import Granite4VisionModel
from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, image_size_to_num_patches

from tests.cli import run_cli
from tests.conftest import make_image
from g4v.errors import G4VError
from g4v.loading import load_config
from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR
from g4v.settings.limits import limits
from g4v.tiling import first_token_to_show, plan_tiling, token_at
from g4v.tiling.view import highlight_token, tiling_report
from viz.figures import display_size
from viz.tiling import render_tiling_overlay

CONFIGS = ["bundled", "real"]
NUM_RANDOM_SIZES = 1000


# ── Fixtures: the two configs, their real processors, their models' packing ────────────────────────


@pytest.fixture(scope="module")
def configs():
    return {"bundled": load_config(BUNDLED_MODEL_DIR), "real": load_config(REAL_CONFIG_DIR)}


@pytest.fixture(scope="module")
def processors():
    """The bundled checkpoint's processor, and the real model's processor settings with the bundled
    tokenizer (the real folder has no tokenizer; the tokenizer does not change placeholder counts)."""
    real_settings = json.loads((REAL_CONFIG_DIR / "processor_config.json").read_text())
    real = Granite4VisionProcessor(
        image_processor=AutoImageProcessor.from_pretrained(REAL_CONFIG_DIR),
        tokenizer=AutoTokenizer.from_pretrained(BUNDLED_MODEL_DIR),
        patch_size=real_settings["patch_size"],
        vision_feature_select_strategy=real_settings["vision_feature_select_strategy"],
        downsample_rate=real_settings["downsample_rate"],
        num_additional_image_tokens=real_settings["num_additional_image_tokens"],
    )
    return {"bundled": AutoProcessor.from_pretrained(BUNDLED_MODEL_DIR), "real": real}


@pytest.fixture(scope="module")
def packers(configs):
    """Granite4VisionModel built on the meta device (no weights, no memory): its pack_image_features
    is the model's own packing code, and it runs on real tensors we hand it."""
    with torch.device("meta"):
        return {name: Granite4VisionModel(config) for name, config in configs.items()}


def sizes_to_check(config, count=NUM_RANDOM_SIZES, seed=0) -> list[tuple[int, int]]:
    """Seeded random (height, width) pairs, log-uniform from 1 to 4000 px so that strips, stamps and
    posters all appear, plus extremes and every pinpoint exactly and one pixel off."""
    rng = np.random.default_rng(seed)
    random_sizes = np.exp(rng.uniform(0, np.log(4000), size=(count, 2))).round().astype(int)
    sizes = [(int(h), int(w)) for h, w in random_sizes]
    sizes += [(1, 1), (1, 4000), (4000, 1), (4000, 4000), (2, 3), (3, 2)]
    for pin_height, pin_width in config.image_grid_pinpoints:
        for dh, dw in [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (1, 1), (1, -1)]:
            sizes.append((pin_height + dh, pin_width + dw))
    return sizes


def placeholders_inserted(processor, size) -> int:
    """How many image placeholders the processor's own insertion code writes for an image of ``size``."""
    tile = processor.image_processor.crop_size["height"]
    fake_inputs = {"image_sizes": [list(size)], "pixel_values": np.zeros((1, 1, 3, tile, tile), np.float32)}
    return processor.replace_image_token(fake_inputs, image_idx=0).count(processor.image_token)


def identity_features(config, size) -> torch.Tensor:
    """Per-view features whose 3 channels say where they come from: (view, row, col) in the view's
    feature grid. Shape (1 + num_tiles, feat * feat, 3); view 0 is the base view."""
    num_views = image_size_to_num_patches(size, config.image_grid_pinpoints, config.vision_config.image_size)
    side = config.vision_config.image_size // config.vision_config.patch_size
    feat = int(side * Fraction(config.downsample_rate))  # as Granite4VisionModel.pack_image_features does
    view, row, col = torch.meshgrid(torch.arange(num_views), torch.arange(feat), torch.arange(feat), indexing="ij")
    return torch.stack([view, row, col], dim=-1).reshape(num_views, feat * feat, 3).double()


def model_packing(packer, config, size) -> torch.Tensor:
    """(num_image_tokens, 3): the model's packed features; newlines are (-1, -1, -1)."""
    packed = packer.pack_image_features(
        [identity_features(config, size)], torch.tensor([list(size)]),
        vision_feature_select_strategy="full", image_newline=torch.full((3,), -1.0, dtype=torch.float64),
    )
    return packed[0]


def expected_identity(plan) -> np.ndarray:
    """What each planned token claims to be, as (view, row-in-view, col-in-view); newline = -1s."""
    feat = plan.view_feature_grid[0]
    out = np.full((plan.num_image_tokens, 3), -1, dtype=np.int64)
    for token in plan.tokens:
        if token.kind == "base":
            out[token.index] = (0, token.row, token.col)
        elif token.kind == "tile":
            out[token.index] = (token.tile + 1, (token.row + plan.unpadded_rows[0]) % feat,
                                (token.col + plan.unpadded_cols[0]) % feat)
    return out


# ── Token counts and packing order, against the processor and the model ──────────────────────────


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.slow  # about 6 s on a quiet 2-core machine
def test_token_count_matches_processor_and_model_packing(name, configs, processors, packers):
    config, processor, packer = configs[name], processors[name], packers[name]
    sizes = sizes_to_check(config)
    assert len(sizes) >= NUM_RANDOM_SIZES + 5
    reference_counts = processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    for size, counted in zip(sizes, reference_counts):
        plan = plan_tiling(size, config)
        packed = model_packing(packer, config, size)
        assert plan.num_image_tokens == placeholders_inserted(processor, size) == counted, size
        assert plan.num_image_tokens == packed.shape[0], size
        assert plan.base_tokens + plan.tile_tokens + plan.newline_tokens == plan.num_image_tokens
        # Which feature sits at each position, as the model packs them.
        assert np.array_equal(expected_identity(plan), packed.long().numpy()), size


@pytest.mark.parametrize("name", CONFIGS)
def test_geometry_matches_transformers(name, configs, processors):
    """Best resolution, grid, resized size and padding equal the image processor's own helpers."""
    config, image_processor = configs[name], processors[name].image_processor
    tile = config.vision_config.image_size
    for size in sizes_to_check(config, count=300, seed=1):
        plan = plan_tiling(size, config)
        assert plan.grid == get_anyres_image_grid_shape(list(size), config.image_grid_pinpoints, tile), size
        assert plan.best_resolution == (plan.grid[0] * tile, plan.grid[1] * tile)
        no_pixels = np.broadcast_to(np.zeros(1, np.uint8), (3, *size))  # shape only, no memory
        resized = get_patch_output_size(no_pixels, plan.best_resolution, ChannelDimension.FIRST)
        assert plan.resized_size == tuple(resized), size
        (top, bottom), (left, right) = image_processor._get_padding_size(resized, plan.best_resolution)
        assert (plan.padding.top, plan.padding.bottom, plan.padding.left, plan.padding.right) == (top, bottom, left, right)


@pytest.mark.parametrize("name, size", [("bundled", (1, 1)), ("bundled", (1, 4000)), ("bundled", (4000, 1)),
                                        ("bundled", (300, 500)), ("bundled", (129, 256)), ("real", (600, 900))])
def test_processor_end_to_end_inserts_that_many_placeholders(name, size, configs, processors):
    """Run the whole processor (pixels and text) on a real picture and count the image tokens."""
    processor = processors[name]
    image = make_image(size[1], size[0], seed=7)
    inputs = processor(text=f"look {processor.image_token} here", images=[image], return_tensors="pt")
    placeholders = int((inputs["input_ids"] == processor.image_token_id).sum())
    plan = plan_tiling(size, configs[name])
    assert plan.num_image_tokens == placeholders
    assert inputs["pixel_values"].shape[1] == 1 + plan.num_tiles


# ── Token boxes, against the processor's pixels and the bundled model ───────────────────────────


def coordinate_image(height: int, width: int) -> Image.Image:
    """Red = x, green = y (exact while both are under 256), blue = 255 (so padding shows as 0)."""
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x, y, np.full_like(x, 255)], axis=-1).astype(np.uint8), mode="RGB")


@pytest.mark.parametrize("name, size", [("bundled", (100, 250)), ("bundled", (250, 90)), ("bundled", (200, 200)),
                                        ("bundled", (37, 255)), ("bundled", (255, 37)), ("real", (150, 250))])
def test_token_boxes_hold_the_pixels_the_processor_puts_there(name, size, configs, processors):
    """Each token's feature cell in the processed views shows original pixels from inside its box.

    The coordinate picture makes every processed pixel say where it came from; swapping rows and
    columns, misplacing padding or mis-scaling a box all fail here."""
    plan = plan_tiling(size, configs[name])
    pixel_values = processors[name].image_processor(images=[coordinate_image(*size)], return_tensors="np")["pixel_values"][0]
    channels = (pixel_values * 0.5 + 0.5) * 255  # undo normalisation: (views, 3, tile, tile), 0..255
    tile, feat = plan.tile_size, plan.view_feature_grid[0]
    cell = tile // feat
    tolerance = 1.5  # bicubic resampling and 8-bit rounding

    checked = 0
    for token in plan.tokens:
        if token.kind == "newline":
            continue
        if token.kind == "base":
            view, row_in_view, col_in_view = 0, token.row, token.col
        else:
            view = token.tile + 1
            row_in_view = (token.row + plan.unpadded_rows[0]) % feat
            col_in_view = (token.col + plan.unpadded_cols[0]) % feat
        centre = channels[view, :, row_in_view * cell + cell // 2 - 1: row_in_view * cell + cell // 2 + 1,
                          col_in_view * cell + cell // 2 - 1: col_in_view * cell + cell // 2 + 1]
        if centre[2].min() < 250:  # the cell centre is padding (blue 0) or an edge blend: nothing to decode
            continue
        x, y = centre[0].mean(), centre[1].mean()
        left, top, right, bottom = token.box
        assert left - tolerance <= x <= right + tolerance and top - tolerance <= y <= bottom + tolerance, (token, x, y)
        checked += 1
    assert checked >= 0.8 * (plan.base_tokens + plan.tile_tokens)

    # Padding: the blue channel of the reassembled canvas is 255 exactly inside content_box.
    rows, cols = plan.grid
    canvas_blue = channels[1:, 2].reshape(rows, cols, tile, tile).transpose(0, 2, 1, 3).reshape(rows * tile, cols * tile)
    left, top, right, bottom = plan.content_box
    inside = np.zeros_like(canvas_blue, dtype=bool)
    inside[top:bottom, left:right] = True
    assert np.array_equal(canvas_blue > 127, inside)


@pytest.fixture(scope="module")
def bundled_model():
    from g4v.loading import load_model

    return load_model(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")


def test_perturbing_a_token_box_changes_that_token_most(bundled_model):
    """Invert the pixels inside one token's box: among tokens of its kind, that token's projected
    feature (every deepstack and spatial projector) moves the most."""
    model, processor = bundled_model.model, bundled_model.processor
    height, width = 300, 500  # 2 x 3 tiles
    image = make_image(width, height, seed=3)
    plan = plan_tiling((height, width), model.config)
    targets = [plan.tokens[plan.newline_positions[0] - 3],  # top row, near the right edge
               next(t for t in plan.tokens if t.kind == "tile" and (t.row, t.col) == (9, 2)),
               next(t for t in plan.tokens if t.kind == "base" and (t.row, t.col) == (5, 1))]
    assert [t.kind for t in targets] == ["tile", "tile", "base"]

    pictures = [image] + [_inverted_inside(image, token.box) for token in targets]
    inputs = processor.image_processor(images=pictures, return_tensors="pt")
    with torch.no_grad():
        output = model.model.get_image_features(pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"],
                                                vision_feature_select_strategy="full")
    kinds = np.array([t.kind for t in plan.tokens])
    for _, packed in output.deepstack_features:  # 8 projectors: (num_image_tokens, hidden) per picture
        assert packed[0].shape[0] == plan.num_image_tokens
        for target, perturbed in zip(targets, packed[1:]):
            change = (perturbed - packed[0]).norm(dim=-1).numpy()
            change[kinds != target.kind] = -1.0
            assert int(change.argmax()) == target.index, target


def _inverted_inside(image: Image.Image, box) -> Image.Image:
    left, top, right, bottom = (int(np.ceil(box[0])), int(np.ceil(box[1])), int(box[2]), int(box[3]))
    pixels = np.asarray(image).copy()
    pixels[top:bottom, left:right] = 255 - pixels[top:bottom, left:right]
    return Image.fromarray(pixels)


# ── Plan invariants and bad input ─────────────────────────────────────────────────────────────────


def test_plan_invariants(configs):
    plan = plan_tiling((300, 500), configs["bundled"])
    assert [t.index for t in plan.tokens] == list(range(plan.num_image_tokens))
    assert [t.index for t in plan.tokens if t.kind == "newline"] == plan.newline_positions
    assert plan.tokens[0].kind == "base" and plan.tokens[-1].kind == "newline"
    for token in plan.tokens:
        left, top, right, bottom = token.box
        assert 0 <= left <= right <= 500 and 0 <= top <= bottom <= 300
        if token.kind == "tile":
            tile = plan.tiles[token.tile].box
            assert tile[0] <= left and tile[1] <= top and right <= tile[2] and bottom <= tile[3]
    assert token_at(plan, 499, 150).kind == "tile"
    assert token_at(plan, 10, 10, kind="base").index == 0
    data = json.loads(plan.to_json())
    assert data["num_image_tokens"] == len(data["tokens"]) == plan.num_image_tokens


def test_bad_input_is_one_line_g4v_error(configs, tmp_path):
    with pytest.raises(G4VError, match="no pixels"):
        plan_tiling((0, 10), configs["bundled"])
    with pytest.raises(G4VError, match="two whole numbers"):
        plan_tiling((10.5, 10), configs["bundled"])
    with pytest.raises(G4VError, match="not found"):
        load_config(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(G4VError, match="not a Granite 4 Vision config"):
        load_config(tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(G4VError, match="unreadable"):
        load_config(tmp_path / "broken.json")
    plan = plan_tiling((20, 20), configs["bundled"])
    with pytest.raises(G4VError, match="out of range"):
        highlight_token(make_image(20, 20), plan, plan.num_image_tokens)


# ── Extreme aspect ratios: images so thin that unpadding keeps no tile feature ───────────────────

#: (height, width) pairs from a 1-pixel stamp to strips and a 20000-pixel line, both ways round.
EXTREME_SIZES = [(1, 1), (1, 600), (3, 600), (600, 3), (1, 8000), (8000, 1), (2, 8000), (8000, 2),
                 (1, 20000), (20000, 1), (64, 20000), (20000, 64)]
#: The pixel limit the app accepts, as a line each way round and as a square.
MAX_IMAGE_PIXELS = limits().max_image_pixels
LIMIT_SIZES = [(1, MAX_IMAGE_PIXELS), (MAX_IMAGE_PIXELS, 1), (int(MAX_IMAGE_PIXELS ** 0.5),) * 2]


def reference_first_token(packer, config, size) -> int:
    """The first token the model packs from a tile view (view >= 1), else 0: from the model's packing."""
    views = model_packing(packer, config, size)[:, 0]
    from_tiles = torch.nonzero(views >= 1).flatten()
    return int(from_tiles[0]) if len(from_tiles) else 0


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("size", EXTREME_SIZES)
def test_extreme_sizes_report_select_and_highlight(name, size, configs, packers):
    """The app's whole path (overlay, first token, highlight, click) works for strips and stamps."""
    config = configs[name]
    height, width = size
    image = Image.new("RGB", (width, height), (128, 128, 128))
    overlay, table, plan, _ = tiling_report(image, config)
    assert overlay.mode == "RGB" and table[-1][2] == plan.num_image_tokens

    first = first_token_to_show(plan)
    assert first == reference_first_token(packers[name], config, size)
    assert plan.tokens[first].kind == ("tile" if plan.tile_tokens else "base")
    assert highlight_token(image, plan, first).size == display_size(*image.size)
    assert highlight_token(image, plan, plan.num_image_tokens - 1).size == display_size(*image.size)

    for x, y in [(0, 0), (width - 1, height - 1), (width // 2, height // 2)]:
        token = token_at(plan, x, y) or token_at(plan, x, y, kind="base")
        left, top, right, bottom = token.box
        assert left <= x < right and top <= y < bottom
        assert highlight_token(image, plan, token.index).size == display_size(*image.size)


@pytest.mark.parametrize("name", CONFIGS)
def test_extreme_and_limit_sizes_count_like_the_processor(name, configs, processors, packers):
    """Token counts and the first token for strips and for the pixel limit, against transformers."""
    config, processor, packer = configs[name], processors[name], packers[name]
    sizes = EXTREME_SIZES + LIMIT_SIZES
    reference_counts = processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    for size, counted in zip(sizes, reference_counts):
        plan = plan_tiling(size, config)
        packed = model_packing(packer, config, size)
        assert plan.num_image_tokens == placeholders_inserted(processor, size) == counted == packed.shape[0], size
        assert np.array_equal(expected_identity(plan), packed.long().numpy()), size
        assert first_token_to_show(plan) == reference_first_token(packer, config, size), size


@pytest.mark.parametrize("name, size", [("bundled", (3, 600)), ("bundled", (1, 8000)), ("bundled", (8000, 1)),
                                        ("real", (1, 8000)), ("real", (600, 3))])
def test_extreme_sizes_end_to_end_placeholders(name, size, configs, processors):
    """The whole processor on real pixels writes as many image tokens as the plan has."""
    processor = processors[name]
    inputs = processor(text=f"look {processor.image_token} here", images=[make_image(size[1], size[0], seed=2)],
                       return_tensors="pt")
    placeholders = int((inputs["input_ids"] == processor.image_token_id).sum())
    assert plan_tiling(size, configs[name]).num_image_tokens == placeholders


def test_highlight_refuses_an_image_the_plan_was_not_made_for(configs):
    plan = plan_tiling((300, 500), configs["bundled"])
    for other in [make_image(300, 500), make_image(501, 300), make_image(1, 8000)]:  # (width, height)
        with pytest.raises(G4VError, match="^the image changed since it was analysed.*analyse it again$"):
            highlight_token(other, plan, 0)
    assert highlight_token(make_image(500, 300), plan, 0).size == (500, 300)


def test_token_index_errors_name_the_valid_range(configs):
    image = make_image(500, 300)
    plan = plan_tiling((300, 500), configs["bundled"])
    last = plan.num_image_tokens - 1
    for index in [5000, plan.num_image_tokens, -1]:
        with pytest.raises(G4VError) as caught:
            highlight_token(image, plan, index)
        assert str(caught.value) == f"token index {index} is out of range: this image has tokens 0-{last}"
    for bad in [None, float("nan"), float("inf"), "abc", "3", 3.5, True, [3]]:
        with pytest.raises(G4VError, match="^token index must be a whole number, got ") as caught:
            highlight_token(image, plan, bad)
        assert "\n" not in str(caught.value)
    assert highlight_token(image, plan, 3.0).size == image.size  # a Number box sends 3.0
    assert highlight_token(image, plan, np.int64(3)).size == image.size


# ── Drawing ───────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("size, grid", [((128, 128), (1, 1)), ((300, 500), (2, 3)), ((700, 120), (6, 1))])
def test_overlay_png_for_three_grid_shapes(size, grid, configs, output_dir):
    height, width = size
    image = make_image(width, height, seed=1)
    overlay, table, plan, _ = tiling_report(image, configs["bundled"])
    assert plan.grid == grid
    assert overlay.mode == "RGB" and overlay.size == (1300, 650)  # 13 x 6.5 inches at 100 dpi
    assert table[-1] == ["total", "", plan.num_image_tokens]
    assert [row[2] for row in table[:3]] == [plan.base_tokens, plan.tile_tokens, plan.newline_tokens]
    path = output_dir / f"tiling-{grid[0]}x{grid[1]}.png"
    overlay.save(path)
    reread = Image.open(path)
    assert reread.size == overlay.size
    same_size_input = np.asarray(image.resize(overlay.size), dtype=np.int16)
    assert np.abs(np.asarray(reread.convert("RGB"), dtype=np.int16) - same_size_input).mean() > 10
    # Drawing again from the JSON form gives the same picture: viz needs plain data only.
    assert np.array_equal(np.asarray(render_tiling_overlay(image, json.loads(plan.to_json()))), np.asarray(overlay))


def test_the_overlay_draws_no_token_budget(configs, monkeypatch):
    """The tab shows the token budget as a table beside the picture and the CLI prints it: the
    overlay drew it a second time (issue 31's walk), so it draws only the canvas, the base view and
    their legend. Every text the figure holds is looked at, not the pixels."""
    from matplotlib.table import Table
    from matplotlib.text import Text

    from viz import tiling as vt

    drawn, real = [], vt.figure_to_image
    monkeypatch.setattr(vt, "figure_to_image", lambda figure, **kw: drawn.append(figure) or real(figure, **kw))
    plan = plan_tiling((300, 500), configs["bundled"])
    vt.render_tiling_overlay(make_image(500, 300, seed=1), plan.to_dict())
    figure, = drawn
    assert not figure.findobj(Table)
    texts = {t.get_text() for t in figure.findobj(Text)}
    assert "total" not in texts and not any(str(plan.num_image_tokens) == t for t in texts)
    assert not any(row[1] and row[1] in texts for row in plan.budget_rows())


def test_highlight_token_marks_its_box(configs):
    image = Image.new("RGB", (500, 300), (128, 128, 128))  # plain grey, so the highlight colour shows
    plan = plan_tiling((300, 500), configs["bundled"])
    token = next(t for t in plan.tokens if t.kind == "tile" and (t.row, t.col) == (5, 20))
    marked = highlight_token(image, plan, token.index)
    assert marked.size == image.size
    before, after = np.asarray(image, dtype=np.int16), np.asarray(marked, dtype=np.int16)
    highlight = np.array([230, 25, 75])  # viz.tiling.highlight_box's default colour
    left, top, right, bottom = (int(v) for v in token.box)
    inside = (slice(top + 3, bottom - 3), slice(left + 3, right - 3))
    assert np.abs(after[inside] - highlight).mean() < np.abs(before[inside] - highlight).mean() - 20
    far_away = (slice(250, 300), slice(0, 100))  # outside the token and its tile: only dimmed
    assert (after[far_away] <= before[far_away]).all() and after[far_away].mean() < before[far_away].mean() - 10


# ── CLI ───────────────────────────────────────────────────────────────────────────────────────────


def _cli(*args):
    return run_cli("tiling", *args)


def test_cli_json_and_png(tmp_path, processors, configs):
    image_path = tmp_path / "wide.png"
    make_image(500, 300, seed=4).save(image_path)
    png_path = tmp_path / "overlay.png"
    result = _cli("--model", str(BUNDLED_MODEL_DIR), str(image_path), "--json", "--png", str(png_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)

    assert data["image_size"] == {"width": 500, "height": 300}
    grid = get_anyres_image_grid_shape([300, 500], configs["bundled"].image_grid_pinpoints, 128)
    assert data["grid"] == list(grid)
    assert data["best_resolution"] == [grid[0] * 128, grid[1] * 128]
    processor = processors["bundled"]
    assert data["num_image_tokens"] == placeholders_inserted(processor, (300, 500)) == len(data["tokens"])
    assert data["base_tokens"] + data["tile_tokens"] + data["newline_tokens"] == data["num_image_tokens"]
    kinds = [t["kind"] for t in data["tokens"]]
    assert kinds.count("base") == data["base_tokens"] and kinds.count("newline") == data["newline_tokens"]
    assert all(len(t["box"]) == 4 for t in data["tokens"])
    assert Image.open(png_path).size == (1300, 650)


def test_cli_real_config_file_and_errors(tmp_path, processors):
    image_path = tmp_path / "tall.png"
    make_image(90, 1000, seed=5).save(image_path)
    result = _cli("--config", str(REAL_CONFIG_DIR / "config.json"), "--json", str(image_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["num_image_tokens"] == placeholders_inserted(processors["real"], (1000, 90))
    assert data["tile_size"] == 384

    missing = _cli(str(tmp_path / "nope.png"))
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "image not found" in missing.stderr
    bad_config = _cli("--config", str(image_path), str(image_path))
    assert bad_config.returncode == 1 and bad_config.stderr.startswith("error:")
    assert "Traceback" not in bad_config.stderr


def test_sizes_read_width_first_and_grids_in_words(tmp_path, capsys):
    """Issue 31, item 8: one order everywhere. A tall picture whose grid has more rows than columns,
    checked against the picture's own size and transformers' grid (rows, cols), never g4v's."""
    from g4v.cli import main
    from viz.tiling import overlay_title

    picture = make_image(400, 1000, seed=5)
    path = tmp_path / "tall.png"
    picture.save(path)
    config = load_config(REAL_CONFIG_DIR)
    rows, cols = get_anyres_image_grid_shape([picture.height, picture.width], config.image_grid_pinpoints,
                                             config.vision_config.image_size)
    assert rows != cols  # else the order could not show

    assert main(["tiling", "--config", str(REAL_CONFIG_DIR), str(path)]) == 0
    text = capsys.readouterr().out
    assert f"image            {picture.width} x {picture.height} px (width x height)" in text
    assert f"{cols} wide x {rows} tall" in text
    assert f"tiles {cols} wide x {rows} tall ->" in text  # the budget row

    assert main(["tiling", "--config", str(REAL_CONFIG_DIR), "--json", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["image_size"]["width"], data["image_size"]["height"]) == picture.size  # sides named, as in port-diff
    assert "image_width" not in data and "image_height" not in data  # said once
    title = overlay_title(data)
    assert title.startswith(f"image {picture.width} x {picture.height} px (width x height)")
    assert f"tiles {cols} wide x {rows} tall" in title
