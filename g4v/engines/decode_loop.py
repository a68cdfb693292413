"""Several chats on one transformers model at once: continuous batching over a KV cache of slots.

Why: ``model.generate`` answers one batch from start to end, so a chat that arrives while another is
answered waits for it, and its Python (logits processors, stopping criteria, a streamer decoding
text in the generating thread) runs around every step. transformers' own continuous batching
takes token ids only, and Granite 4 Vision's pictures enter through 8 injections in the prefill.
This loop keeps the model's own forward for both phases and batches the decode steps itself.

How a request goes through it (:meth:`DecodeLoop.run_once` is one turn):

1. It arrives prepared (pictures processed, the prompt checked against the context window) with
   the :class:`Variant` of weights it runs on, and waits in line.
2. Admission, first in first out: while a slot is free, the next request joins if it runs on the
   same variant as the requests decoding now (one forward serves one set of weights); a request
   of another variant waits until they end, and nothing behind it overtakes it. Requests that
   join together have their pictures encoded together (:meth:`Host.encoded`: the same features).
3. Prefill, alone: the model's forward over the prompt and its pictures, exactly as ``generate``
   prefills (the 8 levels are injected here and only here); its keys and values go to a slot
   (:mod:`g4v.engines.slots`); its first token is picked from the last position's logits.
4. Decode: one forward for every running request, each at its own position, one new token each;
   compiled (``torch.compile``, CUDA graphs on a GPU) when :class:`DecodeSettings` says so.
5. Each request's tokens go to its own outbox as ids; the consumer's own thread turns them into
   text (:mod:`g4v.engines.detokenize`), so a slow reader stalls no one. A request ends on
   end-of-text (``stop``), ``max_new_tokens`` (``length``), or ``cancelled`` when its caller sets
   ``cancel`` or stops reading; its slot is free at the next turn.

Sampling is per request: greedy, or temperature and top-p as transformers' warpers apply them, from
the request's own generator seeded with its seed, so a seeded answer does not depend on the others.
"""

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from g4v.conversation import SamplingSettings
from g4v.engines.base import Piece, PreparedRequest
from g4v.engines.decode_settings import DecodeSettings
from g4v.engines.detokenize import IncrementalText
from g4v.engines.slots import Slots

log = logging.getLogger("g4v.engines")


@dataclass(frozen=True)
class Variant:
    """The weights a request runs on: the model with ``adapters`` (PEFT names) enabled, or, with
    ``merged``, a twin of the model with that adapter merged into its weights (no LoRA layers)."""

    adapters: tuple[str, ...] = ()
    merged: str | None = None


class Host(Protocol):
    """What the loop needs of its engine (:class:`~g4v.engines.hf.TransformersEngine`)."""

    tokenizer: object
    device: torch.device

    def weights(self, variant: Variant) -> tuple[torch.nn.Module, bool]:
        """The module to run ``variant`` on, and whether its decode step may be compiled."""

    def holding(self, variant: Variant) -> AbstractContextManager:
        """Sole use of the model, with ``variant``'s adapters enabled, for one prefill or step."""

    def encoded(self, requests: list[PreparedRequest]) -> list[PreparedRequest]:
        """The requests with their pictures through the vision tower and projectors, together where
        their tile stacks match (as they are where the features depend on the adapter)."""


@dataclass
class _End:
    reason: str
    error: BaseException | None = None


@dataclass(eq=False)
class _Ask:
    """One request in the loop."""

    request: PreparedRequest
    settings: SamplingSettings
    variant: Variant
    cancel: threading.Event
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    gone: threading.Event = field(default_factory=threading.Event)  # the consumer stopped reading
    generator: torch.Generator | None = None
    produced: int = 0
    last: int = 0  # the newest token, fed to the next step

    def stopped(self) -> bool:
        return self.cancel.is_set() or self.gone.is_set()


@dataclass
class LoopStats:
    """What the loop has done, for benchmarks and the GPU check."""

    prefills: int = 0
    steps: int = 0
    rows_stepped: int = 0  # tokens decoded in steps (a step of 8 rows counts 8)
    compile_seconds: dict = field(default_factory=dict)  # (variant, batch, window) -> first call's seconds
    ahead_steps: int = 0  # steps run by a step compiled ahead of time


def decode_step(model, cache, ids, positions, mask, keys, values):
    """One decode step: the model's own forward on one new token per row (``ids`` ``(batch, 1)`` at
    ``positions`` ``(batch,)``), reading and writing the slot buffers ``keys`` and ``values`` (one
    ``(rows, heads, capacity, dim)`` tensor per layer) through ``cache``; the next-token logits
    ``(batch, vocab)`` in float32. The one function the eager loop, ``torch.compile`` and the
    ahead-of-time export (:mod:`g4v.engines.aot`) run."""
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions[:, None],
                   past_key_values=cache.bind(keys, values, positions), use_cache=True)
    return output.logits[:, -1].float()


class DecodeLoop:
    """Continuous batching of one engine's requests (see the module docstring)."""

    def __init__(self, host: Host, settings: DecodeSettings, context_window: int, background: bool = True,
                 text_config=None, dtype: torch.dtype | None = None):
        """``text_config``, ``dtype``: the language model's (the slots' shapes, known before a prefill)."""
        self.host, self.settings = host, settings
        self.eos = host.tokenizer.eos_token_id
        self.slots = Slots(rows=settings.max_batch, device=host.device, limit=context_window,
                           text_config=text_config, dtype=dtype)
        self.stats = LoopStats()
        self._running: list[_Ask] = []  # in slot order: _running[r] decodes in row r
        self._waiting: deque[_Ask] = deque()
        self._cond = threading.Condition()
        self._drive = threading.Lock()  # one driver at a time (the thread, or an inline consumer)
        self._background = background
        self._thread: threading.Thread | None = None
        self._closed = False
        self._compiled: dict[int, Callable] = {}  # id(module) -> its compiled step
        #: Steps compiled ahead of time (:mod:`g4v.engines.aot`): (variant, batch, window) -> step(ids,
        #: positions, mask, keys, values); used instead of torch.compile where one fits.
        self.ahead: dict[tuple, Callable] = {}

    # ── the consumer's side ──────────────────────────────────────────────────────────────────

    def submit(self, request: PreparedRequest, settings: SamplingSettings, variant: Variant,
               cancel: threading.Event | None = None) -> Iterator[Piece]:
        """Queue a prepared request; its answer comes back as pieces, read in the caller's thread."""
        ask = _Ask(request, settings, variant, cancel or threading.Event())
        if not settings.greedy:
            ask.generator = torch.Generator(device=self.host.device)
            if settings.seed is None:
                ask.generator.seed()
            else:
                ask.generator.manual_seed(settings.seed)
        with self._cond:
            if self._closed:
                raise RuntimeError("the decode loop is closed")
            self._waiting.append(ask)
            if self._background and self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="g4v-decode-loop", daemon=True)
                self._thread.start()
            self._cond.notify()
        return self._pieces(ask)

    def _pieces(self, ask: _Ask) -> Iterator[Piece]:
        text = IncrementalText(self.host.tokenizer)
        prompt_tokens = ask.request.prompt_tokens
        try:
            while True:
                items = [self._next(ask)]
                while True:  # whatever else has arrived: one piece for several tokens
                    try:
                        items.append(ask.outbox.get_nowait())
                    except queue.Empty:
                        break
                ids = [item for item in items if isinstance(item, int)]
                end = next((item for item in items if isinstance(item, _End)), None)
                if ids:
                    yield Piece(text.add(ids), ids, prompt_tokens=prompt_tokens)
                if end is not None:
                    if end.error is not None:
                        raise end.error
                    yield Piece(text.finish(), [], end.reason, prompt_tokens)
                    return
        finally:
            ask.gone.set()  # read to the end or left early: either way the loop lets it go

    def _next(self, ask: _Ask):
        """The next item of ``ask``'s outbox: waited for, or (inline) made by driving the loop."""
        if self._background:
            return ask.outbox.get()
        while True:
            try:
                return ask.outbox.get_nowait()
            except queue.Empty:
                with self._drive:
                    self.run_once()

    # ── the loop ─────────────────────────────────────────────────────────────────────────────

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    return
            with self._drive:
                self.run_once()

    def run_once(self) -> None:
        """Let go of stopped requests, admit and prefill what fits, then one decode step."""
        for row in reversed(range(len(self._running))):
            if self._running[row].stopped():
                self._finish(row, _End("cancelled"))
        self._admit()
        if self._running:
            self._step()

    def _admit(self) -> None:
        """Take what fits from the line (same variant, first in first out), encode their pictures
        together, then prefill each alone."""
        joining: list[_Ask] = []
        with self._cond:
            variant = self._running[0].variant if self._running else None
            while self._waiting and len(self._running) + len(joining) < self.slots.rows:
                ask = self._waiting[0]
                if (variant or ask.variant) != ask.variant:
                    break  # it waits for this variant's requests to end; nothing overtakes it
                variant = ask.variant
                joining.append(self._waiting.popleft())
        for ask in [ask for ask in joining if ask.stopped()]:
            ask.outbox.put(_End("cancelled"))
        joining = [ask for ask in joining if not ask.stopped()]
        if len(joining) > 1:  # the vision tower and projectors once for all of them (same results)
            try:
                for ask, request in zip(joining, self.host.encoded([ask.request for ask in joining])):
                    ask.request = request
            except Exception:  # noqa: BLE001 - each prefill then encodes its own, and fails on its own
                log.exception("encoding the pictures together failed")
        for ask in joining:
            try:
                self._prefill(ask)
            except Exception as err:  # noqa: BLE001 - this request's own failure, handed to its reader
                ask.outbox.put(_End("error", err))

    def _prefill(self, ask: _Ask) -> None:
        model, _ = self.host.weights(ask.variant)
        with self.host.holding(ask.variant), torch.inference_mode():
            cache = DynamicCache(config=model.config.text_config)
            output = model(**ask.request.inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
            token = self._pick(output.logits[:, -1].float(), [ask])[0]
        if isinstance(token, Exception):
            raise token
        self.stats.prefills += 1
        if self._emit(ask, token) is None:
            self.slots.add(cache, ask.request.prompt_tokens)
            self._running.append(ask)

    def _emit(self, ask: _Ask, token: int) -> _End | None:
        """Hand ``token`` to ``ask``'s reader; the end it reached, if any (then it is told)."""
        end = None
        if token == self.eos:
            end = _End("stop")
        else:
            ask.outbox.put(token)
            ask.produced += 1
            ask.last = token
            if ask.produced >= ask.settings.max_new_tokens:
                end = _End("length")
        if end is not None:
            ask.outbox.put(end)
        return end

    def _step(self) -> None:
        running = list(self._running)
        variant = running[0].variant
        model, compilable = self.host.weights(variant)
        jit = compilable and self.settings.compiles(self.slots.device)
        fixed = jit or any(shape[0] == variant for shape in self.ahead)  # a compiled step's shapes
        used = len(running)
        batch = _bucket(used, self.slots.rows) if fixed else used
        try:
            self.slots.reserve(max(self.slots.lengths) + 1)
            window = self.slots.capacity if fixed else max(self.slots.lengths) + 1
            # no mask where none is needed: SDPA only (the eager attention builds one regardless)
            sdpa = model.config.text_config._attn_implementation == "sdpa"
            cache, positions, mask = self.slots.step(batch, window, fixed or not sdpa)
            mask = _mask_for(model, mask) if mask is not None else None
            ids = torch.tensor([ask.last for ask in running] + [0] * (batch - used), device=self.slots.device)[:, None]
            with self.host.holding(variant), torch.inference_mode():
                logits = self._run(model, jit, (variant, batch, window), ids, positions, mask, cache)
                tokens = self._pick(logits[:used], running)
        except Exception as err:  # noqa: BLE001 - a failed step fails every request in it
            log.exception("a decode step failed")
            for row in reversed(range(used)):
                self._finish(row, _End("error", err))
            return
        self.slots.advance()
        self.stats.steps += 1
        self.stats.rows_stepped += used
        for row in reversed(range(used)):
            if isinstance(tokens[row], Exception):  # this row's draw failed: it ends alone
                self._finish(row, _End("error", tokens[row]))
                continue
            end = self._emit(running[row], tokens[row])
            if end is not None:
                self._drop(row)

    def _run(self, model, jit: bool, shape, ids, positions, mask, cache) -> torch.Tensor:
        """The step: compiled ahead of time for this shape, else torch.compile'd (``jit``), else eager."""
        buffers = (self.slots.keys, self.slots.values)
        if shape in self.ahead:
            self.stats.ahead_steps += 1
            return self.ahead[shape](ids, positions, mask, *buffers)
        if not jit:
            return decode_step(model, cache, ids, positions, mask, *buffers)
        step = self._compiled.get(id(model))
        if step is None:
            # each (batch bucket, window, model) is a graph: more than dynamo's default of 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            mode = "reduce-overhead" if self.slots.device.type == "cuda" else None
            step = self._compiled[id(model)] = torch.compile(decode_step, mode=mode, fullgraph=True, dynamic=False)
        if self.slots.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        first = shape not in self.stats.compile_seconds
        began = time.perf_counter()
        logits = step(model, cache, ids, positions, mask, *buffers)
        if first:
            self.stats.compile_seconds[shape] = time.perf_counter() - began
        return logits.clone()

    def _pick(self, logits: torch.Tensor, asks: list[_Ask]) -> list[int | Exception]:
        """One token per row: greedy rows together, sampled rows each from its own generator. A row
        short of its ``min_new_tokens`` cannot pick end-of-text (as transformers' processor). A
        sampled row whose draw fails (logits that are not finite) gets the error instead of a token:
        one request's numbers end that request, not the others in its step."""
        early = [row for row, ask in enumerate(asks) if ask.produced < ask.settings.min_new_tokens]
        if early:
            logits[early, self.eos] = -float("inf")
        tokens: list[int | Exception] = logits.argmax(dim=-1).tolist()
        for row, ask in enumerate(asks):
            if ask.generator is not None:
                try:
                    tokens[row] = _sample(logits[row], ask.settings, ask.generator)
                except RuntimeError as err:
                    log.warning("a sampled row failed its draw: %s", err)
                    tokens[row] = err
        return tokens

    def _finish(self, row: int, end: _End) -> None:
        self._running[row].outbox.put(end)
        self._drop(row)

    def _drop(self, row: int) -> None:
        self.slots.drop(row)
        last = self._running.pop()
        if row < len(self._running):
            self._running[row] = last

    def pending(self) -> int:
        """Requests waiting or decoding."""
        with self._cond:
            return len(self._waiting) + len(self._running)

    def close(self) -> None:
        """End every request (cancelled), stop the loop's thread and let go of the slots' memory."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        with self._drive:
            for ask in waiting:
                ask.outbox.put(_End("cancelled"))
            for row in reversed(range(len(self._running))):
                self._finish(row, _End("cancelled"))
            self.slots.release()
            self._compiled.clear()
            self.ahead.clear()


def _bucket(used: int, rows: int) -> int:
    """A compiled step's batch: the next power of two (each shape is a graph of its own)."""
    batch = 1
    while batch < used:
        batch *= 2
    return min(batch, rows)


def _mask_for(model, mask: torch.Tensor) -> torch.Tensor:
    """The boolean mask (True: may read) as the model's attention takes it: SDPA takes booleans,
    the eager implementation adds the mask to its scores."""
    if model.config.text_config._attn_implementation == "eager":
        return torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill(~mask, torch.finfo(model.dtype).min)
    return mask


def supported(model) -> bool:
    """Whether the loop can run ``model``: an attention implementation that takes its masks."""
    return model.config.text_config._attn_implementation in ("sdpa", "eager")


def _sample(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator) -> int:
    """A token drawn as transformers' warpers draw it: temperature, then top-p (the smallest set of
    tokens whose probability reaches ``top_p``, at least one), then a multinomial draw."""
    scores = logits / settings.temperature
    if settings.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - settings.top_p)
        remove[-1:] = False
        scores = scores.masked_fill(remove.scatter(0, order, remove), -float("inf"))
    probabilities = scores.softmax(dim=-1)
    return int(torch.multinomial(probabilities, num_samples=1, generator=generator))
