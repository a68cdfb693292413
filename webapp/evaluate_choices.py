"""What the Evaluate tab offers: the arms and the datasets a visitor may pick, by key.

Keys, not paths or URLs, cross from the browser (or the API) to the server; each is looked up in
the list the server offers, so a visitor can never name a file or an address of their own.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from g4v.checkpoint.vision_lora import DEFAULT_MODE
from g4v.engines.capabilities import Instrumentable
from g4v.errors import G4VError, quoted
from g4v.evaluate import BUNDLED_DATASET, ArmSpec

BUNDLED, UPLOAD = "bundled", "upload"
#: Arm B's choice that runs arm A again (a noise-floor run), and how the dropdown shows it.
SAME_AS_A, SAME_AS_A_LABEL = "same", "same as arm A (noise floor: A run twice)"



@dataclass(frozen=True)
class ArmChoice:
    key: str  # the dropdown's value, and what the API takes
    label: str  # what the dropdown shows
    spec: ArmSpec


def arm_choices(engine, model: str, adapters_dir=None, servers=()) -> list[ArmChoice]:
    """The arms this server offers, the app's own engine first."""
    from g4v.engines import vllm_python
    from g4v.lora.choices import describe_adapters

    backend = engine.info.backend
    base_url = engine.info.device if backend == "openai" else None
    own = ArmSpec(backend, model, base_url=base_url, label=backend)
    choices = [ArmChoice("app", f"{backend} (the app's model)", own)]
    adapters = describe_adapters(adapters_dir, model) if backend != "openai" else []  # made for this model first
    notes = {a.name: "" if a.matches else " (made for another model)" for a in adapters}
    choices += [ArmChoice(f"app+{name}", f"{backend} + adapter {name}{note}",
                          ArmSpec(backend, model, adapter=name, base_url=base_url, label=f"{backend}+{name}"))
                for name, note in notes.items()]
    own_line = engine.info.details.get("vision_lora", "")  # "vision LoRA: native, rank ..." (g4v.checkpoint.vision_lora)
    modes = _vision_lora_modes(model) if backend != "openai" else []
    choices += [ArmChoice(f"app:vision-lora={mode}", f"{backend}, vision LoRA {mode}",
                          ArmSpec(backend, model, label=f"{backend} vision-lora={mode}", vision_lora=mode))
                for mode in modes if not own_line.startswith(f"vision LoRA: {mode},")]  # the app's arm has its own
    choices += _budget_choices(backend, model)
    if engine.supports(Instrumentable) and Path(model).is_dir() and vllm_python() is not None:
        choices.append(ArmChoice("vllm", "vLLM (local server)", ArmSpec("vllm", model, label="vllm")))
        choices += [ArmChoice(f"vllm:vision-lora={mode}", f"vLLM (local server), vision LoRA {mode}",
                              ArmSpec("vllm", model, label=f"vllm vision-lora={mode}", vision_lora=mode))
                    for mode in modes if mode != DEFAULT_MODE]  # the plain vllm arm runs the default
        choices += [ArmChoice(f"vllm+{name}", f"vLLM (local server) + adapter {name}{note}",
                              ArmSpec("vllm", model, adapter=name, label=f"vllm+{name}")) for name, note in notes.items()]
    if backend == "hf":
        choices += precision_choices(model, engine.info.dtype)
    for number, text in enumerate(servers or (), 1):
        spec = ArmSpec.parse(text if text.startswith("openai:") else f"openai:{text}")
        choices.append(ArmChoice(f"server{number}", f"server {number}: {spec.display}", spec))
    return choices


def precision_choices(model: str, own_dtype: str) -> list[ArmChoice]:
    """The app's model in the other dtypes, and with int8 weights (vision quantized or kept) where
    torchao is installed: each against the app's own arm gives per-level drift (:mod:`g4v.model.precision`)."""
    from g4v.model.precision import DTYPES, torchao_installed

    found = [ArmChoice(f"app:dtype={dtype}", f"hf, {dtype}", ArmSpec("hf", model, label=f"hf {dtype}", dtype=dtype))
             for dtype in DTYPES if dtype != own_dtype]
    if torchao_installed():
        found += [ArmChoice("app:quant=int8", "hf, int8 weights (torchao)",
                            ArmSpec("hf", model, label="hf int8", quant="int8", quant_vision=True)),
                  ArmChoice("app:quant=int8,quant-vision=no", "hf, int8 weights, vision kept",
                            ArmSpec("hf", model, label="hf int8 vision kept", quant="int8", quant_vision=False))]
    return found
#: The kept percentage of the token-budget arms the arm boxes offer (a sweep takes any, below them).
BUDGET_ARM_KEEP = 50


def _budget_choices(backend: str, model: str) -> list[ArmChoice]:
    """The app's transformers model keeping half its image tokens, one arm per policy
    (:mod:`g4v.model.token_budget`); none on other backends."""
    from g4v.model.token_budget import POLICIES

    if backend != "hf":
        return []
    keep = BUDGET_ARM_KEEP
    return [ArmChoice(f"app:keep={keep},policy={policy}", f"{backend}, {keep}% of image tokens ({policy})",
                      ArmSpec(backend, model, label=f"{backend} keep {keep}% {policy}", keep=keep, policy=policy))
            for policy in POLICIES]


def _vision_lora_modes(model: str) -> list[str]:
    """The vision LoRA modes worth an arm of their own: all three when the model has a vision LoRA
    beside its base (the app's own arm runs its default), none for a merged checkpoint."""
    from g4v.checkpoint.vision_lora import MODES, find_vision_lora

    try:
        return list(MODES) if find_vision_lora(model) is not None else []
    except G4VError:  # an unreadable adapter: the engine said so at start; no extra arms
        return []


def pick_arm(key, choices: list[ArmChoice], side: str) -> ArmSpec:
    """The arm behind a dropdown key (for B, :data:`SAME_AS_A` is resolved by :func:`pick_arms`)."""
    found = next((choice.spec for choice in choices if choice.key == key), None)
    if found is None:
        if key in (None, ""):
            raise G4VError(f"choose arm {side}")
        raise G4VError(f"unknown arm {quoted(key)} for {side}: choose one of {', '.join(c.key for c in choices)}")
    return found


def pick_arms(key_a, key_b, choices: list[ArmChoice]) -> tuple[ArmSpec, ArmSpec]:
    """Arms A and B; B :data:`SAME_AS_A` is A again under its own name (a noise-floor run)."""
    a = pick_arm(key_a, choices, "A")
    if key_b == SAME_AS_A:
        return a, replace(a, label=f"{a.display} again")
    return a, pick_arm(key_b, choices, "B")


def dataset_choices(data_dirs: list[Path]) -> dict[str, Path]:
    """Dataset key -> source: the bundled one, and those lying (at most two levels deep) in the
    data folders: a folder with a metadata table or a saved dataset, or a table file."""
    found = {BUNDLED: BUNDLED_DATASET}
    for number, root in enumerate(data_dirs, 1):
        if not root.is_dir():
            continue
        for path in sorted([*root.glob("*"), *root.glob("*/*")])[:500]:
            if _looks_like_dataset(path):
                found[f"data{number}:{path.relative_to(root).as_posix()}"] = path
    return found


def _looks_like_dataset(path: Path) -> bool:
    if path.is_dir():
        return any((path / name).is_file() for name in ("metadata.jsonl", "metadata.csv", "dataset_info.json",
                                                        "dataset_dict.json"))
    return path.suffix.lower() in (".jsonl", ".csv", ".parquet") and path.stem != "metadata" and path.is_file()


def dataset_label(key: str) -> str:
    if key == BUNDLED:
        return f"bundled: {BUNDLED_DATASET.name}"
    return "data folder: " + key.partition(":")[2] if key != UPLOAD else "the uploaded files"
