"""What the demo's trainings and its ``eval`` share while they run: the progress bar on stderr, its
running-mean postfix, and dropout switched off. A module of its own, so the trainers and the
evaluation import it instead of each other (torch and tqdm load when first used)."""

import sys


def no_dropout(model) -> None:
    """Switch every dropout off (the recipes train without it)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def progress_bar(total: int | None, desc: str, unit: str = "it"):
    """A tqdm bar on stderr (stdout carries the logs)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=2.0)


def tick(bar, step: int, every: int, name: str, values: list[float], window: int, digits: int = 3) -> None:
    """Advance ``bar`` (None: no bar) by one step; every ``every`` steps show the mean of the last
    ``window`` values as ``name``."""
    if bar is None:
        return
    bar.update(1)
    if step % every == 0:
        recent = values[-window:]
        bar.set_postfix({name: f"{sum(recent) / len(recent):.{digits}f}"})
