"""The steps of the GPU check (``scripts/gpu_check.py``), in the order they run (:func:`STEPS`).

Each step is a function ``step(check) -> dict`` of its numbers (``check`` is
:class:`gpu_check.Check`); the runner times it, measures its peak memory and records a failure
without stopping the others. A step returns ``{"skipped": True, "reason": ...}`` when it cannot
run here. Steps after ``load`` use ``check.engine``, the workbench's own transformers engine around
the random-weight model, and go through the same library functions as the app and the CLI.

A new panel adds its step in :func:`panel_steps` (one line), so the check grows with the workbench.
"""

from __future__ import annotations

import json
import time

import torch

from g4v.conversation import Message, SamplingSettings
from gpu_check_circuits import step_circuits
from gpu_check_decode import step_chat, step_zero_gpu_aot
from gpu_check_model import (LORA_RANK, PROMPT, build_engine, chat_messages, noise_picture, synchronize, weight_bytes,
                             write_random_lora)
from gpu_check_vision_lora import step_vision_lora


def STEPS() -> list[tuple[str, object]]:
    """``(name, step)`` in running order; ``load`` comes first, the chat decoding (the figures the
    check is most often run for) right after it, the LoRA merge last (it rewrites weights)."""
    return [("load", step_load), ("chat", step_chat), ("deepstack_capture", step_deepstack_capture),
            ("deepstack_ablation", step_ablation), ("tiling_27_pinpoints", step_tiling), *panel_steps(),
            ("vision_lora", step_vision_lora), ("zero_gpu_aot", step_zero_gpu_aot),
            ("pipeline_parallel", step_pipeline_parallel), ("lora", step_lora)]


def panel_steps() -> list[tuple[str, object]]:
    """Where a new panel's step goes: ``("name", function)``, the function taking the check and
    returning its numbers. ``None`` in place of the function reports the step as not written yet."""
    return [("attribution", step_attribution), ("documents", step_documents), ("dataset_run", step_dataset_run),
            ("dataset_batching", step_dataset_batching), ("circuits", step_circuits)]


def step_attribution(check) -> dict:
    """Gradient x input at real size against a plain forward pass: time and peak memory with the
    attribution benchmark's own functions (:mod:`g4v.attribution.bench`; targets: at most 3x the
    time and 2.5x the peak memory), and one attribution of the chat prompt's next token."""
    from functools import partial

    from g4v.attribution.bench import MODES, run_mode
    from g4v.model.bench import measure_modes

    engine = check.engine
    inputs = engine.prepare_inputs(chat_messages(check))
    with engine.adapter_scope(None) as model:
        seconds, peaks = measure_modes(partial(run_mode, model, inputs), MODES, check.device, check.sizes.repeats)
        run_mode(model, inputs, "gradxinput")
    return {"seconds": seconds, "peak_bytes": peaks, "time_ratio": seconds["gradxinput"] / seconds["forward"],
            "memory_ratio": peaks["gradxinput"] / max(peaks["forward"], 1),
            "image_tokens": int((inputs["input_ids"] == engine.model.config.image_token_index).sum())}


# ── documents ──────────────────────────────────────────────────────────────────────────────────

#: The key-value step's schema: a user's kind of schema, small (the answer is read against it).
DOCUMENT_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "total": {"type": "number"}},
                   "required": ["title", "total"]}
#: Rows of the bundled held-out dataset the dataset-run step compares.
DATASET_ROWS = {"gpu": 16, "smoke": 2}
#: Longest answer of the dataset run, in tokens (its questions have one-word answers).
DATASET_TOKENS = 8
#: Rows the batching step answers one by one and batched (each side twice, the faster kept).
BATCHING_ROWS = {"gpu": 32, "smoke": 2}


def step_documents(check) -> dict:
    """A PDF page at real size: page 1 of the bundled report (a chart) rendered at the Chat tab's
    resolution, asked with the Chart to CSV preset and the key-value preset through the engine,
    each answer read as the structured panel reads it. The page's image tokens must equal the
    tiling plan's; with random weights an unreadable answer is expected, and must come back as a
    parse error, not an exception."""
    from g4v.documents.examples import REPORT_PDF
    from g4v.documents.pdf import render_pages
    from g4v.documents.presets import build_prompt, get_preset
    from g4v.documents.structured import read_answer
    from g4v.tiling import plan_tiling

    engine = check.engine
    start = time.perf_counter()
    page = render_pages(REPORT_PDF, [1])[0]
    render_s = time.perf_counter() - start
    planned = plan_tiling((page.height, page.width), engine.model.config).num_image_tokens
    schema_text = json.dumps(DOCUMENT_SCHEMA)
    found = {"page_px": [page.width, page.height], "render_s": render_s, "image_tokens": planned}
    for key in ("chart2csv", "kvp"):
        preset = get_preset(key)
        messages = [Message("user", build_prompt(key, schema_text=schema_text), [page])]
        tokens = int((engine.prepare_inputs(messages)["input_ids"] == engine.model.config.image_token_index).sum())
        if tokens != planned:
            raise RuntimeError(f"{key}: the processor made {tokens} image tokens, the tiling plan {planned}")
        start = time.perf_counter()
        answer = engine.generate(messages, SamplingSettings(max_new_tokens=check.sizes.new_tokens))
        seconds = time.perf_counter() - start
        read = read_answer(preset.output, answer.text, DOCUMENT_SCHEMA if preset.needs_schema else None)
        found[key] = {"prompt_tokens": answer.prompt_tokens, "answer_s": seconds, "answer_chars": len(answer.text),
                      "read_ok": read.ok,
                      "read_error": read.error, "schema_problems": len(read.problems)}
    return found


# ── dataset runs ───────────────────────────────────────────────────────────────────────────────


def step_dataset_run(check) -> dict:
    """The Evaluate panel's run (:func:`g4v.evaluate.run_eval`) over the bundled held-out dataset,
    the real-size model on both arms (the same engine), with the blank-picture probe and the
    per-level norms on: rows per second, and the run's own summary. Both arms decode greedily on
    the same weights, so every row must agree and the teacher-forced KL must be about 0."""
    from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig, run_eval

    rows = DATASET_ROWS["smoke" if check.smoke else "gpu"]
    config = EvalConfig(a=ArmSpec("hf", label="first"), b=ArmSpec("hf", label="second"), data=str(BUNDLED_DATASET),
                        limit=rows, max_new_tokens=DATASET_TOKENS, blank_probe=True, levels=True)
    start = time.perf_counter()
    result = run_eval(config, check.out_dir / "dataset-run", reuse={ArmSpec("hf"): check.engine})
    seconds = time.perf_counter() - start
    summary = result.summary
    if summary.n != rows or summary.n_errors or summary.agreement != 1.0:
        raise RuntimeError(f"{summary.n} rows, {summary.n_errors} errors, agreement {summary.agreement}")
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "answers_per_row": 4,
            "agreement": summary.agreement, "kl": summary.to_dict()["kl"], "complete": summary.complete}


def step_dataset_batching(check) -> dict:
    """One ``hf`` arm answering dataset rows one by one and in batches (``bench eval --whole-run``'s
    second table, :func:`g4v.evaluate.bench_run.time_batching`, on the check's engine): the batched
    arm's answers against one by one (issue 36 asks for 2x; the CPU reached 1.71x, its encoding
    being compute-bound), and how many answers are the same greedy tokens. In bf16 a padded row's
    numbers can differ a little from its unpadded ones, so equal answers are counted, not required."""
    from g4v.evaluate import BUNDLED_DATASET, ArmSpec, EvalConfig
    from g4v.evaluate.bench_run import time_batching
    from g4v.evaluate.data import open_dataset
    from g4v.evaluate.run import row_order

    rows = BATCHING_ROWS["smoke" if check.smoke else "gpu"]
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(BUNDLED_DATASET), limit=rows,
                        max_new_tokens=DATASET_TOKENS)
    dataset = open_dataset(config.data, config.columns)
    samples = [sample for sample in (dataset.sample(i) for i in row_order(len(dataset), rows, None))
               if sample.error is None]
    one, batched_ = time_batching(ArmSpec("hf"), samples, config, reuse={ArmSpec("hf"): check.engine})
    failed = [a for a in one[2] + batched_[2] if a is None or a.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {2 * len(samples)} answers failed: {getattr(failed[0], 'error', 'not run')}")
    same = sum(a.token_ids == b.token_ids for a, b in zip(one[2], batched_[2]))
    return {"rows": len(samples), "batch_size": batched_[0], "one_by_one_s": one[1], "batched_s": batched_[1],
            "batched_over_one_by_one": one[1] / batched_[1], "encoding_s_one_by_one": one[3],
            "encoding_s_batched": batched_[3],
            "answers_after_encoding": (one[1] - one[3]) / (batched_[1] - batched_[3]), "same_answers": same}


# ── load ───────────────────────────────────────────────────────────────────────────────────────


def step_load(check) -> dict:
    check.engine = build_engine(check)
    model = check.engine.model
    language_model = model.model.language_model
    # What one decoding step must read: every language-model weight but the embedding table (one row
    # is read), plus the output head.
    decode_bytes = weight_bytes(language_model) - weight_bytes(language_model.embed_tokens) + weight_bytes(model.lm_head)
    check.facts["decode_weight_bytes"] = decode_bytes
    config = model.config
    return {"parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes(model),
            "vision_layers": config.vision_config.num_hidden_layers, "text_layers": config.text_config.num_hidden_layers,
            "deepstack_layer_map": config.deepstack_layer_map, "spatial_target_layers": config.spatial_target_layers,
            "pinpoints": len(config.image_grid_pinpoints), "vocab_size": config.text_config.vocab_size,
            "decode_weight_bytes": decode_bytes, "first_parameter_device": str(next(model.parameters()).device)}


# ── chat ───────────────────────────────────────────────────────────────────────────────────────


# ── Deepstack inspector ────────────────────────────────────────────────────────────────────────


def step_deepstack_capture(check) -> dict:
    """The capture's cost at real size: off / norms / full, with the inspector benchmark's own
    timing and memory functions (:mod:`g4v.model.bench`)."""
    from functools import partial

    from g4v.inspect.bench import MODES, forward_once
    from g4v.model.bench import measure_modes

    engine = check.engine
    inputs = engine.prepare_inputs(chat_messages(check))
    with engine.adapter_scope(None) as model:
        seconds, peaks = measure_modes(partial(forward_once, model, inputs), MODES, check.device, check.sizes.repeats)
    return {"seconds": seconds, "peak_bytes": peaks, "time_norms": seconds["norms"] / seconds["off"],
            "time_full": seconds["full"] / seconds["off"]}


def step_ablation(check) -> dict:
    """The inspector end to end (capture, figures, export) with the first deepstack level ablated.
    With random weights the KL is about 0 (the random attention barely mixes image tokens into the
    last text token); the step is here for its time and memory at real size."""
    from g4v.inspect.run import run_inspection

    height, width = check.sizes.image_hw
    result = run_inspection(check.engine, noise_picture(height, width), PROMPT, ablate=("deepstack0",),
                            max_new_tokens=4, out_dir=check.out_dir / "deepstack", make_zip=False)
    return {"ablation_kl": float(result.ablation.kl_divergence), "image_tokens": result.capture.num_image_tokens,
            "figures": sorted(result.figures)}


# ── tiling ─────────────────────────────────────────────────────────────────────────────────────


def step_tiling(check) -> dict:
    """Every pinpoint of the config: a picture of exactly that size must get the grid the plan
    says, the processor's token count must equal the plan's, and the model must accept the tokens."""
    from g4v.tiling import plan_tiling

    engine = check.engine
    config = engine.model.config
    tile = config.vision_config.image_size
    pinpoints = [tuple(p) for p in config.image_grid_pinpoints]
    # The CPU smoke run checks every pinpoint's token count but runs the model on three of them
    # only (the smallest, the largest and the tallest): a forward pass over ten tiles through 67
    # layers takes seconds on a CPU, and the GPU run covers all 27.
    forwarded = set(pinpoints) if not check.smoke else {
        min(pinpoints, key=lambda hw: hw[0] * hw[1]), max(pinpoints, key=lambda hw: hw[0] * hw[1]),
        max(pinpoints, key=lambda hw: hw[0] / hw[1])}
    rows, problems = [], []
    for height, width in pinpoints:
        plan = plan_tiling((height, width), config)
        inputs = engine.prepare_inputs([Message("user", PROMPT, [noise_picture(height, width)])])
        tokens = int((inputs["input_ids"] == config.image_token_index).sum())
        if tuple(plan.grid) != (height // tile, width // tile) or tokens != plan.num_image_tokens:
            problems.append(f"{width} x {height} px: grid (rows, cols) {plan.grid}, plan {plan.num_image_tokens}, "
                            f"processor {tokens}")
        seconds = None
        if (height, width) in forwarded:
            start = time.perf_counter()
            with engine.adapter_scope(None) as model, torch.inference_mode():
                logits = model(**inputs, logits_to_keep=1).logits  # the model checks features == tokens
            synchronize(check.device)
            seconds = time.perf_counter() - start
            if not torch.isfinite(logits).all():
                problems.append(f"{width} x {height} px: non-finite logits")
        rows.append([height, width, tokens, seconds])
    if problems:
        raise RuntimeError("; ".join(problems))
    return {"pinpoints_ok": len(rows), "pinpoints_run": len(forwarded), "max_pinpoint_tokens": max(r[2] for r in rows),
            "pinpoints": rows}


# ── pipeline parallelism ───────────────────────────────────────────────────────────────────────


def step_pipeline_parallel(check) -> dict:
    """vLLM with ``pipeline_parallel_size=2``: it needs vLLM and two GPUs, neither of which the lent
    machine has (see docs/gpu_check.md); reported as skipped with the reason until a machine has them."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": True, "reason": "vLLM is not installed here"}
    if check.device.type != "cuda" or torch.cuda.device_count() < 2:
        return {"skipped": True, "reason": "needs two GPUs (one pipeline stage each)"}
    return {"skipped": True, "reason": "vLLM and two GPUs found: run docs/gpu_check.md's pipeline recipe"}


# ── LoRA ───────────────────────────────────────────────────────────────────────────────────────


def step_lora(check) -> dict:
    """Side by side (the LoRA panel's streams) and a full merge (``W += scaling * B @ A`` of
    :func:`g4v.lora.merge.merge_into`, which needs float32 weights): the merged model's logits
    against the model with the adapter attached, at real size."""
    from g4v.lora.checks import check_adapter
    from g4v.lora.merge import merge_into
    from g4v.lora.side_by_side import stream_side_by_side

    engine = check.engine
    folder = check.out_dir / "random-lora"
    write_random_lora(engine.model, folder)
    spec = check_adapter(folder, engine.model.config, name="random-lora")
    engine.register_adapter(spec.name, str(folder))
    messages = chat_messages(check)
    start = time.perf_counter()
    pair = None
    for pair in stream_side_by_side(engine, messages, SamplingSettings(max_new_tokens=check.sizes.side_by_side_tokens),
                                    spec.name):
        pass
    side_by_side_s = time.perf_counter() - start
    cast_start = time.perf_counter()
    engine.model.float()  # the merge is exact only in float32 (see g4v.lora.merge)
    inputs = engine.prepare_inputs(messages)
    inputs["pixel_values"] = inputs["pixel_values"].float()
    cast_s = time.perf_counter() - cast_start
    with torch.inference_mode():
        with engine.adapter_scope(spec.name) as model:
            attached = model(**inputs, logits_to_keep=1).logits.float()
        with engine.adapter_scope(None) as model:
            base = model(**inputs, logits_to_keep=1).logits.float()
    merge_start = time.perf_counter()
    merge_into(engine.model, spec)  # adapters stay disabled: the merged base weights now carry the update
    merge_s = time.perf_counter() - merge_start
    with torch.inference_mode(), engine.adapter_scope(None) as model:
        merged = model(**inputs, logits_to_keep=1).logits.float()
    scale = attached.abs().max().item()
    return {"rank": LORA_RANK, "merged_layers": len(spec.modules), "side_by_side_s": side_by_side_s,
            "answers_differ": pair is not None and pair.base != pair.adapter, "cast_to_float32_s": cast_s,
            "merge_s": merge_s, "adapter_vs_base_max_rel": (attached - base).abs().max().item() / scale,
            "merged_vs_adapter_max_rel": (merged - attached).abs().max().item() / scale}

