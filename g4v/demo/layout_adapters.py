"""A user's two kinds of adapter for the layout checkpoint, built from what is bundled
(``python -m g4v.demo build-layout-adapters --out DIR``): the French-colours adapter, once as an
adapter *on the vision model* and once folded into a *replacement* for the vision LoRA.

No training: the French adapter was trained on the trained checkpoint, which is the layout
checkpoint's vision model (base + vision LoRA, :mod:`g4v.demo.vlora`). So, with ``s`` each LoRA's
scaling:

* ``french-on-vision-model``: the French adapter's files as they are, its recorded base a
  ``merge-lora`` checkpoint of the layout's vision LoRA (``vision-model/``, written here too):
  what a user who fine-tunes the merged vision model gets. Run on top of the vision LoRA.
* ``french-replaces-vision-lora``: one LoRA of rank ``r_v + r_f`` (alpha = rank, scaling 1) with
  ``A = [A_v; A_f]`` and ``B = [s_v B_v, s_f B_f]``, so ``B @ A = s_v B_v A_v + s_f B_f A_f``: the
  vision LoRA and the French update in one, recorded base the layout checkpoint. Run instead of the
  vision LoRA, it answers exactly as the other runs on top of it (up to float rounding).

Nothing is random, so the folders are the same on every build; the adapters are small (3 MB; the
merged checkpoint beside them 24 MB) and built in seconds, so tests build them rather than the
repository bundling copies that a rebuilt vision LoRA would make stale.
"""

import json
import shutil
from pathlib import Path

import torch

from g4v.checkpoint.vision_lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, find_vision_lora
from g4v.paths import FRENCH_ADAPTER_DIR, VLORA_MODEL_DIR

ON_VISION_MODEL_NAME = "french-on-vision-model"
REPLACEMENT_NAME = "french-replaces-vision-lora"
VISION_MODEL_NAME = "vision-model"
_PREFIX = "base_model.model."


def build_layout_adapters(out: Path, layout: Path = VLORA_MODEL_DIR, adapter: Path = FRENCH_ADAPTER_DIR) -> dict:
    """Write ``out/vision-model`` (merge-lora of ``layout``) and ``out/adapters/{both kinds}``;
    ``out`` must not exist or be empty. Returns ``{name: folder}`` (the adapters folder under
    ``"adapters"``)."""
    from g4v.lora.merge import merge_lora

    out = Path(out)
    merged = merge_lora(str(layout), None, out / VISION_MODEL_NAME).out
    adapters = out / "adapters"
    stacked = adapters / ON_VISION_MODEL_NAME
    stacked.mkdir(parents=True)
    shutil.copyfile(adapter / ADAPTER_WEIGHTS, stacked / ADAPTER_WEIGHTS)
    _write_config(stacked, json.loads((adapter / ADAPTER_CONFIG).read_text()), base=_recorded(merged))
    replacement = adapters / REPLACEMENT_NAME
    replacement.mkdir()
    _write_replacement(replacement, Path(layout), adapter)
    return {"adapters": adapters, VISION_MODEL_NAME: merged, ON_VISION_MODEL_NAME: stacked,
            REPLACEMENT_NAME: replacement}


def _write_config(folder: Path, config: dict, base: str, **changes) -> None:
    config = {**config, **changes, "base_model_name_or_path": base}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_replacement(folder: Path, layout: Path, adapter: Path) -> None:
    from safetensors.torch import load_file, save_file

    vision = find_vision_lora(str(layout))
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    french_scaling = config["lora_alpha"] / config["r"]
    french = load_file(str(adapter / ADAPTER_WEIGHTS))
    rank = vision.rank + config["r"]
    outside = {k for k in french if k[len(_PREFIX):].rsplit(".lora_", 1)[0] not in vision.modules}
    if outside:
        raise ValueError(f"{adapter.name} adapts modules the vision LoRA does not: {sorted(outside)[:3]}")
    tensors = {}
    for module, (vision_a, vision_b) in vision.pairs().items():
        key = f"{_PREFIX}{module}"
        french_a = french.get(f"{key}.lora_A.weight", torch.zeros(config["r"], vision_a.shape[1])).float()
        french_b = french.get(f"{key}.lora_B.weight", torch.zeros(vision_b.shape[0], config["r"])).float()
        tensors[f"{key}.lora_A.weight"] = torch.cat([vision_a, french_a]).contiguous()
        tensors[f"{key}.lora_B.weight"] = torch.cat([vision.scaling * vision_b, french_scaling * french_b], 1).contiguous()
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    vision_config = json.loads((layout / ADAPTER_CONFIG).read_text())
    _write_config(folder, vision_config, base=_recorded(layout), r=rank, lora_alpha=rank)


def _recorded(folder: Path) -> str:
    """A base as the bundled adapters record it: relative to the repository when inside it (no
    machine's path in what the LoRA tab shows), else absolute."""
    from g4v.paths import REPO_ROOT

    resolved = folder.resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else str(resolved)
