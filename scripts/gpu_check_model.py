"""The model every step of the GPU check measures, and what the steps share about it.

Why random weights: no machine that lends a GPU to this project can reach a model hub. Weights
built from ``assets/granite-vision-4.1-4b-config`` in bf16 have the real model's shapes, so its
compute and memory traffic, and therefore its timings and memory, are real; only the answers are
noise. They are built directly on the device (``torch.device`` context): a 4B model never passes
through CPU memory. The bundled checkpoint's tokenizer stands in for the real one (its ids stay
below the real vocabulary size); the image processor is the real one (384-pixel tiles, 27 pinpoints).

The runner (``gpu_check.py``) and every steps module import this one; it imports none of them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from g4v.conversation import Message

PROMPT = "Describe the picture."
#: The LoRA of the check: rank 16 on every attention and MLP projection of the language model.
LORA_RANK = 16
LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))"

#: Widths of the CPU smoke config; every layer count, map and size that shapes the code path stays real.
SMOKE_WIDTHS = {
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 1},
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1},
    "qformer_config": {"intermediate_size": 128},
}


@dataclass
class Sizes:
    """How much work each step does: the GPU run's, or the smoke run's (fewer tokens and repeats)."""

    # (height, width): 1536 x 768 px (width x height), tiles 4 wide x 2 tall + the base view: 1320 image
    # tokens on the real config.
    image_hw: tuple[int, int] = (768, 1536)
    new_tokens: int = 128
    batch: int = 8
    repeats: int = 5
    side_by_side_tokens: int = 32
    bandwidth_bytes_s: float = 4.8e12  # H200 HBM3e


SMOKE_SIZES = Sizes(new_tokens=8, batch=2, repeats=1, side_by_side_tokens=4)


def real_config(smoke: bool):
    """The real granite-vision-4.1-4b config; for the smoke run with :data:`SMOKE_WIDTHS`."""
    from transformers import Granite4VisionConfig

    from g4v.loading import read_raw_config
    from g4v.paths import REAL_CONFIG_DIR

    raw = read_raw_config(REAL_CONFIG_DIR)
    if smoke:
        for part, widths in SMOKE_WIDTHS.items():
            raw[part] = {**raw[part], **widths}
    raw.pop("model_type", None)
    return Granite4VisionConfig(**raw)


def stand_in_processor(config):
    """The real image processor (from ``processor_config.json``) with the bundled tokenizer."""
    from transformers import AutoProcessor, Granite4VisionProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    from g4v.paths import BUNDLED_MODEL_DIR, REAL_CONFIG_DIR

    raw = json.loads((REAL_CONFIG_DIR / "processor_config.json").read_text())
    image_settings = {key: value for key, value in raw["image_processor"].items() if key != "image_processor_type"}
    image_settings["image_grid_pinpoints"] = config.image_grid_pinpoints
    bundled = AutoProcessor.from_pretrained(str(BUNDLED_MODEL_DIR))
    return Granite4VisionProcessor(
        image_processor=LlavaNextImageProcessorPil(**image_settings), tokenizer=bundled.tokenizer,
        chat_template=bundled.chat_template,
        **{key: raw[key] for key in ("patch_size", "vision_feature_select_strategy", "image_token",
                                     "num_additional_image_tokens", "downsample_rate")})


def build_engine(check):
    """Random weights from the real config, built on ``check.device`` in ``check.dtype``, behind
    the workbench's transformers engine (its default settings: on a GPU the decode loop compiles
    its step). The image token becomes the stand-in tokenizer's."""
    from transformers import Granite4VisionForConditionalGeneration

    from g4v.engines.hf import TransformersEngine
    from g4v.loading import LoadedModel

    config = real_config(check.smoke)
    processor = stand_in_processor(config)
    tokenizer = processor.tokenizer
    if len(tokenizer) > config.text_config.vocab_size:
        raise RuntimeError("the stand-in tokenizer has more ids than the model's vocabulary")
    config.image_token_index = tokenizer.convert_tokens_to_ids(processor.image_token)
    torch.manual_seed(0)
    with torch.device(check.device):
        model = Granite4VisionForConditionalGeneration._from_config(config, dtype=check.dtype)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    loaded = LoadedModel(model=model, processor=processor, source="granite-vision-4.1-4b config, random weights",
                         device=check.device, dtype=check.dtype)
    return TransformersEngine(loaded.source, loaded=loaded)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(check, work):
    """``(seconds, result)`` of ``work()``, the device synchronized on both sides."""
    synchronize(check.device)
    start = time.perf_counter()
    result = work()
    synchronize(check.device)
    return time.perf_counter() - start, result


def noise_picture(height: int, width: int, seed: int = 0) -> Image.Image:
    """A deterministic noisy gradient of ``height x width`` (noise exercises the image processor)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    return Image.fromarray(np.clip(base + rng.integers(0, 48, base.shape), 0, 255).astype(np.uint8), "RGB")


def weight_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def chat_messages(check) -> list[Message]:
    height, width = check.sizes.image_hw
    return [Message("user", PROMPT, [noise_picture(height, width)])]


def write_random_lora(model, folder, rank: int = LORA_RANK, alpha: float | None = None) -> None:
    """A LoRA of ``rank`` (alpha default 2 x rank) with random A and B (so it changes the answers)
    on the language model, saved as an ordinary PEFT adapter folder and detached again."""
    from peft import LoraConfig

    torch.manual_seed(rank)
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, init_lora_weights=False, target_modules=LORA_TARGETS)
    model.add_adapter(config, adapter_name="gpu_check")
    with torch.no_grad():  # PEFT's random B is as large as A; scale it so the update stays an update
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(1e-2)
    model.save_pretrained(str(folder))
    model.delete_adapter("gpu_check")


