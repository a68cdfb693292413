"""Build the bundled tiny Granite 4 Vision checkpoint, bit for bit the same on every run.

The checkpoint has the real architecture (SigLIP tower, 4 deepstack and 4 spatial window Q-Former
projectors, anyres pinpoints, image newline, Granite language model) at tiny sizes, and it obeys
what vLLM's port needs to load it too:

* weights in the hub layout: the vision tower under ``model.vision_tower.vision_model.*``
  (transformers saves ``model.vision_tower.*``, which vLLM rejects; transformers loads both);
* Q-Formers as vLLM builds them whatever the config says: 1 layer, intermediate 3072,
  ``vision_hidden // 64`` heads, hidden = encoder hidden = vision hidden (a multiple of 64);
* a language-model head size of 64 (vLLM's CPU attention rejects 16).
"""

import json
import shutil
from pathlib import Path

import torch
from transformers import Granite4VisionConfig, Granite4VisionForConditionalGeneration, Granite4VisionProcessor
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

from g4v.demo.tokenizer import CHAT_TEMPLATE, END_OF_TEXT, IMAGE, PAD, build_tokenizer
from g4v.loading import save_weights

SEED = 1234
#: The weights are stored in bf16 like the real checkpoint's: it halves the size, and loading upcasts exactly.
STORAGE_DTYPE = torch.bfloat16

TILE = 128  # vision image_size: each anyres tile and the base view are TILE x TILE pixels
PATCH = 8  # 16 x 16 patches per view -> 2 x 2 Q-Former windows of 8 x 8 -> 8 x 8 features per view
DOWNSAMPLE_RATE = "4/8"  # as in the real model: 4 x 4 queries per 8 x 8 window
#: Every (rows, cols) grid of at most 6 tiles, as (height, width) in pixels: 14 grid shapes.
GRID_PINPOINTS = [[r * TILE, c * TILE] for r in range(1, 7) for c in range(1, 7) if r * c <= 6]


#: Widths that tensor parallelism can split in two (``build(out, shardable=True)``): every head count
#: (SigLIP, each Q-Former's ``vision_hidden // 64``, LM query and key-value heads) divides by 2, which
#: the bundled checkpoint's single vision and Q-Former head cannot. Head sizes stay 64.
SHARDABLE_WIDTHS = {"vision_hidden": 128, "vision_intermediate": 256, "vision_heads": 2,
                    "text_hidden": 256, "text_intermediate": 512, "text_heads": 4, "text_kv_heads": 2}
BUNDLED_WIDTHS = {"vision_hidden": 64, "vision_intermediate": 256, "vision_heads": 1,
                  "text_hidden": 128, "text_intermediate": 384, "text_heads": 2, "text_kv_heads": 1}


def tiny_config(vocab_size: int, image_token_id: int, pad_token_id: int, eos_token_id: int,
                widths: dict = BUNDLED_WIDTHS) -> Granite4VisionConfig:
    vision_layers = 8
    text_layers = 10
    return Granite4VisionConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": widths["vision_hidden"],
            "intermediate_size": widths["vision_intermediate"],
            "num_hidden_layers": vision_layers,
            "num_attention_heads": widths["vision_heads"],
            "image_size": TILE,
            "patch_size": PATCH,
            "num_channels": 3,
            "vision_use_head": False,
        },
        text_config={
            "model_type": "granite",
            "vocab_size": vocab_size,
            "hidden_size": widths["text_hidden"],
            "intermediate_size": widths["text_intermediate"],
            "num_hidden_layers": text_layers,
            "num_attention_heads": widths["text_heads"],  # head_dim 64
            "num_key_value_heads": widths["text_kv_heads"],  # grouped-query attention, as in the real model
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "embedding_multiplier": 12.0,
            "attention_multiplier": 0.015625,
            "residual_multiplier": 0.22,
            "logits_scaling": 1.0,
            "tie_word_embeddings": False,
            "pad_token_id": pad_token_id,
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
        },
        qformer_config={
            "model_type": "blip_2_qformer",
            # Written out, as vLLM builds them: transformers 5.19 (the vLLM environment) does not
            # derive them from the vision tower and would build a 768-wide Q-Former.
            "hidden_size": widths["vision_hidden"],
            "encoder_hidden_size": widths["vision_hidden"],
            "num_attention_heads": widths["vision_hidden"] // 64,
            "num_hidden_layers": 1,
            "intermediate_size": 3072,
            "cross_attention_frequency": 1,
            "max_position_embeddings": 2048,
            "use_qformer_text_input": False,
        },
        image_token_index=image_token_id,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=GRID_PINPOINTS,
        downsample_rate=DOWNSAMPLE_RATE,
        # (vision layer, LLM layer): like the real map [[-19, 9], [-13, 6], [-7, 3], [-1, 0]], scaled down.
        deepstack_layer_map=[[-7, 3], [-5, 2], [-3, 1], [-1, 0]],
        spatial_vision_layer=-1,
        spatial_target_layers=[4, 5, 6, 7],
        projector_dropout=0.1,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        architectures=["Granite4VisionForConditionalGeneration"],
    )


def tiny_image_processor() -> LlavaNextImageProcessorPil:
    return LlavaNextImageProcessorPil(
        size={"shortest_edge": TILE},
        crop_size={"height": TILE, "width": TILE},
        image_grid_pinpoints=GRID_PINPOINTS,
        do_resize=True,
        do_center_crop=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_pad=True,
        do_convert_rgb=True,
        resample=3,  # bicubic
    )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _normalise_json_files(folder: Path) -> None:
    """Rewrite every JSON file with sorted keys so that the folder is byte-for-byte reproducible."""
    for path in sorted(folder.glob("*.json")):
        _write_json(path, json.loads(path.read_text()))


def build_processor():
    tokenizer = build_tokenizer()
    return Granite4VisionProcessor(
        image_processor=tiny_image_processor(),
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE,
        num_additional_image_tokens=0,
        downsample_rate=DOWNSAMPLE_RATE,
    )


def build_random_model(processor, widths: dict = BUNDLED_WIDTHS) -> Granite4VisionForConditionalGeneration:
    tokenizer = processor.tokenizer
    config = tiny_config(
        vocab_size=len(tokenizer),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
        widths=widths,
    )
    torch.manual_seed(SEED)
    model = Granite4VisionForConditionalGeneration(config)
    return model.eval()


def save_checkpoint(model, processor, out: Path, provenance: dict) -> str:
    """Write config, weights, processor and tokenizer files into ``out``; returns the weights' SHA-256."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.config.dtype = STORAGE_DTYPE
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    processor.save_pretrained(out)
    weights_sha = save_weights(model, out, STORAGE_DTYPE)
    _normalise_json_files(out)
    _write_json(out / "g4v_build.json", {**provenance, "weights_sha256": weights_sha})
    return weights_sha


def build(out: Path, shardable: bool = False) -> str:
    """Build the random-weight checkpoint into ``out``; returns the weights' SHA-256. ``shardable``
    builds the same architecture at :data:`SHARDABLE_WIDTHS` (the tensor-parallel tests' checkpoint)."""
    torch.use_deterministic_algorithms(True)
    processor = build_processor()
    model = build_random_model(processor, SHARDABLE_WIDTHS if shardable else BUNDLED_WIDTHS)
    provenance = {
        "builder": "g4v.demo.build.build(out, shardable=True)" if shardable else "python -m g4v.demo build",
        "weights": "random (seeded)",
        "seed": SEED,
        "torch": torch.__version__,
    }
    return save_checkpoint(model, processor, out, provenance)
