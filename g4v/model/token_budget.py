"""Token budgets: answer with only K % of the image tokens, the rest dropped from the sequence.

Why drop rather than zero: a zeroed token still costs a position in every layer's attention and
MLP, so prefill does not shrink. A dropped token is gone from ``input_ids`` and the attention mask,
and its rows go from the features of **all 8 levels** (4 deepstack, 4 spatial) together, so the
language model's prefill really runs on fewer positions, and the kept tokens sit at consecutive
positions (as FastV-style pruning leaves them).

How (which mechanism, and why): the picture is encoded once with the model's own
``get_image_features`` (vision tower and the 8 projectors, exactly what its ``forward`` runs), the
rows of the dropped tokens are removed from each level's packed features, and the reduced
``input_ids``, attention mask and features go back through the model's own
``mm_encoder_outputs`` argument (``forward`` and ``generate`` take pre-encoded image outputs, and
``generate`` drops them after prefill as it drops ``pixel_values``). No hook is needed: hooks at
the capture points (:mod:`g4v.model.capture`) could change the injected rows but not the sequence
length, since the placeholders are in ``input_ids`` before any hook runs. The result is a
:class:`~g4v.engines.base.PreparedRequest` like any other, so ``generate_batch``, teacher-forced
scoring (:func:`g4v.model.scoring.answer_logits_batch`) and batching take it unchanged.

``keep=100`` is the plain request itself (the identical path, not a re-encoding).

Policies rank each picture's image tokens (one score per token, the highest kept), per picture:

* ``norm``: the summed L2 norm of the token's injected features over the 8 levels (free: the
  features are computed anyway);
* ``attention`` (FastV-like): the attention weight, averaged over heads, from the last prompt
  token (the one that predicts the first answer token) to each image token at decoder layer
  ``attention_layer`` (2, FastV's K) in one eager pass over the full prompt;
* ``attribution``: gradient x input of the log-probability of the full model's greedy next token
  with respect to every level's features, summed over levels (signed: evidence for the answer
  first), one forward and one backward pass;
* ``random``: the control; a permutation seeded by ``seed`` and the prompt's token ids, so the
  same row keeps the same tokens in every run.

The ranking passes of ``attention`` and ``attribution`` run on the full sequence: they cost more
than the prefill they save (``python -m g4v bench token-budget`` measures both).
"""

import zlib
from dataclasses import dataclass, field, replace

import torch

from g4v.errors import G4VError
from g4v.model.encoding import encode_images

POLICIES = ("norm", "attention", "attribution", "random")
#: The kept percentages a sweep runs unless told otherwise.
DEFAULT_KEEPS = (100, 75, 50, 25, 10)


@dataclass(frozen=True)
class TokenBudget:
    """Keep ``keep`` % of each picture's image tokens, chosen by ``policy``."""

    keep: int = field(default=100, metadata={"help": "percent of each picture's image tokens kept (1-100)"})
    policy: str = field(default="norm", metadata={"help": "which tokens: " + ", ".join(POLICIES)})
    seed: int = field(default=0, metadata={"help": "seed of the random policy"})
    attention_layer: int = field(default=2, metadata={"help": "decoder layer the attention policy reads"})

    def __post_init__(self):
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or not 1 <= self.keep <= 100:
            raise G4VError(f"keep must be a whole percentage from 1 to 100, got {self.keep!r}")
        if self.policy not in POLICIES:
            raise G4VError(f"token policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")

    @property
    def plain(self) -> bool:
        """Every token kept: the request as it is."""
        return self.keep == 100

    def kept_count(self, tokens: int) -> int:
        """Tokens kept of a picture's ``tokens``: ``keep`` % rounded up (at least one)."""
        return max(1, -(-tokens * self.keep // 100))

    def to_dict(self) -> dict:
        return {"keep": self.keep, "policy": self.policy, "seed": self.seed, "attention_layer": self.attention_layer}


@dataclass
class Reduction:
    """Which image tokens a request kept: per picture, the kept token indices (in the model's
    packing order, the tiling plan's order) out of ``image_tokens[i]``."""

    budget: TokenBudget
    image_tokens: list[int]
    kept: list[list[int]]
    prompt_tokens_before: int
    prompt_tokens_after: int

    def to_dict(self) -> dict:
        return {"budget": self.budget.to_dict(), "image_tokens": self.image_tokens, "kept": self.kept,
                "prompt_tokens_before": self.prompt_tokens_before, "prompt_tokens_after": self.prompt_tokens_after}


def _per_picture(levels: list[tuple[int, list[torch.Tensor]]]) -> list[int]:
    return [int(piece.shape[0]) for piece in levels[0][1]]


def _split(values: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(values, sizes))


def _image_mask(model, input_ids: torch.Tensor) -> torch.Tensor:
    return input_ids[0] == model.config.image_token_id


def norm_scores(model, inputs: dict, encoded, budget: TokenBudget) -> list[torch.Tensor]:
    """Per picture (tokens,): the token's injected-feature norm summed over the levels."""
    levels = encoded.deepstack_features
    return [sum(levels[i][1][p].float().norm(dim=-1) for i in range(len(levels))) for p in range(len(levels[0][1]))]


def attention_scores(model, inputs: dict, encoded, budget: TokenBudget) -> list[torch.Tensor]:
    """Per picture (tokens,): head-averaged attention from the last prompt token at ``attention_layer``."""
    from g4v.model.attention import attention_rows

    layers = model.config.text_config.num_hidden_layers
    if not 0 <= budget.attention_layer < layers:
        raise G4VError(f"attention layer {budget.attention_layer} does not exist: the model has layers 0-{layers - 1}")
    seq = inputs["input_ids"].shape[1]
    everything = [torch.arange(size) for size in _per_picture(encoded.deepstack_features)]
    full = without_tokens(model, inputs, encoded, everything)  # the full prompt, the picture not encoded again
    rows = attention_rows(model, full, [budget.attention_layer], seq - 1)[0].mean(dim=0)  # (seq,)
    return _split(rows[_image_mask(model, inputs["input_ids"]).cpu()], _per_picture(encoded.deepstack_features))


def attribution_scores(model, inputs: dict, encoded, budget: TokenBudget) -> list[torch.Tensor]:
    """Per picture (tokens,): gradient x input of log p(greedy next token), summed over levels."""
    levels = encoded.deepstack_features
    with torch.enable_grad():
        leaves = [[piece.detach().clone().requires_grad_(True) for piece in pieces] for _, pieces in levels]
        image = type(encoded)(deepstack_features=[(layer, leaf) for (layer, _), leaf in zip(levels, leaves)])
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                       mm_encoder_outputs={"image": image}, logits_to_keep=1, use_cache=False).logits[0, -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = logprobs[int(logprobs.argmax())]
        flat = [leaf for pieces in leaves for leaf in pieces]
        grads = torch.autograd.grad(target, flat)
    scores = [(grad.float() * leaf.detach().float()).sum(-1) for grad, leaf in zip(grads, flat)]
    pictures = len(levels[0][1])
    return [sum(scores[level * pictures + p] for level in range(len(levels))).cpu() for p in range(pictures)]


def random_scores(model, inputs: dict, encoded, budget: TokenBudget) -> list[torch.Tensor]:
    """Per picture (tokens,): a seeded random permutation (the same row, the same draw)."""
    ids = inputs["input_ids"][0].cpu().numpy().tobytes()
    generator = torch.Generator().manual_seed(budget.seed * 1_000_003 + zlib.crc32(ids))
    return [torch.rand(size, generator=generator) for size in _per_picture(encoded.deepstack_features)]


SCORERS = {"norm": norm_scores, "attention": attention_scores, "attribution": attribution_scores,
           "random": random_scores}


def kept_indices(scores: list[torch.Tensor], budget: TokenBudget) -> list[torch.Tensor]:
    """Per picture: the indices of the ``kept_count`` highest scores, in packing order (ties go to
    the earlier token, so the choice never depends on the sort's whims)."""
    kept = []
    for picture in scores:
        order = sorted(range(len(picture)), key=lambda i: (-float(picture[i]), i))
        kept.append(torch.tensor(sorted(order[:budget.kept_count(len(picture))]), dtype=torch.long))
    return kept


def reduced_inputs(model, inputs: dict, budget: TokenBudget) -> tuple[dict, Reduction]:
    """``inputs`` (one request, batch 1, with pixel values) with only the kept image tokens:
    ``input_ids`` and ``attention_mask`` without the dropped positions, and ``mm_encoder_outputs``
    holding every level's features without the dropped rows. Inputs without a picture, or a
    plain budget, come back as they are."""
    input_ids = inputs["input_ids"]
    if budget.plain or "pixel_values" not in inputs:
        length = int(input_ids.shape[1])
        return inputs, Reduction(budget, [], [], length, length)
    if input_ids.shape[0] != 1:
        raise G4VError("a token budget reduces one request at a time")
    encoded = encode_images(model, inputs)
    kept = kept_indices(SCORERS[budget.policy](model, inputs, encoded, budget), budget)
    reduced = without_tokens(model, inputs, encoded, kept)
    reduction = Reduction(budget, _per_picture(encoded.deepstack_features), [k.tolist() for k in kept],
                          int(input_ids.shape[1]), int(reduced["input_ids"].shape[1]))
    return reduced, reduction


def without_tokens(model, inputs: dict, encoded, kept: list[torch.Tensor]) -> dict:
    """Model inputs with only the ``kept`` image tokens of each picture (indices in packing order):
    the other image positions cut from ``input_ids`` and the attention mask, their rows cut from
    every level's features in ``encoded`` (:func:`encode_images`), handed over as
    ``mm_encoder_outputs``. Every token kept gives the full prompt on the encoded path."""
    input_ids = inputs["input_ids"]
    sizes = _per_picture(encoded.deepstack_features)
    image_positions = torch.nonzero(_image_mask(model, input_ids).cpu()).flatten()
    if image_positions.numel() != sum(sizes):
        raise RuntimeError(f"{image_positions.numel()} image tokens in the prompt, {sum(sizes)} feature rows")
    dropped = torch.ones(sum(sizes), dtype=torch.bool)
    offset = 0
    for size, picture_kept in zip(sizes, kept):
        dropped[offset + picture_kept] = False
        offset += size
    keep_position = torch.ones(input_ids.shape[1], dtype=torch.bool)
    keep_position[image_positions[dropped]] = False
    keep_position = keep_position.to(input_ids.device)
    features = [(layer, [piece[picture_kept.to(piece.device)] for piece, picture_kept in zip(pieces, kept)])
                for layer, pieces in encoded.deepstack_features]
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    return {"input_ids": input_ids[:, keep_position], "attention_mask": mask[:, keep_position],
            "mm_encoder_outputs": {"image": type(encoded)(deepstack_features=features)}}


def reduce_request(engine, request, budget: TokenBudget | None, adapter: str | None = None):
    """A prepared request of a transformers engine with its image tokens cut to ``budget`` (the
    ranking passes run with ``adapter`` as the answers will); the request itself when the budget
    keeps everything or it has no picture. Returns a new :class:`PreparedRequest`; its
    ``reduction`` attribute says what was kept."""
    if budget is None or budget.plain or not request.has_image:
        return request
    with engine.adapter_scope(adapter, True) as model, torch.inference_mode(budget.policy != "attribution"):
        inputs, reduction = reduced_inputs(model, request.inputs, budget)
    made = replace(request, inputs=inputs, prompt_tokens=reduction.prompt_tokens_after)
    made.reduction = reduction
    return made
