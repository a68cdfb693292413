"""One run of the port inspector, end to end: :func:`run_port_diff` (the CLI and the app call it).

The transformers side (:func:`reference_run`) and the vLLM side (a :class:`~g4v.port.probe.VLLMProbe`)
see the same image, prompt and pixel values; :mod:`g4v.port.compare` compares what they computed
and :mod:`g4v.port.audit` checks the config. The result is one typed summary
(:class:`~g4v.port.summary.PortDiffSummary`, whose ``to_dict`` is what ``port-diff --json`` prints)
and, when asked, one picture (:func:`draw_port_diff`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from g4v.conversation import Message, check_continuation_length
from g4v.errors import G4VError, check_value
from g4v.images import named_size, open_image
from g4v.loading import read_raw_config
from g4v.model.capture import capture_forward
from g4v.model.levels import describe_levels
from g4v.model.scoring import greedy_continuation, next_token_probs
from g4v.port import COMPARED_TOKENS
from g4v.port.audit import audit_checkpoint, audit_config, audit_without_engine
from g4v.port.compare import (DEFAULT_TRAJECTORY_RTOL, LevelDiff, NextTokenDiff, TrajectoryDiff, compare_levels,
                              compare_next_token, compare_trajectories, default_tolerance, split_levels)
from g4v.port.probe import VLLMProbe
from g4v.port.summary import PortDiffSummary


#: The stages of a comparison: where each starts on a progress bar (0-1) and what it is called. The
#: shares follow what each took on the demo checkpoint on 2 CPU cores (a 58 s run of ``port-diff
#: --png``, whose imports took its first 7 s): vLLM's engine start-up is most of it, then drawing.
STAGES = {"loading": (0.12, "loading the checkpoint in transformers"),
          "transformers": (0.14, "transformers' run (features, residual stream, greedy answer)"),
          "vllm": (0.16, "starting vLLM (its engine and worker)"),
          "levels": (0.74, "comparing each level's features"),
          "prefill": (0.75, "comparing the residual stream and the answers"),
          "closing": (0.79, "stopping vLLM"),
          "drawing": (0.87, "drawing the picture")}


@dataclass
class PortDiffResult:
    summary: PortDiffSummary  # what --json prints (its to_dict)
    levels: list[LevelDiff]
    picture: Image.Image | None
    tokens: list[tuple[str, tuple]]  # (kind, box) per image token, for heatmaps
    figure: Image.Image | None = None  # drawn by :func:`draw_port_diff` (draw=True)


def reference_run(hf_engine, picture: Image.Image, prompt: str, max_new_tokens: int) -> dict:
    """The transformers side: inputs, per-level injected features, per-token residual norms, the
    next-token distribution and the greedy continuation, holding the engine with adapters off."""
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    levels = describe_levels(model.config)
    inputs = hf_engine.prepare_inputs([Message("user", prompt, [picture])], max_new_tokens)
    with hf_engine.adapter_scope(None):
        capture, logits = capture_forward(model, inputs, full=True, levels=levels, logits_to_keep=1)
        ids = greedy_continuation(model, inputs, tokenizer, max_new_tokens, levels=levels) if max_new_tokens else []
    return {
        "inputs": inputs, "levels": levels, "capture": capture,
        "features": {cap.level.name: cap.injected for cap in capture.levels},
        "norms": torch.linalg.vector_norm(capture.residual_stream.float(), dim=-1),  # (layers + 1, seq)
        "probs": next_token_probs(logits), "continuation": ids,
    }


def run_port_diff(image, prompt: str, model: str | None = None, max_new_tokens: int = COMPARED_TOKENS,
                  atol: float | None = None, rtol: float | None = None, trajectory_rtol: float | None = None,
                  hf_engine=None, probe: VLLMProbe | None = None, draw: bool = False,
                  vision_lora: str | None = None, vllm_vision_lora: str | None = None,
                  vllm_serving: dict | None = None, progress=None) -> PortDiffResult:
    """Compare vLLM's port with transformers on one image and prompt (the CLI and an app tab call this).

    ``hf_engine`` (a transformers engine, float32 on the CPU by default) and ``probe`` (a
    :class:`VLLMProbe`) are reused when given, else started here (and the probe closed again).
    When vLLM cannot start on this checkpoint, the result still carries the config audit and says
    why (``summary.vllm_error``); only bad input raises :class:`G4VError`. ``atol`` and ``rtol``
    override the per-level tolerance's defaults for the model's dtype (:func:`default_tolerance`).
    A checkpoint with a vision LoRA runs it in mode ``vision_lora`` on the transformers side and
    ``vllm_vision_lora`` with vLLM's LoRA arguments ``vllm_serving`` on the vLLM side (defaults:
    native, g4v's recipe; a given engine or probe keeps its own); ``summary.vision_lora`` lists
    the settings under which the two sides are not the same model (:mod:`g4v.port.lora_audit`).
    ``progress(fraction, text)`` is called as each stage (:data:`STAGES`) starts, when given.
    """
    from g4v.checkpoint.vision_lora import check_mode, find_vision_lora
    from g4v.port import lora_audit

    from g4v.engines.hf import TransformersEngine
    from g4v.loading import resolve_source
    from g4v.paths import default_model
    from g4v.tiling import plan_tiling

    tell = progress or (lambda fraction, text: None)
    _check_request(image, prompt, max_new_tokens, atol, rtol)
    picture = open_image(image)
    source = resolve_source(model or (hf_engine.info.model if hf_engine is not None else default_model()))
    raw = read_raw_config(source) if Path(source).is_dir() else None
    if hf_engine is None:
        tell(*STAGES["loading"])
        try:
            hf_engine = TransformersEngine(source, device="cpu", dtype="float32", vision_lora=check_mode(vision_lora))
        except G4VError as err:
            if raw is None:
                raise
            # A Q-Former config that differs from the weights stops transformers too; the audit
            # (from config.json and vLLM's projector class) still says which fields are off.
            return _finish(_unloadable(source, prompt, picture, f"transformers: {err}"), draw)
    config = hf_engine.model.config
    raw = raw if raw is not None else config.to_dict()
    dtype = hf_engine.model.dtype
    tolerance = default_tolerance(dtype, atol, rtol)
    trajectory_rtol = DEFAULT_TRAJECTORY_RTOL.get(dtype, 2e-2) if trajectory_rtol is None else float(trajectory_rtol)

    tell(*STAGES["transformers"])
    ref = reference_run(hf_engine, picture, prompt, max_new_tokens)
    plan = plan_tiling((picture.height, picture.width), config)
    tokens = [(token.kind, token.box) for token in plan.tokens]
    summary = PortDiffSummary(model=source, prompt=prompt, image_size=named_size(*picture.size),
                              dtype=str(dtype).removeprefix("torch."), tolerance=tolerance,
                              num_image_tokens=ref["capture"].num_image_tokens,
                              num_text_tokens=ref["capture"].num_text_tokens)

    lora = find_vision_lora(source)
    vllm_mode = probe.vision_mode if probe is not None else (check_mode(vllm_vision_lora) if lora else "off")
    serving = probe.serving if probe is not None else (
        lora_audit.recipe(lora, vllm_mode) if vllm_serving is None else vllm_serving)
    summary.vision_lora = lora_audit.summary(lora, hf_engine.loaded.vision_mode, vllm_mode, serving)
    own_probe = probe is None
    try:
        if own_probe:
            tell(*STAGES["vllm"])
            try:
                probe = VLLMProbe(source, dtype=str(dtype).removeprefix("torch."), vision_lora=vllm_mode,
                                  serving=serving)
            except G4VError as err:
                audit = audit_without_engine(raw, config)
                summary.vllm_error, summary.config_audit = str(err), audit
                summary.message = f"{err}. Config audit: {audit.message}"
                return _finish(PortDiffResult(summary, [], picture, tokens), draw)
        tell(*STAGES["levels"])
        audit = audit_config(raw, config, probe.module_facts(), "vLLM's built modules (inside its worker)")
        level_rows = _compare_features(probe, ref, tolerance)
        tell(*STAGES["prefill"])
        trajectory, next_token = _compare_prefill(probe, hf_engine, ref, picture, prompt, max_new_tokens,
                                                  trajectory_rtol)
        tell(*STAGES["closing"])
    finally:
        if own_probe and probe is not None:
            probe.close()

    summary.levels, summary.trajectory, summary.next_token, summary.config_audit = (level_rows, trajectory,
                                                                                     next_token, audit)
    summary.ok = all(row.ok for row in level_rows) and trajectory.ok and audit.ok and summary.vision_lora.ok
    summary.message = "; ".join([*summary.vision_lora.findings, _verdict(level_rows, trajectory, next_token, audit)])
    if draw:
        tell(*STAGES["drawing"])
    return _finish(PortDiffResult(summary, level_rows, picture, tokens), draw)


def _check_request(image, prompt: str, max_new_tokens, atol, rtol) -> None:
    """Bad input fails here, before any model loads."""
    if image is None:
        raise G4VError("the port inspector needs an image")
    if not str(prompt or "").strip():
        raise G4VError("the port inspector needs a prompt")
    check_value("max_new_tokens", max_new_tokens, check_continuation_length)
    default_tolerance(torch.float32, atol, rtol)


def _compare_features(probe: VLLMProbe, ref: dict, tolerance) -> list[LevelDiff]:
    """vLLM's per-level features on transformers' pixel values, against transformers' levels."""
    inputs = ref["inputs"]
    embedded = probe.embed_levels(inputs["pixel_values"], inputs["image_sizes"])
    vllm_levels = split_levels(embedded["packed"][0], embedded["llm_layers"], embedded["hidden"])
    return compare_levels(ref["levels"], ref["features"], vllm_levels, tolerance)


def _compare_prefill(probe: VLLMProbe, hf_engine, ref: dict, picture: Image.Image, prompt: str,
                     max_new_tokens: int, trajectory_rtol: float) -> tuple[TrajectoryDiff, NextTokenDiff]:
    """The same prompt through vLLM: residual trajectories, next token and greedy continuations."""
    inputs = ref["inputs"]
    prompt_dict = {"prompt": hf_engine.render_prompt([Message("user", prompt, [picture])]),
                   "multi_modal_data": {"image": [picture]}}
    expected = int(inputs["input_ids"].shape[1])
    norms, logprobs, vllm_prompt_ids = probe.prefill(prompt_dict, expected)
    same_prompt = vllm_prompt_ids == inputs["input_ids"][0].tolist()
    trajectory = compare_trajectories(ref["norms"], norms if same_prompt else None, ref["capture"].image_mask,
                                      ref["capture"].trajectory.injection_layers, trajectory_rtol)
    if not same_prompt:
        trajectory.problem = (f"vLLM's prompt has {len(vllm_prompt_ids)} tokens, transformers' {expected} "
                                 "(or different ids): image placeholders were expanded differently")
    vllm_ids = probe.greedy(prompt_dict, max_new_tokens, hf_engine.tokenizer.eos_token_id)
    next_token = compare_next_token(ref["probs"], logprobs, hf_engine.tokenizer, ref["continuation"], vllm_ids)
    next_token.prompt_token_ids_equal = same_prompt
    return trajectory, next_token


def _verdict(level_rows: list[LevelDiff], trajectory: TrajectoryDiff, next_token: NextTokenDiff, audit) -> str:
    """The summary's one-line message: every kind of departure found, or "all levels agree"."""
    failing = [row.name for row in level_rows if not row.ok]
    return "; ".join(filter(None, [
        f"levels that differ: {', '.join(failing)}" if failing else "all levels agree",
        trajectory.problem, None if audit.ok else audit.message,
        None if next_token.first_divergence is None else f"greedy continuations differ from token {next_token.first_divergence}",
    ]))


def _unloadable(source: str, prompt: str, picture: Image.Image, error: str) -> PortDiffResult:
    audit = audit_checkpoint(source)
    summary = PortDiffSummary(model=source, prompt=prompt, image_size=named_size(*picture.size), load_error=error,
                              config_audit=audit,
                              message=f"could not load the checkpoint ({error}). Config audit: {audit.message}")
    return PortDiffResult(summary, [], picture, [])


def _finish(result: PortDiffResult, draw: bool) -> PortDiffResult:
    if draw:
        result.figure = draw_port_diff(result)
    return result


def draw_port_diff(result: PortDiffResult) -> Image.Image:
    """Per-level difference heatmaps over the picture, the per-level bars and the trajectories."""
    from viz.port import port_diff_figure

    token_diff = {row.name: row.token_diff for row in result.levels if row.token_diff}
    return port_diff_figure(result.picture, result.tokens, result.summary, token_diff)
