"""Seeded synthetic bar charts for the demo checkpoint's chart-to-CSV task (issue 21).

Each chart has 2-4 bars, each a different named colour of :data:`g4v.demo.shapes.COLOURS`, with an
integer height of 1-5 drawn against a y axis with a tick mark per unit, and the colour's name
written under its bar (PIL's default font). The right answer to the ``<chart2csv>`` preset is the
chart's CSV (:func:`chart_csv`): a ``label,value`` header, then one ``colour,height`` row per bar,
left to right, in exactly the format :func:`g4v.documents.tables.parse_csv` reads.

Canvases reuse the shape pictures' kinds and sizes (:data:`g4v.demo.shapes.CANVASES`), so the same
anyres grids occur and a training batch can share one kind. Seeds follow :mod:`g4v.demo.shapes`:
training charts use string seeds ``chart:SEED:INDEX``, held-out and validation charts integer seeds
``CHART_EVAL_SEED * 10_000_000 + i`` and ``CHART_VALIDATION_SEED * 10_000_000 + i``, so the three
sets never meet.
"""

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from g4v.demo import shapes as S

#: The CSV header of every chart (the chart draws no axis titles, so the columns are generic).
CSV_HEADER = ("label", "value")
HEIGHTS = (1, 2, 3, 4, 5)
BARS = (2, 4)
#: Held-out charts and validation charts (seeds apart from the shape pictures' 7 and 8).
CHART_EVAL_SEED = 9
CHART_VALIDATION_SEED = 10
#: Font sizes tried for the labels, largest first: the largest whose widest label fits its slot.
FONT_SIZES = (10, 9, 8, 7, 6)


@dataclass
class Chart:
    """One drawn chart, its bars left to right as (colour name, height), and where each bar is
    (``mask``: bar ``i`` drawn as value ``i + 1``, and the empty plot right of the last bar as
    ``len(bars) + 1``, where "is there another bar?" is answered; the training's attention pointer
    uses it)."""

    image: Image.Image
    bars: list[tuple[str, int]]
    mask: Image.Image | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    @property
    def csv(self) -> str:
        return chart_csv(self.bars)


@dataclass(frozen=True)
class Layout:
    """Where a chart's parts go, in pixels: the axes' origin (x0, y0), the plot's right end, the
    height of one unit, and the width of one bar's slot."""

    x0: float
    y0: float
    right: float
    unit: float
    slot: float


def chart_csv(bars: list[tuple[str, int]]) -> str:
    """The chart's data as a ``<chart2csv>`` answer: header, then one row per bar, left to right."""
    return "\n".join(",".join(map(str, row)) for row in [CSV_HEADER, *bars])


def layout(width: int, height: int, bars: int, label_height: int) -> Layout:
    """Margins for the tick numerals (left), the labels (bottom) and some air (top, right); the y
    axis spans the five units, the x axis holds one equal slot per bar."""
    x0 = round(0.14 * width) + 4
    y0 = height - label_height - 5
    top = round(0.08 * height)
    right = width - round(0.04 * width)
    return Layout(x0=x0, y0=y0, right=right, unit=(y0 - top) / max(HEIGHTS), slot=(right - x0) / bars)


def label_font(names: list[str], slot: float):
    """PIL's default font at the largest size of :data:`FONT_SIZES` whose widest name fits a slot."""
    for size in FONT_SIZES:
        font = ImageFont.load_default(size=size)
        if max(font.getlength(name) for name in names) <= slot - 1:
            return font
    return ImageFont.load_default(size=FONT_SIZES[-1])


def make_chart(rng: random.Random, canvas: str | None = None) -> Chart:
    """Draw one chart: 2-4 distinct colours, heights 1-5, axes with ticks, labels under the bars."""
    width, height = S.canvas_size(rng, canvas or S.canvas_kind(rng))
    colours = rng.sample(list(S.COLOURS), rng.randint(*BARS))
    bars = [(colour, rng.choice(HEIGHTS)) for colour in colours]
    background = tuple(rng.randint(215, 250) for _ in range(3))
    image = Image.new("RGB", (width, height), background)
    mask = Image.new("L", (width, height), 0)
    draw, mask_draw = ImageDraw.Draw(image), ImageDraw.Draw(mask)
    font = label_font(colours, (width * 0.82) / len(bars))
    label_height = round(font.size * 1.1)
    box = layout(width, height, len(bars), label_height)
    ink = (60, 60, 60)
    draw.line([(box.x0, box.y0), (box.x0, box.y0 - max(HEIGHTS) * box.unit - 2)], fill=ink, width=1)
    draw.line([(box.x0, box.y0), (box.right, box.y0)], fill=ink, width=1)
    tick_font = ImageFont.load_default(size=max(6, min(9, round(box.unit * 0.7))))
    for value in HEIGHTS:
        y = box.y0 - value * box.unit
        draw.line([(box.x0 - 3, y), (box.x0, y)], fill=ink, width=1)
        draw.text((box.x0 - 4, y), str(value), fill=ink, font=tick_font, anchor="rm")
    fraction = rng.uniform(0.5, 0.7)
    for index, (colour, value) in enumerate(bars):
        centre = box.x0 + (index + 0.5) * box.slot
        half = box.slot * fraction / 2
        bar = [centre - half, box.y0 - value * box.unit, centre + half, box.y0 - 1]
        draw.rectangle(bar, fill=S.jitter(S.COLOURS[colour], rng))
        mask_draw.rectangle(bar, fill=index + 1)
        draw.text((centre, box.y0 + 3), colour, fill=ink, font=font, anchor="mt")
    top = box.y0 - max(HEIGHTS) * box.unit
    mask_draw.rectangle([centre + half + 1, top, box.right, box.y0 - 1], fill=len(bars) + 1)
    return Chart(image=image, bars=bars, mask=mask)


def chart(seed: int | str, **kwargs) -> Chart:
    """The chart for ``seed`` (the same everywhere)."""
    return make_chart(random.Random(seed), **kwargs)


def train_chart(seed: int, index: int, **kwargs) -> Chart:
    return chart(f"chart:{seed}:{index}", **kwargs)


def chart_eval_set(n: int, seed: int = CHART_EVAL_SEED) -> list[Chart]:
    """``n`` held-out charts (integer seeds, never a training seed)."""
    return [chart(seed * 10_000_000 + i) for i in range(n)]


def chart_validation_set(n: int) -> list[Chart]:
    """``n`` charts watched while training, apart from the training and held-out charts."""
    return chart_eval_set(n, seed=CHART_VALIDATION_SEED)
