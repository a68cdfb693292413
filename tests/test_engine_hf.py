"""The transformers engine: prompts, images, determinism, streaming, sampling, cancel, errors."""

import threading

import pytest
import torch
from transformers.image_processing_utils import select_best_resolution

from g4v.conversation import Message, SamplingSettings
from g4v.errors import G4VError
from tests.conftest import make_image

GREEDY = SamplingSettings(max_new_tokens=12)


def ask(text, *images):
    return [Message("user", text, list(images))]


def test_greedy_output_is_deterministic(hf_engine):
    messages = ask("What colour is the shape?", make_image(200, 120))
    first = hf_engine.generate(messages, GREEDY)
    second = hf_engine.generate(messages, GREEDY)
    assert first.token_ids == second.token_ids and first.text == second.text
    assert first.finish_reason in ("stop", "length")
    assert len(first.token_ids) <= GREEDY.max_new_tokens


@pytest.mark.parametrize("with_image", [True, False], ids=["image", "text-only"])
def test_streamed_text_equals_generated_text(hf_engine, with_image):
    images = [make_image(160, 300, seed=3)] if with_image else []
    messages = ask("Describe the picture.", *images)
    settings = SamplingSettings(max_new_tokens=24)
    pieces = list(hf_engine.stream(messages, settings))
    assert len(pieces) > 1
    assert "".join(pieces) == hf_engine.generate(messages, settings).text


@pytest.mark.parametrize("width,height", [(128, 128), (500, 130), (130, 420), (300, 260)])
def test_image_tokens_equal_visual_features(hf_engine, width, height):
    """The processor's placeholder count equals the number of features the model packs."""
    messages = ask("What is this?", make_image(width, height))
    inputs = hf_engine.prepare_inputs(messages)
    placeholders = int((inputs["input_ids"] == hf_engine.model.config.image_token_index).sum())
    with torch.inference_mode():
        features = hf_engine.model.model.get_image_features(
            inputs["pixel_values"], inputs["image_sizes"], vision_feature_select_strategy="full"
        )
    assert len(features.deepstack_features) == 8  # 4 deepstack + 4 spatial levels
    for _, per_image in features.deepstack_features:
        assert per_image[0].shape[0] == placeholders


def test_the_size_cases_cover_three_grid_shapes(hf_engine):
    pinpoints = hf_engine.model.config.image_grid_pinpoints
    tile = hf_engine.model.config.vision_config.image_size
    sizes = [(128, 128), (130, 500), (420, 130), (260, 300)]  # (height, width) of the cases above
    grids = {tuple(v // tile for v in select_best_resolution(size, pinpoints)) for size in sizes}
    assert len(grids) >= 3


def test_several_images_in_one_turn(hf_engine):
    messages = ask("Compare the two.", make_image(128, 128, 1), make_image(400, 140, 2))
    inputs = hf_engine.prepare_inputs(messages)
    assert inputs["pixel_values"].shape[0] == 2
    result = hf_engine.generate(messages, GREEDY)
    assert result.prompt_tokens == inputs["input_ids"].shape[1]


def test_multi_turn_history_keeps_earlier_images(hf_engine):
    image = make_image(256, 128, 4)
    first = hf_engine.generate(ask("What is it?", image), GREEDY)
    conversation = [
        Message("user", "What is it?", [image]),
        Message("assistant", first.text),
        Message("user", "And its colour?"),
    ]
    prompt = hf_engine.render_prompt(conversation)
    assert prompt.count("<image>") == 1 and prompt.count("<|start_of_role|>user") == 2
    inputs = hf_engine.prepare_inputs(conversation)
    assert inputs["pixel_values"].shape[0] == 1
    assert hf_engine.generate(conversation, GREEDY).finish_reason in ("stop", "length")


def test_seeded_sampling_is_reproducible_and_seed_dependent(hf_engine):
    messages = ask("Tell me something.")
    sampled = lambda seed: hf_engine.generate(
        messages, SamplingSettings(max_new_tokens=16, temperature=1.5, top_p=0.95, seed=seed)
    ).token_ids
    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)
    assert sampled(7) != hf_engine.generate(messages, SamplingSettings(max_new_tokens=16)).token_ids


def test_cancel_stops_the_stream_and_frees_the_engine(hf_engine):
    messages = ask("Count to a thousand.")
    settings = SamplingSettings(max_new_tokens=200)
    full = hf_engine.generate(messages, settings)
    cancel = threading.Event()
    received = []
    for piece in hf_engine.stream(messages, settings, cancel=cancel):
        received.append(piece)
        cancel.set()
    assert 1 <= len(received) <= 2
    assert len("".join(received)) < len(full.text)
    # The engine is free again: a new request completes and gives the same answer as before.
    assert hf_engine.generate(messages, settings).token_ids == full.token_ids


def test_closing_the_stream_early_frees_the_engine(hf_engine):
    messages = ask("Hello")
    stream = hf_engine.stream(messages, SamplingSettings(max_new_tokens=200))
    next(stream)
    stream.close()
    done = threading.Event()
    threading.Thread(target=lambda: (hf_engine.generate(messages, GREEDY), done.set()), daemon=True).start()
    assert done.wait(60), "the engine stayed locked after the stream was closed"


@pytest.mark.parametrize(
    "settings, problem",
    [
        (SamplingSettings(max_new_tokens=0), "max_new_tokens"),
        (SamplingSettings(temperature=-1), "temperature"),
        (SamplingSettings(temperature=float("nan")), "temperature"),
        (SamplingSettings(top_p=0), "top_p"),
        (SamplingSettings(seed=-3), "seed"),
    ],
)
def test_bad_sampling_settings_are_refused(hf_engine, settings, problem):
    with pytest.raises(G4VError, match=problem):
        hf_engine.generate(ask("hi"), settings)


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([], "empty"),
        (ask("   "), "prompt is empty"),
        ([Message("user", "hi"), Message("assistant", "hello")], "last message"),
        ([Message("robot", "hi")], "unknown role"),
    ],
)
def test_bad_conversations_are_refused(hf_engine, messages, problem):
    with pytest.raises(G4VError, match=problem):
        list(hf_engine.stream(messages, GREEDY))


def test_prompt_longer_than_the_context_window_is_refused(hf_engine):
    too_long = "shape " * (hf_engine.context_window() + 10)
    with pytest.raises(G4VError, match="too long"):
        hf_engine.generate(ask(too_long), GREEDY)
