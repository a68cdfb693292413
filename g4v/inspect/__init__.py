"""The deepstack inspector: what Granite 4 Vision's 8 visual injections carry, and what they do to
the language model's answer.

The levels and the recording hooks are the shared layer's (:mod:`g4v.model.levels`,
:mod:`g4v.model.capture`): every panel reads them. This package reads from the bottom up; each
module imports only those above it in this list:

* :mod:`g4v.inspect.settings`: what an inspection is asked (:class:`~g4v.inspect.settings.InspectSettings`,
  the one place for its defaults: the command's flags, the tab's widgets);
* :mod:`g4v.inspect.ablation`: a run with levels zeroed or scaled, compared with the plain run;
* :mod:`g4v.inspect.run`: one request end to end (capture, ablation, figures, an export to the
  shared :mod:`g4v.model.exports` store), for the CLI (``python -m g4v inspect``) and the app's
  Deepstack tab;
* :mod:`g4v.inspect.bench`: what the capture costs in time and memory (``python -m g4v bench
  inspect``, or ``python -m g4v.inspect.bench`` standalone).

The figures themselves are drawn by ``viz.deepstack`` (no model code there).
"""
