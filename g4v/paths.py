"""Where the bundled files live, and which model is the default."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS_DIR = REPO_ROOT / "assets"

#: The small Granite 4 Vision checkpoint that ships with the project (real architecture, tiny sizes).
BUNDLED_MODEL_DIR = ASSETS_DIR / "granite4-vision-tiny"
#: The same architecture trained on synthetic shapes (``python -m g4v.demo train``): the app's default.
TRAINED_MODEL_DIR = ASSETS_DIR / "granite4-vision-tiny-trained"
#: That checkpoint trained further on charts to CSV and key-value extraction
#: (``python -m g4v.demo train-documents``). Not the default: the French adapter was trained on the
#: first one.
DOCUMENTS_MODEL_DIR = ASSETS_DIR / "granite4-vision-tiny-documents"
#: The real model's layout in miniature: a base language model with its vision LoRA in the same
#: folder (``python -m g4v.demo build-vlora``, derived from the trained checkpoint).
VLORA_MODEL_DIR = ASSETS_DIR / "granite4-vision-tiny-vlora"
#: The demo's LoRA adapter that answers colour questions in French, trained on TRAINED_MODEL_DIR
#: (``python -m g4v.demo train-adapter``).
FRENCH_ADAPTER_DIR = ASSETS_DIR / "adapters" / "tiny-trained-french"
#: The real granite-vision-4.1-4b config and processor settings, without weights.
REAL_CONFIG_DIR = ASSETS_DIR / "granite-vision-4.1-4b-config"
EXAMPLES_DIR = ASSETS_DIR / "examples"

REAL_MODEL_ID = "ibm-granite/granite-vision-4.1-4b"


def default_model() -> str:
    """The model used when none is named: ``$G4V_MODEL``, else the trained demo checkpoint, else the
    random-weight one."""
    if os.environ.get("G4V_MODEL"):
        return os.environ["G4V_MODEL"]
    if (TRAINED_MODEL_DIR / "model.safetensors").is_file():
        return str(TRAINED_MODEL_DIR)
    return str(BUNDLED_MODEL_DIR)


def names_folder(model: str | Path, folder: Path) -> bool:
    """Whether the path ``model`` is ``folder`` (symlinks resolved; False where it cannot be resolved)."""
    try:
        return Path(model).resolve() == folder.resolve()
    except OSError:
        return False


def is_bundled(model: str) -> bool:
    """True for a bundled demo checkpoint (random, trained, or trained on documents)."""
    return any(names_folder(model, folder) for folder in (BUNDLED_MODEL_DIR, TRAINED_MODEL_DIR, DOCUMENTS_MODEL_DIR))
