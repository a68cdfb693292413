"""Forward passes of Granite 4 Vision's language model with injected features we choose.

Every attribution method asks the same question many times: "what is the log-probability of the
answer if the 8 levels inject *these* features instead?". The vision tower's output does not change
between those questions, so the image is encoded once (:func:`encode_image`, the model's own
``get_image_features``) and each question is a forward pass that hands the model the features
through its own ``mm_encoder_outputs`` argument. Several questions go through as one batch: the
prompt repeated ``b`` times, the features of the ``b`` variants stacked, which is what the model
itself does for several images. No hooks are needed, so nothing can be left behind.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from g4v.errors import G4VError
from g4v.model.levels import Level

#: Variants per batched forward pass (deletion curves, integrated-gradient steps): enough to keep
#: a CPU busy, small enough that activations of a long real-size prompt stay bounded.
DEFAULT_BATCH = 8


@dataclass
class Answer:
    """The answer being explained: its token ids after the prompt, and which of them is the target."""

    prompt_ids: torch.Tensor  # (1, prompt_len) the prompt with its expanded <image> tokens
    ids: list[int]  # the answer's token ids (teacher-forced after the prompt)
    texts: list[str]  # each answer token decoded on its own
    target: int | None  # index into ids of the explained token; None = the whole answer (sum of log-probs)
    #: Other answers to contrast with (token ids each). When given, the explained number is the
    #: whole answer's log-odds against them, log p(answer) - log sum_a p(a): what tells the answer
    #: apart from its rivals, and it keeps moving when p(answer) is already close to 1.
    alternatives: list[list[int]] = field(default_factory=list)
    alternative_texts: list[str] = field(default_factory=list)

    @property
    def measure(self) -> str:
        """The name of the number explained, for labels: a contrast explains a log-odds."""
        return "log-odds" if self.alternatives else "log-probability"

    def describe(self) -> str:
        if self.alternatives:
            return f"the whole answer {''.join(self.texts)!r} against {', '.join(map(repr, self.alternative_texts))}"
        if self.target is None:
            return f"the whole answer {''.join(self.texts)!r}"
        return f"answer token {self.target} {self.texts[self.target]!r}"


@dataclass
class Encoded:
    """The image encoded once: the features each level injects, in the model's own packing order."""

    features: dict[int, torch.Tensor]  # llm layer -> (num_image_tokens, hidden), no grad
    output_type: type  # the model's image-features output class, to hand features back to it

    @property
    def num_image_tokens(self) -> int:
        return next(iter(self.features.values())).shape[0]


def inner_model(model):
    """The ``Granite4VisionModel`` inside ``Granite4VisionForConditionalGeneration``."""
    inner = getattr(model, "model", model)
    if not hasattr(inner, "get_image_features"):
        raise G4VError(f"{type(model).__name__} is not a Granite 4 Vision model")
    return inner


def encode_image(model, inputs: dict) -> Encoded:
    """The injected features of every level for the request's image (vision tower run once)."""
    if "pixel_values" not in inputs:
        raise G4VError("attribution needs an image in the request")
    with torch.no_grad():
        output = inner_model(model).get_image_features(inputs["pixel_values"], inputs["image_sizes"],
                                                       return_dict=True)
    features = {}
    for layer, packed in output.deepstack_features:
        packed = packed if isinstance(packed, torch.Tensor) else torch.cat(list(packed), dim=0)
        features[int(layer)] = packed.detach()
    return Encoded(features, type(output))


def answer_ids(tokenizer, text: str) -> list[int]:
    """A user's target answer as token ids (no special tokens), refused when it is empty."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not text.strip() or not ids:
        raise G4VError("the target answer is empty: give the answer text to explain")
    return list(ids)


def make_answer(tokenizer, prompt_ids: torch.Tensor, ids: list[int], target: int | None,
                alternatives: tuple[str, ...] = ()) -> Answer:
    """Check ``target`` against the answer's length; decode each token for display. With
    ``alternatives`` (texts), the whole answer is contrasted with them, whatever ``target`` says."""
    if not ids:
        raise G4VError("the answer to explain is empty")
    if alternatives:
        alternatives = tuple(dict.fromkeys(alternatives))  # a repeated answer would count twice in the log-odds
        rivals = [answer_ids(tokenizer, text) for text in alternatives]
        if list(ids) in rivals:
            raise G4VError("an alternative to contrast with is the answer itself")
        return Answer(prompt_ids, list(ids), [tokenizer.decode([i]) for i in ids], None, rivals, list(alternatives))
    if target is not None and not (isinstance(target, int) and -len(ids) <= target < len(ids)):
        raise G4VError(f"answer token {target!r} does not exist: the answer has {len(ids)} tokens (0-{len(ids) - 1})")
    if target is not None and target < 0:
        target += len(ids)
    return Answer(prompt_ids, list(ids), [tokenizer.decode([i]) for i in ids], target)


@contextmanager
def frozen_parameters(model) -> Iterator[None]:
    """No weight needs a gradient while we differentiate with respect to the features: switching
    them off keeps autograd from saving what only weight gradients need (memory), and the previous
    flags come back afterwards, whatever happens."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def answer_logprobs(model, encoded: Encoded, answer: Answer, features: dict[int, torch.Tensor]) -> torch.Tensor:
    """Log-probability of the target for each of ``b`` feature variants, in one forward pass.

    ``features``: llm layer -> (b, num_image_tokens, hidden) for every level. Returns (b,) float32:
    log p(answer[target] | prompt, answer[:target]), or the sum over the whole answer, or with
    ``answer.alternatives`` the whole answer's log-odds against them. Differentiable with respect to
    ``features`` when they require grad."""
    if answer.alternatives:
        scores = sequence_logprobs(model, encoded, answer.prompt_ids, [answer.ids] + answer.alternatives, features)
        return scores[:, 0] - torch.logsumexp(scores[:, 1:], dim=1)  # (b,) log-odds against the rivals
    batch = next(iter(features.values())).shape[0]
    answer_tensor = torch.tensor([answer.ids], device=answer.prompt_ids.device)
    ids = torch.cat([answer.prompt_ids, answer_tensor], dim=1).expand(batch, -1)  # (b, prompt + answer)
    packed = [(layer, features[layer].reshape(-1, features[layer].shape[-1])) for layer in encoded.features]
    image = encoded.output_type(deepstack_features=packed)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_encoder_outputs={"image": image},
                   logits_to_keep=len(answer.ids) + 1, use_cache=False).logits  # (b, answer + 1, vocab)
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # position i predicts answer token i
    per_token = logprobs.gather(-1, answer_tensor.expand(batch, -1).unsqueeze(-1)).squeeze(-1)  # (b, answer)
    return per_token.sum(-1) if answer.target is None else per_token[:, answer.target]


def sequence_logprobs(model, encoded: Encoded, prompt_ids: torch.Tensor, sequences: list[list[int]],
                      features: dict[int, torch.Tensor]) -> torch.Tensor:
    """Log-probability of each whole sequence after the prompt, for each of ``b`` feature variants.

    ``features``: llm layer -> (b, num_image_tokens, hidden). The ``k`` sequences are padded on the
    right (causal attention: padding after a token never changes it) and run as ``b * k`` rows,
    variant-major. Returns (b, k) float32, differentiable with respect to ``features``."""
    batch, count = next(iter(features.values())).shape[0], len(sequences)
    longest = max(len(seq) for seq in sequences)
    ids = torch.zeros(count, longest, dtype=torch.long, device=prompt_ids.device)  # (k, longest)
    valid = torch.zeros(count, longest, device=prompt_ids.device)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq)
        valid[row, :len(seq)] = 1.0
    rows = torch.cat([prompt_ids.expand(count, -1), ids], dim=1).repeat(batch, 1)  # (b * k, prompt + longest)
    packed = [(layer, features[layer].repeat_interleave(count, 0).reshape(-1, features[layer].shape[-1]))
              for layer in encoded.features]
    image = encoded.output_type(deepstack_features=packed)
    logits = model(input_ids=rows, attention_mask=torch.ones_like(rows), mm_encoder_outputs={"image": image},
                   logits_to_keep=longest + 1, use_cache=False).logits  # (b * k, longest + 1, vocab)
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    per_token = logprobs.gather(-1, ids.repeat(batch, 1).unsqueeze(-1)).squeeze(-1)  # (b * k, longest)
    return (per_token * valid.repeat(batch, 1)).sum(-1).reshape(batch, count)


def batched_features(encoded: Encoded, keep: torch.Tensor, levels: list[Level]) -> dict[int, torch.Tensor]:
    """The features with tokens removed: ``keep`` (b, num_levels, num_image_tokens) holds 1 to keep
    a level's token and 0 to zero it. Returns llm layer -> (b, num_image_tokens, hidden)."""
    out = {}
    for i, level in enumerate(levels):
        feature = encoded.features[level.llm_layer]  # (tokens, hidden)
        out[level.llm_layer] = feature.unsqueeze(0) * keep[:, i, :, None].to(feature.dtype)
    return out


def variants_per_pass(answer: Answer, batch_size: int) -> int:
    """Feature variants per forward pass so that a pass holds about ``batch_size`` sequences: a
    contrast runs every variant once per answer (its own and each alternative's)."""
    return max(1, batch_size // (1 + len(answer.alternatives)))


def logprobs_of_variants(model, encoded: Encoded, answer: Answer, keep: torch.Tensor, levels: list[Level],
                         batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """(variants, num_levels, num_image_tokens) keep-masks -> (variants,) target log-probabilities,
    about ``batch_size`` sequences per forward pass (:func:`variants_per_pass`), without gradients."""
    out = []
    step = variants_per_pass(answer, batch_size)
    with torch.inference_mode():
        for start in range(0, keep.shape[0], step):
            chunk = keep[start:start + step]
            out.append(answer_logprobs(model, encoded, answer, batched_features(encoded, chunk, levels)).cpu())
    return torch.cat(out)
