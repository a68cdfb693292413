"""The reverse view: which text tokens read a region of the picture.

A region is a box in the picture's own pixels. The tiling plan (:func:`g4v.tiling.plan_tiling`)
says which image tokens see it: every base-view and tile token whose box overlaps it (newline
tokens are left out: each one's box is its whole row, so it would join every region that touches
the row). For every text token of the prompt and of the model's first greedy answer tokens, the
view is the attention weight (averaged over heads) that token puts on the region's tokens, summed,
per layer.

How: the greedy answer first (the model's own ``generate``, its usual attention), then one pass
over prompt + answer on eager attention (:func:`g4v.circuits.common.eager_pass`), which keeps per
layer only ``(text tokens,)`` numbers: at most one layer's ``heads x seq x seq`` weights exist at a
time, and what is kept is ``layers x text tokens``.
"""

import math
from dataclasses import dataclass

import torch

from g4v.circuits.common import CircuitSettings, check_new_tokens, check_on_picture, image_positions, parse_layers
from g4v.model.attention import Progress, eager_pass
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.model.levels import describe_levels
from g4v.model.records import plain
from g4v.model.scoring import greedy_continuation
from g4v.tiling import TilingPlan, plan_tiling

#: The kinds of image token a region can hold (newline tokens span whole rows: never a region's).
REGION_KINDS = ("base", "tile")
#: A region is four numbers; a longer text is refused before it is read.
MAX_REGION_CHARS = 100

Box = tuple[int, int, int, int]


def parse_region(region, width: int, height: int) -> Box:
    """``"x0,y0,x1,y1"`` (or four numbers) in picture pixels -> the checked box, whole pixels, inside
    the ``width`` x ``height`` picture, with x0 < x1 and y0 < y1 (one that reaches past an edge is
    refused as patching's boxes are: :func:`~g4v.circuits.common.check_on_picture`)."""
    if region is None or (isinstance(region, str) and not region.strip()):
        raise G4VError("the reverse view needs a region: x0,y0,x1,y1 in the picture's pixels")
    if isinstance(region, str):
        if len(region) > MAX_REGION_CHARS:
            raise G4VError(f"a region is four numbers x0,y0,x1,y1; got {len(region):,} characters")
        parts = [part.strip() for part in region.replace(" ", ",").split(",") if part.strip()]
    else:
        parts = list(region)
    numbers = []
    for part in parts:  # each part read before they are counted: "20,20,abc" is wrong for its 'abc'
        try:
            number = float(part) if not isinstance(part, bool) else math.nan
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not math.isfinite(number):
            raise G4VError(f"a region's corners are numbers of pixels, got {str(part)[:20]!r}")
        numbers.append(number)
    if len(numbers) != 4:
        raise G4VError(f"a region is four numbers x0,y0,x1,y1, got {len(numbers)}")
    x0, y0, x1, y1 = numbers
    if x0 >= x1 or y0 >= y1:
        raise G4VError(f"the region {x0:g},{y0:g},{x1:g},{y1:g} is empty: x0 < x1 and y0 < y1 are needed")
    check_on_picture(f"the region {x0:g},{y0:g},{x1:g},{y1:g}", numbers, width, height)
    return math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1)


def overlapping_tokens(plan: TilingPlan, box: Box) -> list[int]:
    """Indices (in the plan's packing order) of the base-view and tile tokens whose box overlaps ``box``."""
    x0, y0, x1, y1 = box

    def overlaps(b) -> bool:
        return min(b[2], x1) > max(b[0], x0) and min(b[3], y1) > max(b[1], y0)

    return [i for i, token in enumerate(plan.tokens) if token.kind in REGION_KINDS and overlaps(token.box)]


@dataclass(frozen=True)
class RegionToken:
    """One image token of the region: its index in the tiling plan's order, its sequence position."""

    index: int
    position: int
    kind: str  # base or tile (REGION_KINDS)
    row: int
    col: int
    box: tuple  # (left, top, right, bottom) in picture pixels


@dataclass(frozen=True)
class TextToken:
    """One text token that reads the region (a column of :attr:`RegionAttention.weights`)."""

    position: int
    text: str
    part: str  # "prompt" or "answer"


@dataclass(frozen=True)
class TopReader:
    """One of the text tokens that attend to the region most, mean over the layers."""

    position: int
    text: str
    mean_attention: float


#: The reverse view names this many text tokens that attend to the region most.
TOP_READERS = 10


@dataclass(frozen=True)
class RegionAttention:
    """Attention from every text token (prompt and first answer tokens) onto one region's image
    tokens. The tab, the command and the figure read it by attribute; :meth:`to_dict` is
    ``reverse.json``."""

    region: Box  # x0, y0, x1, y1 in picture pixels
    layers: list[int]
    injection_layers: dict[int, str]  # llm layer -> the level injected in front of it
    region_token_indices: list[int]  # in the tiling plan's order
    region_positions: list[int]  # their sequence positions
    text_positions: list[int]  # every non-image position of prompt + answer, in order
    text_tokens: list[str]
    answer_start: int  # sequence position of the first answer token (= prompt length)
    weights: torch.Tensor  # (layers, text tokens) float32: head-mean attention, summed over the region
    by_kind: dict[str, torch.Tensor]  # REGION_KINDS -> (layers, text tokens): the same, from that kind only
    plan: TilingPlan

    def part(self, position: int) -> str:
        """``"answer"`` or ``"prompt"``: which part of the sequence ``position`` is in."""
        return "answer" if position >= self.answer_start else "prompt"

    @property
    def region_tokens(self) -> list[RegionToken]:
        tokens = self.plan.tokens
        return [RegionToken(i, p, tokens[i].kind, tokens[i].row, tokens[i].col, tuple(tokens[i].box))
                for i, p in zip(self.region_token_indices, self.region_positions)]

    @property
    def readers(self) -> list[TextToken]:
        """Every text token, in sequence order (the columns of ``weights``)."""
        return [TextToken(p, t, self.part(p)) for p, t in zip(self.text_positions, self.text_tokens)]

    @property
    def mean_over_layers(self) -> torch.Tensor:
        """(text tokens,): ``weights`` averaged over the layers."""
        return self.weights.mean(dim=0)

    @property
    def top_text_tokens(self) -> list[TopReader]:
        """The :data:`TOP_READERS` text tokens that attend to the region most, most first."""
        mean = self.mean_over_layers
        order = sorted(range(len(self.text_positions)), key=lambda i: -float(mean[i]))
        return [TopReader(self.text_positions[i], self.text_tokens[i], float(mean[i])) for i in order[:TOP_READERS]]

    def to_dict(self) -> dict:
        return {
            "region": list(self.region),
            "layers": self.layers,
            "injection_layers": {str(k): v for k, v in sorted(self.injection_layers.items())},
            "region_tokens": plain(self.region_tokens),
            "text_tokens": plain(self.readers),
            "answer_start": self.answer_start,
            "attention": self.weights.tolist(),  # per layer, one number per text token
            "attention_by_kind": {kind: value.tolist() for kind, value in self.by_kind.items()},
            "mean_over_layers": self.mean_over_layers.tolist(),
            "top_text_tokens": plain(self.top_text_tokens),
        }


def region_attention(engine, image, prompt: str, settings: CircuitSettings | None = None,
                     progress: Progress = None) -> RegionAttention:
    """Which text tokens attend to ``settings.box`` of ``image`` (a PIL image or a path), at
    ``settings.layers``, for the prompt and ``settings.max_new_tokens`` greedy answer tokens.
    Bad input raises :class:`G4VError`."""
    settings = settings or CircuitSettings()
    engine = require(engine, Instrumentable, "the circuits views")
    config, tokenizer = engine.model.config, engine.tokenizer
    layers = parse_layers(settings.layers, config.text_config.num_hidden_layers)
    tokens = check_new_tokens(settings.max_new_tokens)
    if image is None:
        raise G4VError("the circuits views need an image")
    picture = open_image(image)
    box = parse_region(settings.box, picture.width, picture.height)
    plan = plan_tiling((picture.height, picture.width), config)
    chosen = overlapping_tokens(plan, box)
    if not chosen:
        raise G4VError(f"no image token covers the region {','.join(map(str, box))}: it lies in the padding")
    inputs = engine.prepare_inputs([Message("user", prompt, [picture])], tokens)
    positions = image_positions(inputs, config, plan.num_image_tokens)
    prompt_length = inputs["input_ids"].shape[1]
    with engine.adapter_scope(None) as model:
        if progress is not None:
            progress(0.0, "greedy answer")
        answer = greedy_continuation(model, inputs, tokenizer, tokens) if tokens else []
        if config.image_token_index in answer:  # one pass would read it as a placeholder
            answer = answer[: answer.index(config.image_token_index)]
        full = with_answer(inputs, answer)
        ids = full["input_ids"][0]
        text = torch.ones(ids.shape[0], dtype=torch.bool)
        text[positions] = False
        text_positions = torch.nonzero(text).flatten()
        region = positions[chosen]
        kinds = torch.tensor([plan.tokens[i].kind == "base" for i in chosen])
        sums: dict[int, torch.Tensor] = {}

        def keep(layer: int, weights: torch.Tensor) -> None:
            # (heads, text, region) -> mean over heads -> (text, region), kept on the CPU
            block = weights[:, text_positions.to(weights.device)][:, :, region.to(weights.device)]
            sums[layer] = block.float().mean(dim=0).cpu()

        eager_pass(model, full, layers, keep, progress)
    stacked = torch.stack([sums[layer] for layer in layers])  # (layers, text, region)
    return RegionAttention(
        region=box,
        layers=layers,
        injection_layers={level.llm_layer: level.name for level in describe_levels(config)},
        region_token_indices=chosen,
        region_positions=region.tolist(),
        text_positions=text_positions.tolist(),
        text_tokens=[tokenizer.decode([int(ids[p])]) for p in text_positions],
        answer_start=prompt_length,
        weights=stacked.sum(dim=-1),
        by_kind={"base": stacked[:, :, kinds].sum(dim=-1), "tile": stacked[:, :, ~kinds].sum(dim=-1)},
        plan=plan,
    )


def with_answer(inputs: dict, answer: list[int]) -> dict:
    """``inputs`` with the ``answer`` tokens appended to the prompt (pictures unchanged)."""
    if not answer:
        return inputs
    ids = inputs["input_ids"]
    extra = torch.tensor([answer], dtype=ids.dtype, device=ids.device)
    full = {**inputs, "input_ids": torch.cat([ids, extra], dim=1)}
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"]
        full["attention_mask"] = torch.cat([mask, torch.ones_like(extra, dtype=mask.dtype)], dim=1)
    return full
