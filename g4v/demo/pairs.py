"""Pairs of held-out demo pictures that differ in one property: the colour or the place of the
shape a question asks about. Two-picture patching (:mod:`g4v.circuits.patching`) reads, per level,
which injection carries that difference into the language model.

Both pictures of a pair are drawn from one ``random.Random``: the same canvas (so the same tiling
grid and token layout), background, shape, size, jitter and distractor; only the asked-about
shape's colour (or place) differs. Seeds are strings ``patch-pairs:PROPERTY:INDEX``, a range that
neither training (``train:SEED:INDEX``) nor the held-out set (integers) draws from.
"""

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from g4v.demo.shapes import COLOURS, PLACES, SHAPE_RADIUS, SHAPES, Shape, _draw_shape, canvas_kind, canvas_size, question

#: The properties a pair can differ in, and the question type that asks about each.
PROPERTIES = {"colour": "colour", "place": "position"}


@dataclass
class PicturePair:
    index: int
    changed: str  # "colour" or "place"
    prompt: str  # the question about the changed shape, the same for both
    a: Image.Image
    b: Image.Image
    answer_a: str  # the true answers
    answer_b: str


def picture_pair(index: int, changed: str) -> PicturePair:
    """Pair ``index`` that differs in ``changed`` (see :data:`PROPERTIES`)."""
    if changed not in PROPERTIES:
        raise ValueError(f"unknown property {changed!r}")
    rng = random.Random(f"patch-pairs:{changed}:{index}")
    width, height = canvas_size(rng, canvas_kind(rng))
    kind, other_kind = rng.sample(SHAPES, 2)
    colours = rng.sample(list(COLOURS), 3)  # A's, B's (a colour pair only), the distractor's
    places = rng.sample(list(PLACES), 3)
    background = tuple(rng.randint(215, 250) for _ in range(3))
    shift = [rng.randint(-20, 20) for _ in range(3)]  # one jitter, the same in both pictures
    side = min(width, height)
    radius, other_radius = (side * rng.uniform(*SHAPE_RADIUS) for _ in range(2))
    distractor = rng.random() < 0.5
    nudge = [(rng.uniform(-0.03, 0.03), rng.uniform(-0.02, 0.02)) for _ in range(2)]

    def draw(colour: str, place: str) -> Image.Image:
        image = Image.new("RGB", (width, height), background)
        canvas = ImageDraw.Draw(image)
        if distractor:
            fx, fy = PLACES[places[2]]
            _draw_shape(canvas, other_kind, (fx + nudge[1][0]) * width, (fy + nudge[1][1]) * height, other_radius,
                        COLOURS[colours[2]])
        fx, fy = PLACES[place]
        rgb = tuple(max(0, min(255, c + d)) for c, d in zip(COLOURS[colour], shift))
        _draw_shape(canvas, kind, (fx + nudge[0][0]) * width, (fy + nudge[0][1]) * height, radius, rgb)
        return image

    a_colour, a_place = colours[0], places[0]
    b_colour, b_place = (colours[1], places[0]) if changed == "colour" else (colours[0], places[1])
    qa_a = question(PROPERTIES[changed], [Shape(kind, a_colour, a_place)], 0)
    qa_b = question(PROPERTIES[changed], [Shape(kind, b_colour, b_place)], 0)
    return PicturePair(index, changed, qa_a.question, draw(a_colour, a_place), draw(b_colour, b_place),
                       qa_a.answer, qa_b.answer)


def picture_pairs(n: int, changed: str) -> list[PicturePair]:
    return [picture_pair(index, changed) for index in range(n)]
