"""The GPU check's vision LoRA step (listed in ``gpu_check_steps.STEPS``): the real model's layout,
a base language model with a rank-256 LoRA beside it, applied native and merged at real size."""

from __future__ import annotations

import time

import torch

from g4v.conversation import SamplingSettings
from gpu_check import synchronize
from gpu_check_steps import batched, chat_messages, decode_rate, write_random_lora


#: The real model's vision LoRA: rank 256, alpha 256, every attention and MLP projection.
VISION_LORA_RANK = 256


def step_vision_lora(check) -> dict:
    """The real model's layout at real size: a random rank-256 vision LoRA on every attention and
    MLP projection, applied as the engines apply it (:mod:`g4v.engines.vision_lora`): native (a PEFT
    adapter on for image requests) against merged (``W += s * B @ A`` in the model's dtype). For
    each: the time to apply it, time to first token through the engine, decode tokens/s at batch 1
    and at the check's batch, and peak memory; then the largest relative logit difference merged
    vs native (bf16 rounding of the merged weights on the GPU; float32 in the smoke run). The model
    keeps the merged weights afterwards (random either way; the LoRA step measures its own)."""
    from dataclasses import replace

    from g4v.engines.hf import TransformersEngine
    from g4v.engines.vision_lora import find_vision_lora, merge_into
    from g4v.loading import VISION_ADAPTER

    engine, sizes = check.engine, check.sizes
    folder = check.out_dir / "random-vision-lora"
    write_random_lora(engine.model, folder, rank=VISION_LORA_RANK, alpha=VISION_LORA_RANK)
    lora = find_vision_lora(str(folder))  # the adapter files in the layout g4v finds them in
    messages = chat_messages(check)
    inputs = engine.prepare_inputs(messages, sizes.new_tokens)
    with torch.inference_mode(), engine.adapter_scope(None) as model:
        base = model(**inputs, logits_to_keep=1).logits.float()
    numbers = {"rank": lora.rank, "alpha": lora.alpha, "modules": len(lora.modules)}
    logits = {}
    for mode in ("native", "merged"):
        _reset_peak(check)
        start = time.perf_counter()
        if mode == "native":
            engine.model.load_adapter(str(folder), adapter_name=VISION_ADAPTER)
            engine.model.disable_adapters()  # on per image request only, as the engine does
        else:
            engine.model.delete_adapter(VISION_ADAPTER)
            merge_into(engine.model, lora)
        synchronize(check.device)
        apply_s = time.perf_counter() - start
        moded = TransformersEngine(engine.info.model, loaded=replace(engine.loaded, vision_lora=lora, vision_mode=mode))
        moded.generate(messages, SamplingSettings(max_new_tokens=1))  # warm-up
        synchronize(check.device)
        start = time.perf_counter()
        moded.generate(messages, SamplingSettings(max_new_tokens=1))
        ttft = time.perf_counter() - start
        with torch.inference_mode(), moded.adapter_scope(None) as model:
            logits[mode] = model(**inputs, logits_to_keep=1).logits.float()
        numbers[mode] = {"apply_s": apply_s, "ttft_s": ttft, "decode_tok_s_batch1": decode_rate(check, inputs, 1, moded),
                         f"decode_tok_s_batch{sizes.batch}": decode_rate(check, batched(inputs, sizes.batch), sizes.batch,
                                                                         moded),
                         "peak_bytes": _peak(check)}
    scale = logits["native"].abs().max().item()
    numbers["native_vs_base_max_rel"] = (logits["native"] - base).abs().max().item() / scale
    numbers["merged_vs_native_max_rel"] = (logits["merged"] - logits["native"]).abs().max().item() / scale
    rates = [numbers[mode]["decode_tok_s_batch1"] for mode in ("native", "merged")]
    numbers["native_over_merged_decode_batch1"] = rates[0] / rates[1] if all(rates) else None
    return numbers


def _reset_peak(check) -> None:
    if check.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(check.device)


def _peak(check) -> int:
    """The CUDA allocator's peak since :func:`_reset_peak` (on the CPU: the process's peak so far)."""
    import resource

    if check.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(check.device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
