"""The config audit of the port inspector: does vLLM build what the checkpoint's config asks for?

Every config field that shapes the projectors or the injection, as the raw ``config.json`` says, as
transformers loaded it, and as vLLM actually built its modules. vLLM builds every Q-Former with
fixed sizes (1 layer, intermediate 3072, hidden/64 heads) whatever ``qformer_config`` says; such a
checkpoint is reported field by field. When vLLM cannot even load it (weights of the wrong shape),
the audit is still produced, from a projector built here by vLLM's own class
(:func:`audit_without_engine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from g4v.errors import G4VError, first_line
from g4v.model.levels import Level, describe_levels
from g4v.loading import read_raw_config
from g4v.model.records import Record

_QFORMER_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                   "encoder_hidden_size", "cross_attention_frequency", "hidden_act", "layer_norm_eps")
#: Blip2QFormerConfig's defaults, for fields a checkpoint leaves out (what transformers would use).
_QFORMER_DEFAULTS = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "cross_attention_frequency": 2}


@dataclass
class AuditRow(Record):
    """One config field as the checkpoint, transformers and vLLM have it; ``ok`` compares vLLM with
    the checkpoint (None when vLLM's side could not be read)."""

    field: str
    checkpoint: object
    transformers: object
    vllm: object
    ok: bool | None
    transformers_ok: bool | None
    note: str | None  # why vLLM departs, when it does


@dataclass(kw_only=True)
class ConfigAudit(Record):
    ok: bool
    message: str
    vllm_source: str  # where the vLLM column comes from
    fields: list[AuditRow]

    @property
    def mismatches(self) -> list[str]:
        return [row.field for row in self.fields if row.ok is False]

    def to_dict(self) -> dict:
        return {**super().to_dict(), "mismatches": self.mismatches}


def static_vllm_facts(hf_config) -> dict:
    """What vLLM builds for one projector, from vLLM's own ``WindowQFormerDownsampler`` class built
    here without weights: the audit's fallback when vLLM's engine cannot load the checkpoint."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.granite4_vision import WindowQFormerDownsampler

    from g4v.port.worker import projector_facts

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
    return audit_without_engine(raw, config)


def audit_without_engine(raw: dict, hf_config) -> ConfigAudit:
    """The audit when vLLM's engine is not running (it could not start, or was never asked to):
    vLLM's side comes from its projector class built here (:func:`static_vllm_facts`)."""
    facts, where = _static_facts(hf_config)
    return audit_config(raw, hf_config, facts, where)


def _static_facts(config) -> tuple[dict, str]:
    try:
        return static_vllm_facts(config), "Q-Former sizes from vLLM's projector class built here, without an engine"
    except Exception as err:  # noqa: BLE001 - the audit must still come back
        return {}, f"vLLM did not start and its projector could not be built here ({first_line(err)})"


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
    bad = [row for row in rows if row.ok is False]
    unknown = [row for row in rows if row.ok is None]
    if bad:
        parts = [f"{row.field}: checkpoint {row.checkpoint!r}, vLLM built {row.vllm!r}" for row in bad]
        message = f"vLLM does not honour {len(bad)} config field(s): " + "; ".join(parts)
    else:
        message = "vLLM's built modules match every audited config field"
    if unknown:
        message += f" ({len(unknown)} model-level field(s) not checked: {source})"
    return ConfigAudit(ok=not bad, message=message, vllm_source=source, fields=rows)


def _row(name, checkpoint, transformers, vllm, note=None) -> AuditRow:
    ok = None if vllm is None or checkpoint is None else _same(checkpoint, vllm)
    return AuditRow(name, checkpoint, _plain(transformers), vllm, ok,
                    None if checkpoint is None else _same(checkpoint, _plain(transformers)), note if ok is False else None)


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
