"""Per-sample comparisons of two answers: token agreement, cross log-probabilities, KL, and the
numbers read from the model without generating (image tokens, per-level injected norms).

Scoring teacher-forces one arm's answer through a model whose logits are in this process (an
``hf`` arm), with :func:`g4v.model.scoring.answer_logits_batch`: the same two passes
``generate`` runs (prompt, then answer on its KV cache), for a batch of rows at once, each from
the request the row's answers were generated from (no picture processed again). So the
log-probability of a greedy answer under its own arm is that of its greedy choices. Numbers are
float64 from the logits.
"""

from __future__ import annotations  # torch in annotations only: the eval flags import this package without it

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image

from g4v.engines.base import Generation
from g4v.evaluate.stats import kl_stats
from g4v.model import BATCH_SIZE

if TYPE_CHECKING:
    import torch

#: Stands for "the model chose to stop" when comparing token lists (stopping is a decision too).
STOP = -1
#: The blank picture of the "image ignored?" probe: one flat mid-grey field of the same size.
BLANK_RGB = (128, 128, 128)


@dataclass
class PairScores:
    """What teacher forcing gives for one sample (None where no arm could score)."""

    logprob_a_under_b: float | None = None
    logprob_b_under_a: float | None = None
    kl_mean: float | None = None
    kl_q90: float | None = None
    kl_q99: float | None = None
    kl_max: float | None = None


def compared_tokens(generation: Generation) -> list[int] | None:
    """The answer's token ids with :data:`STOP` appended when it ended by choice; None when the
    backend gave no ids (a server without vLLM's token-id extension)."""
    if not generation.token_ids and generation.text:
        return None
    return [*generation.token_ids, *([STOP] if generation.finish_reason == "stop" else [])]


def agreement(a: Generation, b: Generation) -> tuple[bool, int | None]:
    """``(agree, first divergence)``: same greedy tokens (text equality where a side has no ids),
    and the index of the first token that differs (None when they agree or ids are missing)."""
    tokens_a, tokens_b = compared_tokens(a), compared_tokens(b)
    if tokens_a is None or tokens_b is None:
        return a.text == b.text, None
    if tokens_a == tokens_b:
        return True, None
    return False, next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y),
                       min(len(tokens_a), len(tokens_b)))


def scoring_tokens(engine, generation: Generation) -> list[int]:
    """The ids to teacher-force for ``generation`` on ``engine``: its ids (or, from a server
    without ids, its text tokenised) plus the end-of-text token when it chose to stop."""
    tokenizer = engine.tokenizer
    ids = list(generation.token_ids) or tokenizer.encode(generation.text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_id] if generation.finish_reason == "stop" else [])


def score_pairs(arm_a, arm_b, samples, gens_a: list[Generation], gens_b: list[Generation], requests,
                batch_size: int = BATCH_SIZE) -> list[PairScores]:
    """For each row: each answer under the other arm where that arm can score, and
    full-vocabulary KL(a||b) along a's answer when both can (and share a vocabulary). Rows are
    teacher-forced ``batch_size`` at a time; a row whose two answers are the same needs one pass
    per arm, else a's answer goes through a too (for the KL)."""
    scores = [PairScores() for _ in samples]
    tokens_a = logits_b = [None] * len(samples)
    if arm_b.can_score:
        tokens_a = [scoring_tokens(arm_b.engine, gen) for gen in gens_a]
        logits_b = _teacher_forced(arm_b, samples, tokens_a, requests, batch_size)
        for score, logits, tokens in zip(scores, logits_b, tokens_a):
            score.logprob_a_under_b = sum_logprob(logits, tokens)
    if not arm_a.can_score:
        return scores
    tokens_b = [scoring_tokens(arm_a.engine, gen) for gen in gens_b]
    on_b = _teacher_forced(arm_a, samples, tokens_b, requests, batch_size)
    logits_a = [logits if tokens_a[i] == tokens_b[i] else None for i, logits in enumerate(on_b)]
    for score, logits, tokens in zip(scores, on_b, tokens_b):
        score.logprob_b_under_a = sum_logprob(logits, tokens)
    missing = [i for i in range(len(samples)) if logits_b[i] is not None and logits_a[i] is None]
    for i, logits in zip(missing, _teacher_forced(arm_a, [samples[i] for i in missing], [tokens_a[i] for i in missing],
                                                  requests, batch_size)):
        logits_a[i] = logits
    for score, logits_p, logits_q in zip(scores, logits_a, logits_b):
        if logits_q is not None and logits_p.shape == logits_q.shape:
            stats = kl_stats(kl_per_position(logits_p, logits_q).tolist())
            score.kl_mean, score.kl_q90, score.kl_q99, score.kl_max = stats.mean, stats.q90, stats.q99, stats.max
    return scores


def _teacher_forced(arm, samples, token_lists, requests, batch_size) -> list[torch.Tensor]:
    """Logits along each token list, from the requests the rows were answered from."""
    from g4v.model.scoring import answer_logits_batch

    prepared = [requests.get(arm.engine, sample, budget=arm.spec.budget, adapter=arm.adapter) for sample in samples]
    return answer_logits_batch(arm.engine, prepared, token_lists, arm.adapter, batch_size)


def sum_logprob(logits: torch.Tensor, tokens: list[int]) -> float:
    """Sum over positions of log p(token): logits (len(tokens), vocab) -> a number."""
    import torch

    logprobs = torch.log_softmax(logits.double(), dim=-1)
    return float(logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def kl_per_position(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats at each position: two (positions, vocab) logits -> (positions,), float64."""
    import torch

    from g4v.model.scoring import kl_divergence

    return kl_divergence(torch.log_softmax(logits_p.double(), dim=-1), torch.log_softmax(logits_q.double(), dim=-1))


def image_tokens(config, images: list[Image.Image]) -> int:
    """Image tokens the model spends on ``images``, from the anyres plan alone (no model run)."""
    from g4v.tiling import plan_tiling

    return sum(plan_tiling((image.height, image.width), config).num_image_tokens for image in images)


def level_norms(arm, sample, requests) -> str:
    """JSON ``{level name: mean injected norm}`` from one instrumented forward pass of the arm's
    model (adapter as the arm runs it): what each injection carries on this sample, from the
    request its answers came from (``requests``)."""
    from g4v.engines.capabilities import Instrumentable, require
    from g4v.model.capture import capture_forward
    from g4v.model.levels import describe_levels

    engine = require(arm.engine, Instrumentable, "per-level norms")
    inputs = requests.get(engine, sample).inputs
    with engine.adapter_scope(arm.adapter) as model:
        capture, _ = capture_forward(model, inputs, levels=describe_levels(model.config), logits_to_keep=1)
    return json.dumps({cap.level.name: round(cap.injected_norm_mean, 6) for cap in capture.levels})


def precision_pair(arm_a, arm_b) -> bool:
    """Whether two arms are one checkpoint in two precisions (both in this process, same model, same adapter and
    vision LoRA mode): then each row records b's per-level drift against a (:func:`level_drift`)."""
    a, b = arm_a.spec, arm_b.spec
    return (arm_a.local and arm_b.local and a.precision() != b.precision()
            and (a.model, a.adapter, a.vision_lora) == (b.model, b.adapter, b.vision_lora))


def level_drift(arm_a, arm_b, sample, requests) -> str:
    """JSON ``{"levels": {name: {"rel_error", "cosine"}}, "next_token_kl"}``: what b injects at each
    level against what a injects on this sample, and KL(a || b) of the next token, each arm on the
    request its answers came from (:func:`g4v.model.precision.engine_drift`)."""
    from g4v.engines.capabilities import Instrumentable, require
    from g4v.model.precision import engine_drift, row_drift

    engine_a = require(arm_a.engine, Instrumentable, "per-level drift")
    engine_b = require(arm_b.engine, Instrumentable, "per-level drift")
    levels, kl, _, _ = engine_drift(engine_a, requests.get(engine_a, sample), engine_b, requests.get(engine_b, sample),
                                    arm_a.adapter, arm_b.adapter)
    return json.dumps(row_drift(levels, kl))


def blanked(sample):
    """A copy of ``sample`` whose pictures are flat grey fields of the same sizes."""
    from dataclasses import replace

    return replace(sample, images=[Image.new("RGB", image.size, BLANK_RGB) for image in sample.images])
