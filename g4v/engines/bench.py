"""``python -m g4v bench engines``: the same chat workload through each backend, timed in one run.

The workload is what a busy workbench sees: ``chats`` conversations submitted at once, each with its
own picture and a greedy answer of ``max_new_tokens`` tokens. For every backend it reports the
median time to first token (from submission, so queueing counts), the throughput in generated
tokens per second over the whole run, and both as ratios to the first backend measured (the
transformers reference). Each backend gets one untimed warm-up request first, so one-off costs
(lazy initialisation, first-call allocation) stay out of the numbers; start-up time is reported
separately.

Token counts come from the engines: vLLM and the OpenAI server report token ids with each piece.
The transformers engine streams text only, so its counts come from one untimed greedy ``generate``
per chat after the timed run (greedy decoding gives the same tokens again).

Decode tokens/s (the median chat's tokens after its first over the time after its first token)
leaves prefill out, which is where a LoRA applied per token (the vision LoRA's native mode) costs:
``--vision-lora-modes native,merged,off`` times each backend once per mode.
"""

import statistics
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from g4v.conversation import Message, SamplingSettings
from g4v.errors import G4VError

PROMPT = "Describe this picture in detail."


@dataclass
class ChatTiming:
    submitted: float
    first_token: float | None = None
    finished: float | None = None
    tokens: int = 0
    text: str = ""
    decode_s: float | None = None  # measured apart for engines that stream text only (count_tokens)


@dataclass
class BackendResult:
    backend: str
    startup_s: float
    wall_s: float
    chats: list[ChatTiming] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(chat.tokens for chat in self.chats)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def ttft_s(self) -> float:
        return statistics.median(chat.first_token - chat.submitted for chat in self.chats)

    @property
    def decode_tokens_per_s(self) -> float:
        """The median chat's decode speed: tokens after its first over the time after its first
        piece (prefill and queueing left out; what a LoRA applied per token costs shows here)."""
        spans = [(chat.tokens, chat.decode_s if chat.decode_s is not None else
                  chat.finished - chat.first_token if chat.first_token is not None else 0.0) for chat in self.chats]
        rates = [(tokens - 1) / span for tokens, span in spans if tokens > 1 and span > 0]
        return statistics.median(rates) if rates else float("nan")


def workload_images(chats: int, size: tuple[int, int] = (256, 192)) -> list[Image.Image]:
    """One distinct, deterministic picture per chat (distinct, so no backend can reuse another
    chat's image features or prompt cache)."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    images = []
    for index in range(chats):
        rng = np.random.default_rng(index)
        base = np.stack([(x * (index + 1)) % 256, (y * 255) // height, (x + y + 40 * index) % 256], axis=-1)
        pixels = np.clip(base + rng.integers(0, 32, size=base.shape), 0, 255).astype(np.uint8)
        images.append(Image.fromarray(pixels, mode="RGB"))
    return images


def workload(chats: int) -> list[list[Message]]:
    return [[Message("user", PROMPT, [image])] for image in workload_images(chats)]


def run_chats(engine, conversations: list[list[Message]], settings: SamplingSettings, progress=None) -> BackendResult:
    """Submit every conversation at once (one thread each) and time each answer's pieces."""
    timings = [ChatTiming(submitted=0.0) for _ in conversations]
    errors: list[BaseException] = []

    def chat(index: int) -> None:
        timing = timings[index]
        timing.submitted = time.perf_counter()
        try:
            for piece in engine.stream_outputs(conversations[index], settings):
                if timing.first_token is None and (piece.text or piece.token_ids):
                    timing.first_token = time.perf_counter()
                timing.tokens += len(piece.token_ids)
                timing.text += piece.text
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)
        timing.finished = time.perf_counter()
        if progress is not None:
            progress.update(1)

    start = time.perf_counter()
    threads = [threading.Thread(target=chat, args=(index,), daemon=True) for index in range(len(conversations))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    result = BackendResult(backend=engine.info.backend, startup_s=0.0, wall_s=wall, chats=timings)
    if any(chat.text and not chat.tokens for chat in timings):  # a server that streams text without ids
        count_tokens(engine, conversations, settings, result)
    return result


def count_tokens(engine, conversations, settings, result: BackendResult) -> None:
    """Token counts for engines that stream text only (after the timed run; greedy repeats the same
    tokens), and their decode time: their text arrives at word boundaries, so the time after the
    first piece is no decode time; the answer's time minus a one-token answer's is."""
    for conversation, timing in zip(conversations, result.chats):
        began = time.perf_counter()
        timing.tokens = len(engine.generate(conversation, settings).token_ids)
        answer_s = time.perf_counter() - began
        began = time.perf_counter()
        engine.generate(conversation, replace(settings, max_new_tokens=1))
        timing.decode_s = answer_s - (time.perf_counter() - began)


def table(results: list[BackendResult], chats: int, max_new_tokens: int) -> str:
    """A Markdown table; ratios are relative to the first backend."""
    reference = results[0]
    lines = [
        f"{chats} concurrent chats, one image each, {max_new_tokens} new tokens, greedy",
        "",
        "| backend | start-up s | wall s | tokens | tokens/s | median TTFT s | decode tokens/s | tokens/s vs "
        f"{reference.backend} | TTFT vs {reference.backend} | decode vs {reference.backend} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        speedup = result.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s else float("nan")
        ttft_ratio = result.ttft_s / reference.ttft_s if reference.ttft_s else float("nan")
        decode_ratio = result.decode_tokens_per_s / reference.decode_tokens_per_s
        lines.append(
            f"| {result.backend} | {result.startup_s:.1f} | {result.wall_s:.2f} | {result.tokens} | "
            f"{result.tokens_per_s:.1f} | {result.ttft_s:.3f} | {known(result.decode_tokens_per_s, '.1f')} | "
            f"{speedup:.2f}x | {ttft_ratio:.2f}x | {known(decode_ratio, '.2f', 'x')} |"
        )
    return "\n".join(lines)


def known(value: float, spec: str, unit: str = "") -> str:
    """A measured number, or n/a where none was (answers of one token have no decode steps; an
    answer time within the noise of its one-token time has none worth a number)."""
    return format(value, spec) + unit if value == value else "n/a"


def bench_backend(name: str, start_engine, conversations, settings, progress) -> BackendResult:
    """Start one backend, warm it up, time the workload, and close it (so backends never share
    the machine while one is timed)."""
    began = time.perf_counter()
    engine, cleanup = start_engine()
    startup = time.perf_counter() - began
    try:
        engine.generate(conversations[0], SamplingSettings(max_new_tokens=4))  # warm-up, untimed
        progress.set_description(f"{name}: {len(conversations)} chats")
        result = run_chats(engine, conversations, settings, progress)
    finally:
        engine.close()
        cleanup()
    result.backend, result.startup_s = name, startup
    return result


def check_backends(backends: list[str], base_url: str | None, serve: bool) -> None:
    from g4v.engines import vllm_installed

    for backend in backends:
        if backend not in ("hf", "vllm", "openai"):
            raise G4VError(f"unknown backend {backend!r} to benchmark (expected hf, vllm or openai)")
    if "vllm" in backends and not vllm_installed():
        raise G4VError("vLLM is not installed here: run the benchmark with .venv-vllm/bin/python, or drop vllm")
    if "openai" in backends and not base_url and not serve:
        raise G4VError("the openai backend needs --base-url URL, or --serve to start a local vLLM server")


def runs(backends: list[str], modes: str | None, model: str | None, serve: bool = False
         ) -> list[tuple[str, str, str | None]]:
    """``(shown name, backend, vision LoRA mode)`` per timed run: each backend once, or once per mode
    in ``modes`` (comma-separated), which needs a checkpoint that carries a vision LoRA (and, for
    openai, a server started here: another server's mode is its own)."""
    from g4v.checkpoint.vision_lora import check_mode, find_vision_lora
    from g4v.loading import resolve_source
    from g4v.paths import default_model

    if not modes:
        return [(backend, backend, None) for backend in backends]
    checked = [check_mode(mode.strip()) for mode in modes.split(",")]
    if "openai" in backends and not serve:
        raise G4VError("--vision-lora-modes: a server's vision LoRA is its own choice; add --serve to start one here")
    if find_vision_lora(resolve_source(model or default_model())) is None:
        raise G4VError("--vision-lora-modes needs a checkpoint with its vision LoRA beside the base "
                       "(e.g. assets/granite4-vision-tiny-vlora); this one has none")
    return [(f"{backend} [{mode}]", backend, mode) for backend in backends for mode in checked]


def mode_options(options: dict, mode: str | None) -> dict:
    """``create_engine`` options for one timed mode: merged and off run vLLM without LoRA slots, as a
    deployment of them would (the slots cost time on every step), so the ratios show the LoRA's cost."""
    if mode is None:
        return options
    vllm = options.get("vllm")
    if vllm is not None and mode != "native":
        vllm = replace(vllm, enable_lora=False, max_lora_rank=None, max_loras=None, default_mm_loras=None)
    return {**options, "vision_lora": mode, "vllm": vllm}


def default_backends(base_url: str | None, serve: bool) -> list[str]:
    """Every backend this environment can run: hf always, vllm when installed, openai when a server
    is given or may be started."""
    from g4v.engines import vllm_installed

    backends = ["hf"]
    if vllm_installed():
        backends.append("vllm")
    if base_url or serve:
        backends.append("openai")
    return backends
