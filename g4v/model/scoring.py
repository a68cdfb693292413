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
from g4v.model.capture import instrument
from g4v.model.levels import Level


def next_token_probs(logits: torch.Tensor) -> torch.Tensor:
    """(batch, seq, vocab) logits -> (vocab,) float32 probabilities of the token after the prompt."""
    return torch.softmax(logits[0, -1].float(), dim=-1).cpu()


def next_token_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """(batch, seq, vocab) logits -> (vocab,) float32 log-probabilities of the token after the prompt."""
    return torch.log_softmax(logits[0, -1].float(), dim=-1).cpu()


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
