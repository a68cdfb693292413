"""Build the demo LoRA adapter for the bundled checkpoint, bit for bit the same on every run.

It is a real PEFT adapter (PEFT creates and saves it) for every language-model linear layer, rank
8, no ``modules_to_save``, under 1 MB. Its weights are random (seeded) but large enough that the
adapter's answers visibly differ from the base model's: PEFT starts ``lora_B`` at zero, which would
make the adapter a no-op, so B is drawn from a seeded normal distribution. A later issue replaces
it with a trained adapter.

``target_modules`` is a regular expression over full module names rather than PEFT's usual list
of short names: the SigLIP vision tower has ``q_proj``/``k_proj``/``v_proj`` layers too, and a
short-name list would adapt them as well.
"""

import json
import shutil
from pathlib import Path

import torch

from g4v.paths import BUNDLED_MODEL_DIR

SEED = 4321
ADAPTER_NAME = "demo-lora"
RANK = 8
ALPHA = 16
B_STD = 0.25
TARGET_MODULES = r"model\.language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
#: Written into adapter_config.json instead of this checkout's absolute path.
BASE_MODEL_NAME = "assets/granite4-vision-tiny"


def build_adapter(out: Path, base_model: str | Path = BUNDLED_MODEL_DIR) -> Path:
    """Write the demo adapter into ``out`` (replacing it); returns ``out``."""
    from peft import LoraConfig, get_peft_model

    from g4v.loading import load_model

    torch.use_deterministic_algorithms(True)
    base = load_model(str(base_model), device="cpu", dtype="float32").model
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGET_MODULES, lora_dropout=0.0, bias="none")
    torch.manual_seed(SEED)  # lora_A: PEFT's own (Kaiming uniform) initialisation
    peft_model = get_peft_model(base, config)
    _randomise_lora_b(peft_model)

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    peft_model.save_pretrained(str(out))
    _make_reproducible(out)
    return out


def _randomise_lora_b(peft_model) -> None:
    generator = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * B_STD)


def _make_reproducible(out: Path) -> None:
    """Drop PEFT's generated model card and pin the config's machine-specific base path."""
    (out / "README.md").unlink(missing_ok=True)
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = BASE_MODEL_NAME
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
