"""The pointing game on the trained demo checkpoint, on a modest number of held-out pictures: the
map's top token must land on the named shape far more often than a token picked at random would
(that chance is computed independently, from the tiling plan and the shape's box). The issue's
80% / 90% targets are measured on more pictures by ``python -m g4v bench attribute --pointing-game N``
(docs/attribution.md)."""

import pytest

from g4v.attribution.pointing import boxes_overlap, pointing_game
from g4v.commands.attribute import demo_pointing_cases
from g4v.paths import TRAINED_MODEL_DIR
from g4v.tiling import plan_tiling

PICTURES = 6


def _chance(case, config, kind: str) -> float:
    """Share of the picture's ``kind`` tokens whose box overlaps the shape: a random token's hit rate."""
    plan = plan_tiling((case.image.height, case.image.width), config)
    boxes = [t.box for t in plan.tokens if t.kind == kind and t.box[2] > t.box[0] and t.box[3] > t.box[1]]
    return sum(boxes_overlap(box, case.box) for box in boxes) / len(boxes)


@pytest.fixture(scope="module")
def trained_engine():
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")


def test_the_top_token_points_at_the_named_shape_far_above_chance(trained_engine):
    cases = demo_pointing_cases(PICTURES)
    assert all(len(case.question.split()) == 5 and case.box for case in cases)
    result = pointing_game(trained_engine, cases, method="gradxinput", seeds=1)  # the cheap method, to keep CI lean
    config = trained_engine.model.config
    tile_chance = sum(_chance(case, config, "tile") for case in cases) / len(cases)
    base_chance = sum(_chance(case, config, "base") for case in cases) / len(cases)
    print(f"pointing game on {PICTURES}: tile {result.hit_rate:.2f} (chance {tile_chance:.2f}), "
          f"base {result.base_hit_rate:.2f} (chance {base_chance:.2f}), deletion {result.beats_random_rate:.2f}")
    assert result.pictures == PICTURES
    assert result.hit_rate >= min(0.6, 3 * tile_chance)
    assert result.base_hit_rate >= min(0.6, 3 * base_chance)
    assert result.beats_random_rate > 0.5  # the deletion curve falls faster than random on most pictures
