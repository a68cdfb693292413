"""The GPU check's vision LoRA step (listed in ``gpu_check_steps.STEPS``): the real model's layout,
a base language model with a rank-256 LoRA beside it, applied native and merged at real size."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from gpu_check_decode import bandwidth_bound, rate_tokens
from gpu_check_model import chat_messages, synchronize, write_random_lora

#: The real model's vision LoRA: rank 256, alpha 256, every attention and MLP projection.
VISION_LORA_RANK = 256


def step_vision_lora(check) -> dict:
    """The real model's layout at real size: a random rank-256 vision LoRA on every attention and
    MLP projection, applied as the engines apply it (:mod:`g4v.checkpoint.vision_lora`): native (image
    requests get it; the decode loop runs them on a merged copy of the LoRA'd layers, or through
    PEFT's layers with ``vision_copy=off``) against merged (``W += s * B @ A`` in the model's dtype).
    For each: the time to apply it, the first token's time through the engine, batch-1 decode
    tokens/s through the engine (compiled on a GPU) and through bare ``generate``, and peak memory;
    native's decode over the bandwidth bound (the issue's 25 % target); then the largest relative
    logit difference merged vs native (bf16 rounding of the merged weights on the GPU; float32 in
    the smoke run). The model keeps the merged weights afterwards (random either way; the LoRA
    step measures its own)."""
    from g4v.engines.decode_bench import bare_generate, decode_rates, first_piece_s, through
    from g4v.engines.hf import TransformersEngine
    from g4v.checkpoint.vision_lora import find_vision_lora, merge_into
    from g4v.loading import VISION_ADAPTER

    engine = check.engine
    folder = check.out_dir / "random-vision-lora"
    write_random_lora(engine.model, folder, rank=VISION_LORA_RANK, alpha=VISION_LORA_RANK)
    lora = find_vision_lora(str(folder))  # the adapter files in the layout g4v finds them in
    request = engine.prepare(chat_messages(check), rate_tokens(check))
    with torch.inference_mode(), engine.adapter_scope(None) as model:
        base = model(**request.inputs, logits_to_keep=1).logits.float()
    numbers = {"rank": lora.rank, "alpha": lora.alpha, "modules": len(lora.modules)}
    logits = {}
    repeats = 2 if not check.smoke else 1
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
        loaded = replace(engine.loaded, vision_lora=lora, vision_mode=mode)
        moded = TransformersEngine(engine.info.model, loaded=loaded, decode=engine.decode)
        paths = {"engine": through(moded, request), "bare generate": bare_generate(moded, request)}
        peft = None
        if mode == "native":  # the vision LoRA through PEFT's layers, for what the merged copy saves
            peft = TransformersEngine(engine.info.model, loaded=loaded, decode=replace(engine.decode, vision_copy="off"))
            paths["engine, PEFT layers"] = through(peft, request)
        rates = decode_rates(paths, rate_tokens(check), repeats, check.device)
        ttft = first_piece_s(moded, request, repeats, check.device)
        with torch.inference_mode(), moded.adapter_scope(None) as model:
            logits[mode] = model(**request.inputs, logits_to_keep=1).logits.float()
        numbers[mode] = {"apply_s": apply_s, "ttft_s": ttft, "decode_tok_s_batch1": rates["engine"],
                         "bare_generate_tok_s": rates["bare generate"], "peak_bytes": _peak(check),
                         "vision_copy": moded.info.details.get("vision_copy")}
        if peft is not None:
            numbers[mode]["peft_layers_tok_s"] = rates["engine, PEFT layers"]
            peft.close()
        moded.close()
    scale = logits["native"].abs().max().item()
    numbers["native_vs_base_max_rel"] = (logits["native"] - base).abs().max().item() / scale
    numbers["merged_vs_native_max_rel"] = (logits["merged"] - logits["native"]).abs().max().item() / scale
    rates = [numbers[mode]["decode_tok_s_batch1"] for mode in ("native", "merged")]
    numbers["native_over_merged_decode_batch1"] = rates[0] / rates[1] if all(rates) else None
    numbers["bandwidth_ratio"] = rates[0] / bandwidth_bound(check)
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
