"""Seeded synthetic pictures of simple shapes, with short canonical question/answer pairs.

Each picture holds one to three shapes (all different shapes, all different colours, each in a
different place) on a plain light background. Canvases vary in size and aspect ratio so that
several anyres grids occur (mostly 1 tile, some 1x2 / 2x1, a few larger), while staying small so
training on the CPU is fast.

Questions and their one-word answers (exact-match accuracy):

* ``colour``:   "What colour is the star?"  -> ``red``
* ``shape``:    "What shape is red?"        -> ``star``
* ``position``: "Where is the star?"        -> ``left`` / ``right`` / ``top`` / ``bottom``
* ``count``:    "How many shapes?"          -> ``one`` / ``two`` / ``three``

Everything is drawn from a ``random.Random(seed)``, so a seed gives the same pictures on every
machine. Training and evaluation use disjoint seeds (:func:`train_picture`, :func:`eval_set`).
"""

import math
import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

#: Named colours and the RGB they are drawn in (with a little jitter per shape).
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 40),
    "blue": (30, 60, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 40, 170),
    "black": (20, 20, 20),
}
#: The demo adapter's behaviour: colours answered in French (all single words in the tokenizer corpus).
FRENCH = {"red": "rouge", "green": "vert", "blue": "bleu", "yellow": "jaune", "purple": "violet", "black": "noir"}
SHAPES = ("circle", "square", "triangle", "star")
#: Places and their centres as fractions of (width, height).
PLACES = {
    "left": (0.22, 0.5),
    "right": (0.78, 0.5),
    "top": (0.5, 0.22),
    "bottom": (0.5, 0.78),
}
#: Shape radius as a fraction of the canvas's shorter side (drawn uniformly in this range). Big
#: enough that a shape spans about 5 vision patches across, which is what lets the tiny vision
#: tower tell a star from a circle; small enough that shapes in different places never overlap.
SHAPE_RADIUS = (0.15, 0.18)
NUMBERS = {1: "one", 2: "two", 3: "three"}
QUESTION_TYPES = ("colour", "shape", "position", "count")
#: Chance level of each question type (uniform guessing among its answers).
CHANCE = {"colour": 1 / len(COLOURS), "shape": 1 / len(SHAPES), "position": 1 / len(PLACES), "count": 1 / 3}

#: Training pictures use string seeds ("train:SEED:INDEX"), held-out ones integer seeds: never the same.
EVAL_SEED = 7
#: Pictures watched during training (learning curves, choosing settings): never the held-out ones.
VALIDATION_SEED = 8


@dataclass
class Shape:
    kind: str
    colour: str
    place: str


@dataclass
class QA:
    kind: str  # one of QUESTION_TYPES
    question: str
    answer: str


@dataclass
class Picture:
    image: Image.Image
    shapes: list[Shape]
    qas: list[QA] = field(default_factory=list)
    #: Same size as ``image``: 0 for background, else 1 + the index of the shape drawn there.
    mask: Image.Image | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


#: Canvas kinds and how often they occur: mostly about square (1 tile), some wide or tall (2 tiles),
#: a few larger (4 tiles, or 3 when one side falls short).
CANVASES = {"square": 0.6, "wide": 0.17, "tall": 0.17, "large": 0.06}


def canvas_kind(rng: random.Random) -> str:
    return rng.choices(list(CANVASES), weights=list(CANVASES.values()))[0]


def canvas_size(rng: random.Random, kind: str) -> tuple[int, int]:
    """(width, height) for a canvas kind."""
    if kind == "square":
        return rng.randint(88, 128), rng.randint(88, 128)
    if kind == "wide":
        return rng.randint(190, 250), rng.randint(100, 128)  # 1 x 2 tiles
    if kind == "tall":
        return rng.randint(100, 128), rng.randint(190, 250)  # 2 x 1 tiles
    if kind == "large":
        return rng.randint(200, 256), rng.randint(200, 256)
    raise ValueError(f"unknown canvas kind {kind!r}")


def jitter(rgb, rng: random.Random, amount: int = 20):
    """``rgb`` moved by up to ``amount`` per channel: a named colour is a range, not one value."""
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, r: float, fill) -> None:
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif kind == "square":
        s = r * 0.85
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)], fill=fill)
    elif kind == "star":
        points = []
        for i in range(10):
            radius = r if i % 2 == 0 else r * 0.45
            angle = -math.pi / 2 + i * math.pi / 5
            points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
        draw.polygon(points, fill=fill)
    else:
        raise ValueError(f"unknown shape {kind!r}")


def question(kind: str, shapes: list[Shape], index: int) -> QA:
    """The ``kind`` question about ``shapes[index]`` (the count question is about the whole picture):
    the one place the question wording and its answer are written."""
    shape = shapes[index]
    if kind == "colour":
        return QA("colour", f"What colour is the {shape.kind}?", shape.colour)
    if kind == "shape":
        return QA("shape", f"What shape is {shape.colour}?", shape.kind)
    if kind == "position":
        return QA("position", f"Where is the {shape.kind}?", shape.place)
    if kind == "count":
        return QA("count", "How many shapes?", NUMBERS[len(shapes)])
    raise ValueError(f"unknown question type {kind!r}")


def questions(shapes: list[Shape]) -> list[QA]:
    """One question of each type about a picture (the shape each is about chosen deterministically:
    the first shape; callers shuffle shapes when drawing, so that is a random one)."""
    return [question(kind, shapes, 0) for kind in QUESTION_TYPES]


def make_picture(rng: random.Random, max_shapes: int = 3, single_shape_p: float | None = None,
                 canvas: str | None = None, max_shapes_p: float | None = None) -> Picture:
    """Draw one picture with 1..max_shapes shapes; ``single_shape_p`` biases towards one shape and
    ``max_shapes_p`` towards ``max_shapes`` (None: no extra draw, so the same pictures as without);
    ``canvas`` fixes the canvas kind (training batches share one, so they need little padding)."""
    width, height = canvas_size(rng, canvas or canvas_kind(rng))
    if single_shape_p is not None and rng.random() < single_shape_p:
        count = 1
    elif max_shapes_p is not None and rng.random() < max_shapes_p:
        count = max_shapes
    else:
        count = rng.randint(1, max_shapes)
    kinds = rng.sample(SHAPES, count)
    colours = rng.sample(list(COLOURS), count)
    places = rng.sample(list(PLACES), count)
    background = tuple(rng.randint(215, 250) for _ in range(3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    mask = Image.new("L", (width, height), 0)
    mask_draw = ImageDraw.Draw(mask)
    side = min(width, height)
    shapes = []
    for kind, colour, place in zip(kinds, colours, places):
        fx, fy = PLACES[place]
        cx = (fx + rng.uniform(-0.03, 0.03)) * width
        cy = (fy + rng.uniform(-0.02, 0.02)) * height
        r = side * rng.uniform(*SHAPE_RADIUS)
        _draw_shape(draw, kind, cx, cy, r, jitter(COLOURS[colour], rng))
        shapes.append(Shape(kind, colour, place))
        _draw_shape(mask_draw, kind, cx, cy, r, len(shapes))
    return Picture(image=image, shapes=shapes, qas=questions(shapes), mask=mask)


def class_indices(shape: Shape) -> tuple[int, int, int]:
    """The shape's colour, shape and place as indices into :data:`COLOURS` / :data:`SHAPES` / :data:`PLACES`."""
    return list(COLOURS).index(shape.colour), SHAPES.index(shape.kind), list(PLACES).index(shape.place)


def feature_labels(picture: Picture, side: int = 8) -> tuple[list[int], list[int], list[int]]:
    """Per-cell labels of a ``side`` x ``side`` grid over the whole picture (row-major), as the base
    view's features see it: colour, shape and place class, 0 = background, else 1 + index into
    :data:`COLOURS` / :data:`SHAPES` / :data:`PLACES`. Each cell takes the label at its centre."""
    cells = list(picture.mask.resize((side, side), Image.NEAREST).getdata())
    colour_labels, shape_labels, place_labels = [], [], []
    for cell in cells:
        colour, kind, place = (-1, -1, -1) if cell == 0 else class_indices(picture.shapes[cell - 1])
        colour_labels.append(1 + colour)
        shape_labels.append(1 + kind)
        place_labels.append(1 + place)
    return colour_labels, shape_labels, place_labels


def picture(seed: int | str, **kwargs) -> Picture:
    """The picture for ``seed`` (the same everywhere)."""
    return make_picture(random.Random(seed), **kwargs)


def train_picture(seed: int, index: int, **kwargs) -> Picture:
    return picture(f"train:{seed}:{index}", **kwargs)


def eval_set(n: int, seed: int = EVAL_SEED) -> list[Picture]:
    """``n`` held-out pictures (seeds far from the training range)."""
    return [picture(seed * 10_000_000 + i) for i in range(n)]


def validation_set(n: int) -> list[Picture]:
    """``n`` pictures for learning curves while training, apart from both training and held-out sets."""
    return eval_set(n, seed=VALIDATION_SEED)


def french_answer(qa: QA) -> str:
    """The demo adapter's target answer: colours in French, other answers unchanged."""
    return FRENCH[qa.answer] if qa.kind == "colour" else qa.answer
