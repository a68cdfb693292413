"""A dataset run: two arms answer every row, each pair of answers is compared, the rows are summed up.

:func:`run_eval` is what the CLI (``python -m g4v eval``) and the app's Evaluate tab call. Its
order of work is chosen so that nothing is lost and nothing is done twice:

1. the dataset, its column mapping and the arms' adapters and model folders are checked (a bad
   one is one line, before any model loads or the output folder is touched);
2. the output folder is prepared (``run.json``) and the rows it already holds are read back
   (:mod:`g4v.evaluate.store`): a resumed run computes only the rest;
3. the arms open (sharing an engine where they can) and answer the remaining rows in chunks; each
   finished chunk is appended to ``samples.jsonl`` before the next starts;
4. the tables and ``summary.json`` are written from every finished row.

A cancel stops after the requests in flight; the rows done so far are kept and summed up, with
the summary's ``complete`` False.
"""

import contextlib
import random
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from g4v.conversation import MAX_NEW_TOKENS, SamplingSettings, check_answer_length
from g4v.errors import G4VError, check_fields, share, whole_number
import g4v.evaluate.store as store
from g4v.evaluate.arms import VLLM_IN_FLIGHT, Arm, ArmSpec, check_arms, open_arms
from g4v.evaluate.data import Columns, EvalSample, PictureFit, open_dataset
from g4v.evaluate.equivalence import DISCORDANCE, MARGIN
from g4v.evaluate.requests import Requests
from g4v.evaluate.scoring import (PairScores, agreement, blanked, image_tokens, level_drift, level_norms,
                                  precision_pair, score_pairs)
from g4v.evaluate.stats import detectable, matches, summarise
from g4v.evaluate.summary import Detectable, LevelDrift, RunSummary
from g4v.model import BATCH_SIZE

#: Fewest rows per chunk when both arms are local transformers (a chunk holds at least one batch);
#: a batching arm gets chunks as large as the requests it keeps in flight.
HF_CHUNK = 4
#: The most picture pixels one chunk of rows holds, decoded (as RGB, 3 bytes each: 144 MB): a chunk
#: ends early at the row that reaches it. Pictures are reduced as read (:class:`PictureFit`), so at
#: worst a chunk of 8 rows of 4 pictures each at the real model's largest fit (1.47 M pixels) fits.
CHUNK_PIXELS = 48_000_000


#: The discordance's check (the app's box uses it too).
check_share = share(example=" (0.02 = 2 points)")
#: The smallest equivalence margin: a tenth of a point of accuracy already needs about 800,000 rows
#: to be shown (a margin of 1e-300 overflowed the row count: OverflowError).
MIN_MARGIN = 0.001
#: The margin's check (the app's box uses it too).
check_margin = share(example=" (0.02 = 2 points)", smallest=MIN_MARGIN)


@dataclass
class EvalConfig:
    """The question a run answers; ``run.json`` records it."""

    a: ArmSpec
    b: ArmSpec
    data: str
    columns: Columns = field(default_factory=Columns)
    limit: int | None = field(default=None, metadata={
        "check": whole_number(1, optional=True), "help": "only the first N rows (after --seed's shuffle)"})
    seed: int | None = field(default=None, metadata={
        "check": whole_number(0, optional=True), "help": "shuffle the rows with this seed before --limit"})
    max_new_tokens: int = field(default=32, metadata={
        "check": check_answer_length, "help": "longest answer, in tokens (greedy decoding)"})
    concurrency: int = field(default=8, metadata={
        "check": whole_number(1, 256, optional=True), "help": "requests in flight for an openai arm"})
    batch_size: int = field(default=BATCH_SIZE, metadata={
        "check": whole_number(1, 256, optional=True),
        "help": "rows an hf arm answers and scores as one batch (1: one by one; the same greedy answers)"})
    blank_probe: bool = field(default=False, metadata={
        "help": "also answer with every picture blanked: flags arms whose answer ignores the image"})
    levels: bool = field(default=False, metadata={"help": "per-level injected norms (Deepstack capture), hf arms"})
    margin: float = field(default=MARGIN, metadata={
        "check": check_margin,
        "help": "equivalence margin: the TOST asks whether |accuracy A - accuracy B| < this (0.02 = 2 points)"})
    discordance: float = field(default=DISCORDANCE, metadata={
        "check": check_share,
        "help": "share of rows assumed right in one arm only, for the detectable difference shown before the run "
                "(a pilot's value; the summary adds the observed one)"})

    def settings(self) -> SamplingSettings:
        """Greedy decoding, so "the same answer" is a property of the model, not of a draw."""
        return SamplingSettings(max_new_tokens=self.max_new_tokens, temperature=0.0).validated(MAX_NEW_TOKENS)

    def check(self) -> None:
        """Refuse bad numbers in one line, before anything loads."""
        check_fields(self)

    @property
    def same_arm(self) -> bool:
        """B is A again (their labels aside): a noise-floor run."""
        return replace(self.a, label="") == replace(self.b, label="")

    def summarise(self, rows: list, complete: bool) -> RunSummary:
        """The summary of ``rows`` with this run's labels, margin and discordance, plus
        ``level_drift`` (per-level means over the rows, :func:`g4v.model.precision.drift_summary`)
        when the arms differ only in precision."""
        import json

        from g4v.model.precision import drift_summary

        summary = summarise(rows, self.a.display, self.b.display, complete, margin=self.margin,
                            discordance=self.discordance, same_arm=self.same_arm)
        drift = drift_summary([json.loads(row.level_drift) for row in rows if row.level_drift])
        if drift is not None:
            summary.level_drift = LevelDrift(**vars(drift), of=self.b.display, against=self.a.display)
        return summary

    @classmethod
    def from_json(cls, values: dict) -> "EvalConfig":
        """The config ``run.json`` records; a file that does not hold one is one line."""
        try:
            config = cls(**{**values, "a": ArmSpec(**values["a"]), "b": ArmSpec(**values["b"]),
                            "columns": Columns(**values["columns"])})
        except (KeyError, TypeError):  # a missing or unknown key, a part that is no object
            raise G4VError(f"{store.RUN_FILE} is damaged") from None
        config.check()
        return config


@dataclass
class SampleResult:
    """One row of ``samples.parquet`` / ``samples.csv``: flat, one value per column."""

    index: int
    sample_id: str
    category: str | None
    prompt: str
    reference: str | None
    answer_a: str
    answer_b: str
    correct_a: bool | None  # normalised match with the reference; None without one
    correct_b: bool | None
    exact_a: bool | None
    exact_b: bool | None
    agree: bool  # same greedy tokens (text where a side gives no ids)
    first_divergence: int | None
    logprob_a_under_b: float | None
    logprob_b_under_a: float | None
    kl_mean: float | None  # KL(a || b) per position along a's answer, both arms hf
    kl_q90: float | None
    kl_q99: float | None
    kl_max: float | None
    image_tokens: int | None
    blank_same_a: bool | None  # the answer did not change with the pictures blanked
    blank_same_b: bool | None
    level_norms_a: str | None  # JSON {level: mean injected norm}
    level_norms_b: str | None
    error: str | None
    level_drift: str | None = None  # JSON: b's per-level drift against a, when they differ only in precision


@dataclass
class RunResult:
    out_dir: Path
    rows: list[SampleResult]  # in run order
    summary: RunSummary  # ``summary.json`` is its ``to_dict()``


def row_order(size: int, limit: int | None, seed: int | None) -> list[int]:
    """The rows a run covers, in order: all of them, shuffled by ``seed`` when given, cut to ``limit``."""
    order = list(range(size))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order[:limit] if limit else order


def chunk_size(config: EvalConfig) -> int:
    """Rows answered between two writes: a vLLM arm gets all it keeps in flight, an openai arm
    its pool, two hf arms one batch (at least :data:`HF_CHUNK`), so a kill loses little."""
    backends = {config.a.backend, config.b.backend}
    if "vllm" in backends:
        return VLLM_IN_FLIGHT
    return max(HF_CHUNK, config.concurrency) if "openai" in backends else max(HF_CHUNK, config.batch_size)


def run_eval(config: EvalConfig, out_dir: Path, *, adapters_dir=None, reuse=None, data_dirs=None,
             progress: Callable[[int, int], None] | None = None,
             cancel: threading.Event | None = None, plan: Callable[[Detectable], None] | None = None) -> RunResult:
    """Run (or resume) ``config`` into ``out_dir``; see the module docstring for the order of work.
    ``plan`` gets the detectable difference for the rows to run (:func:`~g4v.evaluate.stats.detectable`)
    once the dataset is read, before any model loads."""
    config.check()
    cancel = cancel or threading.Event()
    dataset = open_dataset(config.data, config.columns, data_dirs)
    check_arms([config.a, config.b], adapters_dir)
    order = row_order(len(dataset), config.limit, config.seed)
    if plan is not None:
        plan(detectable(len(order), config.discordance, margin=config.margin))
    out_dir = Path(out_dir)
    store.prepare(out_dir, asdict(config))
    wanted = set(order)
    def kept_rows() -> dict:  # the rows file is the record of what is done
        return {index: row for index, row in store.read_rows(out_dir, SampleResult).items() if index in wanted}

    done = kept_rows()
    todo = [index for index in order if index not in done]
    report = progress or (lambda finished, total: None)
    if todo and not cancel.is_set():
        arm_a, arm_b = open_arms(config.a, config.b, adapters_dir=adapters_dir, reuse=reuse,
                                 concurrency=config.concurrency, batch_size=config.batch_size)
        report(len(done), len(order))
        writer = store.RowWriter(out_dir)
        try:
            size = chunk_size(config)
            model_config = _model_config(arm_a, arm_b)
            fit = PictureFit.for_configs([_arm_config(arm) for arm in (arm_a, arm_b)])
            answers_per_row = 4 if config.blank_probe else 2
            progress_lock = threading.Lock()
            for samples in sample_chunks(dataset, todo, size, fit):
                answered = [0]

                def answer_done(*_):  # progress moves with each answer, not only with each chunk
                    with progress_lock:  # a vLLM or openai arm's answers arrive on many threads
                        answered[0] += 1
                        report(len(done) + answered[0] // answers_per_row, len(order))

                rows = compare_chunk(arm_a, arm_b, samples, config, model_config, cancel, answer_done)
                writer.write(rows)
                done.update((row.index, row) for row in rows)
                report(len(done), len(order))
                if cancel.is_set():
                    break
        except BaseException:  # Ctrl-C or a failure: the tables still show every finished row
            writer.close()
            with contextlib.suppress(Exception):  # the first error is the one to show
                # Read back what was written: an interrupt between writing a chunk and counting it
                # (or mid-chunk, where the count ran ahead) must not make the tables disagree with it.
                done = kept_rows()
                report(len(done), len(order))
                _write_results(out_dir, config, order, done)
            raise
        finally:
            writer.close()
            arm_a.close()
            arm_b.close()
    report(len(done), len(order))
    return _write_results(out_dir, config, order, done)


def sample_chunks(dataset, indices: list[int], size: int, fit: PictureFit):
    """The rows ``indices`` in chunks of ``size``, decoded only as each chunk is asked for; a chunk
    whose pictures reach :data:`CHUNK_PIXELS` ends at that row."""
    chunk, pixels = [], 0
    for index in indices:
        chunk.append(sample := dataset.sample(index, fit))
        pixels += sum(picture.width * picture.height for picture in sample.images)
        if len(chunk) == size or pixels >= CHUNK_PIXELS:
            yield chunk
            chunk, pixels = [], 0
    if chunk:
        yield chunk


def _write_results(out_dir: Path, config: EvalConfig, order: list[int], done: dict) -> RunResult:
    """Sum up the finished rows (in run order) and write the tables and ``summary.json``."""
    rows = [done[index] for index in order if index in done]
    summary = config.summarise(rows, complete=len(rows) == len(order))
    store.write_tables(out_dir, rows, SampleResult, summary.to_dict())
    return RunResult(out_dir, rows, summary)


def read_results(out_dir: Path) -> RunResult:
    """A run's rows and summary from its folder (finished or not): the app's "open a run"."""
    out_dir = Path(out_dir)
    config = EvalConfig.from_json(store.read_settings(out_dir))
    done = store.read_rows(out_dir, SampleResult)
    summary = stored_summary(out_dir)
    if summary is None or summary.n != len(done):
        summary = config.summarise(list(done.values()), complete=False)
    return RunResult(out_dir, list(done.values()), summary)


def stored_summary(out_dir: Path) -> RunSummary | None:
    """``summary.json`` as a :class:`RunSummary`; None when it is missing, damaged or not one (an
    older run's, without parts the summary has now): the caller sums the rows up again."""
    values = store.read_summary(out_dir)
    try:
        return RunSummary.from_dict(values) if values is not None else None
    except (KeyError, TypeError, AttributeError):
        return None


def compare_chunk(arm_a: Arm, arm_b: Arm, samples: list[EvalSample], config: EvalConfig, model_config,
                  cancel: threading.Event, on_answer=None) -> list[SampleResult]:
    """Answer ``samples`` on both arms and compare them. Rows the cancel left unanswered are
    not returned (they are not done); bad rows come back with their error. ``on_answer(position,
    generation)`` is called as each answer arrives. Each (engine, picture, prompt) is prepared
    once for all the passes over it (:class:`~g4v.evaluate.arms.Requests`)."""
    settings = config.settings()
    requests = Requests()
    good = [sample for sample in samples if sample.error is None]
    answers_a = arm_a.answer(good, settings, cancel, on_answer, requests)
    answers_b = arm_b.answer(good, settings, cancel, on_answer, requests)
    blank_a = blank_b = [None] * len(good)
    if config.blank_probe:
        probes = [blanked(sample) for sample in good]
        blank_a = arm_a.answer(probes, settings, cancel, on_answer, requests)
        blank_b = arm_b.answer(probes, settings, cancel, on_answer, requests)
    by_index = {sample.index: i for i, sample in enumerate(good)}
    answered = []  # (sample, position in good) of the rows done, in order
    for sample in samples:
        if sample.error is not None:
            answered.append((sample, None))
            continue
        i = by_index[sample.index]
        if any(answer is None for answer in [answers_a[i], answers_b[i]] + ([blank_a[i], blank_b[i]] if config.blank_probe else [])):
            break  # cancelled here: this row and the rest are not done
        answered.append((sample, i))
    scored = [i for sample, i in answered if i is not None and not _failed(answers_a[i], answers_b[i])]
    scores = dict(zip(scored, score_pairs(arm_a, arm_b, [good[i] for i in scored], [answers_a[i] for i in scored],
                                          [answers_b[i] for i in scored], requests, config.batch_size)))
    rows = []
    for sample, i in answered:
        if i is None:
            rows.append(error_row(sample, sample.error))
            continue
        rows.append(compare_sample(arm_a, arm_b, sample, answers_a[i], answers_b[i], blank_a[i], blank_b[i],
                                   config, model_config, scores.get(i), requests))
    return rows


def _failed(*answers) -> bool:
    return any(answer.error for answer in answers)


def compare_sample(arm_a, arm_b, sample, gen_a, gen_b, blank_a, blank_b, config, model_config,
                   scores: PairScores, requests: Requests) -> SampleResult:
    """Every per-sample number for one row (see :class:`SampleResult`); ``scores`` as
    :func:`~g4v.evaluate.scoring.score_pairs` gave them for this row."""
    failed = [f"{side}: {gen.error}" for side, gen in (("a", gen_a), ("b", gen_b)) if gen.error]
    if failed:
        return error_row(sample, "; ".join(failed))
    correct_a, exact_a = matches(gen_a.text, sample.reference)
    correct_b, exact_b = matches(gen_b.text, sample.reference)
    agree, divergence = agreement(gen_a, gen_b)
    return SampleResult(
        index=sample.index, sample_id=sample.sample_id, category=sample.category, prompt=sample.prompt,
        reference=sample.reference, answer_a=gen_a.text, answer_b=gen_b.text,
        correct_a=correct_a, correct_b=correct_b, exact_a=exact_a, exact_b=exact_b,
        agree=agree, first_divergence=divergence, **asdict(scores),
        image_tokens=image_tokens(model_config, sample.images) if model_config is not None else None,
        blank_same_a=_same(gen_a, blank_a), blank_same_b=_same(gen_b, blank_b),
        level_norms_a=level_norms(arm_a, sample, requests) if config.levels and arm_a.local else None,
        level_norms_b=level_norms(arm_b, sample, requests) if config.levels and arm_b.local else None,
        error=None, level_drift=level_drift(arm_a, arm_b, sample, requests) if precision_pair(arm_a, arm_b) else None,
    )


def error_row(sample: EvalSample, error: str) -> SampleResult:
    """A row that could not be compared, kept with its reason."""
    empty = dict.fromkeys(("correct_a", "correct_b", "exact_a", "exact_b", "first_divergence", "logprob_a_under_b",
                           "logprob_b_under_a", "kl_mean", "kl_q90", "kl_q99", "kl_max", "image_tokens",
                           "blank_same_a", "blank_same_b", "level_norms_a", "level_norms_b"))
    return SampleResult(index=sample.index, sample_id=sample.sample_id, category=sample.category,
                        prompt=sample.prompt, reference=sample.reference, answer_a="", answer_b="",
                        agree=False, error=error, **empty)


def _same(answer, blank_answer) -> bool | None:
    if blank_answer is None or blank_answer.error:
        return None
    return answer.text == blank_answer.text


def _arm_config(arm: Arm):
    """The transformers config of the model ``arm`` answers with, or None (a remote server's)."""
    from g4v.loading import load_config

    if arm.local:
        return arm.engine.model_config()
    return load_config(arm.model_path) if arm.model_path else None


def _model_config(arm_a: Arm, arm_b: Arm):
    """The transformers config of a local arm's model (for image-token counts), or None: that of
    an arm whose model runs here first, else that of an arm with a model folder."""
    local = [arm for arm in (arm_a, arm_b) if arm.local] or [arm for arm in (arm_a, arm_b)
                                                                             if arm.model_path]
    return _arm_config(local[0]) if local else None
