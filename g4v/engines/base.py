"""The interface every backend implements: transformers, vLLM in-process, a remote OpenAI server.

An engine answers a conversation (:class:`~g4v.conversation.Message` list) under
:class:`~g4v.conversation.SamplingSettings`, either all at once (:meth:`Engine.generate`) or as a
stream of text pieces (:meth:`Engine.stream`) that a caller can cancel. Adapters (LoRA) are chosen
per request by name, so one loaded engine can serve the base model and its adapters side by side.
"""

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

from g4v.conversation import Message, SamplingSettings

#: The ``adapter=`` value that asks for the base language model of a checkpoint with a vision LoRA
#: (:mod:`g4v.engines.vision_lora`): the request runs without any LoRA, image or not. Only native
#: and off modes have that model; with the LoRA merged (or none in the checkpoint) it is refused.
WITHOUT_VISION_LORA = "<base language model>"

#: Requests the transformers engine runs as one padded batch (``generate_batch``, batched
#: scoring): where a 2-core CPU stops gaining from larger batches on the bundled checkpoints.
BATCH_SIZE = 8


def gpu_present() -> bool:
    """Whether torch sees a CUDA GPU (``auto``'s choice, vLLM's settings). Here, below the engines,
    so an engine module need not import the package that imports it."""
    import torch

    return torch.cuda.is_available()


@dataclass
class Generation:
    """A finished answer."""

    text: str
    #: Generated token ids, without the end-of-text token that stopped generation.
    token_ids: list[int]
    #: ``"stop"`` (end-of-text), ``"length"`` (max_new_tokens reached) or ``"cancelled"``.
    finish_reason: str
    prompt_tokens: int = 0


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
    from g4v.engines.vision_lora import describe

    info = EngineInfo(backend="hf", model=model, device=str(held.device), dtype=str(held.dtype).removeprefix("torch."))
    if held.vision_lora is not None:  # said at start by the commands; absent for merged checkpoints
        info.details["vision_lora"] = describe(held.vision_mode, held.vision_lora)
    return info


class Engine(ABC):
    """One loaded model behind one backend."""

    info: EngineInfo
    #: The checkpoint's vision LoRA (a :class:`~g4v.engines.vision_lora.VisionLora`; None: its
    #: weights are the vision model, or the backend cannot tell) and its mode.
    vision_lora = None
    vision_mode = "off"

    def prepare(self, request: "list[Message] | PreparedRequest", max_new_tokens: int = 0) -> PreparedRequest:
        """``request`` made ready once for this engine (already prepared: returned as it is). The
        engines that send conversations elsewhere check them when they send them."""
        return request if isinstance(request, PreparedRequest) else PreparedRequest(list(request))

    @abstractmethod
    def generate(self, messages: list[Message], settings: SamplingSettings, adapter: str | None = None) -> Generation:
        """Answer the conversation in one piece."""

    @abstractmethod
    def stream(self, messages: list[Message], settings: SamplingSettings, cancel: threading.Event | None = None,
               adapter: str | None = None) -> Iterator[str]:
        """Yield the answer as text pieces whose concatenation equals :meth:`generate`'s text.

        Generation stops early, and the engine is free for the next request, when ``cancel`` is
        set or when the caller stops iterating (closing the generator).
        """

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

    def close(self) -> None:
        """Release the model (and any worker processes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
