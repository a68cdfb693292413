"""The layout checkpoint (base + vision LoRA in one folder) served by vLLM in process and by the
vLLM server g4v starts: text-only prompts get the base language model's tokens, image prompts the
vision model's, token for token against transformers (the trained merged checkpoint and a plain
copy of the base, independent of the vision LoRA code); merged mode gives native's tokens.

Each engine starts once, answers every prompt, and is closed before the next starts (memory)."""

import pytest
from tests.vision_lora_cases import IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, tokens

from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR

pytestmark = pytest.mark.vllm
LAYOUT = str(VLORA_MODEL_DIR)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from g4v.engines.hf import TransformersEngine

    trained = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    base = TransformersEngine(str(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base"))), device="cpu",
                              dtype="float32")
    refs = {"vision": tokens(trained, IMAGE_PROMPTS), "base_image": tokens(base, IMAGE_PROMPTS),
            "base_text": tokens(base, TEXT_PROMPTS)}
    assert refs["vision"] != refs["base_image"], "the vision LoRA must change image answers"
    return refs


def answers(engine) -> dict:
    return {"image": tokens(engine, IMAGE_PROMPTS), "text": tokens(engine, TEXT_PROMPTS),
            "line": engine.info.details.get("vision_lora")}


@pytest.fixture(scope="module")
def in_process():
    """Native and merged engines, one after the other."""
    from g4v.engines.vllm_engine import VLLMEngine

    results = {}
    for mode in ("native", "merged"):
        engine = VLLMEngine(LAYOUT, vision_lora=mode)
        try:
            results[mode] = {**answers(engine), "arguments": dict(engine.arguments)}
        finally:
            engine.close()
    return results


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from g4v.engines.remote import RemoteEngine
    from g4v.engines.vllm_server import VLLMServer

    log = tmp_path_factory.mktemp("server") / "vllm-server.log"
    with VLLMServer(LAYOUT, served_name="g4v-vlora", log_path=str(log)) as running:
        engine = RemoteEngine(running.base_url)
        try:
            return {**answers(engine), "command": running.command}
        finally:
            engine.close()


def test_in_process_native_applies_the_vision_lora_to_image_requests_only(in_process, references):
    native = in_process["native"]
    assert native["line"] == "vision LoRA: native, rank 16, 70 modules"
    assert native["arguments"]["enable_lora"] and native["arguments"]["max_lora_rank"] == 16
    assert native["image"] == references["vision"]
    assert native["text"] == references["base_text"]


def test_in_process_merged_gives_natives_tokens(in_process, references):
    assert in_process["merged"]["line"] == "vision LoRA: merged, rank 16, 70 modules"
    assert in_process["merged"]["image"] == in_process["native"]["image"] == references["vision"]


def test_the_server_applies_the_vision_lora_to_image_requests_only(server, references):
    command = server["command"]
    assert "--default-mm-loras" in command and "--enable-lora" in command
    assert command[command.index("--default-mm-loras") + 1] == '{"image": "%s"}' % LAYOUT
    assert server["image"] == references["vision"]
    assert server["text"] == references["base_text"]
