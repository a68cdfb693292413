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
class EngineInfo:
    backend: str
    model: str
    device: str = ""
    dtype: str = ""
    details: dict = field(default_factory=dict)


class Engine(ABC):
    """One loaded model behind one backend."""

    info: EngineInfo
    #: The checkpoint's vision LoRA (a :class:`~g4v.engines.vision_lora.VisionLora`; None: its
    #: weights are the vision model, or the backend cannot tell) and its mode.
    vision_lora = None
    vision_mode = "off"

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
