"""The language model's own attention weights, read for one query row: what the Circuits view
draws and what the token budget's FastV-like policy ranks image tokens by.

Only eager attention materialises the attention weights (SDPA and flash attention never form them),
so a pass that reads them switches the language model to eager and back in ``finally``: a chat
answer served later by the same model never runs slower, or differently, because of it. A forward
hook on each chosen layer's attention module reads the weights the model itself computed and keeps
only the query row, ``(heads, seq)``; the layer's full ``(heads, seq, seq)`` matrix is freed as soon
as the layer is done.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from g4v.model.hooks import Hooks
from g4v.model.sites import site


@contextmanager
def eager_attention(model) -> Iterator[None]:
    """The language model on eager attention for the ``with`` block, its own implementation after."""
    language_model = site(model, "language_model")
    previous = language_model.config._attn_implementation
    language_model.set_attn_implementation("eager")
    try:
        yield
    finally:
        language_model.set_attn_implementation(previous)


#: ``progress(fraction, text)``: how far a long pass is, for a progress bar (None: not told).
Progress = Callable[[float, str], None] | None


def eager_pass(model, inputs: dict, layers: list[int], keep: Callable[[int, torch.Tensor], None],
               progress: Progress = None) -> None:
    """One forward pass over ``inputs`` on eager attention; ``keep(layer, weights)`` gets each of
    ``layers``' attention weights, ``(heads, query, key)`` of the batch's one row, as the model
    computed them, and keeps what it needs: the layer's matrix is freed when the layer is done, so
    at most one layer's weights exist at a time."""
    done: set[int] = set()

    def hook_for(layer: int):
        def hook(module, args, output):
            if layer in done:  # the prompt pass only
                return
            done.add(layer)
            keep(layer, output[1][0].detach())  # eager attention returns (output, weights)
            if progress is not None:
                progress(len(done) / len(layers), f"layer {layer} read")
        return hook

    with Hooks() as hooks, eager_attention(model), torch.inference_mode():
        for layer in layers:
            hooks.after(site(model, f"layers.{layer}.self_attn"), hook_for(layer))
        model(**inputs, use_cache=False, logits_to_keep=1)


def attention_rows(model, inputs: dict, layers: list[int], position: int, progress: Progress = None) -> torch.Tensor:
    """(len(layers), heads, seq) float32 on the CPU: the attention weights of query ``position`` at
    each of ``layers``, from one eager forward pass over ``inputs``."""
    rows: dict[int, torch.Tensor] = {}

    def keep_row(layer: int, weights: torch.Tensor) -> None:
        rows[layer] = weights[:, position].float().cpu()

    eager_pass(model, inputs, layers, keep_row, progress)
    return torch.stack([rows[layer] for layer in layers])
