"""What an engine can do beyond answering, declared as interfaces (as vLLM declares ``SupportsLoRA``
and ``SupportsMultiModal`` on its models): a caller asks ``engine.supports(Instrumentable)`` or
takes ``require(engine, Instrumentable, "the Deepstack inspector")``, never the backend's name,
class or attributes.

* :class:`Instrumentable`: the model runs in this process, so a caller can prepare its tensors,
  encode pictures once for several passes, and hold the model with one adapter enabled to run its
  own forward passes (hooks, ablations, patching). The transformers engine.
* :class:`Scorable`: teacher-forced log-probabilities of given answer tokens (the evaluate arms'
  cross-scores, the LoRA panel's token comparison). The transformers engine.

An engine loaded on first use (:class:`~g4v.engines.deferred.DeferredEngine`) answers ``supports``
from what it will load, and is loaded by ``capable`` / ``require``.
"""

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager

from g4v.errors import G4VError


class Instrumentable(ABC):
    """An engine whose model runs in this process and can be lent to a caller's own passes."""

    #: The loaded model (a ``Granite4VisionForConditionalGeneration``), its processor and tokenizer,
    #: and what loading found (:class:`~g4v.loading.LoadedModel`: device, dtype, vision LoRA).
    model = None
    processor = None
    tokenizer = None
    loaded = None

    @abstractmethod
    def prepare_inputs(self, messages, max_new_tokens: int = 0) -> dict:
        """The model's inputs for a conversation: ``input_ids`` with expanded image tokens,
        ``attention_mask``, ``pixel_values`` and ``image_sizes``."""

    @abstractmethod
    def collate(self, requests: list) -> dict:
        """One padded batch of prepared requests, for ``model(...)``."""

    @abstractmethod
    def encoded(self, requests: list, batch_size: int) -> list:
        """Prepared requests with their pictures already through the vision tower and projectors."""

    @abstractmethod
    def adapter_scope(self, adapter: str | None, image: bool = True) -> AbstractContextManager:
        """Hold the engine with ``adapter`` enabled (None: the model an ``image`` request gets) and
        yield the model; no request runs on it meanwhile."""


class Scorable(ABC):
    """An engine that can teacher-force answer tokens and give their logits."""

    @abstractmethod
    def answer_logits(self, requests: list, token_lists: list[list[int]], adapter: str | None = None) -> list:
        """For each (request, answer tokens) pair, the logits ``(len(tokens), vocab)`` (float64, on
        the CPU) that predict each answer token from the prompt and the answer before it."""


def require(engine, ability: type, purpose: str):
    """``engine`` as ``ability`` (loaded, where its loading is deferred), or one line saying that
    ``purpose`` needs it: ``"the deepstack inspector needs the transformers backend (hf), not vllm"``
    (the one backend with these abilities)."""
    found = engine.capable(ability)
    if found is None:
        raise G4VError(f"{purpose} needs the transformers backend (hf), not {engine.info.backend}")
    return found
