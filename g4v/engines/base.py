"""The interface every backend implements: transformers, vLLM in-process, a remote OpenAI server.

As lm-evaluation-harness's ``LM`` and vLLM's model interfaces draw it: one small contract that every
engine keeps, and the optional abilities declared as interfaces of their own
(:mod:`g4v.engines.capabilities`) that a caller checks with :meth:`Engine.supports`, never by the
backend's name, class or attributes.

The contract:

* :meth:`Engine.stream_outputs` is the one method a backend writes: the answer to one conversation
  as :class:`Piece`\\ s (new text, its token ids, and the finish reason on the last piece).
* :meth:`Engine.stream` (text only) and :meth:`Engine.generate` (one :class:`Generation`) are made
  from it here, in one place (:func:`fold`), for every backend.
* :meth:`Engine.generate_batch` answers many typed requests (:class:`GenerationRequest`) in their
  order, each engine in the way that suits it: the transformers engine pads them into batches,
  vLLM keeps them all in flight, a remote server gets them from a bounded pool of connections.

Adapters (LoRA) are chosen per request by name, so one loaded engine serves the base model and its
adapters side by side.
"""

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from g4v.conversation import Message, SamplingSettings

#: The ``adapter=`` value that asks for the base language model of a checkpoint with a vision LoRA
#: (:mod:`g4v.checkpoint.vision_lora`): the request runs without any LoRA, image or not. Only native
#: and off modes have that model; with the LoRA merged (or none in the checkpoint) it is refused.
WITHOUT_VISION_LORA = "<base language model>"

def gpu_present() -> bool:
    """Whether torch sees a CUDA GPU (``auto``'s choice, vLLM's settings). Here, below the engines,
    so an engine module need not import the package that imports it."""
    import torch

    return torch.cuda.is_available()


@dataclass
class Generation:
    """A finished answer (or, with ``error`` set, a request refused on its own: one row of a batch)."""

    text: str
    #: Generated token ids, without the end-of-text token that stopped generation.
    token_ids: list[int]
    #: ``"stop"`` (end-of-text), ``"length"`` (max_new_tokens reached), ``"cancelled"``, or
    #: ``"error"`` (``error`` says why).
    finish_reason: str
    prompt_tokens: int = 0
    error: str | None = None

    @classmethod
    def failed(cls, error: str) -> "Generation":
        """The answer of a request refused on its own (a prompt too long, a picture the processor
        cannot read): the rest of its batch is answered."""
        return cls(text="", token_ids=[], finish_reason="error", error=error)


@dataclass
class Piece:
    """One piece of a streamed answer."""

    text: str
    #: The new token ids this piece adds (never the end-of-text token that ended the answer).
    token_ids: list[int] = field(default_factory=list)
    #: None until the last piece: ``"stop"``, ``"length"`` or ``"cancelled"``.
    finish_reason: str | None = None
    #: The prompt's length in tokens, where the engine knows it (on any piece; the largest counts).
    prompt_tokens: int = 0


def fold(pieces: Iterator[Piece]) -> Generation:
    """The one place streamed pieces become a :class:`Generation` (every engine's ``generate``)."""
    texts, token_ids, finish, prompt_tokens = [], [], None, 0
    for piece in pieces:
        texts.append(piece.text)
        token_ids.extend(piece.token_ids)
        finish = piece.finish_reason or finish
        prompt_tokens = max(prompt_tokens, piece.prompt_tokens)
    return Generation(text="".join(texts), token_ids=token_ids, finish_reason=finish or "cancelled",
                      prompt_tokens=prompt_tokens)


def without_end_token(pieces: Iterator[Piece]) -> Iterator[Piece]:
    """Pieces from a server that counts the end-of-text token among its ids (vLLM does, and says
    ``"stop"``): each piece's last id is held back until the next piece shows it was not that
    token, so no piece carries it. No stop strings are sent, so ``"stop"`` always means that token."""
    held: list[int] = []
    for piece in pieces:
        ids = held + piece.token_ids
        held = ids[-1:]
        if piece.finish_reason is not None:
            ids = ids[:-1] if piece.finish_reason == "stop" else ids
            held = []
        else:
            ids = ids[:-1]
        yield Piece(piece.text, ids, piece.finish_reason, piece.prompt_tokens)
    if held:  # ended without a finish reason (cancelled): the held token was a real one
        yield Piece("", held)


@dataclass
class PreparedRequest:
    """A conversation made ready for one engine once, and reused by every pass over it (generate,
    stream, teacher-forced scoring, capture), so a picture is processed once however many passes
    read it. Made by :meth:`Engine.prepare`; only the engine that made it may take it."""

    messages: list[Message]
    #: The rendered prompt text, ``<image>`` placeholders not yet expanded (transformers engine).
    prompt: str = ""
    #: The processed tensors on the model's device (transformers engine; None for engines that
    #: send the conversation elsewhere).
    inputs: dict | None = None
    #: Prompt length in tokens, image tokens expanded (0 where the engine does not tokenise here).
    prompt_tokens: int = 0

    @property
    def has_image(self) -> bool:
        return any(message.images for message in self.messages)


def messages_of(request: "list[Message] | PreparedRequest") -> list[Message]:
    """The conversation of a request given either way, for engines that validate and send it."""
    return request.messages if isinstance(request, PreparedRequest) else request


@dataclass(frozen=True)
class GenerationRequest:
    """One request of a batch (:meth:`Engine.generate_batch`): a conversation (or a request the
    same engine prepared), how to decode it, and the adapter it runs with (None: the model an
    image request gets, see :mod:`g4v.checkpoint.vision_lora`)."""

    messages: "list[Message] | PreparedRequest"
    settings: SamplingSettings = SamplingSettings()
    adapter: str | None = None


@dataclass
class EngineInfo:
    backend: str
    model: str
    device: str = ""
    dtype: str = ""
    details: dict = field(default_factory=dict)


def transformers_info(model: str, held) -> EngineInfo:
    """The transformers engine's info for ``model`` as ``held`` (a :class:`~g4v.loading.LoadedModel`,
    or the :class:`~g4v.loading.ModelOutline` it is loaded from) says it: device, dtype, vision LoRA."""
    from g4v.checkpoint.vision_lora import describe

    info = EngineInfo(backend="hf", model=model, device=str(held.device), dtype=str(held.dtype).removeprefix("torch."))
    if held.vision_lora is not None:  # said at start by the commands; absent for merged checkpoints
        info.details["vision_lora"] = describe(held.vision_mode, held.vision_lora)
    return info


#: ``on_done(position, generation)``: told as each request of a batch finishes.
OnDone = Callable[[int, Generation], None]


class Engine(ABC):
    """One loaded model behind one backend."""

    info: EngineInfo
    #: The checkpoint's vision LoRA (a :class:`~g4v.checkpoint.vision_lora.VisionLora`; None: its
    #: weights are the vision model, or the backend cannot tell) and its mode.
    vision_lora = None
    vision_mode = "off"
    #: Requests :meth:`generate_batch` runs at once by default: a batch's size, the requests kept
    #: in flight, or a pool's connections.
    in_flight: int = 8
    #: Whether the model is in memory, and why its load failed (None: it has not): an engine loaded
    #: on first use (:class:`~g4v.engines.deferred.DeferredEngine`) says False until :meth:`load`.
    is_loaded: bool = True
    error = None

    def load(self) -> "Engine":
        """The engine, its model in memory (this one loaded it when it was made)."""
        return self

    @property
    def concurrent_streams(self) -> int:
        """Streams (chats) this engine answers at once, each at its own pace: the app lets that
        many visitors' answers in together. 1: one after another."""
        return self.in_flight

    # ── abilities ────────────────────────────────────────────────────────────────────────────

    def supports(self, ability: type) -> bool:
        """Whether this engine has ``ability`` (an interface of :mod:`g4v.engines.capabilities`),
        answered without loading anything."""
        return isinstance(self, ability)

    def capable(self, ability: type):
        """This engine as ``ability`` (loaded, where loading is deferred), or None without it.
        :func:`g4v.engines.capabilities.require` turns None into the user's one line."""
        return self if isinstance(self, ability) else None

    # ── requests ─────────────────────────────────────────────────────────────────────────────

    def prepare(self, request: "list[Message] | PreparedRequest", max_new_tokens: int = 0) -> PreparedRequest:
        """``request`` made ready once for this engine (already prepared: returned as it is). The
        engines that send conversations elsewhere check them when they send them."""
        return request if isinstance(request, PreparedRequest) else PreparedRequest(list(request))

    @abstractmethod
    def stream_outputs(self, messages: "list[Message] | PreparedRequest", settings: SamplingSettings,
                       cancel: threading.Event | None = None, adapter: str | None = None) -> Iterator[Piece]:
        """The answer as :class:`Piece`\\ s. The request is checked before this returns (bad input
        fails at the call site, not at the first piece).

        Generation stops early, and the engine is free for the next request, when ``cancel`` is
        set or when the caller stops iterating (closing the generator).
        """

    def stream(self, messages: "list[Message] | PreparedRequest", settings: SamplingSettings,
               cancel: threading.Event | None = None, adapter: str | None = None) -> Iterator[str]:
        """The answer as text pieces whose concatenation equals :meth:`generate`'s text."""
        pieces = self.stream_outputs(messages, settings, cancel, adapter)
        return (piece.text for piece in pieces if piece.text)

    def generate(self, messages: "list[Message] | PreparedRequest", settings: SamplingSettings,
                 adapter: str | None = None) -> Generation:
        """The answer in one piece."""
        return fold(self.stream_outputs(messages, settings, adapter=adapter))

    def generate_batch(self, requests: Sequence[GenerationRequest], *, in_flight: int | None = None,
                       cancel: threading.Event | None = None, on_done: OnDone | None = None) -> list[Generation | None]:
        """Answers to ``requests``, in their order, at most ``in_flight`` (default: :attr:`in_flight`)
        at once. A request refused on its own gives :meth:`Generation.failed`; one not started
        because ``cancel`` was set gives None. ``on_done(position, generation)`` is told as each ends.

        This default runs them from a pool of threads, for engines that schedule concurrent
        requests themselves (vLLM's continuous batching, a server's); the transformers engine pads
        them into batches instead."""
        from g4v.errors import G4VError, check_value, whole_number

        workers = self.in_flight if in_flight is None else in_flight
        check_value("in_flight", workers, whole_number(1))
        cancel = cancel or threading.Event()
        answers: list[Generation | None] = [None] * len(requests)

        def one(position: int) -> None:
            if cancel.is_set():
                return
            request = requests[position]
            try:
                answers[position] = self.generate(request.messages, request.settings, adapter=request.adapter)
            except G4VError as err:
                answers[position] = Generation.failed(str(err))
            if on_done is not None:
                on_done(position, answers[position])

        with ThreadPoolExecutor(max(1, min(workers, len(requests)))) as pool:
            list(pool.map(one, range(len(requests))))
        return answers

    # ── adapters and limits ──────────────────────────────────────────────────────────────────

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        """Make a LoRA adapter folder (already checked by ``g4v.lora.checks``) available as ``name``,
        for the ``adapter=`` argument of :meth:`generate` and :meth:`stream`. ``stacked``: an
        adapter trained on the vision model (base + vision LoRA), applied on top of the vision
        LoRA rather than instead of it (``g4v.lora.activation`` tells which kind it is)."""
        from g4v.errors import G4VError

        raise G4VError(f"the {self.info.backend} backend does not serve adapters")

    def adapters(self) -> list[str]:
        """Names accepted by ``adapter=``."""
        return []

    def context_window(self) -> int | None:
        """The model's maximum sequence length in tokens, when the backend knows it."""
        return None

    def model_config(self):
        """The transformers config of the model this engine answers with, without loading it: here
        the config file of the model it serves (vLLM in process; a remote server's model when it
        is a local folder); the transformers engine gives its loaded model's."""
        from g4v.loading import load_config, resolve_source

        return load_config(resolve_source(self.info.model))

    def close(self) -> None:
        """Release the model (and any worker processes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
