"""The language model's own attention weights, read for one query row: what the Circuits view
draws and what the token budget's FastV-like policy ranks image tokens by.

Only eager attention materialises the attention weights (SDPA and flash attention never form them),
so a pass that reads them switches the language model to eager and back in ``finally``: a chat
answer served later by the same model never runs slower, or differently, because of it. A forward
hook on each chosen layer's attention module reads the weights the model itself computed and keeps
only the query row, ``(heads, seq)``; the layer's full ``(heads, seq, seq)`` matrix is freed as soon
as the layer is done.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from g4v.model.capture import language_model_of
from g4v.model.hooks import Hooks


@contextmanager
def eager_attention(model) -> Iterator[None]:
    """The language model on eager attention for the ``with`` block, its own implementation after."""
    language_model = language_model_of(model)
    previous = language_model.config._attn_implementation
    language_model.set_attn_implementation("eager")
    try:
        yield
    finally:
        language_model.set_attn_implementation(previous)


def attention_rows(model, inputs: dict, layers: list[int], position: int) -> torch.Tensor:
    """(len(layers), heads, seq) float32 on the CPU: the attention weights of query ``position`` at
    each of ``layers``, from one eager forward pass over ``inputs``."""
    language_model = language_model_of(model)
    rows: dict[int, torch.Tensor] = {}

    def keep_row(layer: int):
        def hook(module, args, output):
            weights = output[1]  # (batch, heads, query, key): eager attention returns them
            if layer not in rows:  # the prompt pass only
                rows[layer] = weights[0, :, position].detach().float().cpu()
        return hook

    with Hooks() as hooks, eager_attention(model), torch.inference_mode():
        for layer in layers:
            hooks.after(language_model.layers[layer].self_attn, keep_row(layer))
        model(**inputs, use_cache=False, logits_to_keep=1)
    return torch.stack([rows[layer] for layer in layers])
