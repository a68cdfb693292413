"""The conversations the vLLM parity tests compare, and helpers they share.

Pictures are deterministic gradients with noise (noise, unlike plain colours, exposes differences
in image preprocessing). Their sizes are chosen to land on different anyres grids of the bundled
checkpoint; ``test_parity.py`` checks that they do.
"""

import numpy as np
from PIL import Image

from g4v.conversation import Message, SamplingSettings

GREEDY = SamplingSettings(max_new_tokens=32)
#: The in-process engine's prefill budget: small enough that every image's tokens are split.
CHUNK_TOKENS = 32
#: The test LoRA's name, in process and on the server.
ADAPTER = "tiny-lora"


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 48, size=base.shape)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), mode="RGB")


#: (width, height) of the pictures whose anyres grids must differ.
GRID_SIZES = {"grid_square": (120, 120), "grid_wide": (380, 120), "grid_tall": (150, 260)}

CASES = {
    **{name: [Message("user", "What colour is the shape?", [picture(w, h, seed)])]
       for seed, (name, (w, h)) in enumerate(GRID_SIZES.items())},
    "two_images": [Message("user", "Which picture is brighter?", [picture(200, 140, 7), picture(130, 250, 8)])],
    "text_only": [Message("user", "Tell me about Granite models in two sentences.")],
    "multi_turn": [
        Message("user", "Describe the picture.", [picture(240, 180, 9)]),
        Message("assistant", "A gradient from dark to light with a little noise."),
        Message("user", "Which corner is the brightest?"),
    ],
}


def make_lm_lora(engine, folder, seed: int = 0) -> None:
    """Save a rank-8 LoRA on the language model's attention and MLP projections of ``engine``'s
    model, with random (non-zero) B so it changes the answers. It wraps the model in place, so
    ``engine`` then answers with the adapter attached."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=8, lora_alpha=16, init_lora_weights=False,
        target_modules=r".*language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.(gate_proj|up_proj|down_proj))",
    )
    get_peft_model(engine.model, config).save_pretrained(str(folder))
