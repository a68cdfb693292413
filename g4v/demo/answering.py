"""How the demo's evaluations ask their questions: one engine request per question, or many at once
through the engine's left-padded batches (optionally with injection levels ablated), and
exact-match accuracy per question type. Shared by ``eval`` (:mod:`g4v.demo.evaluate`), its
document rows (:mod:`g4v.demo.documents_eval`) and the trainers' validation
(:func:`g4v.demo.loop.validation_accuracy`), which import it rather than each other."""

from collections import defaultdict
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor

from g4v.conversation import Message, SamplingSettings
from g4v.engines.base import GenerationRequest
from g4v.demo import shapes as S

SETTINGS = SamplingSettings(max_new_tokens=8, temperature=0)


def items(pictures: list[S.Picture]) -> list[tuple[S.Picture, S.QA]]:
    return [(p, qa) for p in pictures for qa in p.qas]


def ask(engine, picture: S.Picture, question: str, settings=SETTINGS, adapter: str | None = None) -> str:
    return engine.generate([Message("user", question, [picture.image])], settings, adapter=adapter).text.strip()


def answers(engine, pairs, workers: int = 1, settings=SETTINGS, bar=None, adapter: str | None = None) -> list[str]:
    """One engine request per question (``workers`` at once), in order; ``bar`` counts them."""

    def one(pair) -> str:
        reply = ask(engine, pair[0], pair[1].question, settings, adapter)
        if bar is not None:
            bar.update(1)
        return reply

    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, pairs))
    return [one(pair) for pair in pairs]


def phase(bar, name: str) -> None:
    """Name the phase the progress bar's next questions belong to (None: no bar). The bar counts
    questions without a total: the phases differ in size and some are known only as they start."""
    if bar is not None:
        bar.set_description(f"eval ({name})")


def batched_answers(model, processor, pairs, batch_size: int = 16, max_new_tokens: int = 6, bar=None) -> list[str]:
    """Greedy answers for many questions at once, for a model in memory (a trainer's, mid-training):
    through a transformers engine around it (:func:`engine_batched_answers`)."""
    from g4v.engines.hf import TransformersEngine

    return engine_batched_answers(TransformersEngine.around(model, processor), pairs, batch_size, max_new_tokens, bar)


def engine_batched_answers(engine, pairs, batch_size: int = 16, max_new_tokens: int = 6, bar=None,
                           adapter: str | None = None) -> list[str]:
    """Greedy answers for many questions at once, through the engine's batched method
    (:meth:`~g4v.engines.base.Engine.generate_batch`: the transformers engine pads them into
    batches, vLLM keeps them in flight), whose greedy answers equal its one-by-one ones; ``adapter``
    (a registered name) for every question; ``bar`` counts them batch by batch."""
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=0)
    replies = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        answers = engine.generate_batch([GenerationRequest([Message("user", qa.question, [p.image])], settings, adapter)
                                         for p, qa in chunk], in_flight=batch_size)
        replies.extend(answer.text.strip() for answer in answers)
        if bar is not None:
            bar.update(len(chunk))
    return replies


def accuracy(pairs, replies: list[str], target=lambda qa: qa.answer) -> dict[str, float]:
    right, total = defaultdict(int), defaultdict(int)
    for (_, qa), reply in zip(pairs, replies):
        total[qa.kind] += 1
        right[qa.kind] += int(reply == target(qa))
    table = {kind: right[kind] / total[kind] for kind in S.QUESTION_TYPES if total[kind]}
    table["all"] = sum(right.values()) / max(1, sum(total.values()))
    return table


def ablation_scales(model, names: list[str] | None) -> dict[str, float]:
    from g4v.model.levels import describe_levels

    levels = describe_levels(model.config)
    return {level.name: 0.0 for level in levels if names is None or level.name in names}


def level_names(model) -> list[str]:
    from g4v.model.levels import describe_levels

    return [level.name for level in describe_levels(model.config)]


@contextmanager
def levels_scaled(engine, scales: dict[str, float]):
    """The engine with the given levels scaled (0 = ablated) while the block runs: the scaling hooks
    sit on the engine's own model (:class:`~g4v.engines.capabilities.Instrumentable`), which its
    batches run on, and are removed on the way out."""
    from g4v.engines.capabilities import Instrumentable, require
    from g4v.model.capture import instrument

    model = require(engine, Instrumentable, "ablating injection levels").model
    with instrument(model, scales=scales, record=False):
        yield engine


def ablated_answers(engine, pairs, scales: dict[str, float], bar=None) -> list[str]:
    """The engine's batched answers with the given levels scaled (0 = ablated)."""
    with levels_scaled(engine, scales):
        return engine_batched_answers(engine, pairs, bar=bar)
