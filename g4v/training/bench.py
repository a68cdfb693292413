"""``python -m g4v bench training``: what the training monitor costs a training step.

Training steps (forward, backward, gradient clipping, an AdamW update) on synthetic batches are
timed in one run, three ways, interleaved round by round (:mod:`g4v.model.bench`): ``off`` (no
monitor), ``measured`` (every step measured: the cost of one measured step) and ``default``
(the default interval: a block of ``MonitorSettings.every`` steps of which one is measured, what a
training run pays). The target is ``default / off <= 1.10``.

Models: ``bundled``, ``larger`` (random weights at about 100M parameters) or ``real`` (the real
granite-vision-4.1-4b config, random weights: for a GPU, in bf16), or a config path.
"""

import argparse
from dataclasses import dataclass

import torch

from g4v.model.bench import BenchSetup, add_model_flags, build_model, fastest_seconds, run_benchmarks, synthetic_inputs
from g4v.training.settings import MonitorSettings

MODES = ("off", "measured", "default")


@dataclass
class BenchResult(BenchSetup):
    every: int
    repeats: int
    seconds: dict  # mode -> fastest seconds per step (the default mode: per step of its block)

    def ratios(self) -> dict:
        return {"measured_step": self.seconds["measured"] / self.seconds["off"],
                "default_interval": self.seconds["default"] / self.seconds["off"]}


def _trainer_steps(model, inputs: dict, every: int):
    """Functions that each run ``every`` training steps: without the monitor, with every step
    measured, and at the default interval (one measured step in the block)."""
    from g4v.training.monitor import DeepstackMonitor

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    monitor = DeepstackMonitor(model)

    def step(number: int | None, measure: bool | None = None) -> None:
        if number is not None:
            monitor.begin(number, measure)
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if number is not None:
            monitor.gradients_ready()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if number is not None:
            monitor.end()

    def off():
        for _ in range(every):
            step(None)

    def measured():
        for number in range(every):
            step(number + 1, measure=True)

    def default():
        for number in range(every + 1, 2 * every + 1):  # exactly one due step: 2 * every
            step(number)

    return {"off": off, "measured": measured, "default": default}, monitor


def bench(name: str, device: torch.device, dtype: torch.dtype, image_size_hw: tuple[int, int],
          repeats: int) -> BenchResult:
    label, model = build_model(name, device, dtype)
    model.train()
    for module in model.modules():  # no dropout: the modes must run the same arithmetic
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs = synthetic_inputs(model.config, image_size_hw, device, dtype)
    labels = inputs["input_ids"].clone()
    labels[labels == model.config.image_token_index] = -100
    inputs["labels"] = labels
    every = MonitorSettings().every
    runs, monitor = _trainer_steps(model, inputs, every)
    try:
        seconds = fastest_seconds(runs, device, repeats)
    finally:
        monitor.close()
    return BenchResult(label, str(device), str(dtype).removeprefix("torch."), sum(p.numel() for p in model.parameters()),
                       int(inputs["input_ids"].shape[1]),
                       int((inputs["input_ids"] == model.config.image_token_index).sum()), every, repeats,
                       {mode: seconds[mode] / every for mode in MODES})


def format_result(result: BenchResult) -> str:
    r = result.ratios()
    s = {mode: result.seconds[mode] * 1e3 for mode in MODES}
    return (f"{result.headline()}, best of {result.repeats} blocks of {result.every} steps\n"
            f"  per step  off {s['off']:.1f} ms | every step measured {s['measured']:.1f} ms (x{r['measured_step']:.3f}) "
            f"| default interval (every {result.every}) {s['default']:.1f} ms (x{r['default_interval']:.3f}, "
            f"target <= 1.10)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser, models=("bundled", "larger"), repeats=3)


def run(args) -> int:
    return run_benchmarks(args, bench, format_result)
