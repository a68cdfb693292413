"""Per-sample comparisons of two answers: token agreement, cross log-probabilities, KL, and the
numbers read from the model without generating (image tokens, per-level injected norms).

Scoring teacher-forces one arm's answer through a model whose logits are in this process (an
``hf`` arm), with :func:`g4v.model.scoring.answer_logits`: the same two passes ``generate``
runs, so the log-probability of a greedy answer under its own arm is that of its greedy choices.
Numbers are float64 from the logits.
"""

import json
from dataclasses import dataclass

import torch
from PIL import Image

from g4v.conversation import Message
from g4v.engines.base import Generation
from g4v.evaluate.stats import kl_stats

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


def score_pair(arm_a, arm_b, sample, gen_a: Generation, gen_b: Generation) -> PairScores:
    """Each answer under the other arm where that arm can score, and full-vocabulary KL(a||b)
    along a's answer when both can (and share a vocabulary)."""
    from g4v.model.scoring import answer_logits

    messages = [Message("user", sample.prompt, list(sample.images))]
    scores = PairScores()
    logits_a = logits_b = tokens_a = None
    if arm_b.spec.can_score():
        tokens_a = scoring_tokens(arm_b.engine, gen_a)
        logits_b = answer_logits(arm_b.engine, messages, tokens_a, arm_b.adapter)
        scores.logprob_a_under_b = sum_logprob(logits_b, tokens_a)
    if arm_a.spec.can_score():
        tokens_b = scoring_tokens(arm_a.engine, gen_b)
        if tokens_a is not None and tokens_b == tokens_a:  # same answer: one pass serves both
            logits_a = answer_logits(arm_a.engine, messages, tokens_a, arm_a.adapter)
            scores.logprob_b_under_a = sum_logprob(logits_a, tokens_b)
        else:
            scores.logprob_b_under_a = sum_logprob(answer_logits(arm_a.engine, messages, tokens_b, arm_a.adapter), tokens_b)
    if logits_b is not None and arm_a.spec.can_score():
        if logits_a is None:
            logits_a = answer_logits(arm_a.engine, messages, tokens_a, arm_a.adapter)
        if logits_a.shape == logits_b.shape:
            stats = kl_stats(kl_per_position(logits_a, logits_b).tolist())
            scores.kl_mean, scores.kl_q90, scores.kl_q99, scores.kl_max = (stats[k] for k in ("mean", "q90", "q99", "max"))
    return scores


def sum_logprob(logits: torch.Tensor, tokens: list[int]) -> float:
    """Sum over positions of log p(token): logits (len(tokens), vocab) -> a number."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    return float(logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def kl_per_position(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) in nats at each position: two (positions, vocab) logits -> (positions,), float64."""
    from g4v.model.scoring import kl_divergence

    return kl_divergence(torch.log_softmax(logits_p.double(), dim=-1), torch.log_softmax(logits_q.double(), dim=-1))


def image_tokens(config, images: list[Image.Image]) -> int:
    """Image tokens the model spends on ``images``, from the anyres plan alone (no model run)."""
    from g4v.tiling import plan_tiling

    return sum(plan_tiling((image.height, image.width), config).num_image_tokens for image in images)


def level_norms(arm, sample) -> str:
    """JSON ``{level name: mean injected norm}`` from one instrumented forward pass of the arm's
    model (adapter as the arm runs it): what each injection carries on this sample."""
    from g4v.engines import transformers_engine
    from g4v.model.capture import capture_forward
    from g4v.model.levels import describe_levels

    engine = transformers_engine(arm.engine, "per-level norms")
    inputs = engine.prepare_inputs([Message("user", sample.prompt, list(sample.images))])
    with engine.adapter_scope(arm.adapter) as model:
        capture, _ = capture_forward(model, inputs, levels=describe_levels(model.config), logits_to_keep=1)
    return json.dumps({cap.level.name: round(cap.injected_norm_mean, 6) for cap in capture.levels})


def blanked(sample):
    """A copy of ``sample`` whose pictures are flat grey fields of the same sizes."""
    from dataclasses import replace

    return replace(sample, images=[Image.new("RGB", image.size, BLANK_RGB) for image in sample.images])
