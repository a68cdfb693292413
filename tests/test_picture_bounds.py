"""Every picture drawn over a photo is drawn from the photo shrunk first (issue 31, H5): Attribution
on a 39.9-megapixel picture, inside the pixel limit, passed 12 GB (the logit-lens figure painted
float64 at full resolution). Each check runs under an address-space limit."""

import pytest
from PIL import Image, ImageDraw

from g4v.settings.limits import limits
from g4v.tiling import plan_tiling
from tests.memory import address_space_limit
from viz.figures import MAX_PICTURE_SIDE

SIZE = (7300, 5465)  # 39.9 Mpx (width, height)
DRAWING_MB = 600  # headroom for drawing: one full-size float64 RGBA canvas alone takes 1,277 MB
RUN_MB = 1500  # headroom for a whole attribution request on the bundled checkpoint


@pytest.fixture(scope="module")
def photo():
    assert SIZE[0] * SIZE[1] <= limits().max_image_pixels
    picture = Image.new("RGB", SIZE, (40, 90, 200))
    ImageDraw.Draw(picture).rectangle((1000, 800, 4000, 3000), fill=(220, 30, 30))
    return picture


def test_figures_over_a_39_megapixel_picture_stay_small(hf_engine, photo):
    from g4v.attribution.lens import LensView
    from viz.attribution import attribution_figure, lens_figure
    from viz.deepstack import heatmaps_figure
    from viz.tiling import highlight_box, render_tiling_overlay

    plan = plan_tiling((photo.height, photo.width), hf_engine.model.config)
    tokens = [(t.kind, t.box) for t in plan.tokens]
    values = {"deepstack0": [float(i % 7) for i in range(len(tokens))]}
    views = [LensView("layer 0", [i % 3 for i in range(len(tokens))], [0.5] * len(tokens))]
    with address_space_limit(DRAWING_MB):
        pictures = [lens_figure(photo, tokens, views, {0: "red", 1: "blue", 2: "sky"}),
                    attribution_figure(photo, tokens, values), heatmaps_figure(photo, tokens, values),
                    render_tiling_overlay(photo, plan.to_dict()), highlight_box(photo, tokens[0][1], "token 0")]
    assert all(max(p.size) <= MAX_PICTURE_SIDE for p in pictures)


@pytest.mark.slow  # about 9 s on a quiet 2-core machine
def test_attribution_on_a_39_megapixel_picture_runs_within_bounds(hf_engine, photo, tmp_path):
    from g4v.attribution.run import FIGURE_FILES, AttributionSettings, run_attribution

    settings = AttributionSettings(target=" red", seeds=1, fractions=(0.0, 0.5))
    with address_space_limit(RUN_MB):
        report = run_attribution(hf_engine, photo, "What colour is the square?", settings, out_dir=tmp_path)
    assert sorted(report.figures) == sorted(FIGURE_FILES)
    assert all(max(figure.size) <= MAX_PICTURE_SIDE for figure in report.figures.values())
