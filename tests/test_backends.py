"""Backend choice and the remote engine's failure modes: no vLLM or server needed (the parity and
streaming tests against real vLLM live in tests/vllm and run in the vLLM environment)."""

import socket

import pytest

from g4v.conversation import SamplingSettings
from g4v.engines import BACKENDS, choose_backend, describe_choice, gpu_present, vllm_installed
from g4v.errors import G4VError
from tests.cli import run_cli


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_backends_are_listed():
    assert set(BACKENDS) == {"auto", "hf", "vllm", "openai"}


def test_auto_takes_vllm_only_with_vllm_and_a_gpu():
    expected = "vllm" if vllm_installed() and gpu_present() else "hf"
    assert choose_backend("auto") == expected
    assert describe_choice("auto", expected).startswith(f"backend: {expected} (auto: ")


def test_unknown_backend_is_a_user_error():
    with pytest.raises(G4VError, match="unknown backend"):
        choose_backend("tgi")


def test_remote_base_url_is_normalised_and_checked():
    from g4v.engines.remote import normalise_base_url

    assert normalise_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalise_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    with pytest.raises(G4VError, match="must start with http"):
        normalise_base_url("127.0.0.1:8000")


def test_remote_sampling_fields():
    from g4v.engines.remote import sampling_body

    assert sampling_body(SamplingSettings(max_new_tokens=5)) == {"max_tokens": 5, "temperature": 0.0}
    sampled = sampling_body(SamplingSettings(max_new_tokens=5, temperature=0.7, top_p=0.9, seed=3))
    assert sampled == {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "seed": 3}


def test_remote_engine_with_no_server_is_one_line_error():
    from g4v.engines.remote import RemoteEngine

    with pytest.raises(G4VError, match="cannot reach the server") as caught:
        RemoteEngine(f"http://127.0.0.1:{closed_port()}")
    assert "\n" not in str(caught.value)


def test_chat_cli_with_no_server_prints_one_line():
    result = run_cli("chat", "--backend", "openai", "--base-url", f"http://127.0.0.1:{closed_port()}", "hello")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("error: cannot reach the server")


def test_openai_backend_needs_a_base_url():
    from g4v.engines import create_engine

    with pytest.raises(G4VError, match="--base-url"):
        create_engine("openai")


def test_vllm_server_command_is_local_and_passes_settings_through():
    from g4v.engines.vllm_settings import VLLMSettings
    from g4v.engines.vllm_server import server_command

    command = server_command("MODEL", 8123, VLLMSettings(max_num_batched_tokens=64, max_images=2), "base",
                             {"a": "/adapters/a"})
    joined = " ".join(command)
    assert "--host 127.0.0.1 --port 8123" in joined
    assert "--max-num-batched-tokens 64" in joined
    assert '--limit-mm-per-prompt {"image": 2}' in joined
    assert "--enable-lora" in joined and "--lora-modules a=/adapters/a" in joined
    assert "trust-remote-code" not in joined


def test_bench_rejects_backends_it_cannot_run():
    from g4v.engines.bench import check_backends

    with pytest.raises(G4VError, match="openai backend needs --base-url"):
        check_backends(["hf", "openai"], base_url=None, serve=False)
    with pytest.raises(G4VError, match="unknown backend"):
        check_backends(["tgi"], base_url=None, serve=False)


def test_cpu_vllm_keeps_the_last_lora_slot_empty():
    """vLLM CPU's LoRA kernels read the last slot for base-model tokens, so on the CPU the engine
    holds one adapter fewer than it has slots (and the server gets a spare slot)."""
    from g4v.engines.vllm_settings import VLLMSettings, adapter_capacity, engine_arguments
    from g4v.engines.vllm_server import server_command

    if gpu_present():
        pytest.skip("the CPU rule only")
    arguments = engine_arguments("MODEL", VLLMSettings(max_loras=2))
    assert adapter_capacity(arguments) == 1
    command = server_command("MODEL", 8123, VLLMSettings(max_loras=2), "base", {"a": "/a", "b": "/b"})
    assert command[command.index("--max-loras") + 1] == "3"


# ── vLLM flags: one per VLLMSettings field (g4v.settings.flags) ─────────────────────────

#: The flags ``python -m g4v chat --help`` listed when the vLLM flags were written out by hand
#: (before they were derived from VLLMSettings): all must stay.
CHAT_FLAGS_BEFORE = (
    "--adapter --adapters-dir --api-key --backend --base-url --default-mm-loras --device --dtype --enforce-eager "
    "--gpu-memory-utilization --help --image --max-lora-rank --max-loras --max-model-len --max-new-tokens "
    "--max-num-batched-tokens --model --no-lora --pipeline-parallel-size --seed --temperature "
    "--tensor-parallel-size --top-p").split()
#: VLLMSettings fields with no flag of their own (``--dtype`` is shared with the hf backend).
NOT_VLLM_FLAGS = {"dtype", "max_images"}


def _chat_parser():
    from g4v.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices["chat"]


def test_chat_help_still_lists_every_flag():
    import re

    listed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _chat_parser().format_help()))
    assert set(CHAT_FLAGS_BEFORE) <= listed, sorted(set(CHAT_FLAGS_BEFORE) - listed)


def test_vllm_flags_are_the_settings_fields():
    """Each VLLMSettings field but dtype and max_images has a flag named after it (enable_lora: its
    --no-lora switch), whose default is the field's: checked field by field, independently of the
    helper that derives them."""
    import dataclasses

    from g4v.engines.vllm_settings import VLLMSettings

    by_dest = {action.dest: action for action in _chat_parser()._actions}
    for field in dataclasses.fields(VLLMSettings):
        if field.name in NOT_VLLM_FLAGS:
            continue
        action = by_dest[field.name]
        flag = "--no-lora" if field.name == "enable_lora" else "--" + field.name.replace("_", "-")
        assert action.option_strings[0] == flag
        assert action.default == field.default, field.name


def test_vllm_settings_come_from_the_flags_given():
    from g4v.commands.engine_flags import engine_options
    from g4v.engines.vllm_settings import VLLMSettings

    parser = _chat_parser()
    assert engine_options(parser.parse_args(["hi"]))["vllm"] == VLLMSettings()
    args = parser.parse_args(["--dtype", "bfloat16", "--no-lora", "--enforce-eager", "--max-model-len", "512",
                              "--gpu-memory-utilization", "0.5", "--default-mm-loras", '{"image": "/a"}', "hi"])
    assert engine_options(args)["vllm"] == VLLMSettings(dtype="bfloat16", enable_lora=False, enforce_eager=True,
                                                        max_model_len=512, gpu_memory_utilization=0.5,
                                                        default_mm_loras={"image": "/a"})


def test_default_mm_loras_must_be_a_json_object():
    result = run_cli("chat", "--default-mm-loras", "[1]", "hi")
    assert result.returncode == 2
    assert "expected a JSON object" in result.stderr and len(result.stderr.strip().splitlines()) == 1
