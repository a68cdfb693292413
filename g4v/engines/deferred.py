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

from g4v.engines.base import Engine, EngineInfo, transformers_info
from g4v.errors import G4VError, first_line
from g4v.loading import ModelOutline


class DeferredEngine:
    """Stands for the engine ``load()`` returns. ``info``, ``vision_lora``, ``vision_mode``,
    ``known_config`` and ``context_window()`` are known from ``outline`` before it loads (and are
    the loaded engine's afterwards); every other attribute is the loaded engine's, and asking for
    one loads it."""

    def __init__(self, load: Callable[[], Engine], info: EngineInfo, outline: ModelOutline):
        self._load, self._info, self.outline = load, info, outline
        self._engine: Engine | None = None
        self._error: G4VError | None = None
        self._lock = threading.Lock()  # one load, however many requests are waiting for it

    def load(self) -> Engine:
        """The real engine, loaded by the first caller (the others wait for it). A load that
        failed, in whatever way (bad weights, out of memory, interrupted), is not tried again:
        every caller gets its one line (:attr:`error`)."""
        with self._lock:
            if self._engine is None and self._error is None:
                try:
                    self._engine = self._load()
                except G4VError as err:
                    self._error = err
                except BaseException as err:  # out of memory, Ctrl-C: no second load behind the app's back
                    self._error = G4VError(f"could not load model {self.outline.model}: {first_line(err)}")
                    raise
            if self._error is not None:
                raise G4VError(str(self._error))
            return self._engine

    @property
    def is_loaded(self) -> bool:
        return self._engine is not None

    @property
    def error(self) -> G4VError | None:
        """Why the load failed, in one line (None: it has not failed)."""
        return self._error

    @property
    def info(self) -> EngineInfo:
        return self._engine.info if self._engine is not None else self._info

    @property
    def vision_lora(self):
        return self._engine.vision_lora if self._engine is not None else self.outline.vision_lora

    @property
    def vision_mode(self) -> str:
        return self._engine.vision_mode if self._engine is not None else self.outline.vision_mode

    @property
    def known_config(self):
        """The model's transformers config: the loaded model's, or its folder's until then."""
        return self._engine.loaded.model.config if self._engine is not None else self.outline.config

    def context_window(self) -> int:
        """The model's context length, from its config (what the loaded engine answers too): Chat
        checks a message against it before the model is in memory, so a refusal shows at once."""
        return int(self.known_config.text_config.max_position_embeddings)

    def __getattr__(self, name: str):  # only for what the class does not define
        if name.startswith("_"):  # its own state not set yet (copy, pickle) or a probe: never a load
            raise AttributeError(name)
        return getattr(self.load(), name)


def defer_transformers(model: str, details: dict, **options) -> DeferredEngine:
    """A :class:`DeferredEngine` for ``TransformersEngine(model, **options)`` (``device``, ``dtype``,
    ``vision_lora``): the folder is outlined now with :func:`g4v.loading.outline_model`, the checks
    loading makes first (so a bad ``--model``, ``--dtype`` or ``--vision-lora`` is refused before the
    page is served), and the load reuses that outline. ``details``: what
    :func:`g4v.engines.create_engine` adds to every engine's ``info.details``."""
    from g4v.loading import load_model, outline_model

    outline = outline_model(model, **options)

    def load() -> Engine:
        from g4v.engines.hf import TransformersEngine

        engine = TransformersEngine(model, loaded=load_model(model, outline=outline))
        engine.info.details.update(details)
        return engine

    info = transformers_info(model, outline)
    info.details.update(details)
    return DeferredEngine(load, info, outline)
