"""The transformers backend: transformers' own Granite 4 Vision classes, on CPU or GPU.

It is also the reference the other backends are checked against, and the one the inspectors
instrument, so it keeps the loaded model and processor reachable (``engine.loaded``).

LoRA adapters are loaded into that same model with transformers' PEFT integration (no wrapper
object: ``engine.model is engine.loaded.model`` stays the Granite model). Between requests every
adapter is disabled, so code that runs the model directly sees the base model; a request with
``adapter=NAME`` enables just that adapter while it holds the engine's lock.

A checkpoint's vision LoRA (:mod:`g4v.engines.vision_lora`) in native mode is one more PEFT
adapter, chosen per request as vLLM chooses it: enabled for requests with an image, off for
text-only ones (the base language model), and replaced by the user's adapter when one is named.
A user adapter registered ``stacked`` (trained on the vision model) is instead enabled together
with the vision LoRA (PEFT sums both updates), for every request: that is the model it was
trained on. ``adapter=WITHOUT_VISION_LORA`` runs the base language model, image or not.
"""

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer, set_seed

from g4v.conversation import Message, SamplingSettings, to_template_messages, validate_conversation
from g4v.engines.base import (BATCH_SIZE, WITHOUT_VISION_LORA, Engine, Generation, PreparedRequest,
                             transformers_info)
from g4v.errors import G4VError, PromptTooLong, check_value, whole_number
from g4v.engines.vision_lora import check_base_available
from g4v.loading import VISION_ADAPTER, LoadedModel, load_model
from g4v.model.encoding import encoded_inputs, features_shared
from g4v.model.precision import quantize_model

_DECODE = {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}


class _StopWhenSet(StoppingCriteria):
    """Ends ``generate`` at the next token once any of the events is set (the user pressed stop,
    or the consumer went away)."""

    def __init__(self, *events: threading.Event):
        self.events = events

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        stop = any(event.is_set() for event in self.events)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class TransformersEngine(Engine):
    def __init__(self, model: str, device: str | None = None, dtype: str | None = None, loaded: LoadedModel | None = None,
                 vision_lora: str | None = None, quant: str | None = None, quant_vision: bool = True):
        self.loaded = loaded or load_model(model, device=device, dtype=dtype, vision_lora=vision_lora)
        self.model = self.loaded.model
        quantized = quantize_model(self.model, quant, vision=quant_vision) if quant else []
        self.processor = self.loaded.processor
        self.tokenizer = self.processor.tokenizer
        # One generation at a time: the model is shared, and a seed must hold for a whole request.
        self._lock = threading.Lock()
        # name -> PEFT's name for it (PEFT names become module names: no dots, no slashes)
        self._adapters: dict[str, str] = {}
        self._stacked: set[str] = set()  # names applied on top of the vision LoRA
        self._adapter_ids = itertools.count(1)
        self.info = transformers_info(model, self.loaded)
        if quant:  # "int8 weights on 57 linear layers (vision kept)": an int8 arm says what it quantized
            kept = "" if quant_vision else ", vision tower and projectors kept"
            self.info.details["quant"] = f"{quant} weights on {len(quantized)} linear layers{kept}"

    @property
    def vision_lora(self):
        return self.loaded.vision_lora

    @property
    def vision_mode(self) -> str:
        return self.loaded.vision_mode
    @classmethod
    def around(cls, model, processor) -> "TransformersEngine":
        """An engine over a model already in memory (a trainer's, mid-training), so its
        evaluations answer through the same prompts and batches as a loaded checkpoint's."""
        parameter = next(model.parameters())
        loaded = LoadedModel(model=model, processor=processor, source="(in memory)", device=parameter.device,
                             dtype=parameter.dtype)
        return cls("(in memory)", loaded=loaded)

    # ── prompts ──────────────────────────────────────────────────────────────────────────────

    def context_window(self) -> int:
        return int(self.model.config.text_config.max_position_embeddings)

    def render_prompt(self, messages: list[Message]) -> str:
        """The prompt text, with one ``<image>`` placeholder per image (before expansion)."""
        return self._template(to_template_messages(messages)[0])

    def _template(self, template_messages: list[dict]) -> str:
        return self.processor.apply_chat_template(template_messages, add_generation_prompt=True, tokenize=False)

    def prepare(self, request: list[Message] | PreparedRequest, max_new_tokens: int = 0) -> PreparedRequest:
        """The conversation validated, rendered and run through the processor once (a request
        already prepared is only checked), and checked to leave room for ``max_new_tokens``."""
        if not isinstance(request, PreparedRequest):
            messages = list(request)
            validate_conversation(messages, context_window=self.context_window())  # text cut before tokenizing
            template_messages, images = to_template_messages(messages)
            prompt = self._template(template_messages)
            inputs = self.processor(text=[prompt], images=images or None, return_tensors="pt").to(self.loaded.device)
            if "pixel_values" in inputs:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.loaded.dtype)
            request = PreparedRequest(messages, prompt, dict(inputs), int(inputs["input_ids"].shape[1]))
        if request.prompt_tokens + max_new_tokens > self.context_window():
            raise PromptTooLong(
                f"the prompt is too long: {request.prompt_tokens} tokens plus {max_new_tokens} new tokens exceed "
                f"the context window of {self.context_window()}"
            )
        return request

    def encoded(self, requests: list[PreparedRequest], batch_size: int = BATCH_SIZE) -> list[PreparedRequest]:
        """``requests`` (prepared) with their pictures already through the vision tower and the 8
        projectors (:mod:`g4v.model.encoding`), for requests that several passes will read (a
        dataset row's answers, scoring and norms): they then share one encoding. Pictures of one
        tile-stack shape are encoded ``batch_size`` requests at a time. A request without a
        picture comes back as it is, and so does every request when an adapter on the model
        reaches the vision side (then the features depend on the pass's adapter)."""
        made = list(requests)
        if not features_shared(self.model):
            return made
        shapes: dict[tuple, list[int]] = {}
        for position, request in enumerate(requests):
            if "pixel_values" in request.inputs:
                shapes.setdefault(tuple(request.inputs["pixel_values"].shape[1:]), []).append(position)
        for positions in shapes.values():
            for start in range(0, len(positions), batch_size):
                chunk = positions[start:start + batch_size]
                with self._lock, torch.inference_mode():
                    inputs = encoded_inputs(self.model, [requests[position].inputs for position in chunk])
                for position, encoded in zip(chunk, inputs):
                    made[position] = replace(requests[position], inputs=encoded)
        return made

    def prepare_inputs(self, messages: list[Message] | PreparedRequest, max_new_tokens: int = 0) -> dict:
        """Tokenised prompt with expanded image placeholders, pixel values and image sizes."""
        return self.prepare(messages, max_new_tokens).inputs

    def collate(self, requests: list[PreparedRequest]) -> dict:
        """One batch of prepared requests for ``model(...)`` / ``model.generate``: prompts padded on
        the left (masked out), pictures' tile stacks padded with zero tiles that the model drops
        (it counts each picture's tiles from its size); pictures given as encoded features
        (``mm_encoder_outputs``, :mod:`g4v.model.token_budget`) are joined level by level. A single request is its own inputs, so a
        batch of one computes exactly what an unbatched request does."""
        if len(requests) == 1:
            return requests[0].inputs
        width = max(request.prompt_tokens for request in requests)
        first = requests[0].inputs["input_ids"]
        input_ids = torch.full((len(requests), width), self.tokenizer.pad_token_id, dtype=first.dtype, device=first.device)
        attention_mask = torch.zeros_like(input_ids)
        for row, request in enumerate(requests):
            input_ids[row, width - request.prompt_tokens:] = request.inputs["input_ids"][0]
            attention_mask[row, width - request.prompt_tokens:] = request.inputs["attention_mask"][0]
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        pictures = [request.inputs for request in requests if "pixel_values" in request.inputs]
        if pictures:
            tiles = max(inputs["pixel_values"].shape[1] for inputs in pictures)
            batch["pixel_values"] = torch.cat([
                torch.nn.functional.pad(inputs["pixel_values"], (0, 0, 0, 0, 0, 0, 0, tiles - inputs["pixel_values"].shape[1]))
                for inputs in pictures])
            batch["image_sizes"] = torch.cat([inputs["image_sizes"] for inputs in pictures])
        encoded = [request.inputs["mm_encoder_outputs"]["image"] for request in requests
                   if "mm_encoder_outputs" in request.inputs]
        if encoded:  # pictures already encoded (a token budget's reduced features): the levels joined in order
            if pictures:
                raise G4VError("a batch cannot mix encoded pictures with pixel values")
            levels = encoded[0].deepstack_features
            batch["mm_encoder_outputs"] = {"image": type(encoded[0])(deepstack_features=[
                (layer, [piece for image in encoded for piece in image.deepstack_features[i][1]])
                for i, (layer, _) in enumerate(levels)])}
        return batch

    def _generate_kwargs(self, settings: SamplingSettings) -> dict:
        kwargs = {
            "max_new_tokens": settings.max_new_tokens,
            "do_sample": not settings.greedy,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
        }
        if settings.greedy:
            # Neutralise any sampling defaults in the checkpoint's generation_config.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=0)
        return kwargs

    def _seed(self, settings: SamplingSettings) -> None:
        if not settings.greedy:
            set_seed(settings.seed if settings.seed is not None else torch.seed() % 2**32)

    # ── generation ───────────────────────────────────────────────────────────────────────────

    def generate(self, messages: list[Message] | PreparedRequest, settings: SamplingSettings,
                 adapter: str | None = None) -> Generation:
        settings = settings.validated()
        self._check_adapter(adapter)
        request = self.prepare(messages, settings.max_new_tokens)
        return self._generate_together([request], settings, adapter)[0]

    def generate_batch(self, requests: list[list[Message] | PreparedRequest], settings: SamplingSettings,
                       adapter: str | None = None, batch_size: int = BATCH_SIZE) -> list[Generation]:
        """Answers to many requests, in their order, ``batch_size`` at a time as left-padded batches.
        Greedy answers equal :meth:`generate`'s one by one. Each batch holds requests that run with
        the same adapter (:meth:`active_adapter`): in native vision-LoRA mode the image requests go
        together with the LoRA on and the text-only ones without it, as they would one by one."""
        settings = settings.validated()
        self._check_adapter(adapter)
        check_value("batch size", batch_size, whole_number(1))
        prepared = [self.prepare(request, settings.max_new_tokens) for request in requests]
        groups: dict[str | tuple[str, ...] | None, list[int]] = {}
        for position, request in enumerate(prepared):
            active = self.active_adapter(adapter, request.has_image)  # a stacked adapter's is a list: a tuple as a key
            groups.setdefault(tuple(active) if isinstance(active, list) else active, []).append(position)
        answers: list[Generation | None] = [None] * len(prepared)
        for positions in groups.values():
            positions.sort(key=lambda position: prepared[position].prompt_tokens)  # like lengths pad least
            for start in range(0, len(positions), batch_size):
                chunk = positions[start:start + batch_size]
                for position, answer in zip(chunk, self._generate_together([prepared[p] for p in chunk], settings, adapter)):
                    answers[position] = answer
        return answers

    def _generate_together(self, requests: list[PreparedRequest], settings: SamplingSettings,
                           adapter: str | None) -> list[Generation]:
        """One ``model.generate`` over ``requests`` (all with the same active adapter)."""
        inputs = self.collate(requests)
        width = inputs["input_ids"].shape[1]
        with self._lock, self._adapter_enabled(adapter, requests[0].has_image), torch.inference_mode():
            self._seed(settings)
            output = self.model.generate(**inputs, **self._generate_kwargs(settings))
        return [self._finish(output[row, width:].tolist(), request.prompt_tokens, settings)
                for row, request in enumerate(requests)]

    def _finish(self, new_tokens: list[int], prompt_tokens: int, settings: SamplingSettings, cancelled=False) -> Generation:
        eos = self.tokenizer.eos_token_id
        finish_reason = "cancelled" if cancelled else "length"
        if eos in new_tokens:
            new_tokens = new_tokens[: new_tokens.index(eos)]
            finish_reason = "stop"
        text = self.tokenizer.decode(new_tokens, **_DECODE)
        return Generation(text=text, token_ids=new_tokens, finish_reason=finish_reason, prompt_tokens=prompt_tokens)

    def stream(self, messages: list[Message] | PreparedRequest, settings: SamplingSettings, cancel: threading.Event | None = None,
               adapter: str | None = None) -> Iterator[str]:
        # Validate and tokenise before the first yield, so bad input fails at the call site.
        settings = settings.validated()
        self._check_adapter(adapter)
        request = self.prepare(messages, settings.max_new_tokens)
        return self._stream(request, settings, cancel or threading.Event(), adapter)

    def _stream(
        self, request: PreparedRequest, settings: SamplingSettings, cancel: threading.Event, adapter: str | None = None
    ) -> Iterator[str]:
        inputs = request.inputs
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, timeout=None, **_DECODE)
        consumer_gone = threading.Event()
        failure: list[BaseException] = []

        def run():
            try:
                with torch.inference_mode():
                    self._seed(settings)
                    self.model.generate(
                        **inputs,
                        **self._generate_kwargs(settings),
                        streamer=streamer,
                        stopping_criteria=StoppingCriteriaList([_StopWhenSet(cancel, consumer_gone)]),
                    )
            except BaseException as err:  # surfaced in the consumer's thread below
                failure.append(err)
                streamer.end()

        # the request's own messages say whether it carries a picture, as for generate: a token
        # budget's request holds encoded features instead of pixel values
        with self._lock, self._adapter_enabled(adapter, request.has_image):
            worker = threading.Thread(target=run, name="g4v-hf-generate", daemon=True)
            worker.start()
            ended = False
            try:
                for piece in streamer:
                    if piece:
                        yield piece
                    if cancel.is_set():
                        break
                else:
                    ended = True
            finally:
                # Reached on normal end, on cancel and when the consumer closes the generator:
                # stop the worker and wait for it, so the next request finds the engine free.
                consumer_gone.set()
                if not ended:
                    for _ in streamer:  # drain up to the end signal that generate() sends
                        pass
                worker.join()
        if failure:
            raise failure[0]

    # ── adapters ─────────────────────────────────────────────────────────────────────────────

    def register_adapter(self, name: str, path: str, stacked: bool = False) -> None:
        """Load a checked LoRA folder into the shared model as ``name`` (replacing an adapter of
        that name); it stays disabled until a request asks for it. ``stacked``: applied on top of
        the vision LoRA (in merged mode that is the weights themselves)."""
        if stacked and self.vision_lora is not None and self.vision_mode == "off":
            raise G4VError(f"adapter {name} runs on top of the vision LoRA, which is off here (--vision-lora off)")
        with self._lock:
            self._stacked.discard(name)
            if name in self._adapters:
                self.model.delete_adapter(self._adapters.pop(name))
            peft_name = f"g4v_adapter_{next(self._adapter_ids)}"
            try:
                self.model.load_adapter(str(path), adapter_name=peft_name)
            except Exception as err:  # PEFT and file errors come in many types; the user needs one line
                if peft_name in (getattr(self.model, "peft_config", None) or {}):
                    self.model.delete_adapter(peft_name)  # undo a half-done load; the engine keeps serving
                detail = (str(err).strip() or type(err).__name__).splitlines()[0][:300]
                raise G4VError(f"could not load adapter {name}: {detail}") from None
            self._adapters[name] = peft_name
            if stacked and self.vision_mode == "native":
                self._stacked.add(name)
            self.model.disable_adapters()

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    @contextmanager
    def adapter_scope(self, adapter: str | None, image: bool = True):
        """Hold the engine with ``adapter`` enabled (``None``: the model an ``image`` request gets,
        the vision model in native mode) and yield the model, for callers that run their own
        forward passes (the token-level LoRA comparison)."""
        self._check_adapter(adapter)
        with self._lock, self._adapter_enabled(adapter, image):
            yield self.model

    def active_adapter(self, adapter: str | None, image: bool) -> str | list[str] | None:
        """The PEFT adapter(s) a request runs with, as vLLM picks them: the user's adapter when one
        is named (it replaces the vision LoRA; a stacked one comes with it), else the vision LoRA
        in native mode when the request has an image, else none (the base language model, or
        merged weights)."""
        if adapter == WITHOUT_VISION_LORA:
            return None
        if adapter in self._stacked:
            return [VISION_ADAPTER, self._adapters[adapter]]
        if adapter is not None:
            return self._adapters[adapter]
        if image and self.loaded.vision_mode == "native":
            return VISION_ADAPTER
        return None

    @contextmanager
    def _adapter_enabled(self, adapter: str | None, image: bool):
        """Enable only the request's adapter (:meth:`active_adapter`) for the duration (caller holds
        the lock), then disable all again.

        With adapters disabled PEFT's LoRA layers call the original linear layer and nothing else,
        so base outputs stay bit-identical to an engine that never loaded an adapter."""
        active = self.active_adapter(adapter, image)
        if active is None:
            yield
            return
        self.model.enable_adapters()
        self.model.set_adapter(active)
        try:
            yield
        finally:
            self.model.disable_adapters()

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter == WITHOUT_VISION_LORA:
            check_base_available(self.vision_lora, self.vision_mode)
        elif adapter is not None and adapter not in self.adapters():
            raise G4VError(f"unknown adapter {adapter!r}")
