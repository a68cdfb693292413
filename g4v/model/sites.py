"""The capture points of Granite 4 Vision, declared once by name, and the one resolver of a name.

Every g4v hook goes on one of a few modules: the language model (its input is what the vision side
injects), a decoder layer (the residual stream around it), a layer's attention (its weights, its
mask) or a window Q-Former projector (a level's features). Rather than each caller walking
``model.model.language_model.layers[i].self_attn`` by hand, as TransformerLens names
``blocks.{i}.hook_resid_pre``, a caller names the point and :func:`site` finds the module::

    with Hooks() as hooks:
        hooks.before(site(model, "layers.3.self_attn"), hook, with_kwargs=True)

The names are the same for transformers' ``Granite4VisionForConditionalGeneration`` (PEFT's
wrapper of one included) and for the model vLLM builds inside its workers (:mod:`g4v.port.worker`),
which keeps the same modules under other paths (its ``hf_to_vllm_mapper``); :data:`SITES` writes
both paths down. Only torch's module API and g4v's own torch-free modules are used here, so vLLM's
workers import this module too.
"""

import re
from dataclasses import dataclass

import torch

from g4v.errors import G4VError, quoted
from g4v.model.levels import SPATIAL_OFFSETS, Level


@dataclass(frozen=True)
class Site:
    """Where one kind of capture point lives, from the module that holds the projectors (transformers'
    ``Granite4VisionModel``, vLLM's ``Granite4VisionForConditionalGeneration``); ``{i}`` is an index."""

    transformers: str
    vllm: str
    sees: str  # what a hook there sees


#: Every capture point, by name. ``{i}``: a decoder layer, or a projector in its list.
SITES: dict[str, Site] = {
    "language_model": Site(
        "language_model", "language_model.model",
        "the text model: a pre-hook's kwargs hold inputs_embeds (image placeholders zeroed) and the features "
        "it injects (transformers: deepstack_features {llm_layer: (image tokens, hidden)} and vision_mask; "
        "vLLM: deepstack_input_embeds)"),
    "layers.{i}": Site(
        "language_model.layers.{i}", "language_model.model.layers.{i}",
        "decoder layer i: its input is the residual stream after layer i's injection, its output the stream "
        "leaving it (vLLM's layer takes (positions, hidden_states) and returns (hidden_states, residual))"),
    "layers.{i}.self_attn": Site(
        "language_model.layers.{i}.self_attn", "language_model.model.layers.{i}.self_attn",
        "decoder layer i's attention: a pre-hook's kwargs hold the attention mask; on eager attention "
        "(transformers) the output is (output, weights (batch, heads, query, key))"),
    "layerwise_projectors.{i}": Site(
        "layerwise_projectors.{i}", "layerwise_projectors.{i}",
        "the window Q-Former of deepstack level i: its output is that level's features (views, queries, hidden)"),
    "spatial_projectors.{i}": Site(
        "spatial_projectors.{i}", "spatial_projectors.{i}",
        "the window Q-Former of spatial level i (corners in the order TL, TR, BL, BR): its output is that "
        "level's features"),
}

_PATTERNS = {pattern: re.compile(re.escape(pattern).replace(r"\{i\}", r"(\d+)") + r"\Z") for pattern in SITES}


def base_model_of(model):
    """The Granite 4 Vision model itself, also when PEFT wraps it (a LoRA being trained)."""
    unwrap = getattr(model, "get_base_model", None)
    return unwrap() if callable(unwrap) else model


def _holder(model) -> tuple[torch.nn.Module, str]:
    """The module :data:`SITES`' paths start from, and which of its columns applies."""
    base = base_model_of(model)
    for holder in (base, getattr(base, "model", None)):  # transformers' and vLLM's wrappers hold it as .model
        if not isinstance(holder, torch.nn.Module) or not hasattr(holder, "layerwise_projectors"):
            continue
        language_model = getattr(holder, "language_model", None)
        if hasattr(language_model, "layers"):
            return holder, "transformers"
        if hasattr(getattr(language_model, "model", None), "layers"):
            return holder, "vllm"
    raise G4VError(f"{type(model).__name__} is not a Granite 4 Vision model")


def _count(holder: torch.nn.Module, path: str) -> int:
    """How many modules the ``{i}`` of ``path`` runs over (the length of the list it indexes)."""
    return len(holder.get_submodule(path.split(".{i}")[0]))


def site_names(model, pattern: str | None = None) -> list[str]:
    """Every capture point of ``model`` by name (or those of one pattern of :data:`SITES`, in index
    order: ``site_names(model, "layers.{i}")`` is ``["layers.0", ...]`` for every decoder layer)."""
    if pattern is not None and pattern not in SITES:
        raise G4VError(f"no capture point pattern {quoted(pattern)}: the patterns are {', '.join(SITES)}")
    holder, layout = _holder(model)
    names = []
    for declared, where in SITES.items():
        if pattern not in (None, declared):
            continue
        if "{i}" in declared:
            names += [declared.replace("{i}", str(i)) for i in range(_count(holder, getattr(where, layout)))]
        else:
            names.append(declared)
    return names


def site(model, name: str) -> torch.nn.Module:
    """The module behind capture point ``name`` (see :data:`SITES`), in a transformers Granite 4
    Vision model or in vLLM's. A name that is not one gives one line listing the model's names."""
    holder, layout = _holder(model)
    for pattern, regex in _PATTERNS.items():
        found = regex.match(str(name))
        if found is None:
            continue
        path = getattr(SITES[pattern], layout)
        if found.groups():
            index = int(found.group(1))
            if index >= _count(holder, path):
                break
            path = path.replace("{i}", str(index))
        return holder.get_submodule(path)
    raise G4VError(f"no capture point {quoted(name)} in this model; its capture points: {_summary(holder, layout)}")


def _summary(holder: torch.nn.Module, layout: str) -> str:
    """The model's capture points in a few words: ``language_model, layers.0-3, layers.0-3.self_attn, ...``."""
    parts = []
    for pattern, where in SITES.items():
        count = _count(holder, getattr(where, layout)) if "{i}" in pattern else 1
        if count:
            parts.append(pattern.replace("{i}", f"0-{count - 1}" if count > 1 else "0"))
    return ", ".join(parts)


def projector_site(level: Level) -> str:
    """The name of the window Q-Former that makes ``level``'s features: ``layerwise_projectors.{i}``
    for deepstack level i, ``spatial_projectors.{offset}`` for a spatial level (the order of
    :data:`g4v.model.levels.SPATIAL_OFFSETS`)."""
    if level.kind == "deepstack":
        return f"layerwise_projectors.{level.index}"
    return f"spatial_projectors.{SPATIAL_OFFSETS.index(level.offset)}"
