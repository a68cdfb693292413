"""Which weights a transformers-engine request runs on: its adapters, and the twins that spare the
hot path PEFT's layers.

LoRA adapters are loaded into the engine's one model with transformers' PEFT integration (no
wrapper object: ``engine.model`` stays the Granite model). A request's adapters are chosen as vLLM
chooses them (:meth:`AdapterSwitch.active_adapter`): the user's adapter when one is named (a
``stacked`` one, trained on the vision model, together with the vision LoRA), else the
checkpoint's vision LoRA in native mode for requests with a picture, else none.

Every holder of the engine's lock says which adapters it needs (:meth:`AdapterSwitch.holding`);
PEFT's state is changed only when it differs from what the last holder left (enabling adapters
walks every module of the model, too slow for every decode step). With adapters disabled PEFT's
LoRA layers call the original linear layer and nothing else, so base outputs stay bit-identical to
an engine that never loaded an adapter.

The decode loop runs the two common cases on twins (:mod:`g4v.engines.twins`) instead of through
PEFT's layers: the base model (no adapter) on the model with its LoRA layers unwrapped, and, with
:attr:`DecodeSettings.vision_copy`, image requests of a native vision LoRA on a copy of the
language model with the LoRA merged in.
"""

import itertools
import logging
import threading
from contextlib import contextmanager

from g4v.checkpoint.vision_lora import check_base_available
from g4v.engines.base import WITHOUT_VISION_LORA
from g4v.engines.decode_loop import Variant
from g4v.engines.twins import free_bytes, mergeable, merged_bytes, with_merged, without_lora
from g4v.errors import G4VError
from g4v.loading import VISION_ADAPTER

log = logging.getLogger("g4v.engines")

#: Free memory the merged copy must leave: what it costs, times this.
_COPY_MARGIN = 1.5


class FairLock:
    """A lock handed out in the order it was asked for: the decode loop takes it for every step,
    and an inspector that asks between two steps gets it next instead of waiting out the answer."""

    def __init__(self):
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._serving = 0

    def acquire(self) -> None:
        with self._cond:
            ticket = next(self._tickets)
            self._cond.wait_for(lambda: self._serving == ticket)

    def release(self) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class _Guard:
    """What every engine over one model shares (``TransformersEngine.around`` can put two on one
    model): its lock, PEFT's enabled adapters as last set, a count of adapter loads, and the
    PEFT names given out."""

    def __init__(self):
        self.lock = FairLock()
        self.enabled: tuple[str, ...] | None = None  # None: not known
        self.loads = 0
        self.names = itertools.count(1)  # PEFT names are the model's: unique across its engines

    def __reduce__(self):  # a copy of the model (deepcopy, pickle) is another model: a guard of its own
        return (_Guard, ())


def _guard_of(model) -> _Guard:
    guard = model.__dict__.get("_g4v_guard")
    if guard is None:
        guard = model.__dict__["_g4v_guard"] = _Guard()
    return guard


class AdapterSwitch:
    """The adapter half of :class:`~g4v.engines.hf.TransformersEngine` (see the module docstring).
    Needs ``model``, ``loaded``, ``decode`` (the :class:`~g4v.engines.decode_settings.DecodeSettings`)."""

    def _init_adapters(self) -> None:
        self._guard = _guard_of(self.model)
        self._lock = self._guard.lock  # one holder at a time: a request's step, a prefill, an inspector
        self._adapters: dict[str, str] = {}  # name -> PEFT's name for it (no dots, no slashes)
        self._stacked: set[str] = set()  # names applied on top of the vision LoRA
        self._twins: dict[tuple[Variant, int], object] = {}  # (variant, adapter loads when made) -> twin

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        """Load a checked LoRA folder into the shared model as ``name`` (replacing an adapter of
        that name); it stays disabled until a request asks for it. ``stacked``: applied on top of
        the vision LoRA (in merged mode that is the weights themselves)."""
        if stacked and self.vision_lora is not None and self.vision_mode == "off":
            raise G4VError(f"adapter {name} runs on top of the vision LoRA, which is off here (--vision-lora off)")
        with self._lock:
            self._stacked.discard(name)
            if name in self._adapters:
                self.model.delete_adapter(self._adapters.pop(name))
            peft_name = f"g4v_adapter_{next(self._guard.names)}"
            self._guard.enabled = None  # loading changes PEFT's state and the model's layers
            self._guard.loads += 1
            try:
                self.model.load_adapter(str(path), adapter_name=peft_name)
            except Exception as err:  # PEFT and file errors come in many types; the user needs one line
                if peft_name in (getattr(self.model, "peft_config", None) or {}):
                    self.model.delete_adapter(peft_name)  # undo a half-done load; the engine keeps serving
                detail = (str(err).strip() or type(err).__name__).splitlines()[0][:300]
                raise G4VError(f"could not load adapter {name}: {detail}") from None
            finally:
                self._enable(())
            self._adapters[name] = peft_name
            if stacked and self.vision_mode == "native":
                self._stacked.add(name)

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def active_adapter(self, adapter: str | None, image: bool) -> tuple[str, ...]:
        """The PEFT adapters a request runs with, as vLLM picks them: the user's adapter when one
        is named (it replaces the vision LoRA; a stacked one comes with it), else the vision LoRA
        in native mode when the request has an image, else none (the base language model, or
        merged weights)."""
        if adapter == WITHOUT_VISION_LORA:
            return ()
        if adapter in self._stacked:
            return (VISION_ADAPTER, self._adapters[adapter])
        if adapter is not None:
            return (self._adapters[adapter],)
        if image and self.loaded.vision_mode == "native":
            return (VISION_ADAPTER,)
        return ()

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter == WITHOUT_VISION_LORA:
            check_base_available(self.vision_lora, self.vision_mode)
        elif adapter is not None and adapter not in self.adapters():
            raise G4VError(f"unknown adapter {adapter!r}")

    # ── holding the model ────────────────────────────────────────────────────────────────────

    def _enable(self, active: tuple[str, ...]) -> None:
        """Make PEFT's enabled adapters ``active`` (caller holds the lock)."""
        if active == self._guard.enabled:
            return
        if active:
            self.model.enable_adapters()
            self.model.set_adapter(list(active) if len(active) > 1 else active[0])
        elif getattr(self.model, "_hf_peft_config_loaded", False):  # transformers' own "an adapter is loaded"
            self.model.disable_adapters()
        self._guard.enabled = active

    @contextmanager
    def _holding_active(self, active: tuple[str, ...]):
        with self._lock:
            self._enable(active)
            yield self.model

    @contextmanager
    def adapter_scope(self, adapter: str | None, image: bool = True):
        """Hold the engine with ``adapter`` enabled (``None``: the model an ``image`` request gets,
        the vision model in native mode) and yield the model, for callers that run their own
        forward passes (the inspectors, the token-level LoRA comparison)."""
        self._check_adapter(adapter)
        with self._holding_active(self.active_adapter(adapter, image)) as model:
            yield model

    # ── the decode loop's host ───────────────────────────────────────────────────────────────

    def variant(self, adapter: str | None, image: bool) -> Variant:
        """The weights a request runs on in the decode loop (:class:`~g4v.engines.decode_loop.Variant`)."""
        active = self.active_adapter(adapter, image)
        if active == (VISION_ADAPTER,) and self._vision_copy():
            return Variant(merged=VISION_ADAPTER)
        return Variant(adapters=active)

    def holding(self, variant: Variant):
        """Sole use of the model for one prefill or decode step of ``variant``."""
        return self._holding_active(variant.adapters)

    def weights(self, variant: Variant):
        """``(module, compilable)``: a twin for the base model and a merged adapter, the model
        itself (PEFT's layers enabled, not compiled) for the rest."""
        if variant.adapters:
            return self.model, False
        key = (variant, self._guard.loads)  # a twin made before an adapter was loaded is stale
        if key not in self._twins:
            with self._lock:
                self._twins = {made: twin for made, twin in self._twins.items() if made[1] == self._guard.loads}
                self._twins[key] = (with_merged(self.model, variant.merged) if variant.merged
                                    else without_lora(self.model))
        return self._twins[key], True

    def _vision_copy(self) -> bool:
        """Whether image requests of the native vision LoRA run on a merged copy (see
        :attr:`DecodeSettings.vision_copy`; never over int8 weights): decided once, when first asked."""
        if not hasattr(self, "_vision_copy_on"):
            setting = self.decode.vision_copy
            cost = merged_bytes(self.model, VISION_ADAPTER)
            fits = free_bytes(self.loaded.device) > _COPY_MARGIN * cost
            self._vision_copy_on = mergeable(self.model, VISION_ADAPTER) and (setting == "on" or (setting == "auto" and fits))
            self.info.details["vision_copy"] = (f"merged copy of the vision LoRA's layers, {cost / 2**20:.1f} MiB"
                                                if self._vision_copy_on else "vision LoRA through PEFT's layers")
        return self._vision_copy_on
