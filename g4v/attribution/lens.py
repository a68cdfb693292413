"""The logit lens at image positions: what each layer's residual stream "would say" there.

At every point of the residual stream the inspector records (entering each decoder layer, after its
injection; and the last layer's output), the stream at the image positions goes through the model's
own final norm and LM head, divided by Granite's ``logits_scaling`` as the model's forward does; the
top token per image token is what gets drawn over the image. The same decoding is applied to each
level's injected features alone, to see what a level "writes". The last point is exactly the
model's own logits at those positions (tested).
"""

from dataclasses import dataclass

import torch

from g4v.model.capture import Capture, capture_forward
from g4v.model.levels import Level
from g4v.model.sites import site

CHUNK = 256  # image tokens decoded at a time: (CHUNK, vocab) logits, whatever the image size


@dataclass
class LensView:
    """The top token at each image token for one decoded stream."""

    name: str  # "layer 3" or a level name
    top_ids: list[int]  # per image token
    top_probs: list[float]


@dataclass
class LogitLens:
    layers: list[LensView]  # one per residual-stream point, 0 .. num_layers
    levels: list[LensView]  # one per level: its injected features alone
    vocabulary: dict[int, str]  # every top id -> its text

    def to_dict(self) -> dict:
        views = lambda items: [{"name": v.name, "top_ids": v.top_ids, "top_probs": v.top_probs} for v in items]
        return {"layers": views(self.layers), "levels": views(self.levels),
                "vocabulary": {str(k): v for k, v in sorted(self.vocabulary.items())}}


def lens_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """(tokens, hidden) residual stream -> (tokens, vocab) logits, as the model's head computes them."""
    language_model = site(model, "language_model")
    scaling = float(getattr(model.config.text_config, "logits_scaling", 1.0) or 1.0)
    return model.get_output_embeddings()(language_model.norm(hidden)) / scaling


def top_tokens(model, hidden: torch.Tensor) -> tuple[list[int], list[float]]:
    """(tokens, hidden) -> the top token id and its probability per token, ``CHUNK`` tokens at a time."""
    ids, probs = [], []
    with torch.inference_mode():
        for start in range(0, hidden.shape[0], CHUNK):
            p = torch.softmax(lens_logits(model, hidden[start:start + CHUNK]).float(), dim=-1)
            best = p.max(-1)
            ids += best.indices.tolist()
            probs += best.values.tolist()
    return ids, probs


def logit_lens(model, inputs: dict, tokenizer, levels: list[Level]) -> LogitLens:
    """One recording forward pass (the inspector's hooks, full tensors, removed afterwards), then
    the lens on every residual-stream point and every level's injected features."""
    capture, _ = capture_forward(model, inputs, full=True, levels=levels, logits_to_keep=1)
    return lens_of_capture(model, capture, tokenizer)


def lens_of_capture(model, capture: Capture, tokenizer) -> LogitLens:
    device = next(model.parameters()).device
    mask = capture.image_mask
    layers = []
    for point, stream in enumerate(capture.residual_stream):  # (seq, hidden) each
        ids, probs = top_tokens(model, stream[mask].to(device))
        layers.append(LensView(f"layer {point}", ids, probs))
    level_views = []
    for cap in capture.levels:
        ids, probs = top_tokens(model, cap.injected.to(device))
        level_views.append(LensView(cap.level.name, ids, probs))
    seen = {i for view in layers + level_views for i in view.top_ids}
    return LogitLens(layers, level_views, {i: token_text(tokenizer, i) for i in sorted(seen)})


def token_text(tokenizer, token_id: int) -> str:
    """A token's text for a legend: decoded, or, for a byte-level BPE piece that is not valid UTF-8
    alone (it decodes to U+FFFD), its bytes as ``<0xE2>``: the replacement character names nothing."""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    piece = tokenizer.convert_ids_to_tokens(token_id)
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    if not piece or any(char not in byte_of for char in piece):
        return piece or text  # not a byte-level piece (e.g. SentencePiece's own "<0xE2>")
    return "".join(f"<0x{byte_of[char]:02X}>" for char in piece)
