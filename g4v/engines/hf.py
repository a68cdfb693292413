"""The transformers backend: transformers' own Granite 4 Vision classes, on CPU or GPU.

It is also the reference the other backends are checked against, and the one the inspectors
instrument (:class:`~g4v.engines.capabilities.Instrumentable`, :class:`~g4v.engines.capabilities.Scorable`):
it keeps the loaded model and processor reachable (``engine.loaded``).

Two ways to answer, one model:

* chats (``stream``, ``generate``) go through the decode loop (:mod:`g4v.engines.decode_loop`):
  several visitors decode together, each at its own pace, over a KV cache of slots, the step
  compiled on a GPU; ``DecodeSettings(decode_loop=False)`` answers one request at a time through
  transformers' ``generate`` instead (the reference path);
* batches (``generate_batch``: dataset runs) go through ``generate`` as left-padded batches, the
  prompts' pictures prefilled together; greedy answers equal one-by-one answers.

Adapters and the vision LoRA: :mod:`g4v.engines.hf_adapters`.
"""

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, set_seed
from transformers.generation.streamers import BaseStreamer

from g4v.conversation import Message, SamplingSettings, to_template_messages, validate_conversation
from g4v.engines.base import (Engine, Generation, GenerationRequest, OnDone, Piece, PreparedRequest,
                              fold, transformers_info)
from g4v.engines.capabilities import Instrumentable, Scorable
from g4v.engines.decode_loop import DecodeLoop, supported
from g4v.engines.decode_settings import DecodeSettings
from g4v.engines.detokenize import DECODE, IncrementalText
from g4v.engines.hf_adapters import AdapterSwitch
from g4v.errors import G4VError, PromptTooLong, check_value, whole_number
from g4v.loading import LoadedModel, load_model
from g4v.model import BATCH_SIZE
from g4v.model.encoding import encoded_inputs, features_shared
from g4v.model.precision import quantize_model


class TransformersEngine(AdapterSwitch, Engine, Instrumentable, Scorable):
    in_flight = BATCH_SIZE

    def __init__(self, model: str, device: str | None = None, dtype: str | None = None, loaded: LoadedModel | None = None,
                 vision_lora: str | None = None, quant: str | None = None, quant_vision: bool = True,
                 decode: DecodeSettings | None = None, inline: bool = False):
        """``decode``: how chats are decoded (:class:`DecodeSettings`); ``inline``: the decode loop
        runs in each request's own thread, not a thread of its own (ZeroGPU, whose GPU calls run
        in processes of their own)."""
        self.loaded = loaded or load_model(model, device=device, dtype=dtype, vision_lora=vision_lora)
        self.model = self.loaded.model
        quantized = quantize_model(self.model, quant, vision=quant_vision) if quant else []
        self.processor = self.loaded.processor
        self.tokenizer = self.processor.tokenizer
        self.device = self.loaded.device
        self.decode = decode or DecodeSettings()
        self._init_adapters()
        self.info = transformers_info(model, self.loaded)
        if quant:  # "int8 weights on 57 linear layers (vision kept)": an int8 arm says what it quantized
            kept = "" if quant_vision else ", vision tower and projectors kept"
            self.info.details["quant"] = f"{quant} weights on {len(quantized)} linear layers{kept}"
        self._loop, self._inline = None, inline
        if self.decode.decode_loop and supported(self.model):
            self._loop = DecodeLoop(self, self.decode, self.context_window(), background=not inline,
                                    text_config=self.model.config.text_config, dtype=self.loaded.dtype)

    @property
    def concurrent_streams(self) -> int:
        """The decode loop's slots; one without it, or when each request drives it (inline)."""
        return self.decode.max_batch if self._loop is not None and not self._inline else 1

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

    def model_config(self):
        return self.model.config

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
                f"the prompt ({request.prompt_tokens:,} tokens) and the {max_new_tokens:,} new tokens asked for are too "
                f"long for the context window of {self.context_window():,} tokens"
            )
        return request

    def prepare_inputs(self, messages: list[Message] | PreparedRequest, max_new_tokens: int = 0) -> dict:
        """Tokenised prompt with expanded image placeholders, pixel values and image sizes."""
        return self.prepare(messages, max_new_tokens).inputs

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
                with self._holding_active(()), torch.inference_mode():
                    inputs = encoded_inputs(self.model, [requests[position].inputs for position in chunk])
                for position, encoded in zip(chunk, inputs):
                    made[position] = replace(requests[position], inputs=encoded)
        return made

    def collate(self, requests: list[PreparedRequest]) -> dict:
        """One batch of prepared requests for ``model(...)`` / ``model.generate``: prompts padded on
        the left (masked out), pictures' tile stacks padded with zero tiles that the model drops
        (it counts each picture's tiles from its size); pictures given as encoded features
        (``mm_encoder_outputs``, :mod:`g4v.model.token_budget`) are joined level by level. A single
        request is its own inputs, so a batch of one computes exactly what an unbatched request does."""
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

    # ── chats: the decode loop, or generate one request at a time ────────────────────────────

    def stream_outputs(self, messages: list[Message] | PreparedRequest, settings: SamplingSettings,
                       cancel: threading.Event | None = None, adapter: str | None = None) -> Iterator[Piece]:
        settings = settings.validated()
        self._check_adapter(adapter)
        request = self.prepare(messages, settings.max_new_tokens)  # bad input fails here, at the call site
        if self._loop is not None:
            return self._loop.submit(request, settings, self.variant(adapter, request.has_image), cancel)
        return self._generate_streaming(request, settings, cancel or threading.Event(), adapter)

    def generate(self, messages: list[Message] | PreparedRequest, settings: SamplingSettings,
                 adapter: str | None = None) -> Generation:
        if self._loop is not None:
            return fold(self.stream_outputs(messages, settings, adapter=adapter))
        settings = settings.validated()
        self._check_adapter(adapter)
        request = self.prepare(messages, settings.max_new_tokens)
        return self._generate_together([request], settings, adapter)[0]

    def _generate_streaming(self, request: PreparedRequest, settings: SamplingSettings, cancel: threading.Event,
                            adapter: str | None) -> Iterator[Piece]:
        """The reference path: ``generate`` in a worker thread handing over token ids, which this
        (the consumer's) thread turns into text."""
        tokens = _TokenQueue()
        consumer_gone = threading.Event()
        failure: list[BaseException] = []

        def run():
            try:
                with torch.inference_mode():
                    self._seed(settings)
                    self.model.generate(**request.inputs, **self._generate_kwargs(settings), streamer=tokens,
                                        stopping_criteria=StoppingCriteriaList([_StopWhenSet(cancel, consumer_gone)]))
            except BaseException as err:  # surfaced in the consumer's thread below
                failure.append(err)
            finally:
                tokens.end()

        text, produced = IncrementalText(self.tokenizer), []
        with self._holding_active(self.active_adapter(adapter, request.has_image)):
            worker = threading.Thread(target=run, name="g4v-hf-generate", daemon=True)
            worker.start()
            try:
                for ids in tokens:
                    ids = ids[:ids.index(self.tokenizer.eos_token_id)] if self.tokenizer.eos_token_id in ids else ids
                    produced.extend(ids)
                    if ids:
                        yield Piece(text.add(ids), ids, prompt_tokens=request.prompt_tokens)
            finally:
                # Reached on normal end, on cancel and when the consumer closes the generator:
                # stop the worker and wait for it, so the next request finds the engine free.
                consumer_gone.set()
                for _ in tokens:  # drain up to the end signal
                    pass
                worker.join()
        if failure:
            raise failure[0]
        finish = self._finish(produced, request.prompt_tokens, settings, cancelled=cancel.is_set()).finish_reason
        yield Piece(text.finish(), [], finish, request.prompt_tokens)

    # ── batches: generate over left-padded batches ───────────────────────────────────────────

    def generate_batch(self, requests: Sequence[GenerationRequest], *, in_flight: int | None = None,
                       cancel: threading.Event | None = None, on_done: OnDone | None = None) -> list[Generation | None]:
        """Answers to ``requests``, in their order, ``in_flight`` at a time as left-padded batches
        (default :data:`BATCH_SIZE`). Greedy answers equal :meth:`generate`'s one by one. Each
        batch holds requests that run with the same adapters and settings (:meth:`active_adapter`):
        in native vision-LoRA mode the image requests go together with the LoRA on and the
        text-only ones without it, as they would one by one. A cancel stops between batches."""
        size = self.in_flight if in_flight is None else in_flight
        check_value("in_flight", size, whole_number(1))
        cancel = cancel or threading.Event()
        answers: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, PreparedRequest]]] = {}
        for position, ask in enumerate(requests):
            try:
                settings = ask.settings.validated()
                self._check_adapter(ask.adapter)
                prepared = self.prepare(ask.messages, settings.max_new_tokens)
            except G4VError as err:
                answers[position] = Generation.failed(str(err))
                if on_done is not None:
                    on_done(position, answers[position])
                continue
            key = (self.active_adapter(ask.adapter, prepared.has_image), ask.adapter, settings)
            groups.setdefault(key, []).append((position, prepared))
        for (_, adapter, settings), members in groups.items():
            members.sort(key=lambda member: member[1].prompt_tokens)  # like lengths pad least
            for start in range(0, len(members), size):
                if cancel.is_set():
                    return answers
                chunk = members[start:start + size]
                try:
                    made = self._generate_together([prepared for _, prepared in chunk], settings, adapter)
                except G4VError as err:  # the batch failed as a whole: each of its rows says why
                    made = [Generation.failed(str(err)) for _ in chunk]
                for (position, _), answer in zip(chunk, made):
                    answers[position] = answer
                    if on_done is not None:
                        on_done(position, answer)
        return answers

    def _generate_together(self, requests: list[PreparedRequest], settings: SamplingSettings,
                           adapter: str | None) -> list[Generation]:
        """One ``model.generate`` over ``requests`` (all with the same active adapter)."""
        inputs = self.collate(requests)
        width = inputs["input_ids"].shape[1]
        with self._holding_active(self.active_adapter(adapter, requests[0].has_image)), torch.inference_mode():
            self._seed(settings)
            output = self.model.generate(**inputs, **self._generate_kwargs(settings))
        return [self._finish(output[row, width:].tolist(), request.prompt_tokens, settings)
                for row, request in enumerate(requests)]

    def _generate_kwargs(self, settings: SamplingSettings) -> dict:
        kwargs = {
            "max_new_tokens": settings.max_new_tokens,
            "min_new_tokens": settings.min_new_tokens or None,
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

    def _finish(self, new_tokens: list[int], prompt_tokens: int, settings: SamplingSettings, cancelled=False) -> Generation:
        eos = self.tokenizer.eos_token_id
        finish_reason = "cancelled" if cancelled else "length"
        if eos in new_tokens:
            new_tokens = new_tokens[: new_tokens.index(eos)]
            finish_reason = "stop"
        text = self.tokenizer.decode(new_tokens, **DECODE)
        return Generation(text=text, token_ids=new_tokens, finish_reason=finish_reason, prompt_tokens=prompt_tokens)

    # ── scores ───────────────────────────────────────────────────────────────────────────────

    def answer_logits(self, requests: list, token_lists: list[list[int]], adapter: str | None = None,
                      batch_size: int = BATCH_SIZE) -> list:
        from g4v.model.scoring import answer_logits_batch

        return answer_logits_batch(self, requests, token_lists, adapter, batch_size)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


class _StopWhenSet(StoppingCriteria):
    """Ends ``generate`` at the next token once any of the events is set (the user pressed stop,
    or the consumer went away)."""

    def __init__(self, *events: threading.Event):
        self.events = events

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        stop = any(event.is_set() for event in self.events)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class _TokenQueue(BaseStreamer):
    """``generate``'s streamer that only hands over token ids (the prompt's first), iterated by the
    consumer until :meth:`end`."""

    _END = object()

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._prompt_seen = False
        self._ended = False  # the end was read: iterating again yields nothing

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate hands the prompt over first
            self._prompt_seen = True
            return
        self._queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        self._queue.put(self._END)

    def __iter__(self):
        while not self._ended:
            item = self._queue.get()
            if item is self._END:
                self._ended = True
                return
            yield item
