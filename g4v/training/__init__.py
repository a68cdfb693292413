"""The Training panel: Granite 4 Vision's 8 injection levels watched while a model trains, and a
training run read back.

The package reads from the bottom up; each module imports only those above it in this list:

* :mod:`g4v.training.settings`: :class:`~g4v.training.settings.MonitorSettings`, when the levels are
  measured and the warnings' thresholds (no torch);
* :mod:`g4v.training.records`: one measurement as a typed record, its flat names in a trainer's
  logs, and the collapse and explosion warnings read from it (no torch);
* :mod:`g4v.training.log_file`: the training log a custom loop writes beside its checkpoint;
* :mod:`g4v.training.monitor`: the measurement itself, on a training step's own forward and
  backward (hooks through :mod:`g4v.model.hooks`, capture points of :mod:`g4v.model.capture`);
* :mod:`g4v.training.callback`: the same as a ``transformers.TrainerCallback``;
* :mod:`g4v.training.runs`: the run folders and what a run's files say;
* :mod:`g4v.training.measure`: a run's checkpoints measured on a probe set, two steps side by side;
* :mod:`g4v.training.report`: a run opened for the Training tab and ``python -m g4v training``;
* :mod:`g4v.training.bench`: what the monitor costs a training step (``python -m g4v bench training``).

The pictures are drawn by ``viz.training``.
"""
