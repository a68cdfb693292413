"""The training monitor as a ``transformers.TrainerCallback``: the 8 levels in the Trainer's own logs.

::

    trainer = Trainer(model=model, args=TrainingArguments(..., report_to="tensorboard"), ...)
    with monitor_training(trainer):  # the callback, and its hooks gone however training ends
        trainer.train()

Each measured step's record (:mod:`g4v.training.records`) is logged through ``trainer.log`` at
that step, so it reaches ``trainer_state.json``'s ``log_history`` and every tracker in
``report_to`` (TensorBoard, W&B, trackio) beside the loss; a collapsed or exploded level is also a
warning in the ``g4v.training`` logger. The Trainer tells a callback when training ends but not
when it fails: :func:`monitor_training` removes the hooks in either case (a callback added on its
own removes them when training ends, and a measured step's hooks never outlive its forward pass
unless that pass fails).
"""

from collections.abc import Iterator
from contextlib import contextmanager

from transformers import TrainerCallback

from g4v.training.monitor import DeepstackMonitor
from g4v.training.settings import MonitorSettings


class DeepstackCallback(TrainerCallback):
    """Measures the 8 levels every ``settings.every`` optimizer steps (see
    :class:`~g4v.training.monitor.DeepstackMonitor`) and logs them through ``trainer.log``.
    ``probe``: a fixed batch (model inputs on the model's device) to measure the forward numbers on
    after each measured step's update, instead of the step's own forward pass."""

    def __init__(self, trainer, settings: MonitorSettings | None = None, probe: dict | None = None):
        self.trainer = trainer
        self.settings = settings or MonitorSettings()
        self.probe = probe
        self.monitor: DeepstackMonitor | None = None

    @property
    def history(self):
        return self.monitor.history if self.monitor is not None else []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.close()
        self.monitor = DeepstackMonitor(model, self.settings, self.probe, on_record=self._log)

    def on_step_begin(self, args, state, control, **kwargs):
        self.monitor.begin(state.global_step + 1)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.monitor.gradients_ready()

    def on_step_end(self, args, state, control, **kwargs):
        # trainer.log ends in on_log, which clears should_log: the Trainer's own log of this step
        # (the loss) comes after this callback and must still happen.
        should_log = control.should_log
        self.monitor.end()
        control.should_log = should_log

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Remove the hooks and the weight copies (training ended or failed)."""
        if self.monitor is not None:
            self.monitor.close()

    def _log(self, record) -> None:
        self.trainer.log(record.to_logs())


@contextmanager
def monitor_training(trainer, settings: MonitorSettings | None = None, probe: dict | None = None
                     ) -> Iterator[DeepstackCallback]:
    """``trainer`` with a :class:`DeepstackCallback` for the ``with`` block; the callback and every
    hook it added go when the block ends, whether training finished or raised."""
    callback = DeepstackCallback(trainer, settings, probe)
    trainer.add_callback(callback)
    try:
        yield callback
    finally:
        callback.close()
        trainer.remove_callback(callback)
