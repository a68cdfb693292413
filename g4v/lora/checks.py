"""The checks a LoRA adapter passes before any engine sees it, and the model layout they compare with.

Granite 4 Vision adapters are PEFT LoRA folders (``adapter_config.json`` plus
``adapter_model.safetensors``) that change only language-model linear layers. An adapter is a file
a user points us at, found inside the adapter folders (:mod:`g4v.lora.folders`), and it is
**checked before use**: :func:`check_adapter` reads the config and the weights (safetensors only:
pickled ``.bin`` files can run code) and compares every tensor with the model's own layer shapes.
Each problem is its own one-line :class:`~g4v.errors.G4VError`, because "PEFT raised somewhere
inside generate" tells a user nothing.
"""

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from g4v.errors import G4VError
from g4v.lora.folders import WEIGHTS_FILE, read_adapter_config, resolve_adapter

#: Where the language model's layers live in transformers' Granite 4 Vision (in-memory names).
LANGUAGE_MODEL_PREFIX = "model.language_model."
VISION_TOWER_PREFIX = "model.vision_tower."
MAX_RANK = 1024
MAX_SCALING = 256.0

#: ``init_lora_weights`` values after which PEFT's loaded "base" is no longer the base: PiSSA, OLoRA
#: and CorDA subtract a low-rank part from each adapted weight when PEFT loads the adapter, LoftQ
#: replaces it with a quantized copy, and LoRA-GA adapters were trained against a weight PEFT offset
#: the same way (PEFT lists the same methods as needing conversion to plain LoRA before sharing).
#: Matched on the lower-cased value; ``pissa_niter_N`` and other PiSSA / CorDA spellings by prefix.
_BASE_REWRITING_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")
#: Values that only choose how A and B start (the saved weights replace them): the base is untouched.
_PLAIN_INITS = ("gaussian", "orthogonal", "eva", "mica")

#: PEFT options that change what the weights mean: with any of them set, ``W += scaling * B @ A``
#: is no longer the merge, and vLLM's per-request LoRA would not reproduce PEFT's output.
_UNSUPPORTED_OPTIONS = {
    "use_dora": "DoRA (its magnitude vector is not a plain low-rank update)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "target_parameters": "parameter targets (target_parameters)",
    "trainable_token_indices": "trainable token embeddings (trainable_token_indices)",
    "layer_replication": "layer replication",
    "lora_bias": "LoRA biases (lora_bias)",
    "fan_in_fan_out": "fan_in_fan_out weights",
    "use_qalora": "QA-LoRA",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
}

#: ``base_model.model.<module>.lora_A.weight`` as PEFT saves it (the adapter name is dropped).
_TENSOR_NAME = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight")


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: safe to hand to an engine or to merge into this model."""

    name: str  # what engines register it as: its path inside the adapter folder
    path: Path  # resolved folder
    rank: int
    alpha: float
    scaling: float  # alpha / rank (alpha / sqrt(rank) with rsLoRA): the merge factor
    modules: tuple[str, ...]  # language-model linear layers the weights change (in-memory names)
    #: On a checkpoint with a vision LoRA, whether it replaces it or runs on the vision model
    #: (``g4v.lora.activation``); None until activated, and on checkpoints without one.
    kind: str | None = None


# ── checks ─────────────────────────────────────────────────────────────────────────────────────


def load_adapter_spec(choice: str, model_config, dirs: list[Path] | None = None) -> AdapterSpec:
    """Resolve ``choice`` inside the adapter folders and check it against ``model_config``."""
    name, path = resolve_adapter(choice, dirs)
    return check_adapter(path, model_config, name=name)


def check_adapter(path: Path, model_config, name: str | None = None) -> AdapterSpec:
    """Check an adapter folder against a Granite 4 Vision config; one G4VError per problem."""
    name = name or Path(path).name
    config = read_adapter_config(path, name)
    _check_lora_type(config, name)
    _check_options(config, name)
    _check_init(config, name)
    rank, alpha, scaling = _rank_and_scaling(config, name)
    layout = model_layout(model_config)
    targeted = _targeted_modules(config, layout, name)
    tensors = read_adapter_weights(path, name)
    modules = _check_tensors(tensors, layout, targeted, rank, name)
    return AdapterSpec(name=name, path=Path(path), rank=rank, alpha=alpha, scaling=scaling, modules=modules)


def _check_lora_type(config: dict, name: str) -> None:
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise G4VError(f"adapter {name} is not a LoRA adapter (peft_type {peft_type!r}); only LoRA is supported")


def _check_options(config: dict, name: str) -> None:
    """Refuse full module copies and PEFT options that a plain low-rank update cannot express."""
    if config.get("modules_to_save"):
        raise G4VError(
            f"adapter {name} has modules_to_save ({', '.join(map(str, config['modules_to_save']))}): "
            "only LoRA weights are accepted, not full copies of model layers"
        )
    for option, what in _UNSUPPORTED_OPTIONS.items():
        if config.get(option):
            raise G4VError(f"adapter {name} uses {what}, which is not supported")
    if config.get("bias", "none") != "none":
        raise G4VError(f"adapter {name} trains biases (bias={config['bias']!r}); only bias='none' is supported")


def _check_init(config: dict, name: str) -> None:
    """Refuse initialisations that make PEFT rewrite the base weights when it loads the adapter.

    PEFT runs an adapter's initialisation again at load time. For most values that only sets A and
    B, which the saved weights then replace; for PiSSA-like ones it also changes the base layer, so
    the "base" the workbench compares against (adapter disabled) is another model, and a merge into
    the real base gives a third. Unknown values are refused too: PEFT's meaning for them is unknown.
    """
    value = config.get("init_lora_weights", True)
    if value is None or isinstance(value, bool):
        return
    spelled = value.lower() if isinstance(value, str) else None
    if spelled in _PLAIN_INITS:
        return
    if spelled is not None and spelled.startswith(_BASE_REWRITING_INITS):
        raise G4VError(
            f"adapter {name} uses init_lora_weights={value!r}, which rewrites the base weights when PEFT loads it, "
            "so the base model would no longer be the base; convert it to a plain LoRA adapter first "
            "(PEFT: save_pretrained(..., path_initial_model_for_weight_conversion=...))"
        )
    raise G4VError(f"adapter {name} has an unknown init_lora_weights value {value!r}")


def _rank_and_scaling(config: dict, name: str) -> tuple[int, float, float]:
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_RANK:
        raise G4VError(f"adapter {name}: rank r must be an integer from 1 to {MAX_RANK}, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) or alpha <= 0:
        raise G4VError(f"adapter {name}: lora_alpha must be a positive number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    if scaling > MAX_SCALING:
        raise G4VError(f"adapter {name}: scaling {scaling:g} (lora_alpha {alpha:g}, r {rank}) is above {MAX_SCALING:g}")
    return rank, float(alpha), float(scaling)


def _targeted_modules(config: dict, layout: "ModelLayout", name: str) -> set[str]:
    """The modules PEFT would wrap in this model (PEFT's own matching rule), all of them
    language-model linear layers; otherwise a G4VError naming the first offender."""
    from peft.tuners.tuners_utils import check_target_module_exists

    targets = config.get("target_modules")
    if not targets or not isinstance(targets, (str, list)):
        raise G4VError(f"adapter {name}: target_modules is missing or empty")
    if targets == "all-linear":
        targets = sorted(layout.linear)
    rule = SimpleNamespace(
        target_modules=targets,
        exclude_modules=config.get("exclude_modules"),
        layers_to_transform=config.get("layers_to_transform"),
        layers_pattern=config.get("layers_pattern"),
        modules_to_save=None,
        target_parameters=None,
    )
    try:
        matched = [module for module in layout.modules if bool(check_target_module_exists(rule, module))]
    except re.error as err:
        raise G4VError(f"adapter {name}: target_modules is not a valid pattern ({err})") from None
    if isinstance(targets, list):
        for target in targets:
            if not any(module == target or module.endswith(f".{target}") for module in layout.modules):
                raise G4VError(f"adapter {name} targets an unknown module {target!r} (not in this model)")
    if not matched:
        raise G4VError(f"adapter {name}: target_modules {targets!r} matches no module of this model")
    for module in matched:
        _check_language_linear(module, layout, name)
    return set(matched)


def _check_language_linear(module: str, layout: "ModelLayout", name: str) -> None:
    if module.startswith(VISION_TOWER_PREFIX):
        raise G4VError(
            f"adapter {name} targets the vision tower ({module}); only language-model layers "
            f"({LANGUAGE_MODEL_PREFIX}*) may be adapted"
        )
    if not module.startswith(LANGUAGE_MODEL_PREFIX):
        raise G4VError(f"adapter {name} targets {module}, which is not a language-model module")
    if module not in layout.linear:
        raise G4VError(f"adapter {name} targets {module}, which is not a linear layer")


def read_adapter_weights(path: Path, name: str) -> dict[str, torch.Tensor]:
    """All adapter tensors (adapters are small). Safetensors only: a pickle can run code."""
    from safetensors.torch import load_file

    weights_path = Path(path) / WEIGHTS_FILE
    if not weights_path.is_file():
        if (Path(path) / "adapter_model.bin").exists():
            raise G4VError(f"adapter {name} has only adapter_model.bin (a pickle); convert it to {WEIGHTS_FILE}")
        raise G4VError(f"adapter {name}: weights file {WEIGHTS_FILE} is missing")
    try:
        return load_file(str(weights_path))
    except Exception as err:  # safetensors raises several types for truncated or garbled files
        detail = (str(err).strip() or type(err).__name__).splitlines()[0][:200]
        raise G4VError(f"adapter {name}: weights file {WEIGHTS_FILE} is corrupt ({detail})") from None


def _check_tensors(tensors: dict, layout: "ModelLayout", targeted: set[str], rank: int, name: str) -> tuple[str, ...]:
    """Every tensor is a lora_A or lora_B of a targeted layer, with the shape this model needs."""
    parts: dict[str, set[str]] = {}
    for key in sorted(tensors):
        match = _TENSOR_NAME.fullmatch(key)
        if match is None:
            raise G4VError(f"adapter {name}: unexpected tensor {key} (only lora_A / lora_B weights are accepted)")
        module, part = match["module"], match["part"]
        if module not in layout.modules:
            raise G4VError(f"adapter {name} has weights for an unknown module {module} (not in this model)")
        _check_language_linear(module, layout, name)
        if module not in targeted:
            raise G4VError(f"adapter {name} has weights for {module}, which its target_modules does not name")
        out_features, in_features = layout.linear[module]
        expected = (rank, in_features) if part == "A" else (out_features, rank)
        tensor = tensors[key]
        if tuple(tensor.shape) != expected:
            raise G4VError(
                f"adapter {name}: {key} has shape {list(tensor.shape)}, this model needs {list(expected)} (rank {rank})"
            )
        if not tensor.is_floating_point() or not torch.isfinite(tensor).all():
            raise G4VError(f"adapter {name}: {key} holds non-finite or non-float values")
        parts.setdefault(module, set()).add(part)
    if not parts:
        raise G4VError(f"adapter {name}: weights file {WEIGHTS_FILE} holds no LoRA weights")
    for module, found in parts.items():
        if found != {"A", "B"}:
            missing = ({"A", "B"} - found).pop()
            raise G4VError(f"adapter {name}: {module} has no lora_{missing} weight")
    return tuple(sorted(parts))


def lora_pairs(spec: AdapterSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``module -> (A, B)`` for a checked adapter, as float32 (for the merge)."""
    tensors = read_adapter_weights(spec.path, spec.name)
    prefix = "base_model.model."
    return {
        module: (tensors[f"{prefix}{module}.lora_A.weight"].float(), tensors[f"{prefix}{module}.lora_B.weight"].float())
        for module in spec.modules
    }


# ── the model side ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ModelLayout:
    """Module names of a Granite 4 Vision model and the (out, in) shapes of its linear layers."""

    modules: tuple[str, ...]
    linear: dict


def model_layout(model_config) -> ModelLayout:
    """The layout for ``model_config``, from a weightless (meta-device) copy of the model: the
    checks then use transformers' own module tree, for the bundled and the real checkpoint alike."""
    return _layout_from_json(model_config.to_json_string(use_diff=False))


@functools.lru_cache(maxsize=4)
def _layout_from_json(config_json: str) -> ModelLayout:
    from transformers import AutoConfig, AutoModelForImageTextToText

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    modules = tuple(module_name for module_name, _ in model.named_modules() if module_name)
    linear = {
        module_name: (module.out_features, module.in_features)
        for module_name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    return ModelLayout(modules=modules, linear=linear)
