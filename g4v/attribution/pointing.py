"""The pointing game on the trained demo checkpoint: does the map point at the named shape?

For held-out pictures of 2-3 shapes (``g4v.demo.shapes``, never trained on; the front doors draw
them, since the library never imports the demo) and the question "What colour is the <shape>?",
the correct colour is explained (teacher-forced, the whole answer); a picture is a *hit* when the
highest-attributed tile token's box overlaps the named shape's box, and the deletion curve *beats
random* when its area is positive. Three tops are reported: the tile token by its own score, the
tile token by its region score (both views on the same pixels, :mod:`g4v.attribution.regions`),
and the base-view token.
"""

from dataclasses import dataclass

from g4v.attribution.deletion import deletion_curve
from g4v.attribution.forward import answer_ids, encode_image, make_answer
from g4v.attribution.gradients import attribute
from g4v.attribution.regions import region_scores
from g4v.attribution.run import top_token
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.model.levels import describe_levels
from g4v.tiling import plan_tiling

#: Chosen on validation pictures (docs/attribution.md): gradient x input's deletion curve beats
#: random more often than integrated gradients', and the mean of 8 random orders is a steadier
#: baseline than 2.
POINTING_METHOD = "gradxinput"
POINTING_STEPS = 8  # integrated-gradient path points, when the method is "ig"
POINTING_SEEDS = 8
#: What is explained: the answer's log-probability, or its log-odds against the other answers.
POINTING_TARGETS = ("logprob", "contrast")
POINTING_TARGET = "contrast"
#: The demo's picture sets for the game: held-out pictures to report on, validation pictures to
#: choose methods and settings on (the front door draws them).
PICTURE_SETS = ("held-out", "validation")


@dataclass
class PointingResult:
    method: str
    target: str  # one of POINTING_TARGETS
    pictures: int
    hits: int  # the top tile token (by its own score) overlaps the named shape
    region_hits: int  # the same for the top tile token by region score (both views)
    base_hits: int  # the same for the top base-view token
    beats_random: int
    rows: list[dict]  # per picture: question, answer, shape box, top token box, hit, area_between

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.pictures, 1)

    @property
    def region_hit_rate(self) -> float:
        return self.region_hits / max(self.pictures, 1)

    @property
    def base_hit_rate(self) -> float:
        return self.base_hits / max(self.pictures, 1)

    @property
    def beats_random_rate(self) -> float:
        return self.beats_random / max(self.pictures, 1)

    def to_dict(self) -> dict:
        return {"method": self.method, "target": self.target, "pictures": self.pictures, "hit_rate": self.hit_rate,
                "region_hit_rate": self.region_hit_rate, "base_hit_rate": self.base_hit_rate, "beats_random_rate": self.beats_random_rate, "rows": self.rows}


def boxes_overlap(a, b) -> bool:
    """Two (left, top, right, bottom) boxes share some area."""
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


@dataclass
class PointingCase:
    """One picture of the game: the question, the answer to explain, the named object's box."""

    image: object  # PIL image
    question: str
    answer: str
    box: tuple  # (left, top, right, bottom) in the image's pixels
    alternatives: tuple = ()  # the other possible answers, for the contrastive target


def pointing_game(engine, cases: list[PointingCase], method: str = POINTING_METHOD, steps: int = POINTING_STEPS,
                  seeds: int = POINTING_SEEDS, target: str = POINTING_TARGET, progress=None) -> PointingResult:
    """Play every case; the pictures come from the caller (the demo's shapes, in the front doors).
    ``progress(done, total)`` is called after each picture when given."""
    engine = require(engine, Instrumentable, "the pointing game")
    levels = describe_levels(engine.model.config)
    rows = []
    for number, case in enumerate(cases):
        inputs = engine.prepare_inputs([Message("user", case.question, [case.image])])
        plan = plan_tiling((case.image.height, case.image.width), engine.model.config)
        with engine.adapter_scope(None) as model:
            rivals = case.alternatives if target == "contrast" else ()
            answer = make_answer(engine.tokenizer, inputs["input_ids"], answer_ids(engine.tokenizer, case.answer), None,
                                 rivals)
            encoded = encode_image(model, inputs)
            attribution = attribute(model, encoded, answer, levels, method, steps)
            curve = deletion_curve(model, encoded, answer, attribution, seeds=seeds)
        tile, base = (top_token(plan, attribution.combined, kind) for kind in ("tile", "base"))
        region = top_token(plan, region_scores(plan, attribution.combined), "tile")
        rows.append({"question": case.question, "answer": case.answer, "shape_box": list(case.box),
                     "top_tile_box": tile and tile.box, "hit": bool(tile and boxes_overlap(tile.box, case.box)),
                     "top_region_box": region and region.box,
                     "region_hit": bool(region and boxes_overlap(region.box, case.box)),
                     "top_base_box": base and base.box,
                     "base_hit": bool(base and boxes_overlap(base.box, case.box)),
                     "area_between": curve.area_between})
        if progress:
            progress(number + 1, len(cases))
    return PointingResult(method, target, len(rows), sum(r["hit"] for r in rows), sum(r["region_hit"] for r in rows),
                          sum(r["base_hit"] for r in rows),
                          sum(r["area_between"] > 0 for r in rows), rows)
