"""The vision LoRA: the adapter in a model's own folder that turns its base language model into the
vision model, as Granite Vision 4.x is delivered (rank 256, alpha 256, every attention and MLP
projection of the language model; ``assets/granite4-vision-tiny-vlora`` in miniature).

g4v finds it itself (:func:`find_vision_lora`) and every engine applies it in one of three modes:

* ``native``: kept as a LoRA and applied per request, as vLLM's ``--default-mm-loras '{"image":
  PATH}'`` does: requests with an image get it, text-only requests run the base language model, and
  a request that names a user adapter gets that adapter *instead* (vLLM serves one LoRA per request);
* ``merged``: ``W += scaling * B @ A`` once at load, so every request runs the vision model (no
  LoRA cost per token, text-only requests change too);
* ``off``: the base language model alone, for comparison.

Two library behaviours make the files beside the base weights a trap, so no engine is handed the
model folder itself when it holds the adapter: transformers (with PEFT installed) attaches a
folder's ``adapter_config.json`` by itself in ``from_pretrained``, for every request; and vLLM
loads ``adapter_model.safetensors`` as one more weight shard and fails on its ``base_model.*``
names. Both get :class:`BaseView`, a temporary folder of links to every file but the adapter's.
"""

from __future__ import annotations  # torch in annotations only: the CLI's flags import MODES without it

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from g4v.errors import G4VError, first_line

if TYPE_CHECKING:
    import torch

MODES = ("native", "merged", "off")
#: Every engine here can apply the LoRA per request, so native is the default everywhere.
DEFAULT_MODE = "native"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class VisionLora:
    folder: Path  # the model folder that holds it
    rank: int
    alpha: float
    modules: tuple[str, ...]  # adapted linear layers (in-memory names)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def pairs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``module -> (A, B)`` in float32."""
        from safetensors.torch import load_file

        tensors = load_file(str(self.folder / ADAPTER_WEIGHTS))
        return {m: (tensors[f"{_PREFIX}{m}.lora_A.weight"].float(), tensors[f"{_PREFIX}{m}.lora_B.weight"].float())
                for m in self.modules}


def check_mode(mode: str | None) -> str:
    """``mode``, or the default for ``None``; an unknown mode is one line."""
    mode = mode or DEFAULT_MODE
    if mode not in MODES:
        raise G4VError(f"unknown vision LoRA mode {mode!r} (expected one of {', '.join(MODES)})")
    return mode


def describe(mode: str, lora: VisionLora | None) -> str:
    """The one line an engine says at start."""
    if lora is None:
        return "vision LoRA: none in this checkpoint (its weights are the vision model)"
    return f"vision LoRA: {mode}, rank {lora.rank}, {len(lora.modules)} modules"


def check_base_available(lora: VisionLora | None, mode: str) -> None:
    """One line when an engine cannot run the base language model: the checkpoint has no vision
    LoRA (its weights are the vision model), or the LoRA is merged into the weights."""
    if lora is None:
        raise G4VError("this checkpoint has no vision LoRA: its weights are the vision model, there is no "
                       "base language model to run")
    if mode == "merged":
        raise G4VError("the vision LoRA is merged into the weights (--vision-lora merged): there is no base "
                       "language model to run; use --vision-lora native")


def model_folder(source: str) -> Path | None:
    """The files of ``source``: a local folder, or a hub repository's cached snapshot (downloaded
    the way ``from_pretrained`` would); None when neither can be had."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source))
    except Exception:  # offline, unknown id: from_pretrained reports it in its own words
        return None


def find_vision_lora(source: str) -> VisionLora | None:
    """The vision LoRA in ``source``'s folder, or None when it has none (every bundled merged
    checkpoint). A folder with an adapter config but no usable LoRA is one line."""
    folder = model_folder(source)
    if folder is None or not (folder / ADAPTER_CONFIG).is_file():
        return None
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        from safetensors import safe_open

        with safe_open(str(folder / ADAPTER_WEIGHTS), "pt") as weights:
            names = list(weights.keys())
    except Exception as err:  # missing or malformed files, in many types
        raise G4VError(f"the vision LoRA in {source} is unreadable: {first_line(err)}") from None
    if config.get("peft_type") != "LORA" or config.get("use_dora") or config.get("use_rslora"):
        raise G4VError(f"the adapter in {source} is not a plain LoRA (peft_type {config.get('peft_type')!r})")
    modules = tuple(sorted(n[len(_PREFIX):-len(".lora_A.weight")] for n in names
                           if n.startswith(_PREFIX) and n.endswith(".lora_A.weight")))
    if not modules:
        raise G4VError(f"the vision LoRA in {source} has no lora_A/lora_B weights")
    return VisionLora(folder=folder, rank=rank, alpha=alpha, modules=modules)


def merge_into(model: torch.nn.Module, lora: VisionLora) -> None:
    """``W += scaling * B @ A`` for every adapted layer, computed in float32."""
    import torch

    layers = dict(model.named_modules())
    with torch.no_grad():
        for name, (lora_a, lora_b) in lora.pairs().items():
            weight = layers[name].weight
            merged = weight.float() + lora.scaling * (lora_b.to(weight.device) @ lora_a.to(weight.device))
            weight.copy_(merged.to(weight.dtype))


#: The ranks vLLM 0.32's ``LoRAConfig.max_lora_rank`` accepts (a Literal there).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds a LoRA of ``rank``."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise G4VError(f"vLLM serves LoRAs up to rank {VLLM_LORA_RANKS[-1]}; this one has rank {rank}")
    return fitting[0]


def served_view(lora, mode: str):
    """The folder vLLM is given for a checkpoint with a vision LoRA (None: the checkpoint itself):
    its base without the adapter files, or (merged) a float32 copy with the LoRA merged in."""
    if lora is None:
        return None
    return BaseView(lora.folder, merged=lora if mode == "merged" else None)



class BaseView:
    """A temporary folder of links to every file of ``folder`` but the adapter's: the base model as
    transformers and vLLM must see it (one weights file or shards with an index alike). With
    ``merged=lora`` the weights are instead one float32 file with the LoRA merged in (what vLLM's
    merged mode serves). Call :meth:`close` (or use it as a context manager) to remove it."""

    def __init__(self, folder: Path, merged: VisionLora | None = None):
        self.path = Path(tempfile.mkdtemp(prefix="g4v-base-view-"))
        skipped = {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
        if merged is not None:
            skipped |= {p.name for p in folder.iterdir() if p.name.endswith((".safetensors", ".safetensors.index.json"))}
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name not in skipped:
                (self.path / path.name).symlink_to(path.resolve())
        if merged is not None:
            self._write_merged(folder, merged)

    def _write_merged(self, folder: Path, lora: VisionLora) -> None:
        from safetensors.torch import load_file, save_file

        tensors = {}
        for shard in sorted(folder.glob("*.safetensors")):
            if shard.name != ADAPTER_WEIGHTS:
                tensors.update({k: v.float() for k, v in load_file(str(shard)).items()})
        for module, (lora_a, lora_b) in lora.pairs().items():
            tensors[f"{module}.weight"] = (tensors[f"{module}.weight"] + lora.scaling * (lora_b @ lora_a)).contiguous()
        save_file(tensors, str(self.path / "model.safetensors"), metadata={"format": "pt"})
        config_path = self.path / "config.json"
        config = json.loads(config_path.read_text())
        config["dtype"] = "float32"
        config_path.unlink()  # a link to the original: write a file of its own
        config_path.write_text(json.dumps(config, indent=2))

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
