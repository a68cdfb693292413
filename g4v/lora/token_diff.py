"""What a LoRA adapter changes, token by token.

Both models answer the same chat input; then each answer is teacher-forced through both models
(the base answer through the adapter, the adapter answer through the base model, and each through
its own model). At every answer position that gives the log-probability of the actual token under
each model, their difference, the KL divergence between the two next-token distributions, and each
model's greedy choice. The first position where the greedy choices differ is where the adapter
starts steering the answer.

This needs logits, so it runs on the transformers engine, whose single loaded model serves the
base (adapters disabled) and the adapter (enabled) alike. Numbers are computed in float64 from the
model's logits. :func:`lora_token_diff` is what the app's LoRA tab calls: the same comparison,
ready to show.
"""

from dataclasses import asdict, dataclass, field

import torch

from g4v.conversation import Message, SamplingSettings
from g4v.engines.capabilities import Instrumentable, require
from g4v.lora.models import ADAPTER, VISION, model_label, resolve_sides
from g4v.lora.settings import LoraDiffSettings
from g4v.lora.side_by_side import chat_input
from g4v.model.scoring import answer_logits_batch, kl_divergence

#: Greedy tokens each model answers with in a token diff, unless told (``lora-diff``, the LoRA tab).
DIFF_TOKENS = LoraDiffSettings.max_new_tokens


@dataclass
class TokenScore:
    """One answer token, scored by both models from the same prefix."""

    position: int  # index in the answer (0 = first generated token)
    token_id: int
    text: str
    logprob_base: float
    logprob_adapter: float
    delta: float  # logprob_adapter - logprob_base: > 0 where the adapter favours this token
    kl: float  # KL(adapter || base) of the next-token distributions at this position, in nats
    greedy_base: int  # each model's most likely next token here
    greedy_adapter: int


@dataclass
class ScoredAnswer:
    """One model's answer with every token scored under both models."""

    source: str  # "base" or "adapter": which model wrote it
    text: str
    tokens: list[TokenScore] = field(default_factory=list)

    @property
    def first_divergence(self) -> int | None:
        """First position whose greedy choices differ between the models (None: never)."""
        return next((t.position for t in self.tokens if t.greedy_base != t.greedy_adapter), None)


@dataclass
class LoraDiff:
    adapter: str | None
    base: ScoredAnswer  # the left model's answer (the base, by default)
    tuned: ScoredAnswer  # the right model's answer (the adapter, by default)
    labels: tuple[str, str] = ("base", "adapter")  # the two models' names

    @property
    def first_divergence(self) -> int | None:
        """Where the greedy choices first differ, along either answer (they share the prefix
        before it when both were decoded greedily)."""
        found = [p for p in (self.base.first_divergence, self.tuned.first_divergence) if p is not None]
        return min(found) if found else None

    def to_dict(self) -> dict:
        return {
            "adapter": self.adapter,
            "left": self.labels[0],
            "right": self.labels[1],
            "base_text": self.base.text,
            "adapter_text": self.tuned.text,
            "first_divergence": self.first_divergence,
            "base_tokens": [asdict(t) for t in self.base.tokens],
            "adapter_tokens": [asdict(t) for t in self.tuned.tokens],
        }


def lora_diff(engine, messages: list[Message], adapter: str | None, settings: SamplingSettings | None = None,
              left: str | None = None, labels: tuple[str, str] | None = None) -> LoraDiff:
    """Generate with the requests' ``adapter=`` values ``left`` (the "base" side) and ``adapter``
    (the "adapter" side) on a transformers engine, then score both answers under both models: the
    conversation prepared once, both answers teacher-forced together (one batch per model).
    ``labels`` name the two models (:func:`~g4v.lora.models.resolve_sides` gives them; the default
    names the model Chat runs and that model + the adapter)."""
    engine = require(engine, Instrumentable, "the token-level LoRA comparison")
    labels = labels or (model_label(VISION, engine), model_label(ADAPTER, engine, adapter))
    settings = (settings or LoraDiffSettings().sampling()).validated()
    request = engine.prepare(messages)
    base = engine.generate(request, settings, adapter=left)
    tuned = engine.generate(request, settings, adapter=adapter)
    answers = [("base", base), ("adapter", tuned)]
    token_lists = [_answer_tokens(engine, generation) for _, generation in answers]
    scored = [i for i, tokens in enumerate(token_lists) if tokens]  # an empty answer has nothing to score
    under = {model: dict(zip(scored, answer_logits_batch(engine, [request] * len(scored),
                                                           [token_lists[i] for i in scored], model_adapter)))
             for model, model_adapter in (("base", left), ("adapter", adapter))}
    scores = [ScoredAnswer(source=source, text=generation.text) for source, generation in answers]
    for i in scored:
        scores[i].tokens = compare_positions(engine.tokenizer, token_lists[i], under["base"][i], under["adapter"][i])
    return LoraDiff(adapter=adapter, labels=labels, base=scores[0], tuned=scores[1])


@dataclass
class LoraDiffView:
    """The token diff, ready to show: HTML highlighting, a matplotlib figure, and the diff itself
    (its ``to_dict()`` is the JSON numbers)."""

    html: str
    figure: object  # matplotlib.figure.Figure
    diff: LoraDiff


def lora_token_diff(engine, prompt: str, images=(), settings: LoraDiffSettings | None = None,
                    adapters_dir=None) -> LoraDiffView:
    """For the LoRA tab: greedy answers of the ``settings.left`` and ``settings.right`` models
    (``g4v.lora.models``; an ``adapter`` side runs ``settings.adapter``), scored token by token.
    ``settings`` None: :class:`LoraDiffSettings`' defaults."""
    from viz.lora import diff_html, diff_plot

    settings = settings or LoraDiffSettings()
    messages = chat_input(prompt, images)
    sampling = settings.sampling()
    first, second = resolve_sides(engine, settings.left, settings.right, settings.adapter, adapters_dir)
    diff = lora_diff(engine, messages, second.adapter, sampling, first.adapter, (first.label, second.label))
    return LoraDiffView(html=diff_html(diff), figure=diff_plot(diff), diff=diff)


def _answer_tokens(engine, generation) -> list[int]:
    """The generated tokens plus the end-of-text token when the model chose to stop: stopping is
    a decision the adapter may change too."""
    if generation.finish_reason == "stop":
        return [*generation.token_ids, engine.tokenizer.eos_token_id]
    return list(generation.token_ids)




def compare_positions(tokenizer, tokens: list[int], base_logits: torch.Tensor, adapter_logits: torch.Tensor) -> list[TokenScore]:
    """Per-position numbers from the two models' logits (float64)."""
    base_lp = torch.log_softmax(base_logits.double(), dim=-1)
    adapter_lp = torch.log_softmax(adapter_logits.double(), dim=-1)
    kl = kl_divergence(adapter_lp, base_lp)
    scores = []
    for position, token in enumerate(tokens):
        lp_base, lp_adapter = base_lp[position, token].item(), adapter_lp[position, token].item()
        scores.append(
            TokenScore(
                position=position,
                token_id=int(token),
                text=tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False),
                logprob_base=lp_base,
                logprob_adapter=lp_adapter,
                delta=lp_adapter - lp_base,
                kl=kl[position].item(),
                greedy_base=int(base_lp[position].argmax()),
                greedy_adapter=int(adapter_lp[position].argmax()),
            )
        )
    return scores
