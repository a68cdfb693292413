"""The in-process vLLM backend: vLLM's own ``granite4_vision`` model behind the sync engine interface.

vLLM serves requests from an asyncio engine (``AsyncLLM``) whose model runs in worker processes.
The workbench is synchronous (CLI loops, Gradio generators, tests), so this module runs one event
loop on a background thread and hands each request's outputs to the caller through a queue: every
request streams token by token, requests share vLLM's continuous batching, a cancel event aborts
one, a failed start is one line (:mod:`g4v.engines.vllm_start`). Facts (``../shared/ENVIRONMENT.md``):

* vLLM starts its processes with ``spawn``: a script building a :class:`VLLMEngine` needs the
  ``if __name__ == "__main__":`` guard (``python -m g4v`` has it).
* ``AsyncLLM`` ignores ``default_mm_loras`` (only ``LLM.generate`` and the OpenAI server apply it),
  so this engine passes the checkpoint's vision LoRA (:mod:`g4v.checkpoint.vision_lora`) as every image
  request's ``lora_request``, and gives vLLM the folder without the adapter files (it would load
  ``adapter_model.safetensors`` as a weight shard).
* Its settings and engine arguments: :mod:`g4v.engines.vllm_settings`.
"""

import asyncio
import itertools
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from g4v.checkpoint.vision_lora import check_base_available, served_view
from g4v.conversation import Message, SamplingSettings, to_template_messages, validate_conversation
from g4v.engines.base import WITHOUT_VISION_LORA, Engine, EngineInfo, Piece, gpu_present, messages_of, without_end_token
from g4v.engines.event_loop import LoopThread
from g4v.engines.vllm_settings import VLLMSettings, adapter_capacity, engine_arguments
from g4v.engines.vllm_start import OutputTail, start_error
from g4v.errors import G4VError, PromptTooLong, first_line

#: How often a waiting consumer looks at its cancel event (seconds).
_POLL_S = 0.05
#: How long closing a stream waits for vLLM to confirm the abort.
_ABORT_WAIT_S = 30.0
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}
_END = object()


class _Request:
    """One request in flight: a pump task on the loop fills ``outputs``; the caller drains it."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.outputs: queue.Queue = queue.Queue()
        #: Set once the pump has finished, i.e. once vLLM has finished or aborted the request.
        self.done = threading.Event()
        self.future = None
        self.prompt_tokens = 0


class VLLMEngine(Engine):
    """Granite 4 Vision served by vLLM in this process (model workers in child processes)."""

    #: A batch's requests are all submitted at once, up to this many: continuous batching draws
    #: from them (bounded below the HTTP client's pool when the same arm runs through a server).
    in_flight = 64

    def __init__(self, model: str, settings: VLLMSettings | None = None, vision_lora: str | None = None):
        from g4v.checkpoint.vision_lora import check_mode, describe, find_vision_lora
        from g4v.loading import load_processor, resolve_source

        self.settings = settings or VLLMSettings()
        source = resolve_source(model)
        mode = check_mode(vision_lora)
        self.vision_lora = find_vision_lora(source)
        self.vision_mode = mode if self.vision_lora is not None else "off"
        # The same processor object the transformers engine renders prompts with, so both backends
        # see the same prompt text; vLLM then tokenises it and expands the image placeholders.
        self.processor = load_processor(source)
        native = self.vision_mode == "native"
        self.arguments = engine_arguments(source, self.settings, self.vision_lora.rank if native else None)
        self._view = served_view(self.vision_lora, self.vision_mode)
        if self._view is not None:
            self.arguments["model"] = str(self._view.path)
        self._loop = LoopThread()
        try:
            self._llm = self._loop.run(self._start(self.arguments))
        except G4VError:
            self._loop.stop()
            self._close_view()
            raise
        self._adapters: dict[str, object] = {}  # name -> LoRARequest
        self._request_ids = itertools.count(1)
        self._lora_ids = itertools.count(1)
        self._image_lora = self._load_image_lora(str(self.vision_lora.folder) if native else
                                                 (self.settings.default_mm_loras or {}).get("image"))
        self.info = EngineInfo(
            backend="vllm",
            model=model,
            device="cuda" if gpu_present() else "cpu",
            dtype=str(self._llm.model_config.dtype).removeprefix("torch."),
            details={key: value for key, value in self.arguments.items() if key != "model"},
        )
        if self.vision_lora is not None:
            self.info.details["vision_lora"] = describe(self.vision_mode, self.vision_lora)

    def _load_image_lora(self, path: str | None):
        """Register the LoRA for image requests with vLLM now (so a bad one fails at start)."""
        if path is None:
            return None
        from vllm.lora.request import LoRARequest

        request = LoRARequest("g4v-vision-lora", next(self._lora_ids), str(path))
        try:
            self._loop.run(self._llm.add_lora(request))
        except Exception as err:
            self.close()
            raise G4VError(f"vLLM could not load the vision LoRA: {first_line(err)}") from None
        return request

    def _close_view(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.close()

    @staticmethod
    async def _start(arguments: dict):
        """Build ``AsyncLLM`` inside the loop thread, so its output handler runs on that loop."""
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError:
            raise G4VError("the vllm backend needs vLLM: pip install -r requirements-vllm.txt "
                           "(GPU) or run scripts/setup_vllm_cpu_env.sh (CPU)") from None
        tail = OutputTail()  # the engine core prints why it failed, nowhere else
        try:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**arguments))
        except Exception as err:  # vLLM reports bad settings and start-up failures in many types
            raise start_error(err, tail.restore().lines(wait=2.0)) from None
        finally:
            tail.restore()

    # ── prompts ──────────────────────────────────────────────────────────────────────────────

    def context_window(self) -> int:
        return int(self._llm.model_config.max_model_len)

    def render_prompt(self, messages: list[Message]) -> str:
        """The prompt text with one ``<image>`` placeholder per image, as transformers renders it."""
        template_messages, _ = to_template_messages(messages)
        return self.processor.apply_chat_template(template_messages, add_generation_prompt=True, tokenize=False)

    def build_prompt(self, messages: list[Message]) -> dict:
        """vLLM's prompt: text plus the images, which vLLM's processor expands into feature tokens."""
        messages = messages_of(messages)  # a prepared request carries its conversation
        validate_conversation(messages, max_images=self.settings.max_images, context_window=self.context_window())
        _, images = to_template_messages(messages)
        prompt = {"prompt": self.render_prompt(messages)}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        return prompt

    def sampling_params(self, settings: SamplingSettings):
        """The same decoding as the transformers engine: greedy at temperature 0, else seeded
        temperature/top-p sampling with top-k off."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        settings = settings.validated()
        common = {"max_tokens": settings.max_new_tokens, "min_tokens": settings.min_new_tokens,
                  "skip_special_tokens": True, "output_kind": RequestOutputKind.DELTA}
        if settings.greedy:
            return SamplingParams(temperature=0.0, **common)
        return SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=0,
                              seed=settings.seed, **common)

    # ── adapters ─────────────────────────────────────────────────────────────────────────────

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        """Load the LoRA folder into vLLM now (so a bad adapter fails here, not mid-chat) with a
        stable integer id. ``stacked`` (trained on the vision model): merged weights only."""
        from vllm.lora.request import LoRARequest

        if stacked and self.vision_lora is not None and self.vision_mode != "merged":
            raise G4VError(f"adapter {name} was trained on the vision model, and vLLM in {self.vision_mode} mode would run "
                           "it without the vision LoRA (one LoRA per request): use --vision-lora merged")
        if not self.settings.enable_lora:
            raise G4VError("this vLLM engine was started without LoRA (enable_lora=False)")
        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise G4VError(f"not a LoRA adapter folder (no adapter_config.json): {path}")
        existing = self._adapters.get(name)
        if existing is not None and existing.lora_path == str(folder):
            return
        capacity = adapter_capacity(self.arguments) - (self.vision_mode == "native")
        if existing is None and len(self._adapters) >= capacity:
            raise G4VError(
                f"this vLLM engine holds at most {capacity} adapters "
                f"(max_loras={self.arguments['max_loras']}; on the CPU one slot stays empty so base "
                "requests stay exact); restart it with a larger --max-loras"
            )
        request = LoRARequest(name, next(self._lora_ids), str(folder))
        try:
            self._loop.run(self._llm.add_lora(request))
        except Exception as err:
            raise G4VError(f"vLLM could not load adapter {name!r}: {first_line(err)}") from None
        self._adapters[name] = request

    def adapters(self) -> list[str]:
        return list(self._adapters)

    def _lora_request(self, adapter: str | None, image: bool = False):
        """The request's LoRA, as vLLM's server picks it: the named adapter (it replaces the vision
        LoRA), else the vision LoRA for a request with an image, else none (the base)."""
        if adapter is None:
            return self._image_lora if image else None
        if adapter == WITHOUT_VISION_LORA:
            check_base_available(self.vision_lora, self.vision_mode)
            return None
        if adapter not in self._adapters:
            raise G4VError(f"unknown adapter {adapter!r}")
        return self._adapters[adapter]

    # ── generation ───────────────────────────────────────────────────────────────────────────

    def stream_outputs(self, messages, settings, cancel=None, adapter=None) -> Iterator[Piece]:
        request = self._submit(messages, settings, adapter)  # bad input fails here, at the call site
        return without_end_token(self._drain(request, cancel or threading.Event()))

    def _submit(self, messages: list[Message], settings: SamplingSettings, adapter: str | None) -> _Request:
        """Start the request in vLLM; its outputs arrive on ``request.outputs``."""
        params = self.sampling_params(settings)
        prompt = self.build_prompt(messages)
        lora = self._lora_request(adapter, "multi_modal_data" in prompt)
        request = _Request(f"g4v-{next(self._request_ids)}")
        request.future = self._loop.submit(self._pump(request, prompt, params, lora))
        return request

    async def _pump(self, request: _Request, prompt: dict, params, lora) -> None:
        """Move vLLM's outputs for one request onto its queue. Cancelling this task makes
        ``AsyncLLM.generate`` abort the request inside vLLM before the task ends."""
        try:
            async for output in self._llm.generate(prompt, params, request.request_id, lora_request=lora):
                completion = output.outputs[0]
                request.prompt_tokens = request.prompt_tokens or len(output.prompt_token_ids or ())
                request.outputs.put((completion.text, list(completion.token_ids), completion.finish_reason))
        except asyncio.CancelledError:
            pass
        except Exception as err:  # noqa: BLE001 - handed to the consumer's thread
            request.outputs.put(err)
        finally:
            request.outputs.put(_END)
            request.done.set()

    def _drain(self, request: _Request, cancel: threading.Event) -> Iterator[Piece]:
        """Yield the answer's pieces until the request ends. On cancel, or
        when the consumer closes this generator early, abort the request in vLLM and wait until
        it is gone, so the engine's capacity is free for the next request."""
        try:
            while not cancel.is_set():
                try:
                    item = request.outputs.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise _as_user_error(item)
                text, ids, reason = item
                yield Piece(text, ids, _FINISH_REASONS.get(reason, reason), request.prompt_tokens)
        finally:
            if not request.done.is_set():
                request.future.cancel()
                request.done.wait(_ABORT_WAIT_S)

    def pending_requests(self) -> int:
        """Requests vLLM still holds (finished and aborted ones are gone)."""
        return self._llm.get_num_unfinished_requests()

    def close(self) -> None:
        """Stop vLLM's engine-core and worker processes and the loop thread."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        self._close_view()

        async def shutdown():
            llm.shutdown()

        try:
            self._loop.run(shutdown(), timeout=60)
        finally:
            self._loop.stop()


#: How vLLM words "the prompt does not fit max_model_len".
_CONTEXT_EXCEEDED = re.compile(r"maximum (model|context) length|longer than the maximum", re.IGNORECASE)


def _as_user_error(err: Exception) -> Exception:
    """vLLM's request validation errors (prompt too long, too many images) are the user's to fix;
    anything else is a bug and keeps its type."""
    if _CONTEXT_EXCEEDED.search(str(err)):
        return PromptTooLong(f"the prompt is too long for this model: {first_line(err)}")
    if isinstance(err, ValueError) or type(err).__name__ in ("VLLMValidationError", "VLLMClientError"):
        return G4VError(f"vLLM refused the request: {first_line(err)}")
    return err
