"""Build the layout checkpoint: a base language model with its vision LoRA beside it, as the real
Granite Vision 4.x is delivered (``python -m g4v.demo build-vlora``).

Derived from the trained demo checkpoint, not trained: for every attention and MLP projection of
the language model (``q/k/v/o_proj``, ``gate/up/down_proj``, 70 in all), :data:`RANK` seeded output
rows of the trained weight ``W`` are replaced by seeded random rows of the same spread (an entry keeps W's value in the
rare case that W - W0 would not be exact in float32); that is the
base ``W0`` (stored in bf16, like every bundled checkpoint). The vision LoRA puts those rows back:
``B`` is the one-hot ``out x r`` matrix that picks the rows and ``A`` holds ``W - W0`` on them, in
float32, so that ``W0 + B @ A == W`` exactly (alpha = r, scaling 1). Everything outside those
projections (vision tower, projectors, embeddings, head) is the trained checkpoint's, bit for bit.

So base + vision LoRA *is* the trained checkpoint (its answers, its accuracy), and without the
LoRA 16 of every projection's output channels are noise: image answers fall to about chance.
"""

import json
import re
import shutil
from pathlib import Path

import torch

from g4v.loading import load_model, save_weights
from g4v.paths import TRAINED_MODEL_DIR, VLORA_MODEL_DIR

SEED = 35
#: The vision LoRA's rank (and alpha): how many output rows of each projection it restores.
RANK = 16
#: PEFT's ``target_modules``: every attention and MLP projection of the language model.
TARGET_MODULES = r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
_TENSOR_PREFIX = "base_model.model."
_NOT_COPIED = ("model.safetensors", "g4v_build.json")


def build_vlora(out: Path = VLORA_MODEL_DIR, source: Path = TRAINED_MODEL_DIR) -> dict:
    """Write the layout checkpoint to ``out`` (replaced); returns its provenance."""
    loaded = load_model(str(source), device="cpu", dtype="float32")
    model = loaded.model
    generator = torch.Generator().manual_seed(SEED)
    pattern = re.compile(TARGET_MODULES + "$")
    lora: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not pattern.match(name):
                continue
            weight = module.weight  # bf16 values held in float32
            rows = torch.randperm(weight.shape[0], generator=generator)[:RANK].sort().values
            noise = torch.randn(RANK, weight.shape[1], generator=generator) * weight.std()
            base = weight.clone()
            base[rows] = noise.to(torch.bfloat16).float()  # the base is stored in bf16: round it now
            # W - W0 is exact in float32 unless the two differ by more than 2**16 in size; there
            # (a handful of entries) W0 keeps W's value, so the difference is 0.
            inexact = base + (weight - base) != weight
            base[inexact] = weight[inexact]
            lora_a = (weight - base)[rows].contiguous()
            lora_b = torch.zeros(weight.shape[0], RANK)
            lora_b[rows, torch.arange(RANK)] = 1.0
            if not torch.equal(base + lora_b @ lora_a, weight):
                raise AssertionError(f"{name}: base + B @ A does not restore the trained weight exactly")
            lora[f"{_TENSOR_PREFIX}{name}.lora_A.weight"] = lora_a
            lora[f"{_TENSOR_PREFIX}{name}.lora_B.weight"] = lora_b.contiguous()
            weight.copy_(base)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for path in sorted(Path(source).iterdir()):
        if path.is_file() and path.name not in _NOT_COPIED:
            shutil.copyfile(path, out / path.name)
    base_sha = save_weights(model, out, dtype=torch.bfloat16)
    adapter_sha = _save_adapter(out, lora)
    provenance = {"command": "python -m g4v.demo build-vlora", "source": "assets/" + Path(source).name,
                  "seed": SEED, "rank": RANK, "alpha": RANK, "modules": len(lora) // 2,
                  "derivation": "base = trained weights with RANK seeded output rows of every LM projection "
                                "replaced by seeded noise (bf16); vision LoRA B one-hot on those rows, "
                                "A = W - W0 there (float32), so base + B @ A == trained exactly",
                  "weights_sha256": base_sha, "adapter_sha256": adapter_sha}
    (out / "g4v_build.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return provenance


def _save_adapter(out: Path, tensors: dict[str, torch.Tensor]) -> str:
    """``adapter_config.json`` (PEFT's own, from ``LoraConfig``) and ``adapter_model.safetensors``."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from g4v.loading import sha256_file
    from g4v.engines.vision_lora import ADAPTER_WEIGHTS

    config = LoraConfig(r=RANK, lora_alpha=RANK, lora_dropout=0.0, target_modules=TARGET_MODULES,
                        bias="none", inference_mode=True)
    config.base_model_name_or_path = "assets/" + out.name
    config.save_pretrained(str(out))
    data = json.loads((out / "adapter_config.json").read_text())
    data.pop("peft_version", None)  # the build does not depend on PEFT's version; keep the file stable
    (out / "adapter_config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path = out / ADAPTER_WEIGHTS
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sha256_file(path)
