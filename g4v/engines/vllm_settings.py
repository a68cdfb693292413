"""How vLLM is configured: the settings users tune, and the engine arguments made from them for
the in-process engine (:mod:`g4v.engines.vllm_engine`), the OpenAI-compatible server
(:mod:`g4v.engines.vllm_server`) and the port probe (:mod:`g4v.port.probe`). Nothing here imports
vLLM: the commands' flags are derived from :class:`VLLMSettings` in the main environment too.

On the CPU, vLLM reserves its KV cache from RAM (``VLLM_CPU_KVCACHE_SPACE``, GiB, read at start):
:func:`cpu_defaults` sets a small default before the engine is built, unless set.
"""

import os
from dataclasses import dataclass, field

from g4v.checkpoint.vision_lora import lora_rank_slot
from g4v.engines.base import gpu_present
from g4v.errors import G4VError, check_fields, share, whole_number

#: KV cache (GiB) reserved on the CPU when ``VLLM_CPU_KVCACHE_SPACE`` is unset: enough for a few
#: chats on the bundled checkpoint, small enough for a laptop (vLLM's own default is far larger).
_CPU_KV_CACHE_GIB = "1"
#: LoRA slots on the CPU when the user sets none: three adapters plus the slot kept empty (below).
_CPU_MAX_LORAS = 4
#: ``max_lora_rank`` when neither the user nor a vision LoRA asks for more (vLLM's own default).
_DEFAULT_MAX_LORA_RANK = 16

_count = whole_number(1, optional=True)  # None: vLLM's own default


@dataclass
class VLLMSettings:
    """The settings users tune, passed through to vLLM's engine arguments (``None``: vLLM's or
    :func:`cpu_defaults`' choice). Names match vLLM's, so its documentation applies.

    The one place for them: the commands' flags (:mod:`g4v.commands.engine_flags`, help from each
    field's metadata) and the server's command line (:mod:`g4v.engines.vllm_server`) are derived
    from these fields."""

    dtype: str | None = None
    tensor_parallel_size: int = field(default=1, metadata={"check": _count, "help": "GPUs each layer is split over"})
    pipeline_parallel_size: int = field(default=1, metadata={"check": _count, "help": "GPUs the layers are staged on"})
    max_model_len: int | None = field(default=None, metadata={
        "check": _count, "help": "context length in tokens, prompt and answer (default: the model's; 4096 on the CPU)"})
    max_num_batched_tokens: int | None = field(default=None, metadata={
        "check": _count, "help": "tokens scheduled in one engine step (default: vLLM's)"})
    gpu_memory_utilization: float | None = field(
        default=None, metadata={"check": share(up_to_one=True, optional=True), "help": "share of GPU memory (on the CPU build: of RAM) vLLM may take"})
    enforce_eager: bool | None = field(default=None, metadata={"help": "skip CUDA graphs and compilation"})
    #: LoRA slots are reserved at start-up, so adapters can only be served when this is on.
    enable_lora: bool = field(default=True, metadata={
        "flag": "--no-lora", "help": "start vLLM without LoRA slots (a little faster; adapters cannot be served)"})
    max_lora_rank: int | None = field(default=None, metadata={
        "check": _count, "help": "largest LoRA rank vLLM reserves room for (default: vLLM's, raised to a vision LoRA's)"})
    max_loras: int | None = field(default=None, metadata={"check": _count, "help": "adapters vLLM keeps loaded at once"})
    #: ``{"image": PATH}`` applies that LoRA to every request with an image (vLLM feature).
    default_mm_loras: dict | None = field(
        default=None, metadata={"help": 'apply a LoRA to every image request, e.g. \'{"image": "PATH"}\''})
    #: Images one prompt may carry (vLLM reserves encoder memory for this many).
    max_images: int = 4


def cpu_defaults(settings: VLLMSettings) -> dict:
    """Engine arguments that make vLLM's CPU build start quickly and agree with transformers.

    float32 because the transformers reference runs float32 on the CPU (bf16 would change the
    greedy tokens); eager mode because compiling takes minutes on a few cores for no gain at this
    size; a share of RAM and a context that fit beside other programs.
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", _CPU_KV_CACHE_GIB)
    return {
        "dtype": settings.dtype or "float32",
        "enforce_eager": True if settings.enforce_eager is None else settings.enforce_eager,
        "gpu_memory_utilization": settings.gpu_memory_utilization or 0.3,
        "max_model_len": settings.max_model_len or 4096,
    }


def engine_arguments(model: str, settings: VLLMSettings, vision_rank: int | None = None) -> dict:
    """vLLM ``AsyncEngineArgs`` keywords for ``model`` under ``settings``; ``vision_rank``: a vision
    LoRA served natively (settings that cannot serve it are one line, not a silent base)."""
    check_fields(settings)
    args = {
        "model": model,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "limit_mm_per_prompt": {"image": settings.max_images},
        "trust_remote_code": False,
        "disable_log_stats": True,
    }
    passthrough = {
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enforce_eager": settings.enforce_eager,
    }
    args.update({key: value for key, value in passthrough.items() if value is not None})
    if not gpu_present():
        args.update(cpu_defaults(settings))
    if vision_rank:
        if not settings.enable_lora:
            raise G4VError("the checkpoint's vision LoRA (native mode) needs LoRA in vLLM: drop --no-lora, "
                           "or use --vision-lora merged")
        if settings.max_lora_rank and settings.max_lora_rank < vision_rank:
            raise G4VError(f"max_lora_rank {settings.max_lora_rank} is below the vision LoRA's rank {vision_rank}: "
                           f"use --max-lora-rank {lora_rank_slot(vision_rank)} or leave it unset")
    if settings.enable_lora:
        args["enable_lora"] = True
        args["max_lora_rank"] = settings.max_lora_rank or max(_DEFAULT_MAX_LORA_RANK, lora_rank_slot(vision_rank or 1))
        # one slot more for the vision LoRA, so the user's adapters keep the slots they had
        args["max_loras"] = settings.max_loras or (2 if gpu_present() else _CPU_MAX_LORAS) + bool(vision_rank)
        if settings.default_mm_loras:
            args["default_mm_loras"] = settings.default_mm_loras
    elif settings.default_mm_loras or settings.max_lora_rank:
        raise G4VError("default_mm_loras and max_lora_rank need LoRA enabled (enable_lora)")
    return args


def adapter_capacity(arguments: dict) -> int:
    """How many adapters one engine may hold.

    On the CPU, vLLM 0.32's LoRA kernels (``vllm/lora/ops/torch_ops``) pick each token's adapter
    by indexing the stacked slots with the token's slot number, and base-model tokens carry -1,
    which Python indexing reads as the *last* slot. As long as that slot stays empty (zeros), base
    requests batched with adapter requests stay exact; once it holds an adapter, they silently
    get that adapter. vLLM fills slots in order, so holding at most ``max_loras - 1`` adapters
    keeps the last one empty. GPU kernels treat -1 as "no adapter" and can use every slot.
    """
    slots = arguments.get("max_loras", 0)
    if gpu_present():
        return slots
    return max(slots - 1 - bool(arguments.get("default_mm_loras")), 0)
