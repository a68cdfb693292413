"""Merge a LoRA adapter into a full checkpoint: ``W += scaling * B @ A`` for every adapted layer.

vLLM serves adapters per request but no longer merges them, and a merged checkpoint needs no LoRA
support anywhere, so the workbench writes one itself. The output is an ordinary Granite 4 Vision
checkpoint in the hub layout (vision tower under ``model.vision_tower.vision_model.*``, written by
:func:`g4v.loading.save_weights`), with the base's config, processor, tokenizer and chat
template files copied, which both transformers and vLLM load.

**Saved dtype: float32.** The bundled (and the real) base is stored in bf16. A LoRA update is
small next to W: rounding ``W + scaling * B @ A`` back to bf16 (8 significant bits) loses most of
it and moves each weight by up to 2**-9 of its size, so the merged model's logits would differ
from the base-with-adapter by about 1e-2 relative, not the 1e-4 the merge promises. Float32 keeps
the merge exact to float rounding; the price is twice the file size of a bf16 checkpoint.
"""

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from g4v.errors import G4VError
from g4v.loading import load_model, save_weights
from g4v.lora.checks import AdapterSpec, check_adapter, lora_pairs
from g4v.lora.folders import adapter_dirs, resolve_adapter

MERGED_DTYPE = torch.float32
PROVENANCE_FILE = "g4v_merge.json"
#: The adapter name the provenance records when a model's own vision LoRA was merged alone (the
#: vision model, which adapters "on the vision model" are trained on).
MERGED_VISION_LORA = "vision LoRA"
#: Files of the base folder that are not copied: the weights are rewritten, provenance is per build.
_SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json", ".gguf")
#: A vision LoRA's config is not copied either: it is merged, and beside the merged weights it would be
#: applied a second time.
_SKIPPED_NAMES = {"g4v_build.json", PROVENANCE_FILE, "adapter_config.json"}


@dataclass
class MergeResult:
    out: Path
    base: str
    adapter: str
    scaling: float
    merged_layers: int
    dtype: str
    weights_sha256: str


def merge_lora(model: str, adapter: str | None, out: str | Path, adapters_dir=None) -> MergeResult:
    """Check ``adapter`` (from the adapter folders) against ``model`` and write the merged
    checkpoint to ``out``, which must not exist or be empty. A model with a vision LoRA of its own
    is merged with it first (the vision model); ``adapter=None`` writes just that."""
    out = Path(out)
    _check_output_folder(out)
    if adapter is not None:
        name, path = resolve_adapter(adapter, adapter_dirs(adapters_dir))  # refuse bad paths before the slow load
    loaded = load_model(model, device="cpu", dtype="float32", vision_lora="merged")
    vision = loaded.vision_lora
    if adapter is None:
        if vision is None:
            raise G4VError(f"{model} has no vision LoRA of its own: name the adapter to merge (--adapter)")
        spec = AdapterSpec(name=MERGED_VISION_LORA, path=vision.folder, rank=vision.rank, alpha=vision.alpha,
                           scaling=vision.scaling, modules=vision.modules)
    else:
        spec = check_adapter(path, loaded.model.config, name=name)
        merge_into(loaded.model, spec)
    out.mkdir(parents=True, exist_ok=True)
    _copy_model_files(_source_folder(loaded.source), out)
    _set_config_dtype(out / "config.json", MERGED_DTYPE)
    sha = save_weights(loaded.model, out, dtype=MERGED_DTYPE)
    result = MergeResult(
        out=out,
        base=loaded.source,
        adapter=spec.name,
        scaling=spec.scaling,
        merged_layers=len(spec.modules),
        dtype=str(MERGED_DTYPE).removeprefix("torch."),
        weights_sha256=sha,
    )
    (out / PROVENANCE_FILE).write_text(json.dumps({**asdict(result), "out": str(out)}, indent=2, sort_keys=True) + "\n")
    return result


def merge_into(model: torch.nn.Module, spec: AdapterSpec) -> None:
    """Add ``scaling * B @ A`` to each adapted linear layer's weight, in float32, in place."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (lora_a, lora_b) in lora_pairs(spec).items():
            weight = modules[name].weight
            if weight.dtype != torch.float32:
                raise G4VError(f"merging needs a float32 model, {name} is {weight.dtype}")
            weight += spec.scaling * (lora_b.to(weight.device) @ lora_a.to(weight.device))


def _check_output_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise G4VError(f"output folder {out} already exists and is not empty; choose a new folder")


def _source_folder(source: str) -> Path:
    """The base model's files: its folder, or the hub cache the model was just loaded from."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source, local_files_only=True))


def _copy_model_files(source: Path, out: Path) -> None:
    """Config, generation config, processor, tokenizer and chat template: every top-level file
    except weights and g4v provenance."""
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in _SKIPPED_NAMES and not path.name.endswith(_SKIPPED_SUFFIXES):
            shutil.copyfile(path, out / path.name)


def _set_config_dtype(config_path: Path, dtype: torch.dtype) -> None:
    """Record the stored dtype, so ``dtype="auto"`` loads the merged weights without rounding."""
    config = json.loads(config_path.read_text())
    name = str(dtype).removeprefix("torch.")
    config["dtype"] = name
    if "torch_dtype" in config:
        config["torch_dtype"] = name
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
