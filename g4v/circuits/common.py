"""What both circuits views share: their settings, the checked layer selection and query position,
the image-token positions of a prompt. Eager attention for one pass is the shared layer's
(:mod:`g4v.model.attention`, the token budget reads attention too).

Only eager attention materialises the attention weights (SDPA and flash attention never form them),
so a circuits pass switches the language model to eager and back in ``finally``: a chat answer
served later by the same model never runs slower, or differently, because of an inspection.
"""

from __future__ import annotations  # torch in annotations only: the circuits flags import this module without it

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from g4v.conversation import check_continuation_length
from g4v.errors import G4VError, NumberError, check_value, quoted, read_whole, whole_number
from g4v.model.levels import Level

if TYPE_CHECKING:
    import torch


#: A knockout window: a whole number of layers, 0 or more (None: use ``layers``).
check_window = whole_number(0, optional=True)


@dataclass
class CircuitSettings:
    """The one place for the circuits views' defaults; the command's flags are derived from it."""

    layers: str = field(default="all", metadata={"help": "decoder layers: all, N, or A-B (inclusive)"})
    window: int | None = field(default=None, metadata={
        "check": check_window,
        "help": "knockout: the layers within W of every injection layer (instead of --layers)"})
    token: int | None = field(default=None, metadata={
        "help": "sequence position of the query token (default: the last prompt token, which "
                "produces the first answer token; negative counts from the end)"})
    max_new_tokens: int = field(default=12, metadata={
        "check": check_continuation_length, "help": "knockout, patch: greedy continuation length (0: none); reverse: the answer tokens read with the prompt"})
    levels: str = field(default="all", metadata={
        "help": "patch: the levels patched one at a time: all, or names or indices, comma-separated "
                "(e.g. deepstack0,spatial_TL or 0,4)"})
    direction: str = field(default="both", metadata={
        "help": "patch: a_from_b (run A with B's features), b_from_a (the reverse) or both"})
    complement: bool = field(default=False, metadata={
        "help": "patch: patch every level but each chosen one (is the one kept needed?) instead of each alone"})
    region: str = field(default="all", metadata={
        "help": "patch: which image tokens take the other picture's features: all, tokens:A-B (image "
                "tokens in packing order, inclusive) or box:X0,Y0,X1,Y1 (pixels of picture A; the tokens "
                "whose box centre lies inside)"})
    box: str | None = field(default=None, metadata={
        "help": "reverse: the region of the picture read, X0,Y0,X1,Y1 in its pixels (X0 < X1, Y0 < Y1, "
                "inside the picture); the base-view and tile tokens whose box overlaps it"})


#: A layer range is a few digits; a longer text is refused before it is read as numbers.
MAX_LAYERS_CHARS = 40


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """``"all"``, ``"5"`` or ``"2-7"`` (inclusive) -> the checked decoder layers, in order."""
    text = str(spec).strip().lower()
    if text == "all":
        return list(range(num_layers))
    if len(text) > MAX_LAYERS_CHARS:
        raise G4VError(f"layers are written all, N or A-B (e.g. 2-5); got {len(text):,} characters")
    first, sep, last = text.partition("-")
    try:
        start, end = read_whole(first, signed=False), read_whole(last if sep else first, signed=False)
    except NumberError:
        raise G4VError(f"layers are written all, N or A-B with the digits 0-9 (e.g. 2-5), got {quoted(spec)}") from None
    if start > end:
        raise G4VError(f"the layer range {spec} is empty: its start is after its end")
    if end >= num_layers:
        raise G4VError(f"layer {end} is out of range: this model's language model has layers 0-{num_layers - 1}")
    return list(range(start, end + 1))


def window_layers(levels: list[Level], window: int, num_layers: int) -> list[int]:
    """The layers within ``window`` of any injection layer, clipped to the model's layers."""
    check_value("the window", window, check_window)
    if window >= num_layers:
        raise G4VError(f"a window of {window} layers is larger than this model's {num_layers} layers: "
                       "use --layers all to cover every layer")
    return sorted({layer for level in levels for layer in range(level.llm_layer - window, level.llm_layer + window + 1)
                   if 0 <= layer < num_layers})


def check_on_picture(named: str, box, width: int, height: int, picture: str = "the picture") -> None:
    """Refuse a box (x0, y0, x1, y1 in pixels, not empty) that is not wholly inside the ``width`` x
    ``height`` ``picture``, in one line that starts with ``named`` (e.g. ``"the box 0,0,200,200"``):
    outside it when it misses the picture, reaching past it when it crosses an edge. Both circuits
    views that take a box refuse it rather than clip it: a clipped box would read other tokens than
    the ones asked for."""
    x0, y0, x1, y1 = box
    size = f"{picture}, which is {width} x {height} px (width x height)"
    if x1 <= 0 or y1 <= 0 or x0 >= width or y0 >= height:
        raise G4VError(f"{named} is outside {size}")
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise G4VError(f"{named} reaches past {size}")


#: How a refusal names the greedy answer tokens asked for (the boxes' "answer tokens", ``--max-new-tokens``).
ANSWER_TOKENS = "the number of answer tokens"


def check_new_tokens(tokens) -> int:
    """The checked greedy continuation length of a knockout."""
    check_value(ANSWER_TOKENS, tokens, check_continuation_length)
    return tokens


def query_position(token: int | None, seq_len: int) -> int:
    """The checked sequence position of the query token (None: the last prompt token)."""
    if token is None:
        return seq_len - 1
    if not isinstance(token, int) or not -seq_len <= token < seq_len:
        raise G4VError(f"token position {token} is past the prompt: it has {seq_len} tokens "
                       f"(positions 0-{seq_len - 1}, or -1 to -{seq_len} from the end)")
    return token % seq_len


def image_positions(inputs: dict, config, expected: int) -> torch.Tensor:
    """(num_image_tokens,) sequence positions of the image tokens, which must number ``expected``
    (the tiling plan's count): the model packs one image's features in the plan's order."""
    import torch

    positions = torch.nonzero(inputs["input_ids"][0] == config.image_token_index).flatten().cpu()
    if positions.numel() == 0:
        raise G4VError("the circuits views need an image in the prompt")
    if positions.numel() != expected:
        raise RuntimeError(f"the tiling plan has {expected} image tokens, the prompt {positions.numel()}")
    return positions
