"""A run's checkpoints measured on a probe set, and two of its steps side by side.

A run trained without the monitor still has its checkpoints: each is loaded in turn (one model in
memory at a time, closed before the next), and the monitor's probe pass
(:class:`g4v.training.monitor.DeepstackMonitor` with a fixed probe) measures its 8 levels on the
probe pictures: the numbers the Deepstack inspector reads, per level, the same as a record written
while training with a probe batch. The update norms are the projectors' moves from one measured
checkpoint to the next; gradients are not in a checkpoint, so there are none.

The probe set is the bundled Chat examples made for every model (pictures of shapes with their
questions), or the pictures the caller gives.
"""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from g4v.conversation import Message
from g4v.errors import G4VError, first_line
from g4v.images import open_image
from g4v.paths import EXAMPLES_DIR
from g4v.training.records import Record, check_levels, counted
from g4v.training.runs import RunCurves
from g4v.training.settings import MonitorSettings

#: Checkpoints measured at most (evenly spaced, the last always among them): each one is a model load.
MAX_CHECKPOINTS = 12
#: New tokens of each step's greedy answer in a side-by-side view.
ANSWER_TOKENS = 16
#: One checkpoint loaded at a time in this process, whoever asks (two visitors' comparisons queue).
_ONE_MODEL = threading.Lock()


def default_probe() -> list[tuple[str, str]]:
    """``(picture path, prompt)`` of the bundled Chat examples meant for every model."""
    listed = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    return [(str(EXAMPLES_DIR / item["file"]), item["prompt"]) for item in listed if "model" not in item]


def spaced(steps: list[int], limit: int) -> list[int]:
    """At most ``limit`` of ``steps`` (sorted), evenly spaced, the first and last kept."""
    if len(steps) <= limit:
        return steps
    picks = {steps[round(i * (len(steps) - 1) / (limit - 1))] for i in range(limit)}
    return sorted(picks)


def _engine(folder: Path, device: str | None):
    from g4v.engines.hf import TransformersEngine

    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise G4VError(f"{folder.name} holds a LoRA adapter, not a whole model: only a run's whole-model "
                       "checkpoints can be measured")
    try:
        return TransformersEngine(str(folder), device=device, dtype="float32")
    except G4VError:
        raise
    except Exception as err:  # a damaged or foreign checkpoint: transformers' own error, in one line, no path
        said = first_line(err, 160).replace(str(folder.resolve()), folder.name).replace(str(folder), folder.name)
        raise G4VError(f"{folder.name} cannot be loaded as Granite 4 Vision: {said}") from None


def _inputs(engine, probe: list[tuple]) -> list[dict]:
    return [engine.prepare_inputs([Message("user", prompt, [open_image(picture)])]) for picture, prompt in probe]


@dataclass
class StepView:
    """One step's checkpoint on one picture: its levels and its greedy answer."""

    step: int
    record: Record
    answer: str

    def to_dict(self) -> dict:
        return {"step": self.step, "levels": [level.to_dict() for level in self.record.levels], "answer": self.answer}


def _measured(engine, step: int, probe: list[tuple], settings: MonitorSettings) -> tuple[Record, dict]:
    """The probe pass's record on ``engine``'s model, and its projectors' weights (CPU copies)."""
    from g4v.model.sites import projector_site, site
    from g4v.training.monitor import DeepstackMonitor

    with engine.adapter_scope(None) as model:
        monitor = DeepstackMonitor(model, replace(settings, update_norms=False), probe=_inputs(engine, probe))
        try:
            monitor.begin(step, measure=True)
            record = monitor.end()
        finally:
            monitor.close()
        weights = {level.name: [p.detach().cpu().clone() for p in site(model, projector_site(level)).parameters()]
                   for level in monitor.levels}
    return record, weights


def measure_checkpoints(curves: RunCurves, probe: list[tuple] | None = None, settings: MonitorSettings | None = None,
                        limit: int = MAX_CHECKPOINTS, device: str | None = None,
                        progress: Callable[[int, int, float], None] | None = None) -> RunCurves:
    """``curves`` with one record per measured checkpoint (``progress(done, total, elapsed)`` after each)."""
    import torch

    settings = settings or MonitorSettings()
    probe = probe or default_probe()
    steps = spaced(sorted(curves.checkpoints), limit)
    records, previous, started = [], None, time.monotonic()
    if progress is not None:
        progress(0, len(steps), 0.0)
    for done, step in enumerate(steps, 1):
        with _ONE_MODEL:
            engine = _engine(curves.checkpoints[step], device)
            try:
                record, weights = _measured(engine, step, probe, settings)
            finally:
                engine.close()
        for level in record.levels:
            if previous is not None:
                level.update_norm = float(torch.sqrt(sum(((w - v) ** 2).sum() for w, v in
                                                         zip(weights[level.name], previous[level.name]))))
        record.alerts = check_levels(step, record.levels, {lv.name: lv for lv in records[-1].levels} if records else {},
                                     settings)
        records.append(record)
        previous = weights
        if progress is not None:
            progress(done, len(steps), time.monotonic() - started)
    levels = [level.name for level in records[0].levels] if records else []
    source = f"{counted(len(steps), 'checkpoint')} measured on {counted(len(probe), 'probe picture')}"
    return RunCurves(curves.name, source, levels, records, curves.loss, curves.checkpoints)


def open_steps(curves: RunCurves, steps: tuple[int, int], picture, prompt: str, device: str | None = None,
               max_new_tokens: int = ANSWER_TOKENS) -> list[StepView]:
    """Two of the run's checkpoints on one picture and prompt, one loaded at a time: each one's 8
    levels (the probe pass) and its greedy answer."""
    from g4v.model.scoring import greedy_continuation

    if not isinstance(prompt, str) or not prompt.strip():
        raise G4VError("the prompt is empty")
    picture = open_image(picture)
    missing = [step for step in steps if step not in curves.checkpoints]
    if missing:
        kept = ", ".join(map(str, sorted(curves.checkpoints))) or "none"
        raise G4VError(f"run {curves.name!r} keeps no checkpoint of step {missing[0]} (its checkpoints: {kept})")
    views = []
    for step in steps:
        with _ONE_MODEL:
            engine = _engine(curves.checkpoints[step], device)
            try:
                record, _ = _measured(engine, step, [(picture, prompt)], MonitorSettings())
                inputs = engine.prepare_inputs([Message("user", prompt, [picture])], max_new_tokens)
                with engine.adapter_scope(None) as model:
                    ids = greedy_continuation(model, inputs, engine.tokenizer, max_new_tokens)
                answer = engine.tokenizer.decode(ids, skip_special_tokens=True)
            finally:
                engine.close()
        views.append(StepView(step, record, answer))
    return views
