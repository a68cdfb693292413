"""Adapter activation: check a user's adapter against the engine's model, tell which kind it is, and
register it with the engine. Every engine user of an adapter comes through here (the LoRA tab,
``chat --adapter``, ``lora-diff``, Evaluate's arms), so the refusals below hold everywhere.

On a checkpoint with a vision LoRA (:mod:`g4v.checkpoint.vision_lora`) people fine-tune in two ways,
and the two must run differently:

* a **replacement** (:data:`REPLACES`): trained from the vision LoRA, so it holds the vision LoRA's
  update and more; per request it takes the vision LoRA's place, as vLLM does with a named
  adapter, on every engine;
* an adapter **on the vision model** (:data:`ON_VISION_MODEL`): trained on base + vision LoRA merged
  (a ``merge-lora`` checkpoint); transformers applies it on top of the vision LoRA (both enabled),
  vLLM serves it on merged weights only (``--vision-lora merged``): natively it would replace the
  vision LoRA.

Which kind an adapter is, the first rule that applies (:func:`adapter_kind`):

1. its ``g4v_adapter.json`` says so (``"kind"``: ``replaces-vision-lora`` or ``on-vision-model``);
2. its recorded base (``base_model_name_or_path``) is a ``merge-lora`` checkpoint of this model's
   own vision LoRA (that folder's ``g4v_merge.json`` says so): on the vision model;
3. its targets and rank: an adapter on every module of the vision LoRA with at least its rank can
   hold the vision LoRA, so it replaces it; one that cannot (fewer modules, lower rank) would lose
   the vision model wherever it falls short, so it was trained on the vision model.

A combination that vLLM would run differently from transformers, or that runs neither the model
the adapter was trained on, is one line (:func:`check_combination`).
"""

import json
from dataclasses import replace

from g4v.errors import G4VError
from g4v.lora.checks import AdapterSpec, load_adapter_spec
from g4v.lora.folders import adapter_dirs, local_base_folder, read_adapter_config, same_base
from g4v.lora.merge import MERGED_VISION_LORA, PROVENANCE_FILE

#: The kinds, as :attr:`AdapterSpec.kind` holds them (``None``: the checkpoint has no vision LoRA).
REPLACES = "replaces-vision-lora"
ON_VISION_MODEL = "on-vision-model"
KINDS = (REPLACES, ON_VISION_MODEL)
#: g4v's record beside an adapter's PEFT files (the demo's trainers and builders write it).
MARKER_FILE = "g4v_adapter.json"


def activate_adapter(engine, choice: str, adapters_dir=None) -> AdapterSpec:
    """Resolve and check ``choice`` against the engine's model, tell its kind, refuse a combination
    the engine would run wrongly, and register it with the engine if it is new. Returns the checked
    adapter; ``spec.name`` is what to pass as ``adapter=``."""
    spec = load_adapter_spec(choice, engine.model_config(), adapter_dirs(adapters_dir))
    spec = replace(spec, kind=adapter_kind(spec, engine))
    check_combination(spec, engine)
    if spec.name not in engine.adapters():
        engine.register_adapter(spec.name, str(spec.path), stacked=spec.kind == ON_VISION_MODEL)
    return spec


def adapter_kind(spec: AdapterSpec, engine) -> str | None:
    """:data:`REPLACES` or :data:`ON_VISION_MODEL` on an engine whose checkpoint has a vision LoRA,
    else None (the adapter simply runs on the model)."""
    vision = engine.vision_lora
    if vision is None:
        return None
    marked = _marker_kind(spec)
    if marked is not None:
        return marked
    if _trained_on_merged_vision_model(spec, engine.info.model):
        return ON_VISION_MODEL
    holds_it = set(vision.modules) <= set(spec.modules) and spec.rank >= vision.rank
    return REPLACES if holds_it else ON_VISION_MODEL


def check_combination(spec: AdapterSpec, engine) -> None:
    """One line for an adapter the engine's vision LoRA mode cannot run as it was trained."""
    mode = engine.vision_mode
    if spec.kind == REPLACES and mode == "merged":
        raise G4VError(f"adapter {spec.name} replaces the vision LoRA, which is merged into these weights "
                       "(--vision-lora merged), so it would run on top of it: use --vision-lora native")
    if spec.kind == ON_VISION_MODEL and mode == "off":
        raise G4VError(f"adapter {spec.name} was trained on the vision model (base + vision LoRA), which is off here "
                       "(--vision-lora off): use --vision-lora native or merged")


def _marker_kind(spec: AdapterSpec) -> str | None:
    path = spec.path / MARKER_FILE
    if not path.is_file():
        return None
    try:
        kind = json.loads(path.read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        raise G4VError(f"adapter {spec.name}: {MARKER_FILE} is not a readable JSON object") from None
    if kind is not None and kind not in KINDS:
        raise G4VError(f"adapter {spec.name}: {MARKER_FILE} names an unknown kind {kind!r} "
                       f"(expected {' or '.join(KINDS)})")
    return kind


def _trained_on_merged_vision_model(spec: AdapterSpec, model: str) -> bool:
    """Whether the adapter's recorded base is a merge-lora checkpoint of ``model``'s vision LoRA."""
    base = read_adapter_config(spec.path, spec.name).get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        return False
    folder = local_base_folder(base)
    if folder is None:  # a hub id
        return False
    try:
        merged = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):  # a folder without g4v's record
        return False
    return isinstance(merged, dict) and merged.get("adapter") == MERGED_VISION_LORA and \
        same_base(str(merged.get("base", "")), model)
