"""Where the language model reads the picture: the attention weight from one text token to every
image token, per layer and head, and the share of its attention that goes to the picture.

One instrumented pass over the prompt, on eager attention for that pass only
(:func:`g4v.circuits.common.eager_attention`). A forward hook on each chosen layer's attention
module reads the weights the model itself computed (eager returns them) and keeps only the query
row, ``(heads, seq)``; the layer's full ``(heads, seq, seq)`` matrix is freed as soon as the layer
is done. So at most one layer's weights exist at a time, and what is kept is ``layers x heads x seq``,
not ``layers x heads x seq^2`` as ``output_attentions=True`` would keep. Reading the model's own
weights, rather than recomputing softmax(q k^T) from q and k, keeps no copy of its scaling, rotary
embedding and masking that could drift from transformers'.
"""

from dataclasses import dataclass

import torch
from PIL import Image

from g4v.circuits.common import CircuitSettings, image_positions, parse_layers, query_position
from g4v.conversation import Message
from g4v.engines.capabilities import Instrumentable, require
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.model.attention import Progress, attention_rows, eager_pass
from g4v.model.levels import describe_levels
from g4v.model.records import plain
from g4v.tiling import TOKEN_KINDS, TilingPlan, plan_tiling


@dataclass(frozen=True)
class PlacedImageToken:
    """One image token (:class:`g4v.tiling.ImageToken`) with its place in the prompt's sequence."""

    position: int  # in the prompt's token sequence
    kind: str  # base, tile or newline (g4v.tiling.TOKEN_KINDS)
    row: int
    col: int
    tile: int | None  # the tile it belongs to (None: base view)
    box: tuple  # (left, top, right, bottom) in picture pixels


@dataclass(frozen=True)
class ImageAttention:
    """Attention from the query token to the image tokens, at each chosen layer. The tab, the
    command and the figures read it by attribute; :meth:`to_dict` is ``attention.json``."""

    query_position: int  # in the prompt's token sequence
    query_token: str
    layers: list[int]  # the decoder layers, in order; rows of ``per_head``
    injection_layers: dict[int, str]  # llm layer -> the level injected in front of it
    image_positions: list[int]  # sequence position of each image token, in the tiling plan's order
    per_head: torch.Tensor  # (layers, heads, num_image_tokens) float32, CPU
    text_per_head: torch.Tensor  # (layers, heads) float32: the rest of each row (text tokens)
    plan: TilingPlan  # token i of the plan is image_positions[i]; its box is where it sits

    @property
    def num_heads(self) -> int:
        return int(self.per_head.shape[1])

    @property
    def num_image_tokens(self) -> int:
        return len(self.image_positions)

    @property
    def image_tokens(self) -> list[PlacedImageToken]:
        """Every image token, in the tiling plan's order (the columns of :meth:`maps`)."""
        return [PlacedImageToken(p, t.kind, t.row, t.col, t.tile, tuple(t.box))
                for p, t in zip(self.image_positions, self.plan.tokens)]

    @property
    def mean(self) -> torch.Tensor:
        """(layers, num_image_tokens): the weights averaged over heads."""
        return self.per_head.mean(dim=1)

    @property
    def image_share(self) -> torch.Tensor:
        """(layers,): the share of the query's attention (averaged over heads) on all image tokens."""
        return self.mean.sum(dim=-1)

    def maps(self, head: int | None = None) -> list[list[float]]:
        """Per layer, one weight per image token: averaged over heads, or ``head``'s own."""
        return (self.mean if head is None else self.per_head[:, head]).tolist()

    def share_by_kind(self) -> dict[str, list[float]]:
        """The head-averaged share on each kind of image token (base view, tiles, newlines), per layer."""
        kinds = [token.kind for token in self.plan.tokens]
        mean = self.mean
        return {kind: mean[:, [i for i, k in enumerate(kinds) if k == kind]].sum(dim=-1).tolist()
                for kind in TOKEN_KINDS}

    def to_dict(self) -> dict:
        return {
            "query_position": self.query_position,
            "query_token": self.query_token,
            "layers": self.layers,
            "injection_layers": {str(k): v for k, v in sorted(self.injection_layers.items())},
            "num_heads": self.num_heads,
            "num_image_tokens": self.num_image_tokens,
            "image_share": self.image_share.tolist(),
            "image_share_per_head": self.per_head.sum(dim=-1).tolist(),
            "text_share_per_head": self.text_per_head.tolist(),
            "image_share_by_kind": self.share_by_kind(),
            "mean_attention": self.maps(),  # per layer, one weight per image token
            "attention_per_head": self.per_head.tolist(),  # per layer, per head, one weight per image token
            "image_tokens": plain(self.image_tokens),
        }


def image_attention(engine, image, prompt: str, settings: CircuitSettings | None = None,
                    progress: Progress = None) -> ImageAttention:
    """Attention from ``settings.token`` (default: the last prompt token) to every image token of
    ``image`` (a PIL image or a path) at ``settings.layers``; ``progress`` is told each layer read.
    Bad input raises :class:`G4VError`."""
    settings = settings or CircuitSettings()
    engine = require(engine, Instrumentable, "the circuits views")
    config = engine.model.config
    layers = parse_layers(settings.layers, config.text_config.num_hidden_layers)
    if image is None:
        raise G4VError("the circuits views need an image")
    picture = open_image(image)
    inputs = engine.prepare_inputs([Message("user", prompt, [picture])])
    plan = plan_tiling((picture.height, picture.width), config)
    positions = image_positions(inputs, config, plan.num_image_tokens)
    seq_len = inputs["input_ids"].shape[1]
    position = query_position(settings.token, seq_len)
    with engine.adapter_scope(None) as model:
        rows = attention_rows(model, inputs, layers, position, progress)  # (layers, heads, seq)
    image_mask = torch.zeros(seq_len, dtype=torch.bool)
    image_mask[positions] = True
    token_id = int(inputs["input_ids"][0, position])
    return ImageAttention(
        query_position=position,
        query_token=engine.tokenizer.decode([token_id]),
        layers=layers,
        injection_layers={level.llm_layer: level.name for level in describe_levels(config)},
        image_positions=positions.tolist(),
        per_head=rows[:, :, positions],
        text_per_head=rows[:, :, ~image_mask].sum(dim=-1),
        plan=plan,
    )
