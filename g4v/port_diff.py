"""vLLM port inspector: vLLM's ``granite4_vision`` compared with transformers, level by level.

Token-level parity (``tests/vllm/test_parity.py``) says *whether* vLLM's port and the transformers
reference agree. This module says *where* and *by how much*:

1. **Per-level features.** vLLM's ``embed_multimodal`` returns, per image, all 8 levels packed on
   the last dimension. It is run inside vLLM's worker on the *same pixel values* transformers
   uses, split per level, and compared with what transformers injects at the same LLM layer
   (:func:`g4v.deepstack.capture_forward`): max absolute and relative difference per level, and
   a per-token difference that the tiling token map turns into a heatmap over the picture.
2. **Inside the language model.** Hooks installed in vLLM's worker record the residual norm at
   every decoder layer during a real prefill; compared with the transformers capture's trajectory.
   Then the next-token distributions (KL, top-5 overlap; vLLM's full-vocabulary logprobs) and the
   greedy continuations (first divergence).
3. **Config audit.** Every config field that shapes the projectors or the injection, as the raw
   ``config.json`` says, as transformers loaded it, and as vLLM actually built its modules.
   vLLM builds every Q-Former with fixed sizes (1 layer, intermediate 3072, hidden/64 heads)
   whatever ``qformer_config`` says; such a checkpoint is reported field by field. When vLLM cannot
   even load it (weights of the wrong shape), the audit is still produced, from a projector built
   here by vLLM's own class, and the result says why vLLM did not start instead of crashing.

Why ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``: the only way into vLLM's worker processes is
``LLM.apply_model(func)``, and vLLM only ships a Python function to its workers (cloudpickle) when
that variable is set, because unpickling runs arbitrary code. This tool starts its *own*
``vllm.LLM`` (engine and workers are its children), sets the variable just before that, and puts the
previous value back on :meth:`VLLMProbe.close`. The app's serving engine never gets it.

Both sides must run in the same environment (the vLLM CPU venv: ``.venv-vllm``), so they use the
same image processor; the pixel values are handed to vLLM explicitly anyway.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from g4v.conversation import Message
from g4v.deepstack import (Level, capture_forward, describe_levels, greedy_continuation, kl_divergence,
                           next_token_probs)
from g4v.errors import G4VError, first_line
from g4v.images import open_image
from g4v.loading import read_raw_config

#: Per-level feature tolerance ``(atol, rtol)`` by dtype (see :class:`Tolerance` for the rule).
#: The reference is ``torch.testing.assert_close``'s defaults, read from the installed torch
#: (2.13, ``torch/testing/_comparison.py``, ``_DTYPE_PRECISIONS``): float32 atol 1e-5, rtol 1.3e-6;
#: float16 atol 1e-5, rtol 1e-3; bfloat16 atol 1e-5, rtol 1.6e-2. Those rtols allow one operation's
#: rounding; the features here come out of the vision tower, the Q-Formers and the projectors,
#: computed by two implementations with their own kernels and summation orders, so rtol is wider:
#: far wider in float32 (rounding accumulates over many steps, but a 0.1 % fault must still stand
#: out), less so in float16 and bfloat16 (their own rounding of every input already dominates).
#: atol stays torch's: it only matters where a whole token is near zero.
DEFAULT_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-5, 1e-2), torch.bfloat16: (1e-5, 5e-2)}
#: Trajectory points agree when the mean norms differ by at most this share (float32).
DEFAULT_TRAJECTORY_RTOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
_INSECURE = "VLLM_ALLOW_INSECURE_SERIALIZATION"


# ── vLLM, with a way into its workers ───────────────────────────────────────────────────────────


class VLLMProbe:
    """A ``vllm.LLM`` started for this tool, with the worker-side probes of :mod:`g4v.vllm_probe`.

    Prefix caching is off so that every request's prefill runs through every token (a cached prefix
    would skip the hooks); ``max_logprobs=-1`` lets a request ask for the full-vocabulary logprobs
    the KL needs. Like every vLLM engine it starts child processes with ``spawn``: scripts need the
    ``if __name__ == "__main__":`` guard.
    """

    def __init__(self, model: str, dtype: str = "float32", max_model_len: int = 4096,
                 max_num_batched_tokens: int | None = None):
        from g4v.engines import vllm_installed

        if not vllm_installed():
            raise G4VError("the port inspector needs vLLM: run it from the vLLM environment "
                           "(scripts/setup_vllm_cpu_env.sh, then .venv-vllm/bin/python -m g4v port-diff ...)")
        from g4v.engines.vllm_engine import VLLMSettings, engine_arguments
        from g4v.loading import resolve_source

        settings = VLLMSettings(dtype=dtype, max_model_len=max_model_len, enable_lora=False, max_images=1,
                                max_num_batched_tokens=max_num_batched_tokens or max_model_len)
        self.arguments = engine_arguments(resolve_source(model), settings)
        self.arguments.update(enable_prefix_caching=False, max_logprobs=-1)
        self._previous = os.environ.get(_INSECURE)
        os.environ[_INSECURE] = "1"  # see the module docstring: apply_model ships functions by pickle
        try:
            from vllm import LLM

            self.llm = LLM(**self.arguments)
        except Exception as err:  # vLLM reports load failures in many types; the caller reports it
            self._restore_env()
            raise G4VError(f"vLLM could not start: {first_line(err)}") from None

    def apply(self, func, **kwargs):
        """``func(model, **kwargs)`` in vLLM's worker; the first worker's answer."""
        return self.llm.apply_model(functools.partial(func, **kwargs) if kwargs else func)[0]

    def embed_levels(self, pixel_values: torch.Tensor, image_sizes: torch.Tensor) -> dict:
        from g4v import vllm_probe

        return self.apply(vllm_probe.embed_levels, pixel_values=pixel_values.detach().cpu(),
                          image_sizes=image_sizes.detach().cpu())

    def module_facts(self) -> dict:
        from g4v import vllm_probe

        return self.apply(vllm_probe.module_facts)

    def prefill(self, prompt: dict, expected_tokens: int) -> tuple[torch.Tensor | None, dict, list[int]]:
        """One prefill with hooks in the worker: per-token residual norms ``(layers + 1, tokens)``,
        the full-vocabulary logprobs of the next token ``{id: logprob}`` and vLLM's prompt token ids."""
        from vllm import SamplingParams

        from g4v import vllm_probe

        self.apply(vllm_probe.install_trajectory_hooks, expected_tokens=expected_tokens)
        try:
            output = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, logprobs=-1),
                                       use_tqdm=False)[0]
        finally:
            recorded = self.apply(vllm_probe.collect_trajectory)
        logprobs = {int(k): float(v.logprob) for k, v in output.outputs[0].logprobs[0].items()}
        return recorded["norms"], logprobs, list(output.prompt_token_ids)

    def greedy(self, prompt: dict, max_tokens: int, eos_token_id: int | None) -> list[int]:
        from vllm import SamplingParams

        if max_tokens <= 0:
            return []
        output = self.llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                   use_tqdm=False)[0]
        ids = list(output.outputs[0].token_ids)
        return ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids

    def _restore_env(self) -> None:
        if self._previous is None:
            os.environ.pop(_INSECURE, None)
        else:
            os.environ[_INSECURE] = self._previous

    def close(self) -> None:
        """Stop vLLM's engine-core and worker processes."""
        llm, self.llm = getattr(self, "llm", None), None
        try:
            if llm is not None:
                engine = getattr(llm, "llm_engine", None)
                shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None),
                                                                        "shutdown", None)
                if shutdown is not None:
                    shutdown()
                del llm
        finally:
            self._restore_env()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ── per-level features ──────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Tolerance:
    """When one level's features agree: elementwise ``|got - ref| <= atol + rtol * max(|ref|, rms)``.

    That is ``torch.testing.assert_close``'s rule with one change: ``|ref|`` is floored at the RMS of
    the token's reference features. Float rounding in a matrix product scales with the numbers an
    element was computed from, not with the element itself, so an element that happens to be near
    zero carries rounding of its token's size; with plain ``|ref|`` only ``atol`` covers it, and a
    fixed ``atol`` is too tight for large features and too loose for small ones. A fault (a level
    scaled, swapped or dropped) still shows on the elements that carry the token's weight.
    """

    atol: float
    rtol: float
    source: str  # where the numbers came from: a dtype's defaults, or given by the caller

    def allowed(self, ref: torch.Tensor) -> torch.Tensor:
        """The largest difference each element of ``ref`` (tokens, hidden) may show."""
        rms = ref.pow(2).mean(dim=-1, keepdim=True).sqrt() if ref.numel() else ref
        return self.atol + self.rtol * torch.maximum(ref.abs(), rms)

    def used(self, got: torch.Tensor, ref: torch.Tensor) -> float:
        """max over elements of |got - ref| / allowed: the level agrees when it is at most 1."""
        if not ref.numel():
            return 0.0
        diff = (got - ref).abs()
        # diff == 0 uses none of it, even where nothing is allowed (atol = rtol = 0: any other
        # difference is then infinitely over).
        return float(torch.where(diff == 0, 0.0, diff / self.allowed(ref)).max())

    def within(self, got: torch.Tensor, ref: torch.Tensor) -> bool:
        return got.shape == ref.shape and self.used(got, ref) <= 1.0

    def summary(self) -> dict:
        """For the JSON; ``rule`` is what the report and the picture print."""
        rule = f"|vLLM - transformers| <= {self.atol:g} + {self.rtol:g} * max(|transformers|, token RMS)"
        return {"atol": self.atol, "rtol": self.rtol, "source": self.source, "rule": rule}


def default_tolerance(dtype: torch.dtype, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The dtype's defaults (:data:`DEFAULT_TOLERANCE`), with ``atol`` / ``rtol`` overriding each
    side when given. Dtypes without an entry get the loosest one (bfloat16's)."""
    name = str(dtype).removeprefix("torch.")
    default_atol, default_rtol = DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE[torch.bfloat16])
    given = [flag for flag, value in (("atol", atol), ("rtol", rtol)) if value is not None]
    source = f"{name} defaults" if not given else f"{' and '.join(given)} given, {name} defaults otherwise"
    return Tolerance(_tolerance_value("atol", atol, default_atol), _tolerance_value("rtol", rtol, default_rtol), source)


def _tolerance_value(name: str, value, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise G4VError(f"{name} must be a number >= 0, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise G4VError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


@dataclass
class LevelDiff:
    name: str
    llm_layer: int
    kind: str
    ok: bool
    max_abs_diff: float | None  # None when the level is missing or shaped differently
    max_rel_diff: float | None  # max over tokens of ||vllm - ref|| / ||ref||
    mean_abs_diff: float | None
    reference_max_abs: float | None
    problem: str | None  # None when ok
    tolerance_used: float | None = None  # max |diff| / allowed (Tolerance.used); ok when <= 1
    token_diff: list[float] = field(default_factory=list)  # per image token: max |vllm - ref|

    def summary(self) -> dict:
        return {"name": self.name, "llm_layer": self.llm_layer, "kind": self.kind, "ok": self.ok,
                "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "mean_abs_diff": self.mean_abs_diff, "reference_max_abs": self.reference_max_abs,
                "tolerance_used": self.tolerance_used, "problem": self.problem}


def split_levels(packed: torch.Tensor, llm_layers: list[int], hidden: int) -> dict[int, torch.Tensor]:
    """vLLM's packed ``(tokens, hidden * levels)`` tensor -> ``{llm_layer: (tokens, hidden)}``, the
    way vLLM's ``embed_input_ids`` splits it (level ``i`` goes to ``llm_layers[i]``)."""
    if packed.shape[-1] != hidden * len(llm_layers):
        raise G4VError(f"vLLM packed {packed.shape[-1]} features per token, expected {hidden} x {len(llm_layers)} levels")
    return dict(zip(llm_layers, packed.split(hidden, dim=-1)))


def compare_levels(levels: list[Level], reference: dict[str, torch.Tensor], candidate: dict[int, torch.Tensor],
                   tolerance: Tolerance) -> list[LevelDiff]:
    """Each reference level (by name) against what vLLM injects at the same LLM layer.

    A level agrees when vLLM has it, with the same shape, and every element is within ``tolerance``.
    A level that fails is explained when possible: it matches *another* reference level (swapped),
    one side is zeros (dropped), or one factor explains the difference (scaled).
    """
    rows = []
    for level in levels:
        ref = reference.get(level.name)
        got = candidate.get(level.llm_layer)
        base = {"name": level.name, "llm_layer": level.llm_layer, "kind": level.kind}
        if ref is None or got is None:
            side = "transformers" if ref is None else "vLLM"
            rows.append(LevelDiff(**base, ok=False, max_abs_diff=None, max_rel_diff=None, mean_abs_diff=None,
                                  reference_max_abs=None,
                                  problem=f"{side} injects nothing at LLM layer {level.llm_layer}"))
            continue
        # Compare in the wider of the two dtypes (float64 references stay float64).
        dtype = torch.promote_types(torch.promote_types(ref.dtype, got.dtype), torch.float32)
        ref, got = ref.to(dtype), got.to(dtype)
        if ref.shape != got.shape:
            rows.append(LevelDiff(**base, ok=False, max_abs_diff=None, max_rel_diff=None, mean_abs_diff=None,
                                  reference_max_abs=float(ref.abs().max()) if ref.numel() else 0.0,
                                  problem=f"shape {tuple(got.shape)} in vLLM, {tuple(ref.shape)} in transformers"))
            continue
        diff = (got - ref).abs()
        token_diff = diff.amax(dim=-1) if diff.numel() else torch.zeros(0)
        ref_norm = torch.linalg.vector_norm(ref, dim=-1)
        rel = torch.linalg.vector_norm(got - ref, dim=-1) / ref_norm.clamp(min=1e-12)
        max_abs = float(diff.max()) if diff.numel() else 0.0
        used = tolerance.used(got, ref)
        ok = used <= 1.0
        problem = None if ok else _explain(got, ref, reference, level.name, max_abs, used, tolerance)
        rows.append(LevelDiff(**base, ok=ok, max_abs_diff=max_abs, max_rel_diff=float(rel.max()) if rel.numel() else 0.0,
                              mean_abs_diff=float(diff.mean()) if diff.numel() else 0.0,
                              reference_max_abs=float(ref.abs().max()) if ref.numel() else 0.0, problem=problem,
                              tolerance_used=used, token_diff=token_diff.float().tolist()))
    return rows


def _explain(got: torch.Tensor, ref: torch.Tensor, reference: dict[str, torch.Tensor], name: str, max_abs: float,
             used: float, tolerance: Tolerance) -> str:
    """One line on a level that does not agree: by how much, and the likeliest reason."""
    problem = f"differs by up to {max_abs:.3g}, {used:.3g}x what the tolerance allows"
    twin = next((other for other, features in reference.items()
                 if other != name and tolerance.within(got, features.to(got.dtype))), None)
    if twin:
        return problem + f"; vLLM's features here equal transformers' {twin} (levels swapped?)"
    if torch.count_nonzero(got) == 0:
        return problem + "; vLLM injects zeros here (level dropped?)"
    if torch.count_nonzero(ref) == 0:
        return problem + "; transformers injects zeros here (level dropped?)"
    # A uniform factor explains the difference when what is left after it is small.
    ratio = float((got * ref).sum() / (ref * ref).sum().clamp(min=1e-30))
    left = float(torch.linalg.vector_norm(got - ratio * ref) / torch.linalg.vector_norm(ref).clamp(min=1e-30))
    if left < 0.1 * abs(ratio - 1):
        problem += f"; vLLM's features are transformers' times {ratio:.6g} (scaled?)"
    return problem


# ── the residual trajectory ─────────────────────────────────────────────────────────────────────


def compare_trajectories(reference: torch.Tensor, candidate: torch.Tensor | None, image_mask: torch.Tensor,
                         injection_layers: dict[int, str], rtol: float) -> dict:
    """Per-token residual norms ``(layers + 1, tokens)`` of both sides -> the mean norm at image and
    text tokens per point, their relative differences and the first layer where they depart."""
    points = reference.shape[0]
    out = {"layers": list(range(points)), "injection_layers": {str(k): v for k, v in sorted(injection_layers.items())},
           "rtol": rtol}
    if candidate is None or candidate.shape != reference.shape:
        shape = None if candidate is None else list(candidate.shape)
        out.update(ok=False, problem=f"vLLM recorded residual norms of shape {shape}, transformers {list(reference.shape)}",
                   first_departure=None)
        return out
    rows = {}
    for side, norms in (("transformers", reference), ("vllm", candidate)):
        rows[side] = {"image_norm": _masked_means(norms, image_mask), "text_norm": _masked_means(norms, ~image_mask)}
    rel_image = [_rel(a, b) for a, b in zip(rows["vllm"]["image_norm"], rows["transformers"]["image_norm"])]
    rel_text = [_rel(a, b) for a, b in zip(rows["vllm"]["text_norm"], rows["transformers"]["text_norm"])]
    token_rel = ((candidate - reference).abs() / reference.abs().clamp(min=1e-12)).amax(dim=1).tolist()
    worst = [max(x for x in (a, b, c) if x is not None) for a, b, c in zip(rel_image, rel_text, token_rel)]
    first = next((layer for layer, value in enumerate(worst) if value > rtol), None)
    out.update({
        "transformers": rows["transformers"], "vllm": rows["vllm"],
        "rel_diff_image": rel_image, "rel_diff_text": rel_text, "max_token_rel_diff": token_rel,
        "max_rel_diff": max(worst) if worst else 0.0,
        "first_departure": first, "ok": first is None, "problem": None if first is None else
        f"residual norms depart at layer {first} by {worst[first]:.3g} (tolerance {rtol:.3g})",
    })
    return out


def _masked_means(norms: torch.Tensor, mask: torch.Tensor) -> list[float | None]:
    if not bool(mask.any()):
        return [None] * norms.shape[0]
    return norms[:, mask].mean(dim=1).tolist()


def _rel(a, b):
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(b), 1e-12)


# ── next token and continuation ─────────────────────────────────────────────────────────────────


def compare_next_token(reference_probs: torch.Tensor, vllm_logprobs: dict[int, float], tokenizer,
                       reference_ids: list[int], vllm_ids: list[int], k: int = 5) -> dict:
    """KL(transformers || vLLM) of the next-token distribution, the two top-5 lists and their
    overlap, and where the greedy continuations first differ."""
    vocab = reference_probs.numel()
    logp = torch.full((vocab,), -math.inf)
    for token, value in vllm_logprobs.items():
        if 0 <= token < vocab:
            logp[token] = value
    vllm_probs = torch.softmax(logp, dim=-1)  # renormalise (vLLM's logprobs are log-softmaxed already)
    covered = len([t for t in vllm_logprobs if 0 <= t < vocab])

    def top(probs):
        values, ids = torch.topk(probs, k=min(k, vocab))
        return [{"token_id": int(i), "text": tokenizer.decode([int(i)]), "prob": float(v)} for v, i in zip(values, ids)]

    top_ref, top_vllm = top(reference_probs), top(vllm_probs)
    overlap = len({t["token_id"] for t in top_ref} & {t["token_id"] for t in top_vllm})
    first = next((i for i, (a, b) in enumerate(zip(reference_ids, vllm_ids)) if a != b), None)
    if first is None and len(reference_ids) != len(vllm_ids):
        first = min(len(reference_ids), len(vllm_ids))
    return {
        "kl_divergence": kl_divergence(reference_probs.float(), vllm_probs),
        "kl_over": "full vocabulary" if covered == vocab else f"{covered} of {vocab} tokens",
        "top5_transformers": top_ref, "top5_vllm": top_vllm, "top5_overlap": overlap,
        "argmax_agrees": top_ref[0]["token_id"] == top_vllm[0]["token_id"],
        "continuation_transformers": tokenizer.decode(reference_ids, skip_special_tokens=True),
        "continuation_vllm": tokenizer.decode(vllm_ids, skip_special_tokens=True),
        "continuation_ids_transformers": reference_ids, "continuation_ids_vllm": vllm_ids,
        "first_divergence": first,
    }


# ── config audit ────────────────────────────────────────────────────────────────────────────────

_QFORMER_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                   "encoder_hidden_size", "cross_attention_frequency", "hidden_act", "layer_norm_eps")
#: Blip2QFormerConfig's defaults, for fields a checkpoint leaves out (what transformers would use).
_QFORMER_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "cross_attention_frequency": 2}


@dataclass
class ConfigAudit:
    rows: list[dict]  # field, checkpoint, transformers, vllm, ok, note
    source: str  # where the vLLM column comes from
    ok: bool
    message: str

    def summary(self) -> dict:
        return {"ok": self.ok, "message": self.message, "vllm_source": self.source, "fields": self.rows,
                "mismatches": [row["field"] for row in self.rows if row["ok"] is False]}


def static_vllm_facts(hf_config) -> dict:
    """What vLLM builds for one projector, from vLLM's own ``WindowQFormerDownsampler`` class built
    here without weights: the audit's fallback when vLLM's engine cannot load the checkpoint."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.granite4_vision import WindowQFormerDownsampler

    from g4v.vllm_probe import projector_facts

    with set_current_vllm_config(VllmConfig()), torch.device("meta"):
        projector = WindowQFormerDownsampler(hf_config)
    return {"projectors": projector_facts(projector)}


def audit_checkpoint(model: str | Path) -> ConfigAudit:
    """The config audit without starting anything: what vLLM's projector class builds for this
    checkpoint's config (no weights, no engine) against ``config.json``. Works for checkpoints vLLM
    cannot load at all; model-level fields that need the built model stay unchecked (``ok`` None)."""
    from transformers import AutoConfig

    from g4v.loading import resolve_source

    source = resolve_source(str(model))
    raw = read_raw_config(source)
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as err:  # noqa: BLE001 - transformers reports bad configs in many types
        raise G4VError(f"transformers could not read the config of {model}: {first_line(err)}") from None
    facts, where = _static_facts(config)
    return audit_config(raw, config, facts, where)


def audit_config(raw: dict, hf_config, vllm_facts: dict, source: str) -> ConfigAudit:
    """Every field that shapes the projectors or the injection: checkpoint (raw ``config.json``),
    transformers (the loaded config), vLLM (its built modules). ``ok`` compares vLLM with the
    checkpoint; ``None`` when vLLM's side could not be read."""
    rows = []
    raw_q = raw.get("qformer_config") or {}
    proj = vllm_facts.get("projectors", {})
    hf_q = getattr(hf_config, "qformer_config", None)
    for name in _QFORMER_FIELDS:
        ckpt = raw_q.get(name, _QFORMER_DEFAULTS.get(name))
        rows.append(_row(f"qformer_config.{name}", ckpt, getattr(hf_q, name, None), proj.get(f"qformer.{name}"),
                         "vLLM builds every Q-Former with fixed sizes, ignoring qformer_config"))
    rate = raw.get("downsample_rate")
    vllm_rate = f"{proj['query_side']}/{proj['window_side']}" if "query_side" in proj else None
    rows.append(_row("downsample_rate", rate, getattr(hf_config, "downsample_rate", None), vllm_rate,
                     "query side / window side of every window Q-Former"))
    vision = raw.get("vision_config") or {}
    text = raw.get("text_config") or {}
    rows.append(_row("text_config.hidden_size (projector output)", text.get("hidden_size"),
                     hf_config.text_config.hidden_size, proj.get("out_features")))
    model_fields = [
        ("deepstack_layer_map", _pairs(raw.get("deepstack_layer_map")), _pairs(hf_config.deepstack_layer_map),
         vllm_facts.get("deepstack_layer_map")),
        ("deepstack projectors", len(raw.get("deepstack_layer_map") or []), len(hf_config.deepstack_layer_map or []),
         vllm_facts.get("num_layerwise_projectors")),
        ("spatial_vision_layer", raw.get("spatial_vision_layer"), hf_config.spatial_vision_layer,
         vllm_facts.get("spatial_vision_layer")),
        ("spatial_target_layers", raw.get("spatial_target_layers"), list(hf_config.spatial_target_layers),
         vllm_facts.get("spatial_target_layers")),
        ("spatial projectors", len(raw.get("spatial_target_layers") or []), len(hf_config.spatial_target_layers),
         vllm_facts.get("num_spatial_projectors")),
        ("image_grid_pinpoints", _pairs(raw.get("image_grid_pinpoints")), _pairs(hf_config.image_grid_pinpoints),
         vllm_facts.get("image_grid_pinpoints")),
        ("vision_feature_select_strategy", raw.get("vision_feature_select_strategy"),
         hf_config.vision_feature_select_strategy, vllm_facts.get("vision_feature_select_strategy")),
        ("vision_config.num_hidden_layers", vision.get("num_hidden_layers"), hf_config.vision_config.num_hidden_layers,
         vllm_facts.get("vision_num_hidden_layers")),
        ("text_config.num_hidden_layers", text.get("num_hidden_layers"), hf_config.text_config.num_hidden_layers,
         vllm_facts.get("num_llm_layers")),
        ("image_newline size", text.get("hidden_size"), hf_config.text_config.hidden_size,
         vllm_facts.get("image_newline_size")),
    ]
    for name, ckpt, hf_value, vllm_value in model_fields:
        rows.append(_row(name, ckpt, hf_value, vllm_value))
    if "injection_layers" in vllm_facts:
        expected = [l for _, l in _pairs(raw.get("deepstack_layer_map"))] + list(raw.get("spatial_target_layers") or [])
        rows.append(_row("injection layers (derived)", expected, [lv.llm_layer for lv in _levels_or_empty(hf_config)],
                         vllm_facts["injection_layers"], "order of vLLM's packed levels"))
    bad = [row for row in rows if row["ok"] is False]
    unknown = [row for row in rows if row["ok"] is None]
    if bad:
        parts = [f"{row['field']}: checkpoint {row['checkpoint']!r}, vLLM built {row['vllm']!r}" for row in bad]
        message = f"vLLM does not honour {len(bad)} config field(s): " + "; ".join(parts)
    else:
        message = "vLLM's built modules match every audited config field"
    if unknown:
        message += f" ({len(unknown)} model-level field(s) not checked: {source})"
    return ConfigAudit(rows, source, not bad, message)


def _row(name, checkpoint, transformers, vllm, note=None) -> dict:
    ok = None if vllm is None or checkpoint is None else _same(checkpoint, vllm)
    return {"field": name, "checkpoint": checkpoint, "transformers": _plain(transformers), "vllm": vllm, "ok": ok,
            "transformers_ok": None if checkpoint is None else _same(checkpoint, _plain(transformers)),
            "note": note if ok is False else None}


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _pairs(value):
    return [list(map(int, pair)) for pair in value] if value is not None else None


def _levels_or_empty(hf_config) -> list[Level]:
    try:
        return describe_levels(hf_config)
    except G4VError:
        return []


# ── one run, end to end ─────────────────────────────────────────────────────────────────────────


@dataclass
class PortDiffResult:
    summary: dict  # what --json prints
    levels: list[LevelDiff]
    picture: Image.Image | None
    tokens: list[tuple[str, tuple]]  # (kind, box) per image token, for heatmaps
    figure: Image.Image | None = None  # drawn by :func:`draw_port_diff` (draw=True)


def reference_run(hf_engine, picture: Image.Image, prompt: str, max_new_tokens: int) -> dict:
    """The transformers side: inputs, per-level injected features, per-token residual norms, the
    next-token distribution and the greedy continuation, under the engine's lock."""
    model, tokenizer = hf_engine.model, hf_engine.tokenizer
    levels = describe_levels(model.config)
    inputs = hf_engine.prepare_inputs([Message("user", prompt, [picture])], max_new_tokens)
    with hf_engine._lock:
        capture, logits = capture_forward(model, inputs, full=True, levels=levels, logits_to_keep=1)
        ids = greedy_continuation(model, inputs, tokenizer, max_new_tokens, levels=levels) if max_new_tokens else []
    return {
        "inputs": inputs, "levels": levels, "capture": capture,
        "features": {cap.level.name: cap.injected for cap in capture.levels},
        "norms": torch.linalg.vector_norm(capture.residual_stream.float(), dim=-1),  # (layers + 1, seq)
        "probs": next_token_probs(logits), "continuation": ids,
    }


def run_port_diff(image, prompt: str, model: str | None = None, max_new_tokens: int = 16,
                  atol: float | None = None, rtol: float | None = None, trajectory_rtol: float | None = None,
                  hf_engine=None, probe: VLLMProbe | None = None, draw: bool = False) -> PortDiffResult:
    """Compare vLLM's port with transformers on one image and prompt (the CLI and an app tab call this).

    ``hf_engine`` (a transformers engine, float32 on the CPU by default) and ``probe`` (a
    :class:`VLLMProbe`) are reused when given, else started here (and the probe closed again).
    When vLLM cannot start on this checkpoint, the result still carries the config audit and says
    why (``summary["vllm_error"]``); only bad input raises :class:`G4VError`. ``atol`` and ``rtol``
    override the per-level tolerance's defaults for the model's dtype (:func:`default_tolerance`).
    """
    from g4v.engines.hf import TransformersEngine
    from g4v.loading import resolve_source
    from g4v.paths import default_model
    from g4v.tiling import plan_tiling

    if image is None:
        raise G4VError("the port inspector needs an image")
    if not str(prompt or "").strip():
        raise G4VError("the port inspector needs a prompt")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise G4VError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    default_tolerance(torch.float32, atol, rtol)  # bad values fail here, before any model loads
    picture = open_image(image)
    source = resolve_source(model or (hf_engine.info.model if hf_engine is not None else default_model()))
    raw = read_raw_config(source) if Path(source).is_dir() else None
    if hf_engine is None:
        try:
            hf_engine = TransformersEngine(source, device="cpu", dtype="float32")
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

    ref = reference_run(hf_engine, picture, prompt, max_new_tokens)
    plan = plan_tiling((picture.height, picture.width), config)
    tokens = [(token.kind, token.box) for token in plan.tokens]
    summary = {"model": source, "prompt": prompt, "image_size": [picture.height, picture.width],
               "dtype": str(dtype).removeprefix("torch."), "tolerance": tolerance.summary(),
               "num_image_tokens": ref["capture"].num_image_tokens, "num_text_tokens": ref["capture"].num_text_tokens,
               "vllm_error": None}

    own_probe = probe is None
    try:
        if own_probe:
            try:
                probe = VLLMProbe(source, dtype=str(dtype).removeprefix("torch."))
            except G4VError as err:
                facts, where = _static_facts(config)
                audit = audit_config(raw, config, facts, where)
                summary.update(vllm_error=str(err), levels=[], trajectory=None, next_token=None,
                               config_audit=audit.summary(), ok=False)
                summary["message"] = f"{err}. Config audit: {audit.message}"
                return _finish(PortDiffResult(summary, [], picture, tokens), draw)
        facts = probe.module_facts()
        audit = audit_config(raw, config, facts, "vLLM's built modules (inside its worker)")
        inputs = ref["inputs"]
        embedded = probe.embed_levels(inputs["pixel_values"], inputs["image_sizes"])
        vllm_levels = split_levels(embedded["packed"][0], embedded["llm_layers"], embedded["hidden"])
        level_rows = compare_levels(ref["levels"], ref["features"], vllm_levels, tolerance)

        prompt_dict = {"prompt": hf_engine.render_prompt([Message("user", prompt, [picture])]),
                       "multi_modal_data": {"image": [picture]}}
        expected = int(inputs["input_ids"].shape[1])
        norms, logprobs, vllm_prompt_ids = probe.prefill(prompt_dict, expected)
        same_prompt = vllm_prompt_ids == inputs["input_ids"][0].tolist()
        trajectory = compare_trajectories(ref["norms"], norms if same_prompt else None, ref["capture"].image_mask,
                                          ref["capture"].trajectory.injection_layers, trajectory_rtol)
        if not same_prompt:
            trajectory["problem"] = (f"vLLM's prompt has {len(vllm_prompt_ids)} tokens, transformers' {expected} "
                                     "(or different ids): image placeholders were expanded differently")
        vllm_ids = probe.greedy(prompt_dict, max_new_tokens, hf_engine.tokenizer.eos_token_id)
        next_token = compare_next_token(ref["probs"], logprobs, hf_engine.tokenizer, ref["continuation"], vllm_ids)
        next_token["prompt_token_ids_equal"] = same_prompt
    finally:
        if own_probe and probe is not None:
            probe.close()

    summary.update(levels=[row.summary() for row in level_rows], trajectory=trajectory, next_token=next_token,
                   config_audit=audit.summary())
    summary["ok"] = all(row.ok for row in level_rows) and bool(trajectory.get("ok")) and audit.ok
    failing = [row.name for row in level_rows if not row.ok]
    summary["message"] = "; ".join(filter(None, [
        f"levels that differ: {', '.join(failing)}" if failing else "all levels agree",
        trajectory.get("problem"), None if audit.ok else audit.message,
        None if next_token["first_divergence"] is None else f"greedy continuations differ from token {next_token['first_divergence']}",
    ]))
    return _finish(PortDiffResult(summary, level_rows, picture, tokens), draw)


def _unloadable(source: str, prompt: str, picture: Image.Image, error: str) -> PortDiffResult:
    audit = audit_checkpoint(source)
    summary = {"model": source, "prompt": prompt, "image_size": [picture.height, picture.width], "tolerance": None,
               "vllm_error": None, "load_error": error, "levels": [], "trajectory": None, "next_token": None,
               "config_audit": audit.summary(), "ok": False,
               "message": f"could not load the checkpoint ({error}). Config audit: {audit.message}"}
    return PortDiffResult(summary, [], picture, [])


def _static_facts(config) -> tuple[dict, str]:
    try:
        return static_vllm_facts(config), "Q-Former sizes from vLLM's projector class built here, without an engine"
    except Exception as err:  # noqa: BLE001 - the audit must still come back
        return {}, f"vLLM did not start and its projector could not be built here ({first_line(err)})"


def _finish(result: PortDiffResult, draw: bool) -> PortDiffResult:
    if draw:
        result.figure = draw_port_diff(result)
    return result


def draw_port_diff(result: PortDiffResult) -> Image.Image:
    """Per-level difference heatmaps over the picture, the per-level bars and the trajectories."""
    from viz.port import port_diff_figure

    token_diff = {row.name: row.token_diff for row in result.levels if row.token_diff}
    return port_diff_figure(result.picture, result.tokens, result.summary, token_diff)
