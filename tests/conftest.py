"""Shared fixtures: one loaded engine per test session, example images, output folder."""

import os
from pathlib import Path

import pytest
from PIL import Image

from g4v.paths import BUNDLED_MODEL_DIR

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEST_OUTPUT = Path(__file__).resolve().parent.parent / "test-output"


@pytest.fixture(scope="session")
def hf_engine():
    """The transformers engine on the bundled checkpoint, loaded once for the whole session."""
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where tests leave artefacts people may want to look at (screenshots, PNGs)."""
    TEST_OUTPUT.mkdir(exist_ok=True)
    return TEST_OUTPUT


def make_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """A deterministic picture: a coloured square on a gradient, so every tile has content."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 32, size=base.shape)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, mode="RGB")
