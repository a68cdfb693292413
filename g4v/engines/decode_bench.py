"""``python -m g4v bench decode``: the transformers engine's chat decoding, measured in one run.

Every figure is a ratio of two measurements taken in the same run, interleaved round by round, so
a busy machine slows both sides alike (the machines this project runs on are shared):

1. **engine vs bare generate**: decode tokens/s of a chat through the engine (``engine.stream``,
   the app's path) over ``model.generate`` on the same model and inputs, a batch of one;
2. **the decode loop vs the reference path**: the same through the engine answering one request at
   a time with ``generate`` (``--no-decode-loop``), the path the engine had before the loop;
3. **compiled vs eager** (``--compile``, or on a GPU): the loop with its decode step compiled, and
   the first request's compile time;
4. **N chats at once vs one at a time**: the engine's total tokens/s as it is set (on a GPU its
   step compiled), each chat with its own picture writing exactly N tokens, the two ways taking
   turns for ``--repeats`` rounds (each way's fastest round counts), and whether each chat got
   the tokens it gets alone in every round;
5. the time to the first token of a picture request.

Decode tokens/s is the tokens after an answer's first, over the time from its first token to its
last, as the reader receives them (``generate``: a streamer that only notes the time; the engine:
its pieces). Prefill and the first token are left out by measuring within one answer, not by taking
a 1-token answer's time from an N-token one: that was two noisy timings for one figure. Answers are
held to exactly N tokens (``min_new_tokens``: a trained checkpoint would otherwise end after a few
words).
"""

import math
import statistics
import threading
import time
from dataclasses import dataclass, field, replace

import torch
from transformers.generation.streamers import BaseStreamer

from g4v.conversation import Message, SamplingSettings
from g4v.engines.bench import workload
from g4v.engines.decode_settings import DecodeSettings

PROMPT = "Describe this picture in detail."


@dataclass
class DecodeReport:
    """What one run measured (tokens/s are decode rates, batch of one, unless said)."""

    new_tokens: int
    repeats: int
    rates: dict[str, float] = field(default_factory=dict)  # path -> decode tokens/s
    ttft_s: dict[str, float] = field(default_factory=dict)  # path -> median seconds to the first piece
    compile_s: float | None = None  # the compiled path's first request, over a warm one
    chats: int = 0
    one_at_a_time_s: float = 0.0
    together_s: float = 0.0
    chat_tokens: int = 0
    same_as_alone: int = 0

    @property
    def together_over_one_at_a_time(self) -> float:
        return self.one_at_a_time_s / self.together_s if self.together_s else float("nan")

    def ratio(self, path: str, over: str = "bare generate") -> float:
        return self.rates[path] / self.rates[over] if self.rates.get(over) else float("nan")

    def to_dict(self) -> dict:
        return {"new_tokens": self.new_tokens, "repeats": self.repeats, "decode_tok_s": self.rates,
                "ratios_over_bare_generate": {path: self.ratio(path) for path in self.rates},
                "ttft_s": self.ttft_s, "compile_s": self.compile_s, "chats": self.chats,
                "one_at_a_time_s": self.one_at_a_time_s, "together_s": self.together_s,
                "chat_tokens": self.chat_tokens, "together_over_one_at_a_time": self.together_over_one_at_a_time,
                "same_as_alone": self.same_as_alone}


def forced(tokens: int) -> SamplingSettings:
    """Greedy answers of exactly ``tokens`` tokens."""
    return SamplingSettings(max_new_tokens=tokens, min_new_tokens=tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Times(BaseStreamer):
    """A streamer that only notes when each new token arrives (``generate`` hands it the prompt first)."""

    def __init__(self):
        self.prompt_seen, self.times = False, []

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def bare_generate(engine, request):
    """``answer(n)``: ``model.generate`` on the engine's model as ``request`` sees it (its adapters),
    with nothing of the engine around it; returns ``(seconds from the first new token to the last,
    tokens after the first)``."""
    tokenizer = engine.tokenizer

    def answer(tokens: int) -> tuple[float, int]:
        times = _Times()
        with engine.adapter_scope(None, request.has_image) as model, torch.inference_mode():
            model.generate(**request.inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           temperature=None, top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, streamer=times)
        return _span(times.times, [1] * len(times.times))
    return answer


def through(engine, request):
    """``answer(n)``: the engine's chat path, read to the end as the app reads it; returns ``(seconds
    from the first piece with tokens to the last, tokens after the first piece)``."""
    def answer(tokens: int) -> tuple[float, int]:
        times, counts = [], []
        for piece in engine.stream_outputs(request, forced(tokens)):
            if piece.token_ids:
                times.append(time.perf_counter())
                counts.append(len(piece.token_ids))
        return _span(times, counts)
    return answer


def _span(times: list[float], counts: list[int]) -> tuple[float, int]:
    """``(seconds from the first arrival to the last, tokens after the first arrival)`` of an answer
    whose tokens arrived at ``times``, ``counts[i]`` of them at ``times[i]``; ``(0.0, 0)`` for none."""
    return (times[-1] - times[0], sum(counts[1:])) if times else (0.0, 0)


def decode_rates(paths: dict, new_tokens: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Decode tokens/s of each ``answer(n)`` path, the paths taking turns in every round; each path's
    fastest round counts (a shared machine's noise only ever adds time). NaN where in every round no
    token arrived after the first one (``new_tokens`` 1, or an answer's tokens read in one piece)."""
    best = {name: float("nan") for name in paths}
    for answer in paths.values():
        answer(2)  # one untimed answer: first-call costs out of the numbers
    for _ in range(repeats):
        for name, answer in paths.items():
            _sync(device)
            seconds, tokens = answer(new_tokens)
            rate = tokens / seconds if tokens and seconds > 0 else float("nan")
            if math.isnan(best[name]) or rate > best[name]:
                best[name] = rate
    return best


def first_piece_s(engine, request, repeats: int, device: torch.device) -> float:
    """Median seconds from asking to the first piece of a 1-token answer (prefill included)."""
    seconds = []
    for _ in range(repeats):
        _sync(device)
        began = time.perf_counter()
        next(iter(engine.stream_outputs(request, forced(1))))
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def at_once(chat, count: int) -> float:
    """Seconds for ``chat(0) .. chat(count - 1)`` run all at once, one thread each."""
    threads = [threading.Thread(target=chat, args=(index,)) for index in range(count)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def chats_at_once(engine, conversations: list[list[Message]], settings: SamplingSettings,
                  rounds: int = 1) -> tuple[float, float, int, int]:
    """``(one at a time s, together s, tokens, answers equal to their alone answer)``: the same chats
    answered one after another, then all submitted at once (one thread each), ``rounds`` times
    taking turns; each way's fastest round counts (a shared machine's noise only adds time), and
    every round's together answers are checked against the alone ones."""
    alone_s, together_s, same = [], [], len(conversations)
    for _ in range(rounds):
        began = time.perf_counter()
        alone = [engine.generate(conversation, settings) for conversation in conversations]
        alone_s.append(time.perf_counter() - began)
        together: list = [None] * len(conversations)

        def chat(index: int) -> None:
            together[index] = engine.generate(conversations[index], settings)

        together_s.append(at_once(chat, len(conversations)))
        same = min(same, sum(a.token_ids == b.token_ids for a, b in zip(alone, together)))
    return min(alone_s), min(together_s), sum(len(a.token_ids) for a in alone), same


def measure(engine, new_tokens: int = 48, repeats: int = 3, chats: int = 8, compile_too: bool = False,
            conversations: list[list[Message]] | None = None) -> DecodeReport:
    """Every figure of the module docstring for ``engine`` (a transformers engine; the reference
    and compiled engines are made over its loaded model). ``conversations``: the chats (default:
    :func:`g4v.engines.bench.workload`, one picture each); the first one is the batch of one."""
    from g4v.engines.hf import TransformersEngine

    conversations = conversations or workload(chats)
    device = engine.loaded.device
    report = DecodeReport(new_tokens=new_tokens, repeats=repeats, chats=len(conversations))
    request = engine.prepare(conversations[0], new_tokens)
    base = engine.decode

    def over_it(**changes) -> TransformersEngine:  # another engine over the same loaded model
        return TransformersEngine(engine.info.model, loaded=engine.loaded, decode=replace(base, **changes))

    made = {"engine (reference path)": over_it(decode_loop=False), "engine (decode loop)": over_it(compile_decode="off")}
    if compile_too:
        made["engine (compiled)"] = compiled = over_it(compile_decode="on")
        began = time.perf_counter()
        through(compiled, request)(2)
        cold = time.perf_counter() - began
        began = time.perf_counter()
        through(compiled, request)(2)
        report.compile_s = cold - (time.perf_counter() - began)
    paths = {"bare generate": bare_generate(engine, request),
             **{name: through(other, request) for name, other in made.items()}}
    report.rates = decode_rates(paths, new_tokens, repeats, device)
    report.ttft_s = {name: first_piece_s(other, request, repeats, device)
                     for name, other in made.items() if name != "engine (reference path)"}
    for other in made.values():
        other.close()
    # every chat writes all its tokens, as a model's long answers do (a small checkpoint ends early)
    (report.one_at_a_time_s, report.together_s, report.chat_tokens,
     report.same_as_alone) = chats_at_once(engine, conversations, forced(new_tokens), rounds=repeats)
    return report


def table(report: DecodeReport) -> str:
    """The report as Markdown: decode rates with their ratio to bare generate, then the chats."""
    lines = [f"decode, a batch of one, {report.new_tokens} new tokens, the fastest of {report.repeats} interleaved rounds",
             "", "| path | decode tokens/s | vs bare generate | first piece s |", "|---|---:|---:|---:|"]
    for path, rate in report.rates.items():
        ttft = report.ttft_s.get(path)
        lines.append(f"| {path} | {rate:.1f} | {report.ratio(path):.2f}x | {'' if ttft is None else f'{ttft:.3f}'} |")
    if report.compile_s is not None:
        lines += ["", f"compiled path: the first request took {report.compile_s:.1f} s more than a warm one (compiling)"]
    lines += ["", f"{report.chats} chats, {report.chat_tokens} tokens (the fastest of {report.repeats} rounds each): one at a time {report.one_at_a_time_s:.2f} s, "
                  f"all at once {report.together_s:.2f} s: **{report.together_over_one_at_a_time:.2f}x**; "
                  f"{report.same_as_alone} of {report.chats} answers the tokens they get alone"]
    return "\n".join(lines)
