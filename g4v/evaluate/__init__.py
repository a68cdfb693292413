"""Dataset runs: two arms (backend + model + adapter) over a whole dataset, and the statistics
that settle a question about them (did the adapter help, and where; does a port answer as
transformers does). No Gradio here: the CLI (``python -m g4v eval``) and the app's Evaluate tab
call the same functions.

* :mod:`g4v.evaluate.arms`: what an arm is, typed as text, opened as an engine.
* :mod:`g4v.evaluate.data`: datasets through Hugging Face ``datasets``, column mapping, bad rows.
* :mod:`g4v.evaluate.readers`: each kind of dataset read safely (its own files only, nothing cached).
* :mod:`g4v.evaluate.scoring`: per-sample comparisons (token agreement, log-probabilities, KL).
* :mod:`g4v.evaluate.summary`: the run's summary as types (``summary.json`` is its ``to_dict``).
* :mod:`g4v.evaluate.stats`: accuracy with Wilson intervals, exact McNemar, the summary computed.
* :mod:`g4v.evaluate.equivalence`: the paired TOST, the detectable difference, the noise floor.
* :mod:`g4v.evaluate.fields`: per-field scores of key-value and table answers.
* :mod:`g4v.evaluate.store`: the run's folder, appended row by row, resumable, refused when tampered.
* :mod:`g4v.evaluate.run`: the run itself.
"""

from g4v.evaluate.arms import Arm, ArmSpec, open_arm, open_arms
from g4v.evaluate.data import BUNDLED_DATASET, Columns, EvalDataset, EvalSample, open_dataset
from g4v.evaluate.run import EvalConfig, RunResult, SampleResult, read_results, run_eval
from g4v.evaluate.stats import mcnemar_exact, normalise, summarise, wilson_interval

__all__ = ["BUNDLED_DATASET", "Arm", "ArmSpec", "Columns", "EvalConfig", "EvalDataset", "EvalSample", "RunResult",
           "SampleResult", "mcnemar_exact", "normalise", "open_arm", "open_arms", "open_dataset", "read_results",
           "run_eval", "summarise", "wilson_interval"]
