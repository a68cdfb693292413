"""An engine described at once and loaded when first used: what lets ``app.py`` serve its page
before the model is in memory.

Why: loading the transformers engine is about half of the app's start-up (transformers' model
classes, then the weights), yet building the page needs only what the model folder says: which
model and backend, its vision LoRA and its config. :class:`DeferredEngine` answers those from the
folder, checked as loading would check them (a missing or foreign folder is still one line before
anything is served), and loads the real engine the first time anything else is asked of it. The
app asks right after its page is served; a visitor's request that arrives meanwhile waits for that
one load, and a load that failed is the same one line for every request.
"""

import threading
from collections.abc import Callable

from g4v.engines.base import Engine, EngineInfo
from g4v.errors import G4VError, first_line


class DeferredEngine:
    """Stands for the engine ``load()`` returns. ``info``, ``vision_lora``, ``vision_mode`` and
    ``known_config`` are known before it loads (and are the loaded engine's afterwards); every other
    attribute is the loaded engine's, and asking for one loads it."""

    def __init__(self, load: Callable[[], Engine], info: EngineInfo, vision_lora, vision_mode: str, config):
        self._load, self._outline = load, (info, vision_lora, vision_mode, config)
        self._engine: Engine | None = None
        self._error: G4VError | None = None
        self._lock = threading.Lock()  # one load, however many requests are waiting for it

    def load(self) -> Engine:
        """The real engine, loaded by the first caller (the others wait for it). A load that
        failed, in whatever way (bad weights, out of memory, interrupted), is not tried again:
        every caller gets its one line."""
        with self._lock:
            if self._engine is None and self._error is None:
                try:
                    self._engine = self._load()
                except G4VError as err:
                    self._error = err
                except BaseException as err:  # out of memory, Ctrl-C: no second load behind the app's back
                    self._error = G4VError(f"could not load model {self._outline[0].model}: {first_line(err)}")
                    raise
            if self._error is not None:
                raise G4VError(str(self._error))
            return self._engine

    @property
    def is_loaded(self) -> bool:
        return self._engine is not None

    @property
    def info(self) -> EngineInfo:
        return self._engine.info if self._engine is not None else self._outline[0]

    @property
    def vision_lora(self):
        return self._engine.vision_lora if self._engine is not None else self._outline[1]

    @property
    def vision_mode(self) -> str:
        return self._engine.vision_mode if self._engine is not None else self._outline[2]

    def context_window(self) -> int:
        """The model's context length, from its config (what the loaded engine answers too): Chat
        checks a message against it before the model is in memory, so a refusal shows at once."""
        return int(self.known_config.text_config.max_position_embeddings)

    @property
    def known_config(self):
        """The model's transformers config: the loaded model's, or its folder's until then."""
        return self._engine.loaded.model.config if self._engine is not None else self._outline[3]

    def __getattr__(self, name: str):  # only for what the class does not define
        if name.startswith("_"):  # its own state not set yet (copy, pickle) or a probe: never a load
            raise AttributeError(name)
        return getattr(self.load(), name)


def defer_transformers(model: str, details: dict, **options) -> DeferredEngine:
    """A :class:`DeferredEngine` for ``TransformersEngine(model, **options)``, its outline read from
    the folder with the checks :func:`g4v.loading.load_model` makes first (so a bad ``--model``,
    ``--dtype`` or ``--vision-lora`` is refused before the page is served). ``details``: what
    :func:`g4v.engines.create_engine` adds to every engine's ``info.details``."""
    from g4v.engines.vision_lora import check_mode, describe, find_vision_lora
    from g4v.loading import load_config, pick_device, pick_dtype, resolve_source

    def load() -> Engine:
        from g4v.engines.hf import TransformersEngine

        engine = TransformersEngine(model, **options)
        engine.info.details.update(details)
        return engine

    source = resolve_source(model)
    mode = check_mode(options.get("vision_lora"))
    device = pick_device(options.get("device"))
    dtype = pick_dtype(device, options.get("dtype"))
    config = load_config(source)
    lora = find_vision_lora(source)
    info = EngineInfo(backend="hf", model=model, device=str(device), dtype=str(dtype).removeprefix("torch."))
    if lora is not None:  # as TransformersEngine says it (tests/test_deferred_engine.py holds them equal)
        info.details["vision_lora"] = describe(mode, lora)
    info.details.update(details)
    return DeferredEngine(load, info, lora, mode if lora is not None else "off", config)
