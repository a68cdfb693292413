"""The GPU check's chat decoding: the transformers engine's chat path at the real model's size, with
the measurements of ``python -m g4v bench decode`` (:mod:`g4v.engines.decode_bench`, one function for
both), and the ZeroGPU ahead-of-time path (:mod:`g4v.engines.aot`).

The targets (issue "chat at the speed of the GPU"): batch-1 decode with the vision LoRA applied at
least 25 % of the bandwidth bound (the ``vision_lora`` step reports that figure), 8 concurrent
chats at least 5x the tokens/s of one, the first token of a 1320-token picture within 0.2 s, and
the compile time reported."""

from __future__ import annotations

import time

from g4v.conversation import Message
from gpu_check_model import PROMPT, chat_messages, noise_picture, synchronize

#: Decode rates are timed over this many new tokens (the bare ``generate`` runs at a few tens of
#: tokens/s on the GPU: longer answers would spend the check's minutes there).
RATE_TOKENS = 64


def rate_tokens(check) -> int:
    """New tokens a decode rate is timed over: :data:`RATE_TOKENS`, or the smoke run's fewer."""
    return min(RATE_TOKENS, check.sizes.new_tokens)


def conversations(check, count: int) -> list[list[Message]]:
    """``count`` chats with a picture of the check's size each (distinct pictures: no prefix can be
    shared); the first is :func:`gpu_check_model.chat_messages`."""
    height, width = check.sizes.image_hw
    return [chat_messages(check)] + [[Message("user", PROMPT, [noise_picture(height, width, seed=seed)])]
                                     for seed in range(1, count)]


def bandwidth_bound(check) -> float:
    """Decode tokens/s if a step cost only reading its weights once (batch of one)."""
    return check.sizes.bandwidth_bytes_s / check.facts["decode_weight_bytes"]


def step_chat(check) -> dict:
    """The engine as the app runs it (on a GPU the decode step compiled) on a 1536 x 768 px picture
    (1320 image tokens): its image tokens against the tiling plan, the first token's time, decode
    tokens/s of bare ``generate``, the reference path, the eager loop and (GPU) the compiled loop,
    with the first request's compile time, and ``sizes.batch`` chats at once against one at a time."""
    from g4v.engines.decode_bench import first_piece_s, measure
    from g4v.tiling import plan_tiling

    engine, sizes = check.engine, check.sizes
    chats = conversations(check, sizes.batch)
    request = engine.prepare(chats[0], sizes.new_tokens)
    image_tokens = int((request.inputs["input_ids"] == engine.model.config.image_token_index).sum())
    planned = plan_tiling(sizes.image_hw, engine.model.config).num_image_tokens
    if image_tokens != planned:
        raise RuntimeError(f"the processor made {image_tokens} image tokens, the tiling plan {planned}")
    compiles = engine.decode.compiles(check.device)
    new_tokens = rate_tokens(check)
    report = measure(engine, new_tokens, repeats=2 if not check.smoke else 1, conversations=chats,
                     compile_too=compiles)
    configured = "engine (compiled)" if compiles else "engine (decode loop)"
    ttft = first_piece_s(engine, request, repeats=3 if not check.smoke else 1, device=check.device)
    rate1 = report.rates[configured]
    bound = bandwidth_bound(check)
    concurrent = report.chat_tokens / report.together_s if report.together_s else None
    return {"image_tokens": image_tokens, "prompt_tokens": request.prompt_tokens, "ttft_s": ttft,
            "decode_tok_s": report.rates, "decode_tok_s_batch1": rate1, "engine_over_bare": report.ratio(configured),
            "compiled_over_eager": (report.ratio("engine (compiled)", "engine (decode loop)") if compiles else None),
            "compile_s": report.compile_s, "chats": report.chats, "chat_tokens": report.chat_tokens,
            "concurrent_tok_s": concurrent, f"decode_tok_s_batch{sizes.batch}": concurrent,
            "chats_over_one_at_a_time": report.together_over_one_at_a_time, "same_as_alone": report.same_as_alone,
            "bandwidth_bound_tok_s": bound, "bandwidth_ratio": rate1 / bound, "new_tokens": new_tokens}


def step_zero_gpu_aot(check) -> dict:
    """What a ZeroGPU Space gets: the decode step exported and compiled ahead of time, installed
    into an engine that decodes each request in its own call (``inline``): the compile time, batch-1
    decode tokens/s through it, and whether its answer equals the eager loop's. With the ``spaces``
    package here it compiles as a Space does (``spaces.aoti_compile``; outside ZeroGPU ``spaces.GPU``
    runs the function where it is); else with AOTInductor directly (:func:`compile_here`, what
    ``spaces.aoti_compile`` wraps; ``spaces`` requires gradio, which the check does not carry)."""
    import importlib.util
    import tempfile
    from dataclasses import replace

    from g4v.engines.aot import compile_here, compile_on_zero_gpu, installed, variants
    from g4v.engines.decode_bench import decode_rates, forced, through
    from g4v.engines.hf import TransformersEngine

    if check.device.type != "cuda":
        return {"skipped": True, "reason": "the ahead-of-time compile is for CUDA builds of torch"}

    base = check.engine
    aot = TransformersEngine(base.info.model, loaded=base.loaded, inline=True,
                             decode=replace(base.decode, compile_decode="off"))
    eager = TransformersEngine(base.info.model, loaded=base.loaded, decode=replace(base.decode, compile_decode="off"))
    began = time.perf_counter()
    if importlib.util.find_spec("spaces") is not None:
        import spaces

        line = compile_on_zero_gpu(aot, spaces)
    else:
        folder, made = tempfile.mkdtemp(prefix="g4v-aot-"), variants(aot)
        for variant in made:
            compile_here(aot, folder, variant)
        line = f"decode step: compiled ahead of time with AOTInductor for {len(made)} variant(s)"
    compile_s = time.perf_counter() - began
    if not installed(aot):
        raise RuntimeError(line)
    request = aot.prepare(chat_messages(check), rate_tokens(check))
    settings = forced(16)
    same = aot.generate(request, settings).token_ids == eager.generate(request, settings).token_ids
    synchronize(check.device)
    rates = decode_rates({"aot": through(aot, request), "eager": through(eager, request)}, rate_tokens(check), 2,
                         check.device)
    shapes = len(installed(aot))
    for engine in (aot, eager):
        engine.close()
    return {"line": line, "compile_s": compile_s, "shapes": shapes, "same_as_eager": same,
            "decode_tok_s_batch1": rates["aot"], "eager_decode_tok_s_batch1": rates["eager"],
            "bandwidth_ratio": rates["aot"] / bandwidth_bound(check)}
