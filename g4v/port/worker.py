"""Functions that run *inside* vLLM's model workers, for the port inspector (:mod:`g4v.port`).

vLLM keeps its model in worker processes; the only way in is ``LLM.apply_model(func)``, which
pickles ``func`` (cloudpickle), runs ``func(model)`` in every worker and sends back the results.
Everything here is therefore a module-level function of the model (bound to its arguments with
:func:`functools.partial`), imports nothing from vLLM at module level, and returns only small
CPU tensors and plain Python values, so the answers travel back cheaply.

Why worker-side hooks instead of reading vLLM's outputs: vLLM's public outputs are tokens and
logprobs. The per-level visual features and the residual stream never leave the worker, so the
probes must run next to the model: :func:`embed_levels` calls the model's own multimodal embedding
function, :func:`install_trajectory_hooks` / :func:`collect_trajectory` wrap a real prefill (on the
capture points ``layers.{i}``, found by :func:`g4v.model.sites.site` as in transformers' model), and
:func:`module_facts` reads the sizes of the modules vLLM actually built.

State between calls (the hooks and what they record) lives on the model object as
``model._g4v_probe``, which persists in the worker between ``apply_model`` calls.
"""

from __future__ import annotations

import torch

from g4v.model.hooks import Hooks
from g4v.model.sites import site, site_names


def granite_model(model):
    """The ``Granite4VisionForConditionalGeneration`` vLLM built (``apply_model`` hands it over
    directly today; some runners wrap it, so unwrap ``.model`` once if needed)."""
    if hasattr(model, "embed_multimodal") and hasattr(model, "layerwise_projectors"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layerwise_projectors"):
        return inner
    raise TypeError(f"{type(model).__name__} is not vLLM's granite4_vision model")


def embed_levels(model, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> dict:
    """vLLM's own image path on the given pixel values: ``embed_multimodal`` returns, per image,
    all levels packed on the last dimension ``(tokens, lm_hidden * levels)``.

    Returns ``{"packed": [per-image float32 CPU tensor], "llm_layers": [...], "hidden": int}``.
    """
    model = granite_model(model)
    param = next(model.parameters())
    with torch.inference_mode():
        packed = model.embed_multimodal(pixel_values=pixel_values.to(param.device, param.dtype),
                                        image_sizes=image_sizes.to(param.device))
    return {
        "packed": [t.detach().float().cpu() for t in packed],
        "llm_layers": [int(x) for x in model._ds_layer_indices],
        "hidden": int(model.config.text_config.hidden_size),
    }


class _TrajectoryProbe:
    """Per-token L2 norms of the residual stream entering every decoder layer (after vLLM's
    injection, which happens in the layer loop right before the call) and leaving the last one.

    Forwards with a single token (decoding steps) are ignored; prefill forwards are recorded,
    chunk after chunk, until ``expected_tokens`` tokens have been seen (chunked prefill)."""

    def __init__(self, layers, expected_tokens: int):
        self.layers = layers
        self.expected = expected_tokens
        self.num_layers = len(layers)
        self.chunks: list[list[torch.Tensor]] = []  # per forward: one (tokens,) norm per point
        self.current: list[torch.Tensor] | None = None
        self.seen = 0
        self.hooks = Hooks()
        for idx, layer in enumerate(layers):
            self.hooks.before(layer, lambda m, a, k, idx=idx: self._pre(idx, a, k), with_kwargs=True)
        self.hooks.after(layers[-1], lambda m, a, o: self._post(o))

    def _pre(self, idx: int, args, kwargs):
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        if idx == 0:
            self.current = None
            if hidden.shape[0] <= 1 or self.seen >= self.expected:
                return
            self.current = []
        if self.current is not None:
            self.current.append(torch.linalg.vector_norm(hidden.float(), dim=-1).cpu())

    def _post(self, output):
        if self.current is None:
            return
        hidden = output[0] if isinstance(output, tuple) else output
        self.current.append(torch.linalg.vector_norm(hidden.float(), dim=-1).cpu())
        if len(self.current) == self.num_layers + 1:
            self.chunks.append(self.current)
            self.seen += int(self.current[0].shape[0])
        self.current = None

    def result(self) -> dict:
        if not self.chunks:
            return {"norms": None, "tokens": 0}
        points = [torch.cat([chunk[p] for chunk in self.chunks]) for p in range(self.num_layers + 1)]
        return {"norms": torch.stack(points), "tokens": self.seen}  # (num_layers + 1, tokens)

    def remove(self):
        self.hooks.remove()


def install_trajectory_hooks(model, expected_tokens: int) -> int:
    """Hook every decoder layer of vLLM's language model; returns the number of layers."""
    model = granite_model(model)
    remove_trajectory_hooks(model)
    layers = [site(model, name) for name in site_names(model, "layers.{i}")]
    model._g4v_probe = _TrajectoryProbe(layers, expected_tokens)
    return len(layers)


def collect_trajectory(model) -> dict:
    """What the hooks recorded, and remove them (so later requests run untouched)."""
    model = granite_model(model)
    probe = getattr(model, "_g4v_probe", None)
    if probe is None:
        return {"norms": None, "tokens": 0}
    result = probe.result()
    remove_trajectory_hooks(model)
    return result


def remove_trajectory_hooks(model) -> None:
    model = granite_model(model)
    probe = getattr(model, "_g4v_probe", None)
    if probe is not None:
        probe.remove()
        model._g4v_probe = None


def module_facts(model) -> dict:
    """The sizes and settings of the projector/injection modules vLLM built (read from the modules,
    not from the config), for the config audit (:func:`g4v.port.audit.audit_config`)."""
    model = granite_model(model)
    facts = {
        "deepstack_layer_map": [[int(v), int(l)] for v, l in model._deepstack_layer_map],
        "num_layerwise_projectors": len(site_names(model, "layerwise_projectors.{i}")),
        "spatial_vision_layer": int(model._spatial_vision_layer),
        "spatial_target_layers": [int(x) for x in model._spatial_target_layers],
        "num_spatial_projectors": len(site_names(model, "spatial_projectors.{i}")),
        "injection_layers": [int(x) for x in model._ds_layer_indices],
        "vision_feature_select_strategy": model._vision_feature_select_strategy,
        "downsample_rate": str(model._downsample_rate),
        "image_grid_pinpoints": [list(map(int, p)) for p in model.config.image_grid_pinpoints],
        "image_newline_size": int(model.image_newline.shape[0]),
        "vision_num_hidden_layers": len(_vision_model(model).encoder.layers),
        "num_llm_layers": len(site_names(model, "layers.{i}")),
    }
    facts["projectors"] = projector_facts(site(model, "layerwise_projectors.0"))
    return facts


def _vision_model(model):
    tower = model.vision_tower
    return tower.vision_model if hasattr(tower, "vision_model") else tower


def projector_facts(projector) -> dict:
    """Sizes of one vLLM ``WindowQFormerDownsampler``, read from its modules and parameters."""
    qformer = projector.qformer
    layers = qformer.encoder.layer
    first = layers[0] if len(layers) else None
    facts = {
        "qformer.num_hidden_layers": len(layers),
        "qformer.hidden_size": int(qformer.layernorm.normalized_shape[0]),
        "qformer.layer_norm_eps": float(qformer.layernorm.eps),
        "query_side": int(projector.query_side),
        "window_side": int(projector.window_side),
        "query_length": int(projector.query.shape[1]),
        "image_positions": int(projector.image_positions.shape[1]),
        "out_features": int(projector.out_linear.out_features),
    }
    if first is not None:
        attention = first.attention.attention
        facts.update({
            "qformer.num_attention_heads": int(attention.num_attention_heads),
            "qformer.intermediate_size": int(first.intermediate_query.dense.out_features),
            "qformer.encoder_hidden_size": int(first.crossattention.attention.key.in_features)
            if getattr(first, "has_cross_attention", False) else None,
            "qformer.cross_attention_frequency": int(qformer.config.cross_attention_frequency),
            "qformer.hidden_act": str(qformer.config.hidden_act),
        })
    return facts
