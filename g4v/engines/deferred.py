"""An engine described at once and loaded when first used: what lets ``app.py`` serve its page
before the model is in memory.

Why: loading the transformers engine is about half of the app's start-up (transformers' model
classes, then the weights), yet building the page needs only what the model folder says: which
model and backend, its vision LoRA and its config. :class:`DeferredEngine` answers those from the
folder, checked as loading would check them (a missing or foreign folder is still one line before
anything is served), and loads the real engine the first time a request needs it. The app asks
right after its page is served; a visitor's request that arrives meanwhile waits for that one
load, and a load that failed is the same one line for every request.
"""

import threading
from collections.abc import Callable, Iterator, Sequence

from g4v.engines.base import Engine, EngineInfo, Generation, GenerationRequest, OnDone, Piece, transformers_info
from g4v.errors import G4VError, first_line
from g4v.loading import ModelOutline


def _transformers() -> type:
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine


class DeferredEngine(Engine):
    """An :class:`Engine` that stands for the one ``load()`` returns. ``info``, ``vision_lora``,
    ``vision_mode``, ``model_config()``, ``context_window()`` and the abilities it has
    (:meth:`supports`) are known from ``outline`` before it loads; a request loads it."""

    def __init__(self, load: Callable[[], Engine], info: EngineInfo, outline: ModelOutline,
                 kind: Callable[[], type] = _transformers, streams: int | None = None):
        """``kind()``: the class ``load`` makes (imported when first asked: it imports the model
        code); ``streams``: the loaded engine's :attr:`concurrent_streams`, known from its settings."""
        self._load, self._info, self.outline, self._kind, self._streams = load, info, outline, kind, streams
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

    # ── known from the folder ────────────────────────────────────────────────────────────────

    @property
    def info(self) -> EngineInfo:
        return self._engine.info if self._engine is not None else self._info

    @property
    def vision_lora(self):
        return self._engine.vision_lora if self._engine is not None else self.outline.vision_lora

    @property
    def vision_mode(self) -> str:
        return self._engine.vision_mode if self._engine is not None else self.outline.vision_mode

    def model_config(self):
        """The model's transformers config: the loaded model's, or its folder's until then."""
        return self._engine.model_config() if self._engine is not None else self.outline.config

    def context_window(self) -> int:
        """The model's context length, from its config (what the loaded engine answers too): Chat
        checks a message against it before the model is in memory, so a refusal shows at once."""
        return int(self.model_config().text_config.max_position_embeddings)

    @property
    def in_flight(self) -> int:
        return self._kind().in_flight

    @property
    def concurrent_streams(self) -> int:
        if self._engine is not None:
            return self._engine.concurrent_streams
        return self._streams if self._streams is not None else self._kind().in_flight

    def supports(self, ability: type) -> bool:
        return issubclass(self._kind(), ability)

    # ── everything else: the loaded engine's ─────────────────────────────────────────────────

    def capable(self, ability: type):
        return self.load().capable(ability) if self.supports(ability) else None

    def prepare(self, request, max_new_tokens: int = 0):
        return self.load().prepare(request, max_new_tokens)

    def stream_outputs(self, messages, settings, cancel=None, adapter=None) -> Iterator[Piece]:
        return self.load().stream_outputs(messages, settings, cancel, adapter)

    def generate(self, messages, settings, adapter=None) -> Generation:
        return self.load().generate(messages, settings, adapter)

    def generate_batch(self, requests: Sequence[GenerationRequest], *, in_flight: int | None = None,
                       cancel: threading.Event | None = None, on_done: OnDone | None = None) -> list[Generation | None]:
        return self.load().generate_batch(requests, in_flight=in_flight, cancel=cancel, on_done=on_done)

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        self.load().register_adapter(name, path, stacked)

    def adapters(self) -> list[str]:
        return self._engine.adapters() if self._engine is not None else []

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


def defer_transformers(model: str, details: dict, decode=None, inline: bool = False, **options) -> DeferredEngine:
    """A :class:`DeferredEngine` for ``TransformersEngine(model, **options)`` (``device``, ``dtype``,
    ``vision_lora``): the folder is outlined now with :func:`g4v.loading.outline_model`, the checks
    loading makes first (so a bad ``--model``, ``--dtype`` or ``--vision-lora`` is refused before the
    page is served), and the load reuses that outline. ``details``: what
    :func:`g4v.engines.create_engine` adds to every engine's ``info.details``."""
    from g4v.loading import load_model, outline_model

    outline = outline_model(model, **options)

    def load() -> Engine:
        engine = _transformers()(model, loaded=load_model(model, outline=outline), decode=decode, inline=inline)
        engine.info.details.update(details)
        return engine

    info = transformers_info(model, outline)
    info.details.update(details)
    from g4v.engines.decode_settings import DecodeSettings

    settings = decode or DecodeSettings()
    return DeferredEngine(load, info, outline, streams=settings.max_batch if settings.decode_loop and not inline else 1)
