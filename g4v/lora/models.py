"""The models a LoRA comparison can put side by side, by name.

On a checkpoint with a vision LoRA in native mode (:mod:`g4v.checkpoint.vision_lora`) there are three:

* ``base``: the **base language model** (no LoRA at all, image or not);
* ``vision``: the **vision model**, what Chat answers (the vision LoRA on image requests);
* ``adapter``: the user's adapter, as its kind runs it (:mod:`g4v.lora.activation`):
  "**vision model + <adapter>**" for an adapter on the vision model, "**<adapter> (replaces the
  vision LoRA)**" for a replacement.

A checkpoint without a vision LoRA (every merged one), or one whose LoRA is merged at load, has no
base language model to run: there only ``vision`` (named "model", or "vision model (merged)") and
``adapter`` exist, and asking for ``base`` is one line rather than a fake third. With the vision
LoRA off, ``vision`` is the base language model and says so.
"""

from dataclasses import dataclass

from g4v.engines.base import WITHOUT_VISION_LORA
from g4v.errors import G4VError

BASE, VISION, ADAPTER = "base", "vision", "adapter"
MODELS = (BASE, VISION, ADAPTER)
#: What a comparison shows when nobody chooses: what the adapter changes in the model Chat runs.
DEFAULT_LEFT, DEFAULT_RIGHT = VISION, ADAPTER


def available_models(engine) -> tuple[str, ...]:
    """The models this engine can run: all three only with a vision LoRA in native mode."""
    if engine.vision_lora is not None and engine.vision_mode == "native":
        return MODELS
    return (VISION, ADAPTER)


def check_model(which: str, engine) -> str:
    """``which`` when this engine can run it; else one line naming the models it has."""
    if which not in MODELS:
        raise G4VError(f"unknown model {which!r} (expected one of {', '.join(MODELS)})")
    available = available_models(engine)
    if which not in available:
        reason = ("this checkpoint has no vision LoRA (its weights are the vision model)" if engine.vision_lora is None
                  else f"its vision LoRA is {engine.vision_mode} (--vision-lora {engine.vision_mode})")
        raise G4VError(f"there is no base language model to compare: {reason}; the models here are "
                       + " and ".join(repr(m) for m in available))
    return which


def model_label(which: str, engine, adapter: str | None = None, kind: str | None = None) -> str:
    """How the tab, the command and their pictures name ``which`` (``adapter``: its name; ``kind``:
    its :attr:`~g4v.lora.checks.AdapterSpec.kind`)."""
    if which == BASE:
        return "base language model"
    if which == VISION:
        if engine.vision_lora is None:
            return "model"
        return {"native": "vision model", "merged": "vision model (merged)",
                "off": "base language model (vision LoRA off)"}[engine.vision_mode]
    from g4v.lora.activation import REPLACES  # torch's: the lora-diff flags import this module without it

    name = adapter or "adapter"
    if kind == REPLACES:
        return f"{name} (replaces the vision LoRA)"
    return f"{model_label(VISION, engine)} + {name}"


def request_adapter(which: str, adapter: str | None) -> str | None:
    """The ``adapter=`` value an engine request for ``which`` carries."""
    return {BASE: WITHOUT_VISION_LORA, VISION: None, ADAPTER: adapter}[which]



@dataclass(frozen=True)
class Side:
    """One column of a comparison: which model, its name as shown, its requests' ``adapter=``."""

    which: str
    label: str
    adapter: str | None


def resolve_sides(engine, left: str, right: str, adapter: str | None, adapters_dir=None) -> tuple[Side, Side]:
    """Check both choices against the engine (bad ones are one line, before anything runs) and
    activate ``adapter`` when a side needs it."""
    check_model(left, engine)
    check_model(right, engine)
    if left == right:  # its answers would be compared with themselves: "the greedy choices never differ"
        raise G4VError(f"both sides are the {model_label(left, engine, (adapter or '').strip() or None)} "
                       f"({left}): choose two different models to compare")
    spec = None
    if ADAPTER in (left, right):
        if not (adapter or "").strip():
            raise G4VError("choose an adapter to compare (or compare two other models)")
        from g4v.lora.activation import activate_adapter

        spec = activate_adapter(engine, adapter, adapters_dir)

    def side(which):
        name, kind = (spec.name, spec.kind) if spec else (None, None)
        return Side(which, model_label(which, engine, name, kind), request_adapter(which, name))

    return side(left), side(right)


def model_choices(engine, adapter: str | None, adapters_dir=None) -> list[tuple[str, str]]:
    """``(label, which)`` for the tab's two model pickers, the adapter's entry named as its kind
    runs it (an adapter that fails its checks keeps a plain name: running it says why)."""
    from g4v.lora.activation import adapter_kind
    from g4v.lora.checks import load_adapter_spec
    from g4v.lora.folders import adapter_dirs

    kind = None
    if (adapter or "").strip() and engine.vision_lora is not None:  # without one every adapter's kind is None
        # (checking the adapter builds the model's module tree: the app's page is built before the model loads)
        try:
            kind = adapter_kind(load_adapter_spec(adapter, engine.model_config(), adapter_dirs(adapters_dir)), engine)
        except G4VError:
            pass
    return [(model_label(which, engine, adapter, kind), which) for which in available_models(engine)]
