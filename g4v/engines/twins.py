"""Views of a PEFT-adapted model without PEFT's layers on the hot path.

When an adapter is loaded into the model (transformers' PEFT integration), every adapted linear
layer becomes a PEFT ``LoraLayer``: even with every adapter disabled it runs Python and a dispatch
around each matrix product, on every layer of every decode step. The decode loop
(:mod:`g4v.engines.decode_loop`) answers the common cases through twins of the model instead:

* :func:`without_lora`: the base model, each LoRA layer replaced by the linear layer it wraps (the
  same weights: no memory);
* :func:`with_merged`: the model with one adapter merged in, ``W + scaling * B @ A`` in float32 as
  :func:`g4v.checkpoint.vision_lora.merge_into` merges at load (memory: the adapted layers' weights
  once more; :func:`merged_bytes`).

A twin is the model's own classes and forward: a shallow copy of each module on the way down to a
LoRA layer, every other module (the vision tower, the projectors, the embeddings) shared.
"""

import copy

import torch
from torch import nn


def _is_lora(module: nn.Module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "base_layer")


def lora_layers(model: nn.Module) -> list[nn.Module]:
    return [module for module in model.modules() if _is_lora(module)]


def _rebuilt(module: nn.Module, swap) -> nn.Module:
    """``module``, or a shallow copy of it whose LoRA layers below are replaced by ``swap(layer)``."""
    if _is_lora(module):
        return swap(module)
    children = {name: _rebuilt(child, swap) for name, child in module._modules.items() if child is not None}
    if all(child is module._modules[name] for name, child in children.items()):
        return module
    twin = copy.copy(module)
    twin._modules = {**module._modules, **children}
    return twin


def without_lora(model: nn.Module) -> nn.Module:
    """The model with every LoRA layer replaced by its base layer (``model`` itself when it has none)."""
    return _rebuilt(model, lambda layer: layer.get_base_layer())


def with_merged(model: nn.Module, adapter: str) -> nn.Module:
    """The model with ``adapter`` (a PEFT adapter name) merged into copies of the layers it adapts;
    every other adapter's layers become their base layers."""

    def merged(layer: nn.Module) -> nn.Module:
        base = layer.get_base_layer()
        if adapter not in layer.lora_A:
            return base
        lora_a, lora_b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        with torch.no_grad():
            weight = base.weight.float() + layer.scaling[adapter] * (lora_b.float() @ lora_a.float())
        linear = copy.copy(base)
        linear._parameters = {**base._parameters, "weight": nn.Parameter(weight.to(base.weight.dtype), requires_grad=False)}
        return linear

    return _rebuilt(model, merged)


def mergeable(model: nn.Module, adapter: str) -> bool:
    """Whether ``adapter``'s layers have plain floating-point weights to merge into (not int8)."""
    return all(type(layer.get_base_layer().weight.data) is torch.Tensor and layer.get_base_layer().weight.is_floating_point()
               for layer in lora_layers(model) if adapter in layer.lora_A)


def merged_bytes(model: nn.Module, adapter: str) -> int:
    """What :func:`with_merged` costs in memory: the weights of the layers ``adapter`` adapts."""
    return sum(layer.get_base_layer().weight.nbytes for layer in lora_layers(model) if adapter in layer.lora_A)


def free_bytes(device: torch.device) -> int:
    """Memory free on ``device`` now (the GPU's, or the machine's for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0
