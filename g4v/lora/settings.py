"""What a token-level LoRA comparison is asked: :class:`LoraDiffSettings`, the one place for its defaults.

``python -m g4v lora-diff`` derives its ``--adapter``, ``--left``, ``--right`` and ``--max-new-tokens``
flags from the fields (:mod:`g4v.settings.flags`), the LoRA tab starts its pickers and
its slider at them, and :func:`g4v.lora.token_diff.lora_token_diff` takes the object itself: a
default changed here changes all three. No torch here, so the command's flags cost no import.
"""

from dataclasses import dataclass, field

from g4v.conversation import SamplingSettings, check_answer_length
from g4v.lora.models import DEFAULT_LEFT, DEFAULT_RIGHT, MODELS


@dataclass(frozen=True)
class LoraDiffSettings:
    """Which two models answer (:mod:`g4v.lora.models`: ``base``, ``vision``, ``adapter``), with which
    adapter, and how long their greedy answers are."""

    adapter: str | None = field(default=None, metadata={
        "help": "adapter name or folder inside the adapter folders, for a side that is 'adapter' (default: the "
                "first made for the model, the one the LoRA tab preselects)"})
    left: str = field(default=DEFAULT_LEFT, metadata={"choices": MODELS, "help": "left model"})
    right: str = field(default=DEFAULT_RIGHT, metadata={"choices": MODELS, "help": "right model"})
    max_new_tokens: int = field(default=48, metadata={
        "check": check_answer_length, "help": "greedy tokens each model answers with"})

    def sampling(self) -> SamplingSettings:
        """Greedy decoding of :attr:`max_new_tokens`, checked (one line for a bad length): both
        answers are decoded greedily, so where they part is the models' doing, not a draw's."""
        return SamplingSettings(max_new_tokens=self.max_new_tokens).validated()
