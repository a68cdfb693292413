"""The layout checkpoint (base + vision LoRA in one folder) served by vLLM in process, by the
vLLM server g4v starts and by a server started with docs/real-model.md's recipe (g4v's openai engine): text-only
prompts get the base language model's tokens, image prompts the vision model's, token for token
against transformers (the weights merged by hand from the files and a plain copy of the base,
independent of the vision LoRA code); merged mode gives native's tokens and logprobs. A start that
fails in vLLM's engine core is one line naming the core's own exception.

The in-process engines are the session's (conftest.layout_engine, shared with the adapter and
Evaluate tests); each server starts once, answers every prompt, and stops before the next starts."""

import re
import shlex
import shutil

import pytest
from tests.vision_lora_cases import GREEDY, IMAGE_PROMPTS, TEXT_PROMPTS, base_copy, hand_merged, tokens

from g4v.errors import G4VError
from g4v.paths import REPO_ROOT, VLORA_MODEL_DIR

pytestmark = pytest.mark.vllm
LAYOUT = str(VLORA_MODEL_DIR)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    from g4v.engines.hf import TransformersEngine

    vision = TransformersEngine(str(hand_merged(VLORA_MODEL_DIR, tmp_path_factory.mktemp("vision"))), device="cpu",
                                dtype="float32")
    base = TransformersEngine(str(base_copy(VLORA_MODEL_DIR, tmp_path_factory.mktemp("base"))), device="cpu",
                              dtype="float32")
    refs = {"vision": tokens(vision, IMAGE_PROMPTS), "base_image": tokens(base, IMAGE_PROMPTS),
            "base_text": tokens(base, TEXT_PROMPTS)}
    assert refs["vision"] != refs["base_image"], "the vision LoRA must change image answers"
    return refs


def answers(engine) -> dict:
    return {"image": tokens(engine, IMAGE_PROMPTS), "text": tokens(engine, TEXT_PROMPTS),
            "line": engine.info.details.get("vision_lora")}


#: Top tokens whose logprobs are compared, per generated token.
TOP_K = 5


def top_logprobs(engine, messages) -> list[dict[int, float]]:
    """vLLM's own logprobs of the top tokens at each greedy step, for the LoRA this engine gives
    the request (the vision LoRA for an image prompt): vLLM's ``logprobs`` sampling option, sent
    through the engine's loop as the engine sends its requests."""
    from vllm import SamplingParams

    prompt = engine.build_prompt(messages)
    params = SamplingParams(temperature=0.0, max_tokens=GREEDY.max_new_tokens, logprobs=TOP_K)
    lora = engine._lora_request(None, "multi_modal_data" in prompt)

    async def final():
        last = None
        async for output in engine._llm.generate(prompt, params, "g4v-test-logprobs", lora_request=lora):
            last = output
        return last.outputs[0].logprobs

    return [{token: entry.logprob for token, entry in step.items()} for step in engine._loop.run(final())]


@pytest.fixture(scope="module")
def in_process(layout_engine):
    """What the native and the merged engines answer (the session's, conftest.layout_engine)."""
    def answered(engine) -> dict:
        return {**answers(engine), "arguments": dict(engine.arguments),
                "logprobs": [top_logprobs(engine, p) for p in IMAGE_PROMPTS[:4]]}

    return {mode: answered(layout_engine(mode)) for mode in ("native", "merged")}


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


def test_in_process_merged_gives_natives_tokens_and_logprobs(in_process, references):
    """Merged (W0 + B @ A once, float32) and native (the LoRA's two matmuls per layer) differ only
    by float32 rounding; through 10 layers that stays far below 1e-3 in a logprob, while the
    gap between the top two tokens of these greedy steps is tenths to units."""
    assert in_process["merged"]["line"] == "vision LoRA: merged, rank 16, 70 modules"
    assert in_process["merged"]["image"] == in_process["native"]["image"] == references["vision"]
    for native_steps, merged_steps in zip(in_process["native"]["logprobs"], in_process["merged"]["logprobs"],
                                          strict=True):
        assert len(native_steps) == len(merged_steps) > 0
        for native, merged in zip(native_steps, merged_steps):
            best = sorted(native, key=native.get, reverse=True)[:2]
            assert native[best[0]] - native[best[1]] > 1e-2  # a clear greedy choice: a tie would not test much
            for token in best:
                assert abs(merged[token] - native[token]) < 1e-3, (token, merged[token], native[token])


def test_the_server_applies_the_vision_lora_to_image_requests_only(server, references):
    command = server["command"]
    assert "--default-mm-loras" in command and "--enable-lora" in command
    assert command[command.index("--default-mm-loras") + 1] == '{"image": "%s"}' % LAYOUT
    assert server["image"] == references["vision"]
    assert server["text"] == references["base_text"]


def documented_recipe() -> list[str]:
    """docs/real-model.md's command for a vLLM server of your own that applies the vision LoRA (the
    block with ``--default-mm-loras`` that serves ``BASE_FOLDER``), as arguments."""
    text = (REPO_ROOT / "docs" / "real-model.md").read_text()
    block = re.search(r"^ +(python -m vllm\.entrypoints\.openai\.api_server --model BASE_FOLDER[^\n]*\\\n[^\n]*)$",
                      text, re.MULTILINE)
    assert block, "docs/real-model.md no longer has the server recipe for the layout"
    return shlex.split(block.group(1).replace("\\\n", " "))


@pytest.fixture(scope="module")
def recipe_server(tmp_path_factory):
    """docs/real-model.md's recipe, run as written: BASE_FOLDER a folder of the base files alone, MODEL_FOLDER
    the layout checkpoint, the port a free one; plus what the CPU build needs (float32, eager, a
    small context), which the recipe leaves to the user. g4v's openai engine asks it."""
    import sys

    from g4v.engines.remote import RemoteEngine
    from g4v.engines.vllm_server import VLLMServer

    folder = tmp_path_factory.mktemp("recipe")
    base = base_copy(VLORA_MODEL_DIR, folder / "base")
    command = [part.replace("BASE_FOLDER", str(base)).replace("MODEL_FOLDER", LAYOUT) for part in documented_recipe()]
    assert command[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    server = VLLMServer(str(base), log_path=str(folder / "vllm-server.log"))
    command[0] = sys.executable
    command[command.index("--port") + 1] = str(server.port)
    server.command = command + ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    with server:
        engine = RemoteEngine(server.base_url)
        try:
            return {**answers(engine), "command": command}
        finally:
            engine.close()


def test_openai_against_the_documented_recipe_gets_the_vision_model_and_the_base(recipe_server, references):
    assert "--default-mm-loras" in recipe_server["command"] and "--enable-lora" in recipe_server["command"]
    assert recipe_server["image"] == references["vision"]
    assert recipe_server["text"] == references["base_text"]


def test_a_failed_start_names_the_engine_cores_cause(tmp_path):
    """The issue's case: a folder whose adapter file vLLM reads as one more weight shard (here
    without the adapter config, so nothing tells g4v it is a LoRA). vLLM's own exception says
    "See root cause above"; g4v's one line is the core's exception instead."""
    from g4v.engines.vllm_engine import VLLMEngine

    folder = base_copy(VLORA_MODEL_DIR, tmp_path / "stray-adapter")
    shutil.copyfile(VLORA_MODEL_DIR / "adapter_model.safetensors", folder / "adapter_model.safetensors")
    with pytest.raises(G4VError) as refused:
        VLLMEngine(str(folder))
    message = str(refused.value)
    assert message.startswith("vLLM could not start: ") and "\n" not in message
    assert "base_model" in message and "root cause above" not in message, message
