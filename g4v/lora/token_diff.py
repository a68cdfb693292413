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
from transformers import DynamicCache

from g4v.conversation import Message, SamplingSettings
from g4v.engines import transformers_engine
from g4v.engines.base import BATCH_SIZE
from g4v.lora.side_by_side import activate_adapter, chat_input


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
    adapter: str
    base: ScoredAnswer  # the base model's answer
    tuned: ScoredAnswer  # the adapter's answer

    @property
    def first_divergence(self) -> int | None:
        """Where the greedy choices first differ, along either answer (they share the prefix
        before it when both were decoded greedily)."""
        found = [p for p in (self.base.first_divergence, self.tuned.first_divergence) if p is not None]
        return min(found) if found else None

    def to_json(self) -> dict:
        return {
            "adapter": self.adapter,
            "base_text": self.base.text,
            "adapter_text": self.tuned.text,
            "first_divergence": self.first_divergence,
            "base_tokens": [asdict(t) for t in self.base.tokens],
            "adapter_tokens": [asdict(t) for t in self.tuned.tokens],
        }


def lora_diff(engine, messages: list[Message], adapter: str, settings: SamplingSettings | None = None) -> LoraDiff:
    """Generate with and without ``adapter`` on a transformers engine, then score both answers:
    the conversation prepared once, both answers teacher-forced together (one batch per model)."""
    transformers_engine(engine, "the token-level LoRA comparison")
    settings = (settings or SamplingSettings(max_new_tokens=48)).validated()
    request = engine.prepare(messages)
    base = engine.generate(request, settings)
    tuned = engine.generate(request, settings, adapter=adapter)
    answers = [("base", base), ("adapter", tuned)]
    token_lists = [_answer_tokens(engine, generation) for _, generation in answers]
    scored = [i for i, tokens in enumerate(token_lists) if tokens]  # an empty answer has nothing to score
    under = {model: dict(zip(scored, answer_logits_batch(engine, [request] * len(scored),
                                                           [token_lists[i] for i in scored], model_adapter)))
             for model, model_adapter in (("base", None), ("adapter", adapter))}
    scores = [ScoredAnswer(source=source, text=generation.text) for source, generation in answers]
    for i in scored:
        scores[i].tokens = compare_positions(engine.tokenizer, token_lists[i], under["base"][i], under["adapter"][i])
    return LoraDiff(adapter=adapter, base=scores[0], tuned=scores[1])


@dataclass
class LoraDiffView:
    """The token diff, ready to show: HTML highlighting, a matplotlib figure, the JSON numbers."""

    html: str
    figure: object  # matplotlib.figure.Figure
    data: dict


def lora_token_diff(
    engine, adapter: str, prompt: str, images=(), max_new_tokens: int = 48, adapters_dir=None
) -> LoraDiffView:
    """For the LoRA tab: greedy answers with and without the adapter, scored token by token."""
    from viz.lora import diff_html, diff_plot

    messages = chat_input(prompt, images)
    settings = SamplingSettings(max_new_tokens=max_new_tokens).validated()
    spec = activate_adapter(engine, adapter, adapters_dir)
    data = lora_diff(engine, messages, spec.name, settings).to_json()
    return LoraDiffView(html=diff_html(data), figure=diff_plot(data), data=data)


def _answer_tokens(engine, generation) -> list[int]:
    """The generated tokens plus the end-of-text token when the model chose to stop: stopping is
    a decision the adapter may change too."""
    if generation.finish_reason == "stop":
        return [*generation.token_ids, engine.tokenizer.eos_token_id]
    return list(generation.token_ids)


def answer_logits(engine, messages: list[Message], tokens: list[int], adapter: str | None) -> torch.Tensor:
    """Logits (len(tokens), vocab) that predict each answer token from the prompt and the answer
    before it.

    Two passes, as ``generate`` runs them: the prompt with its images, then the answer on top of
    the prompt's KV cache without images. (One pass over prompt + answer would treat an
    ``<image>`` token that the model happened to generate as a placeholder needing features.)
    """
    inputs = engine.prepare_inputs(messages, max_new_tokens=len(tokens))
    input_ids = inputs["input_ids"]
    answer = torch.tensor([tokens[:-1]], dtype=input_ids.dtype, device=input_ids.device)
    with engine.adapter_scope(adapter) as model, torch.inference_mode():
        cache = DynamicCache(config=model.config.text_config)  # the model does not create one itself
        prompt_pass = model(**inputs, past_key_values=cache, use_cache=True)
        logits = [prompt_pass.logits[0, -1:]]
        if answer.shape[1]:
            mask = torch.ones((1, input_ids.shape[1] + answer.shape[1]), dtype=inputs["attention_mask"].dtype, device=input_ids.device)
            answer_pass = model(input_ids=answer, attention_mask=mask, past_key_values=cache, use_cache=True)
            logits.append(answer_pass.logits[0])
    return torch.cat(logits).double().cpu()


def answer_logits_batch(engine, requests: list, token_lists: list[list[int]], adapter: str | None,
                        batch_size: int = BATCH_SIZE) -> list[torch.Tensor]:
    """:func:`answer_logits` for many (request, answer tokens) pairs, ``batch_size`` rows per pass:
    the prompts left-padded (``engine.collate``), the answers right-padded after them, positions
    counted from each row's own first token, so each row computes what it computes alone (up to
    float rounding). ``requests``: prepared requests (``engine.prepare``) or conversations. Rows
    with and without a picture go in separate batches: in native vision-LoRA mode they run with
    different adapters."""
    prepared = [engine.prepare(request, max_new_tokens=len(tokens)) for request, tokens in zip(requests, token_lists)]
    groups: dict[bool, list[int]] = {}
    for row, request in enumerate(prepared):
        groups.setdefault(request.has_image, []).append(row)
    found: list[torch.Tensor | None] = [None] * len(prepared)
    for image, rows in groups.items():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            logits = _forced_batch(engine, [prepared[row] for row in chunk], [token_lists[row] for row in chunk], adapter, image)
            for row, row_logits in zip(chunk, logits):
                found[row] = row_logits
    return found


def _forced_batch(engine, requests, token_lists, adapter, image: bool) -> list[torch.Tensor]:
    """One batch of :func:`answer_logits_batch`: the prompt pass (last position's logits only),
    then every answer on top of its prompt's KV cache."""
    inputs = engine.collate(requests)
    mask = inputs["attention_mask"]
    lengths = mask.sum(dim=1, keepdim=True)
    answers = [list(tokens[:-1]) for tokens in token_lists]
    longest = max(len(answer) for answer in answers)
    answer_ids = torch.full((len(answers), longest), engine.tokenizer.pad_token_id, dtype=mask.dtype, device=mask.device)
    answer_mask = torch.zeros_like(answer_ids)
    for row, answer in enumerate(answers):
        answer_ids[row, :len(answer)] = torch.tensor(answer, dtype=mask.dtype)
        answer_mask[row, :len(answer)] = 1
    with engine.adapter_scope(adapter, image) as model, torch.inference_mode():
        cache = DynamicCache(config=model.config.text_config)
        prompt_pass = model(**inputs, position_ids=(mask.cumsum(dim=1) - 1).clamp_min(0), past_key_values=cache,
                            use_cache=True)
        logits = [[prompt_pass.logits[row, -1:]] for row in range(len(answers))]
        if longest:
            positions = lengths + torch.arange(longest, device=mask.device)
            answer_pass = model(input_ids=answer_ids, attention_mask=torch.cat([mask, answer_mask], dim=1),
                                position_ids=positions, past_key_values=cache, use_cache=True)
            for row, answer in enumerate(answers):
                logits[row].append(answer_pass.logits[row, :len(answer)])
    return [torch.cat(row_logits).double().cpu() for row_logits in logits]


def compare_positions(tokenizer, tokens: list[int], base_logits: torch.Tensor, adapter_logits: torch.Tensor) -> list[TokenScore]:
    """Per-position numbers from the two models' logits (float64)."""
    base_lp = torch.log_softmax(base_logits.double(), dim=-1)
    adapter_lp = torch.log_softmax(adapter_logits.double(), dim=-1)
    kl = (adapter_lp.exp() * (adapter_lp - base_lp)).sum(dim=-1)
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
                kl=max(kl[position].item(), 0.0),  # rounding can leave -1e-17
                greedy_base=int(base_lp[position].argmax()),
                greedy_adapter=int(adapter_lp[position].argmax()),
            )
        )
    return scores
