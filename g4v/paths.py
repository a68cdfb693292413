"""Where the bundled files live, and which model is the default."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS_DIR = REPO_ROOT / "assets"

#: The small Granite 4 Vision checkpoint that ships with the project (real architecture, tiny sizes).
BUNDLED_MODEL_DIR = ASSETS_DIR / "granite4-vision-tiny"
#: The real granite-vision-4.1-4b config and processor settings, without weights.
REAL_CONFIG_DIR = ASSETS_DIR / "granite-vision-4.1-4b-config"
EXAMPLES_DIR = ASSETS_DIR / "examples"

REAL_MODEL_ID = "ibm-granite/granite-vision-4.1-4b"


def default_model() -> str:
    """The model used when none is named: ``$G4V_MODEL``, else the bundled checkpoint."""
    return os.environ.get("G4V_MODEL") or str(BUNDLED_MODEL_DIR)


def is_bundled(model: str) -> bool:
    try:
        return Path(model).resolve() == BUNDLED_MODEL_DIR.resolve()
    except OSError:
        return False
