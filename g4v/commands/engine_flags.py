"""Flags for the backends that need settings: the remote server's address and key, and vLLM's own
settings under vLLM's own names (so its documentation applies). Used with ``--backend`` from
:mod:`g4v.commands.common` by every command that loads an engine."""

import argparse
import json
import os


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    remote = parser.add_argument_group("openai backend (an OpenAI-compatible server such as vllm serve)")
    remote.add_argument("--base-url", default=None, help="the server, e.g. http://127.0.0.1:8000/v1")
    remote.add_argument("--api-key", default=None, help="sent as a bearer token (default: $OPENAI_API_KEY)")
    vllm = parser.add_argument_group("vllm backend (passed to vLLM; see its engine arguments)")
    vllm.add_argument("--tensor-parallel-size", type=int, default=1)
    vllm.add_argument("--pipeline-parallel-size", type=int, default=1)
    vllm.add_argument("--max-model-len", type=int, default=None)
    vllm.add_argument("--max-num-batched-tokens", type=int, default=None)
    vllm.add_argument("--gpu-memory-utilization", type=float, default=None,
                      help="share of GPU memory (on the CPU build: of RAM) vLLM may take")
    vllm.add_argument("--max-lora-rank", type=int, default=None)
    vllm.add_argument("--max-loras", type=int, default=None, help="adapters vLLM keeps loaded at once")
    vllm.add_argument("--default-mm-loras", type=_json_object, default=None, metavar="JSON",
                      help='apply a LoRA to every image request, e.g. \'{"image": "PATH"}\'')
    vllm.add_argument("--enforce-eager", action="store_true", default=None, help="skip CUDA graphs and compilation")
    vllm.add_argument("--no-lora", dest="enable_lora", action="store_false",
                      help="start vLLM without LoRA slots (a little faster; adapters cannot be served)")


def engine_options(args: argparse.Namespace) -> dict:
    """``create_engine`` keywords from these flags and ``--device``/``--dtype``.

    Commands print answers and tables on stdout, so vLLM's logging (stdout by default, configured
    when vLLM is first imported, which happens later) is sent to stderr unless the user chose."""
    from g4v.engines.vllm_engine import VLLMSettings

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

    dtype = getattr(args, "dtype", "auto")
    vllm = VLLMSettings(
        dtype=None if dtype == "auto" else dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        enable_lora=args.enable_lora,
        max_lora_rank=args.max_lora_rank,
        max_loras=args.max_loras,
        default_mm_loras=args.default_mm_loras,
    )
    return {"device": getattr(args, "device", None), "dtype": dtype, "vllm": vllm,
            "base_url": args.base_url, "api_key": args.api_key}


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value
