"""The training log a custom loop writes (the demo's trainer does): JSON lines beside the checkpoint.

The first line says what it is (:data:`FORMAT`), the model type, its levels and the monitor's
settings; every other line is one log entry, as a ``transformers.Trainer`` keeps them in
``trainer_state.json``'s ``log_history``: ``{"step": N, "loss": ..., "deepstack/<level>/<metric>":
..., ...}``. So one reader reads both (:mod:`g4v.training.runs`). Numbers are kept to 6 significant
digits: the log ships with the trained checkpoint and stays small.
"""

import json
import math
from dataclasses import asdict
from pathlib import Path

from g4v.training.settings import MonitorSettings

LOG_FILE = "training_log.jsonl"
FORMAT = "g4v-training-log/1"


def rounded(value):
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return float(f"{value:.6g}")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf or NaN
    return value


def write_log(path: Path, model_type: str, levels: list[str], settings: MonitorSettings, entries: list[dict],
              **about) -> Path:
    """Write ``entries`` (``{"step": N, name: value, ...}``) under a header into ``path``."""
    header = {"format": FORMAT, "model_type": model_type, "levels": list(levels), "monitor": asdict(settings), **about}
    lines = [json.dumps(header, sort_keys=True)]
    lines += [json.dumps({key: rounded(value) for key, value in entry.items()}, sort_keys=True) for entry in entries]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)
