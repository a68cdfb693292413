"""Region scores (both views on the same pixels) against an independent pixel raster, and the
attribution heatmap's colour scale centred on zero."""

import numpy as np
import pytest
import torch

from g4v.attribution.regions import region_scores
from g4v.loading import load_config
from g4v.paths import BUNDLED_MODEL_DIR
from g4v.tiling import plan_tiling


def _raster_regions(plan, scores: np.ndarray, height: int, width: int) -> dict[int, float]:
    """Spread every base token's score evenly over its pixels on a pixel grid, then sum that grid
    over each tile token's box and add the tile token's own score (integer-aligned boxes only)."""
    density = np.zeros((height, width))
    for token in plan.tokens:
        if token.kind == "base":
            left, top, right, bottom = (int(v) for v in token.box)
            density[top:bottom, left:right] += scores[token.index] / ((right - left) * (bottom - top))
    out = {}
    for token in plan.tokens:
        if token.kind == "tile" and token.box[2] > token.box[0] and token.box[3] > token.box[1]:
            left, top, right, bottom = (int(v) for v in token.box)
            out[token.index] = scores[token.index] + density[top:bottom, left:right].sum()
    return out


@pytest.mark.parametrize("size_hw", [(128, 128), (128, 256), (256, 256)])
def test_region_scores_equal_a_pixel_raster_of_both_views(size_hw):
    config = load_config(BUNDLED_MODEL_DIR)
    plan = plan_tiling(size_hw, config)
    boxes = [t.box for t in plan.tokens if t.kind in ("base", "tile")]
    assert all(float(v).is_integer() for box in boxes for v in box)  # sizes chosen so the raster is exact
    scores = torch.randn(plan.num_image_tokens, generator=torch.Generator().manual_seed(0))
    regions = region_scores(plan, scores)
    expected = _raster_regions(plan, scores.double().numpy(), *size_hw)
    assert expected and sorted(expected) == [i for i in range(len(regions)) if not torch.isnan(regions[i])]
    for index, value in expected.items():
        assert float(regions[index]) == pytest.approx(value, abs=1e-5)
    base_total = float(sum(scores[t.index] for t in plan.tokens if t.kind == "base"))
    tile_total = float(sum(scores[i] for i in expected))
    # tiles cover the whole picture here, so every base score is handed out exactly once
    assert float(torch.nansum(regions.double())) == pytest.approx(base_total + tile_total, abs=1e-4)


def test_signed_heatmaps_are_centred_on_zero(monkeypatch):
    """The colour bar of a map with scores from -1 to 3 runs from -3 to 3 (in units of the panel's
    largest magnitude, 3: -1 to 1, with -1 painted at -1/3): white means no effect."""
    from matplotlib.figure import Figure
    from PIL import Image

    from viz.attribution import attribution_figure

    seen = []
    original = Figure.colorbar

    def record(self, mappable, *args, **kwargs):
        seen.append((*mappable.get_clim(), float(np.nanmin(mappable.get_array()))))
        return original(self, mappable, *args, **kwargs)

    tokens = [("tile", (0, 0, 16, 16)), ("tile", (16, 0, 32, 16))]
    monkeypatch.setattr(Figure, "colorbar", record)  # records the limits, draws as before
    attribution_figure(Image.new("RGB", (32, 16), "white"), tokens, {"combined": [-1.0, 3.0]})
    assert seen == [(-1.0, 1.0, pytest.approx(-1 / 3))]
