"""What a model's logits say, for every panel: the next-token distribution, the greedy
continuation, teacher-forced answer logits, and the one KL divergence between two distributions.

Deepstack (ablations), the vLLM port (transformers against vLLM), LoRA (base against adapter) and
Evaluate (arm against arm) all compare next-token distributions; they compare them with
:func:`kl_divergence` here, so a KL means the same thing in every panel.
"""

from contextlib import nullcontext

import torch
from transformers import DynamicCache

from g4v.conversation import Message
from g4v.model import BATCH_SIZE
from g4v.model.capture import instrument
from g4v.model.levels import Level
from g4v.model.records import TokenProb


def next_token_probs(logits: torch.Tensor) -> torch.Tensor:
    """(batch, seq, vocab) logits -> (vocab,) float32 probabilities of the token after the prompt."""
    return torch.softmax(logits[0, -1].float(), dim=-1).cpu()


def next_token_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """(batch, seq, vocab) logits -> (vocab,) float32 log-probabilities of the token after the prompt."""
    return torch.log_softmax(logits[0, -1].float(), dim=-1).cpu()


def top_tokens(probs: torch.Tensor, tokenizer, k: int = 5) -> list[TokenProb]:
    """The ``k`` likeliest tokens of a (vocab,) distribution, likeliest first."""
    values, ids = torch.topk(probs, k=min(k, probs.numel()))
    return [TokenProb(int(i), tokenizer.decode([int(i)]), float(v)) for v, i in zip(values, ids)]


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats along the last dimension, from log-probabilities: (..., vocab) -> (...).

    Log-probabilities keep it finite where a big change drives some of q's probabilities to exactly
    0 in floating point; a token p never gives (probability 0) adds nothing, even where q's
    log-probability is -inf. Rounding can leave -1e-17: it is clamped to 0."""
    p = log_p.exp()
    terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros((), dtype=p.dtype))
    return terms.sum(dim=-1).clamp_min(0.0)


def greedy_continuation(model, inputs: dict, tokenizer, max_new_tokens: int,
                        scales: dict[str, float] | None = None, levels: list[Level] | None = None) -> list[int]:
    """Greedy new tokens with the given levels scaled (hooks live only for this call)."""
    hooks = instrument(model, levels, scales, record=False) if scales else nullcontext()
    with torch.inference_mode(), hooks:
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                temperature=None, top_p=None, top_k=None,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    new_ids = output[0, inputs["input_ids"].shape[1]:].tolist()
    if tokenizer.eos_token_id in new_ids:
        new_ids = new_ids[: new_ids.index(tokenizer.eos_token_id)]
    return new_ids


def answer_logits(engine, messages: list[Message], tokens: list[int], adapter: str | None) -> torch.Tensor:
    """Logits (len(tokens), vocab), float64 on the CPU, that predict each answer token from the
    prompt and the answer before it, on a transformers engine (``adapter`` as ``adapter_scope``).

    Two passes, as ``generate`` runs them: the prompt with its images, then the answer on top of
    the prompt's KV cache without images. (One pass over prompt + answer would treat an
    ``<image>`` token that the model happened to generate as a placeholder needing features.)
    """
    inputs = engine.prepare_inputs(messages, max_new_tokens=len(tokens))
    input_ids = inputs["input_ids"]
    answer = torch.tensor([tokens[:-1]], dtype=input_ids.dtype, device=input_ids.device)
    # image: as generate ran it (native mode: the vision LoRA on image prompts only)
    with engine.adapter_scope(adapter, image="pixel_values" in inputs) as model, torch.inference_mode():
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
