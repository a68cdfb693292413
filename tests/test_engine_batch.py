"""Prepared requests and the transformers engine's batches: a batch answers what each request
answers alone (greedy tokens identical), whatever the picture sizes, tilings, prompt lengths and
text-only requests in it; the vision LoRA in native mode still applies per request."""

import pytest
import torch

from g4v.conversation import MAX_NEW_TOKENS, Message, SamplingSettings
from g4v.engines.base import GenerationRequest, PreparedRequest
from g4v.errors import G4VError, PromptTooLong
from g4v.tiling import plan_tiling
from tests.conftest import make_image

GREEDY = SamplingSettings(max_new_tokens=12)

#: Pictures whose anyres plans differ (tile grids 1x1, 1x3, 3x1, 2x2...), prompts of different lengths.
MIXED = [
    [Message("user", "What colour is the shape?", [make_image(128, 128, seed=1)])],
    [Message("user", "Describe this wide picture in a few words, please, and name every shape you see.",
             [make_image(500, 130, seed=2)])],
    [Message("user", "How many?", [make_image(130, 420, seed=3)])],
    [Message("user", "Tell me a story about a small red square.")],  # text only
    [Message("user", "Where is it?", [make_image(300, 260, seed=4)])],
    [Message("user", "Hi.")],
]


def asks(requests, settings=GREEDY, adapter=None) -> list[GenerationRequest]:
    """``requests`` as one batch's typed requests, each with ``settings`` and ``adapter``."""
    return [GenerationRequest(request, settings, adapter) for request in requests]


def test_the_mixed_requests_tile_differently(hf_engine):
    """The batch below really mixes tilings and lengths (else it would prove little)."""
    config = hf_engine.model.config
    grids = {plan_tiling((m[0].images[0].height, m[0].images[0].width), config).grid for m in MIXED if m[0].images}
    lengths = {hf_engine.prepare(m).prompt_tokens for m in MIXED}
    assert len(grids) >= 3 and len(lengths) == len(MIXED)


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_a_batch_answers_what_each_request_answers_alone(hf_engine, batch_size):
    alone = [hf_engine.generate(messages, GREEDY) for messages in MIXED]
    together = hf_engine.generate_batch(asks(MIXED), in_flight=batch_size)
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [(g.text, g.finish_reason, g.prompt_tokens) for g in together] == \
        [(g.text, g.finish_reason, g.prompt_tokens) for g in alone]


@pytest.mark.slow
def test_a_batch_with_an_adapter_equals_the_adapter_alone(tmp_path):
    """On the trained checkpoint with its French adapter: the adapter is on for the whole batch."""
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import ASSETS_DIR, TRAINED_MODEL_DIR

    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    engine.register_adapter("french", str(ASSETS_DIR / "adapters" / "tiny-trained-french"))
    alone = [engine.generate(messages, GREEDY, adapter="french").token_ids for messages in MIXED]
    base = [engine.generate(messages, GREEDY).token_ids for messages in MIXED]
    assert alone != base  # the adapter changes answers here, so the comparison means something
    assert [g.token_ids for g in engine.generate_batch(asks(MIXED, adapter="french"))] == alone
    assert [g.token_ids for g in engine.generate_batch(asks(MIXED))] == base


@pytest.mark.slow
def test_native_vision_lora_applies_per_request_in_a_batch(tmp_path):
    """Native mode: image requests in a batch get the vision LoRA, text-only ones the base
    language model, exactly as one by one (references: the trained merged checkpoint for images,
    a bare copy of the base for text)."""
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR
    from tests.vision_lora_cases import GREEDY as VGREEDY, IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, tokens

    prompts = [IMAGE_PROMPTS[0], TEXT_PROMPTS[0], IMAGE_PROMPTS[1], TEXT_PROMPTS[1], IMAGE_PROMPTS[2]]
    trained = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    base = TransformersEngine(str(base_copy(VLORA_MODEL_DIR, tmp_path / "base")), device="cpu", dtype="float32")
    expected = [tokens(trained if p[0].images else base, [p])[0] for p in prompts]
    native = TransformersEngine(str(VLORA_MODEL_DIR), device="cpu", dtype="float32", vision_lora="native")
    assert [g.token_ids for g in native.generate_batch(asks(prompts, VGREEDY))] == expected


def test_a_prepared_request_is_reused_without_processing_again(hf_engine):
    messages = MIXED[1]
    request = hf_engine.prepare(messages)
    assert isinstance(request, PreparedRequest) and request.has_image
    assert request.prompt == hf_engine.render_prompt(messages)
    assert request.prompt_tokens == request.inputs["input_ids"].shape[1]
    with counted_processor(hf_engine) as calls:
        first = hf_engine.generate(request, GREEDY)
        streamed = "".join(hf_engine.stream(request, GREEDY))
        again = hf_engine.generate_batch(asks([request, request]))
        assert hf_engine.prepare(request) is request
    assert calls == []
    assert first.token_ids == hf_engine.generate(messages, GREEDY).token_ids
    assert streamed == first.text and [g.token_ids for g in again] == [first.token_ids] * 2


def test_a_batch_refuses_bad_input_in_one_line(hf_engine):
    """A bad batch setting is one line; a request refused on its own is its own row's one line
    (``Generation.error``) while the rest of the batch is answered."""
    with pytest.raises(G4VError, match="in_flight must be a whole number >= 1"):
        hf_engine.generate_batch(asks(MIXED), in_flight=0)
    # A prompt that fits the window but leaves less room than the longest answer a request may ask for.
    crowded = hf_engine.prepare([Message("user", "red " * (hf_engine.context_window() - MAX_NEW_TOKENS // 2))])
    assert crowded.prompt_tokens <= hf_engine.context_window() < crowded.prompt_tokens + MAX_NEW_TOKENS
    longest = SamplingSettings(max_new_tokens=MAX_NEW_TOKENS)
    refused, answered = hf_engine.generate_batch([GenerationRequest(crowded, longest), GenerationRequest(MIXED[0], GREEDY)])
    assert refused.finish_reason == "error" and refused.error == (
        f"the prompt ({crowded.prompt_tokens:,} tokens) and the {MAX_NEW_TOKENS:,} new tokens asked for are too long "
        f"for the context window of {hf_engine.context_window():,} tokens")
    assert answered.error is None and answered.token_ids == hf_engine.generate(MIXED[0], GREEDY).token_ids
    unknown = hf_engine.generate_batch(asks(MIXED[:2], adapter="nope"))
    assert [answer.error for answer in unknown] == ["unknown adapter 'nope'"] * 2
    assert hf_engine.generate_batch([]) == []


class counted_processor:
    """Count calls of the engine's real processor (which still runs), for "processed once" tests."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __enter__(self):
        processor, calls = self.engine.processor, self.calls
        real = type(processor).__call__

        def counting(*args, **kwargs):
            calls.append(kwargs.get("text"))
            return real(processor, *args, **kwargs)

        self.engine.processor = _Proxy(processor, counting)
        return calls

    def __exit__(self, *exc):
        self.engine.processor = self.engine.processor._wrapped
        return False


class _Proxy:
    """The processor with ``__call__`` counted; every other attribute is the processor's own."""

    def __init__(self, wrapped, call):
        self._wrapped, self._call = wrapped, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


def test_collate_pads_on_the_left_and_keeps_each_picture(hf_engine):
    requests = [hf_engine.prepare(m) for m in MIXED[:4]]
    batch = hf_engine.collate(requests)
    width = max(r.prompt_tokens for r in requests)
    for row, request in enumerate(requests):
        pad = width - request.prompt_tokens
        assert torch.equal(batch["input_ids"][row, pad:], request.inputs["input_ids"][0])
        assert batch["attention_mask"][row, :pad].sum() == 0
    pictures = [r.inputs for r in requests if r.has_image]
    assert batch["pixel_values"].shape[0] == len(pictures) == 3
    for i, inputs in enumerate(pictures):
        tiles = inputs["pixel_values"].shape[1]
        assert torch.equal(batch["pixel_values"][i, :tiles], inputs["pixel_values"][0])
        assert not batch["pixel_values"][i, tiles:].any()


def test_batched_scoring_equals_each_row_scored_alone(hf_engine):
    """Teacher-forced logits of many answers at once (different prompt and answer lengths, text-only
    rows among them) against :func:`answer_logits` row by row: a batch of one is the same pass,
    a larger batch differs only by float32 rounding."""
    from g4v.model.scoring import answer_logits, answer_logits_batch

    answers = [hf_engine.generate(messages, GREEDY) for messages in MIXED]
    token_lists = [g.token_ids[: 3 + i] + [hf_engine.tokenizer.eos_token_id] for i, g in enumerate(answers)]
    alone = [answer_logits(hf_engine, messages, tokens, None) for messages, tokens in zip(MIXED, token_lists)]
    one = answer_logits_batch(hf_engine, MIXED[:1], token_lists[:1], None)
    assert torch.equal(one[0], alone[0])
    together = answer_logits_batch(hf_engine, [hf_engine.prepare(m) for m in MIXED], token_lists, None, batch_size=4)
    for tokens, batched, reference in zip(token_lists, together, alone):
        assert batched.shape == reference.shape == (len(tokens), reference.shape[1])
        assert torch.allclose(batched, reference, atol=1e-4, rtol=0)
        assert torch.equal(batched.argmax(dim=1), reference.argmax(dim=1))


@pytest.mark.slow  # about 7 s on a quiet 2-core machine
def test_an_encoded_request_answers_and_scores_as_its_pixel_values(hf_engine):
    """Requests whose pictures went through the vision tower and projectors once
    (``engine.encoded``; those of one tile shape together) are the same prompts to the model:
    every greedy answer, alone and in a batch, equals the pixel-value request's, and teacher-forced
    logits agree to float32 rounding. Text-only requests come back as they are."""
    from g4v.model.scoring import answer_logits_batch

    twice = MIXED + [[Message("user", "And its colour?", [make_image(128, 128, seed=9)])],  # shapes shared
                     [Message("user", "Compare them.", [make_image(130, 420, seed=5), make_image(128, 128, seed=6)])]]
    prepared = [hf_engine.prepare(messages) for messages in twice]
    assert len({tuple(r.inputs["pixel_values"].shape[1:]) for r in prepared if r.has_image}) < sum(r.has_image for r in prepared)
    encoded = hf_engine.encoded(prepared)
    for request, made in zip(prepared, encoded):
        if request.has_image:
            assert "pixel_values" not in made.inputs and "mm_encoder_outputs" in made.inputs
            assert torch.equal(made.inputs["input_ids"], request.inputs["input_ids"])
            assert made.prompt_tokens == request.prompt_tokens
        else:
            assert made is request
    alone = [hf_engine.generate(request, GREEDY).token_ids for request in prepared]
    assert [hf_engine.generate(request, GREEDY).token_ids for request in encoded] == alone
    assert [g.token_ids for g in hf_engine.generate_batch(asks(encoded), in_flight=3)] == alone
    tokens = [ids[:4] + [hf_engine.tokenizer.eos_token_id] for ids in alone]
    for from_pixels, from_features in zip(answer_logits_batch(hf_engine, prepared, tokens, None),
                                          answer_logits_batch(hf_engine, encoded, tokens, None)):
        assert torch.allclose(from_features, from_pixels, atol=1e-4, rtol=0)


def test_an_adapter_on_the_vision_side_keeps_the_pixel_values(tmp_path):
    """When a loaded adapter reaches the vision tower, the features depend on the adapter a pass
    enables, so no request is encoded ahead; an adapter on the language model alone changes
    nothing to the features, so requests are."""
    from peft import LoraConfig, get_peft_model

    from g4v.engines.hf import TransformersEngine
    from g4v.loading import load_model
    from g4v.paths import BUNDLED_MODEL_DIR

    for name, targets in (("text", r".*language_model.*\.q_proj"), ("vision", r".*vision_tower.*\.q_proj")):
        model = load_model(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32").model
        get_peft_model(model, LoraConfig(r=2, lora_alpha=2, target_modules=targets, init_lora_weights=False)
                       ).save_pretrained(str(tmp_path / name))
    engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
    request = engine.prepare(MIXED[0])
    engine.register_adapter("text", str(tmp_path / "text"))
    assert "mm_encoder_outputs" in engine.encoded([request])[0].inputs
    engine.register_adapter("vision", str(tmp_path / "vision"))
    assert engine.encoded([request])[0] is request
