"""The port inspector's vision LoRA audit: does each side run the model the checkpoint describes?

A checkpoint in the real layout (:mod:`g4v.checkpoint.vision_lora`) is the vision model only with its
LoRA applied. The comparison runs transformers in one mode and vLLM with the LoRA arguments a user
serves it with (``serving``: ``enable_lora``, ``max_lora_rank``, ``default_mm_loras``,
``hf_overrides``...; by default g4v's own recipe for the mode). vLLM is given exactly those
arguments, so what it serves is what that command line would serve, and :func:`findings` names,
one line each (what is wrong, what to do), the settings under which the two sides are not the same
model:

* (a) one side applies the vision LoRA and the other does not (``vision-lora=off`` on one side, or
  vLLM without ``enable_lora`` or without an image entry in ``default_mm_loras``): image requests
  on that side get the base language model;
* (b) ``hf_overrides`` with ``adapter_path``: vLLM 0.32's ``granite4_vision.py`` offers it in its
  docstring as a full merge, but no code of that file reads it, so vLLM serves the base weights;
* (c) ``max_lora_rank`` below the adapter's rank: vLLM refuses to load the LoRA and the requests
  that carry it fail (the comparison then runs vLLM without it, and says so); written without
  ``enable_lora``, it is a finding too (it fails as soon as the LoRA is switched on).

A folder the app may not hand vLLM is refused (:func:`check_serving`), and the app's audit shows
every refusal beside every finding of the rest, not the first refusal alone.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from g4v.checkpoint.vision_lora import VisionLora, lora_rank_slot
from g4v.errors import G4VError
from g4v.model.records import Record

#: The LoRA engine arguments a user may hand the vLLM side (vLLM's own names).
SERVING_KEYS = {"enable_lora": bool, "max_lora_rank": int, "max_loras": int, "default_mm_loras": dict,
                "hf_overrides": dict}

#: vLLM's own ``max_lora_rank`` when the arguments leave it out (``LoRAConfig``).
VLLM_MAX_LORA_RANK = 16
_KINDS = {bool: "true or false", int: "a whole number", dict: "a JSON object"}


#: The longest text of vLLM's LoRA arguments read (a few keys and one folder name each).
MAX_SERVING_CHARS = 4096


def parse_serving(text: str | None, name: str = "--vllm-serving") -> dict | None:
    """``--vllm-serving``'s JSON object, checked: only :data:`SERVING_KEYS`, each of its type
    (``name``: what the one-line refusals call it; the app's box has no flag)."""
    if text is None:
        return None
    if len(text) > MAX_SERVING_CHARS:
        raise G4VError(f"{name} is too long: {len(text):,} characters (vLLM's LoRA arguments take at most "
                       f"{MAX_SERVING_CHARS:,})")
    try:
        serving = json.loads(text)
    except ValueError:
        raise G4VError(f"{name} must be a JSON object, e.g. '{{\"enable_lora\": true, \"max_lora_rank\": 256}}'") from None
    except RecursionError:  # "[" * 100000: json's parser recurses per bracket
        raise G4VError(f"{name} is nested too deeply: vLLM's LoRA arguments are a flat JSON object") from None
    if not isinstance(serving, dict):
        raise G4VError(f"{name} must be a JSON object of vLLM's LoRA arguments")
    for key, value in serving.items():
        kind = SERVING_KEYS.get(key)
        if kind is None:
            raise G4VError(f"{name}: {key!r} is not one of {', '.join(SERVING_KEYS)}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise G4VError(f"{name}: {key} must be {_KINDS[kind]}")
    return serving


#: The keys of ``serving`` whose values are folders (``default_mm_loras``' entries, ``hf_overrides``'
#: ``adapter_path``): the app takes there only the checkpoint's own folder, by its name.
PATH_KEYS = {"default_mm_loras": None, "hf_overrides": "adapter_path"}


def confine_serving(serving: dict | None, folder: Path | None, name: str = "the vLLM LoRA arguments") -> dict | None:
    """``serving`` for a server that must not load what a visitor names: every folder in it (an
    image entry of ``default_mm_loras``, ``hf_overrides``' ``adapter_path``) may only be the
    checkpoint's folder, written as its name (``folder.name``; the page never shows server paths),
    and is given to vLLM as that folder; ``hf_overrides`` takes no other key (it rewrites the
    model's config; ``folder`` None: a model without a local folder, which takes no folder). Anything
    else is one line (every refusal of :func:`check_serving` in it)."""
    confined, refusals = check_serving(serving, folder)
    if refusals:
        raise G4VError(f"{name}: " + "; ".join(refusals))
    return confined


def check_serving(serving: dict | None, folder: Path | None) -> tuple[dict | None, list[str]]:
    """``serving`` confined as :func:`confine_serving` says, and every refusal at once (a list, so
    the audit can show them beside its findings instead of the first alone). The confined dict
    leaves out a refused ``default_mm_loras`` entry (vLLM would not get it) and keeps a refused
    ``adapter_path`` as written (the audit still flags adapter_path itself); with any refusal it is
    for the audit only, never for vLLM."""
    if serving is None:
        return None, []
    confined, refusals = dict(serving), []

    def own(value, where: str) -> str | None:
        if folder is None:
            refusals.append(f"{where} names a folder, and this model has no local folder")
        elif value != folder.name:
            refusals.append(f"{where} may only name this checkpoint's folder, {folder.name!r}")
        else:
            return str(folder)
        return None

    if serving.get("default_mm_loras") is not None:
        entries = {modality: own(value, f"default_mm_loras' {modality!r} entry")
                   for modality, value in serving["default_mm_loras"].items()}
        confined["default_mm_loras"] = {modality: path for modality, path in entries.items() if path is not None}
    if serving.get("hf_overrides") is not None:
        extra = set(serving["hf_overrides"]) - {"adapter_path"}
        if extra:
            refusals.append(f"hf_overrides takes only adapter_path here, not {', '.join(sorted(extra))}")
        if "adapter_path" in serving["hf_overrides"]:
            given = serving["hf_overrides"]["adapter_path"]
            confined["hf_overrides"] = {"adapter_path": own(given, "adapter_path") or given}
        else:
            confined["hf_overrides"] = {}
    return confined, refusals


def recipe(lora: VisionLora | None, mode: str) -> dict:
    """g4v's own LoRA arguments for the vLLM side: native serves the LoRA to image requests, as
    vLLM's docstring recipe (``--enable-lora --max-lora-rank R --default-mm-loras``); merged and
    off need none."""
    if lora is None or mode != "native":
        return {}
    return {"enable_lora": True, "max_lora_rank": lora_rank_slot(lora.rank),
            "default_mm_loras": {"image": str(lora.folder)}}


def _image_lora(serving: dict, lora: VisionLora) -> bool:
    path = (serving.get("default_mm_loras") or {}).get("image")
    return path is not None and Path(path).expanduser().resolve() == lora.folder.resolve()


def _rank_too_small(serving: dict, lora: VisionLora) -> bool:
    return bool(serving.get("enable_lora")) and serving.get("max_lora_rank", VLLM_MAX_LORA_RANK) < lora.rank


def vllm_applies(lora: VisionLora | None, mode: str, serving: dict) -> tuple[bool, str]:
    """Whether vLLM applies the vision LoRA to image requests under ``serving``, and if not, why."""
    if lora is None:
        return False, "the checkpoint has none"
    if mode == "merged":
        return True, ""
    if mode == "off":
        return False, "vision-lora=off"
    if not serving.get("enable_lora"):
        return False, "enable_lora is off"
    if not _image_lora(serving, lora):
        return False, "default_mm_loras has no image entry naming the checkpoint's folder"
    if _rank_too_small(serving, lora):
        return False, f"max_lora_rank {serving.get('max_lora_rank', VLLM_MAX_LORA_RANK)} is below its rank"
    return True, ""


def runnable(lora: VisionLora | None, serving: dict) -> dict:
    """The arguments vLLM is started with: ``serving``, without an image LoRA vLLM would refuse
    (finding (c)): its requests would fail, so the comparison runs without it."""
    if lora is not None and _rank_too_small(serving, lora) and _image_lora(serving, lora):
        return {**serving, "default_mm_loras": None}
    return dict(serving)


def findings(lora: VisionLora | None, transformers_mode: str, vllm_mode: str, serving: dict) -> list[str]:
    """One line per setting that makes the two sides different models (see the module docstring)."""
    lines = []
    if (serving.get("hf_overrides") or {}).get("adapter_path") is not None:
        lines.append("hf_overrides adapter_path is read by no code in vLLM 0.32's granite4_vision (only its docstring "
                     "names it): vLLM serves the weights as they are, without the LoRA; serve a merged copy "
                     "(python -m g4v merge-lora)" + (f" or {_native_flags(lora)}" if lora is not None else ""))
    if lora is None:
        return lines
    if vllm_mode == "native" and _rank_too_small(serving, lora):
        lines.append(f"max_lora_rank {serving.get('max_lora_rank', VLLM_MAX_LORA_RANK)} is below the vision LoRA's rank {lora.rank}: "
                     f"vLLM refuses to load it and image requests fail (compared here without it); use "
                     f"--max-lora-rank {lora_rank_slot(lora.rank)}")
        return lines
    if vllm_mode == "native" and serving.get("max_lora_rank", lora.rank) < lora.rank:  # written, LoRA not on yet
        lines.append(f"max_lora_rank {serving['max_lora_rank']} is below the vision LoRA's rank {lora.rank}: once "
                     f"enable_lora is on, vLLM refuses to load it; use --max-lora-rank {lora_rank_slot(lora.rank)}")
    on_vllm, why = vllm_applies(lora, vllm_mode, serving)
    on_transformers = transformers_mode != "off"
    if on_transformers and not on_vllm:
        lines.append(f"vLLM does not apply the checkpoint's vision LoRA ({why}): its image requests get the base "
                     f"language model; serve it with {_native_flags(lora)}, or a merged copy (python -m g4v merge-lora)")
    elif on_vllm and not on_transformers:
        lines.append("transformers does not apply the checkpoint's vision LoRA (vision-lora=off) while vLLM does: "
                     "the sides are different models; apply it on the transformers side too (vision LoRA native or merged)")
    return lines


def _native_flags(lora: VisionLora) -> str:
    return (f"--enable-lora --max-lora-rank {lora_rank_slot(lora.rank)} "
            f"--default-mm-loras '{{\"image\": \"{lora.folder}\"}}'")


@dataclass
class LoraCheckpoint(Record):
    """The checkpoint's vision LoRA, as the summary names it."""

    rank: int
    alpha: float
    modules: int  # how many modules it adapts


@dataclass(kw_only=True)
class VisionLoraSummary(Record):
    """The ``vision_lora`` block of the port-diff summary: both sides' settings, and the findings
    under which they are not the same model."""

    checkpoint: LoraCheckpoint | None  # None: the checkpoint has no vision LoRA
    transformers: str  # each side's mode
    vllm: str
    vllm_serving: dict | None  # vLLM's LoRA arguments
    vllm_applies: bool
    findings: list[str]
    ok: bool


def summary(lora: VisionLora | None, transformers_mode: str, vllm_mode: str, serving: dict) -> VisionLoraSummary:
    """The ``vision_lora`` block of the port-diff summary."""
    found = findings(lora, transformers_mode, vllm_mode, serving)
    return VisionLoraSummary(
        checkpoint=None if lora is None else LoraCheckpoint(lora.rank, lora.alpha, len(lora.modules)),
        transformers=transformers_mode, vllm=vllm_mode, vllm_serving=serving,
        vllm_applies=vllm_applies(lora, vllm_mode, serving)[0], findings=found, ok=not found)
