"""Precision arms: the model in another dtype or with int8 weights, and how far that moves it from
float32, level by level.

A :class:`Precision` names what an engine runs in: a dtype (float32, bfloat16, float16) and
optionally ``quant="int8"``, the linear layers' weights stored as int8 with one float scale per
output channel (torchao's ``Int8WeightOnlyConfig``; activations stay in the dtype), with the vision
tower and projectors quantized too or kept (``quant_vision``). Why torchao: it is PyTorch's own
quantization library, the one ``torch.ao.quantization`` points to (torch 2.13 warns that its
``quantize_dynamic`` "is deprecated and will be removed"); its int8 weight-only path is plain
PyTorch, so it runs on this CPU (its CUDA kernels are not needed) and on a GPU alike.

:func:`precision_drift` runs one request through a float32 reference engine and a candidate engine,
captures what each injects at the 8 levels (:mod:`g4v.model.capture`) and compares them with the
workbench's one feature comparison (:func:`g4v.model.drift.feature_drift`, which the port inspector
uses too), plus the next-token KL (:func:`g4v.model.scoring.kl_divergence`).
"""

from __future__ import annotations  # torch in annotations only: the precision flags import Precision without it

import importlib.util
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from g4v.errors import G4VError, quoted
from g4v.model.levels import Level, describe_levels
from g4v.model.records import Record

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
#: What ``dtype=`` also takes, by the names torch and the loaders use.
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
QUANTS = ("int8",)
#: The pinned quantization library (requirements.txt) and what ``quant=int8`` runs in it.
QUANT_LIBRARY = "torchao==0.18.0"
#: Names of the language model's own modules; every other module (the vision tower, the deepstack
#: and spatial projectors) is the vision part that ``quant_vision`` keeps or quantizes.
LANGUAGE_PREFIXES = ("model.language_model.", "language_model.", "lm_head")
YES, NO = ("yes", "true", "on", "1"), ("no", "false", "off", "0")


@dataclass(frozen=True)
class Precision:
    """What an engine runs in. ``dtype`` None: the engine's default (float32 on a CPU)."""

    dtype: str | None = field(default=None, metadata={
        "help": f"the candidate's dtype: {', '.join(DTYPES)} (default: bfloat16 unless --quant is given, then float32)"})
    quant: str | None = field(default=None, metadata={
        "help": "int8: the linear layers' weights in int8 (torchao weight-only, one scale per output channel)"})
    quant_vision: bool = field(default=True, metadata={
        "help": "with --quant: quantize the vision tower and projectors too (--no-quant-vision keeps them)"})

    @property
    def label(self) -> str:
        """``float32``, ``bfloat16``, ``int8 (vision kept in float32)``..."""
        dtype = self.dtype or "float32"
        if not self.quant:
            return dtype
        return f"{self.quant} weights" + ("" if self.quant_vision else f", vision kept in {dtype}") + \
            ("" if dtype == "float32" else f", {dtype} activations")

    def to_dict(self) -> dict:
        return {"dtype": self.dtype or "float32", "quant": self.quant, "quant_vision": self.quant_vision,
                "label": self.label}


def check_dtype(value: str) -> str:
    name = DTYPE_ALIASES.get(str(value).strip().lower(), str(value).strip().lower())
    if name not in DTYPES:
        raise G4VError(f"dtype must be one of {', '.join(DTYPES)}, got {quoted(value)}")
    return name


def check_quant(value: str) -> str:
    name = str(value).strip().lower()
    if name not in QUANTS:
        raise G4VError(f"quant must be {' or '.join(QUANTS)} (torchao int8 weight-only), got {quoted(value)}")
    return name


def check_yes_no(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in YES or word in NO:
        return word in YES
    raise G4VError(f"{name} must be yes or no, got {quoted(value)}")


def check_precision(dtype=None, quant=None, quant_vision=None) -> Precision:
    """The checked :class:`Precision` from typed values (one line naming a bad one)."""
    if quant_vision is not None and quant is None:
        raise G4VError("quant-vision= says what quant= does to the vision part: give quant=int8 with it")
    return Precision(dtype=check_dtype(dtype) if dtype else None, quant=check_quant(quant) if quant else None,
                     quant_vision=True if quant_vision is None else check_yes_no("quant-vision", quant_vision))


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def require_quant_library(quant: str | None, what: str = "") -> None:
    """Refuse ``quant`` in one line where torchao is missing, before any model loads."""
    if quant and not torchao_installed():
        raise G4VError(f"{what}quant={quant} needs torchao: pip install {QUANT_LIBRARY}")


# ── quantizing ──────────────────────────────────────────────────────────────────────────────────


def is_vision_module(name: str) -> bool:
    """Whether the module called ``name`` belongs to the vision tower or the projectors."""
    return not name.startswith(LANGUAGE_PREFIXES)


def quantize_model(model: torch.nn.Module, quant: str, vision: bool = True) -> list[str]:
    """Quantize ``model``'s linear layers in place (``vision=False`` keeps the vision tower and the
    projectors); returns the names of the quantized layers. LoRA matrices (a vision LoRA in native
    mode, a user's adapter) stay in the model's dtype: they are small, and PEFT adds their product
    to the quantized base layer's output."""
    require_quant_library(check_quant(quant))
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    chosen = [name for name, module in model.named_modules()
              if _quantizable(name, module) and (vision or not is_vision_module(name))]
    wanted = set(chosen)
    # torchao replaces a Parameter; a tied weight (lm_head = embeddings) must stop being shared first,
    # or the embedding table would be quantized with it.
    kept = {id(module.weight) for name, module in model.named_modules()
            if name not in wanted and isinstance(getattr(module, "weight", None), torch.Tensor)}
    for name in chosen:
        module = model.get_submodule(name)
        if id(module.weight) in kept:
            module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)
    with torch.no_grad():
        quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda module, name: name in wanted)
    return chosen


def _quantizable(name: str, module: torch.nn.Module) -> bool:
    import torch

    return type(module) is torch.nn.Linear and "lora_" not in name


def quantized_layers(model: torch.nn.Module) -> list[str]:
    """Names of the linear layers whose weight is an int8 tensor (what :func:`quantize_model` made)."""
    import torch

    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and is_int8(module.weight)]


def is_int8(weight: torch.Tensor) -> bool:
    """Whether a weight is stored as int8 (torchao's ``Int8Tensor``, its data in ``qdata``)."""
    import torch

    data = getattr(weight, "qdata", None)
    return isinstance(data, torch.Tensor) and data.dtype == torch.int8


# ── drift against float32 ───────────────────────────────────────────────────────────────────────


@dataclass
class LevelDrift:
    """One level of the candidate against the reference (see :class:`g4v.model.drift.FeatureDrift`)."""

    name: str
    llm_layer: int
    kind: str
    rel_error: float
    max_token_rel_error: float
    cosine: float
    min_cosine: float
    max_abs_diff: float
    reference_max_abs: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class DriftReport:
    """A candidate precision against the float32 reference on one request."""

    reference: Precision
    candidate: Precision
    levels: list[LevelDrift]  # the 8 injections (empty without a picture)
    next_token_kl: float  # KL(reference || candidate) of the next-token distribution, nats
    argmax_agrees: bool
    reference_token: str
    candidate_token: str
    quantized_layers: int = 0  # linear layers with int8 weights in the candidate
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"reference": self.reference.to_dict(), "candidate": self.candidate.to_dict(),
                "levels": [level.to_dict() for level in self.levels], "next_token_kl": self.next_token_kl,
                "argmax_agrees": self.argmax_agrees, "reference_token": self.reference_token,
                "candidate_token": self.candidate_token, "quantized_layers": self.quantized_layers,
                "notes": self.notes}


def level_drift(levels: list[Level], reference: dict[str, torch.Tensor], candidate: dict[str, torch.Tensor]
                ) -> list[LevelDrift]:
    """Each level's candidate features ``(image tokens, hidden)`` against the reference's, by name."""
    from g4v.model.drift import feature_drift

    rows = []
    for level in levels:
        ref, got = reference.get(level.name), candidate.get(level.name)
        if ref is None or got is None:
            continue
        if ref.shape != got.shape:
            raise G4VError(f"level {level.name}: {tuple(got.shape)} features against {tuple(ref.shape)} in float32")
        drift = feature_drift(got, ref)
        rows.append(LevelDrift(level.name, level.llm_layer, level.kind, drift.rel_error, drift.max_token_rel_error,
                               drift.cosine, drift.min_cosine, drift.max_abs_diff, drift.reference_max_abs))
    return rows


def injected_features(engine, request, adapter: str | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One instrumented forward pass of a transformers engine on ``request`` (messages or a prepared
    request): ``({level name: injected (image tokens, hidden)}, next-token log-probabilities (vocab,))``."""
    from g4v.model.capture import capture_forward
    from g4v.model.scoring import next_token_logprobs

    prepared = engine.prepare(request)
    with engine.adapter_scope(adapter, image=prepared.has_image) as model:
        capture, logits = capture_forward(model, prepared.inputs, full=True, levels=describe_levels(model.config),
                                          logits_to_keep=1)
    return {cap.level.name: cap.injected for cap in capture.levels}, next_token_logprobs(logits)


def engine_drift(reference_engine, reference_request, candidate_engine, candidate_request,
                 reference_adapter: str | None = None, candidate_adapter: str | None = None
                 ) -> tuple[list[LevelDrift], float, int, int]:
    """The candidate engine against the reference on the same request, each prepared by its own
    engine (pixel values in its dtype): ``(per-level drift, next-token KL(reference || candidate),
    reference's top token id, candidate's)``."""
    from g4v.model.scoring import kl_divergence

    ref_features, ref_logprobs = injected_features(reference_engine, reference_request, reference_adapter)
    got_features, got_logprobs = injected_features(candidate_engine, candidate_request, candidate_adapter)
    levels = describe_levels(reference_engine.model.config)
    kl = float(kl_divergence(ref_logprobs.double(), got_logprobs.double()))
    return (level_drift(levels, ref_features, got_features), kl, int(ref_logprobs.argmax()),
            int(got_logprobs.argmax()))


def precision_drift(reference_engine, candidate_engine, request, reference: Precision, candidate: Precision,
                    adapter: str | None = None) -> DriftReport:
    """``candidate_engine`` against ``reference_engine`` (the same checkpoint, float32) on one
    request (messages): per-level drift of the injected features and the next-token KL."""
    levels, kl, ref_top, got_top = engine_drift(reference_engine, request, candidate_engine, request, adapter, adapter)
    tokenizer = reference_engine.tokenizer
    return DriftReport(reference, candidate, levels, kl, ref_top == got_top, tokenizer.decode([ref_top]),
                       tokenizer.decode([got_top]), len(quantized_layers(candidate_engine.model)))


def row_drift(levels: list[LevelDrift], kl: float) -> dict:
    """What a dataset run keeps per row (:func:`drift_summary` reads it back)."""
    return {"levels": {level.name: {"rel_error": level.rel_error, "cosine": level.cosine} for level in levels},
            "next_token_kl": kl}


# ── over a dataset ──────────────────────────────────────────────────────────────────────────────


@dataclass
class LevelDriftStats(Record):
    """One level's drift over a dataset's rows: the mean and largest relative error
    ``||B - A|| / ||A||`` of its injected features, the mean and smallest cosine."""

    rel_error_mean: float
    rel_error_max: float
    cosine_mean: float
    cosine_min: float


@dataclass
class DriftSummary(Record):
    """Per-level means over ``n`` rows of a precision pair (:func:`drift_summary`), levels in the
    order the rows name them, and the mean next-token KL(A || B) in nats."""

    n: int
    levels: dict[str, LevelDriftStats]
    next_token_kl_mean: float


def drift_summary(per_row: list[dict]) -> DriftSummary | None:
    """Per-level means over rows of ``{"levels": {name: {"rel_error", "cosine"}}, "next_token_kl"}``
    (what Evaluate stores per row); None without rows."""
    if not per_row:
        return None
    names = list(dict.fromkeys(name for row in per_row for name in row["levels"]))
    levels = {}
    for name in names:
        rel = [row["levels"][name]["rel_error"] for row in per_row if name in row["levels"]]
        cos = [row["levels"][name]["cosine"] for row in per_row if name in row["levels"]]
        levels[name] = LevelDriftStats(rel_error_mean=math.fsum(rel) / len(rel), rel_error_max=max(rel),
                                       cosine_mean=math.fsum(cos) / len(cos), cosine_min=min(cos))
    kls = [row["next_token_kl"] for row in per_row]
    return DriftSummary(len(per_row), levels, math.fsum(kls) / len(kls))


#: The columns of :func:`drift_rows`: the CLI's drift table and the Evaluate tab's.
DRIFT_HEADERS = ["level", "rel err mean", "rel err max", "cosine mean", "cosine min"]


def drift_title(drift: DriftSummary) -> str:
    """The line above the per-level drift table of a dataset run (its summary's ``level_drift``)."""
    return (f"per-level drift of B against A over {drift.n} rows (relative error ||B - A|| / ||A||, cosine), "
            f"next-token KL(A||B) mean {drift.next_token_kl_mean:.3g}")


def drift_rows(drift: DriftSummary) -> list[list[str]]:
    """One row of cells per level (:data:`DRIFT_HEADERS`), formatted once for the CLI and the tab:
    errors to 3 significant digits, cosines to 6 decimals (bf16 keeps them near 1)."""
    return [[name, f"{level.rel_error_mean:.3g}", f"{level.rel_error_max:.3g}", f"{level.cosine_mean:.6f}",
             f"{level.cosine_min:.6f}"] for name, level in drift.levels.items()]
