"""``python -m g4v eval --a ARM --b ARM --data D [--columns ...] --out DIR``: two arms over a dataset.

Arms: ``hf``, ``hf:adapter=NAME``, ``hf:model=DIR``, ``vllm[:adapter=NAME]``,
``openai:URL[,model=NAME][,adapter=NAME]``; ``vision-lora=MODE`` on an hf or vllm arm; ``dtype=bfloat16``,
``quant=int8[,quant-vision=no]`` on an hf arm (a precision pair adds per-level drift); ``--b same`` runs
arm A twice (the noise floor). Writes ``samples.jsonl`` as rows finish (run the same
command again to resume), then ``samples.parquet``, ``samples.csv`` and ``summary.json``, and the
Evaluate tab's pictures as PNG (:data:`PLOT_FILES`); prints the detectable difference before the run
(stderr), then a short summary table with the equivalence test, the noise floor and the fields that moved.
``--keep-sweep 100,75,50,25,10 [--policy P,...|all]`` runs a token-budget sweep of ``--a`` instead
(:mod:`g4v.evaluate.budget`; ``--b`` is not needed) and writes its curve (:data:`BUDGET_PLOT`).
See ``docs/evaluate.md`` and ``docs/token-budget.md``.
"""

import contextlib
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from g4v.commands.common import add_adapters_dir_flag, output_folder
from g4v.evaluate.equivalence import plan_line, summary_lines
from g4v.evaluate.fields import field_rows
from g4v.evaluate.summary import ArmScore, RunSummary
from g4v.model.precision import DRIFT_HEADERS, DriftSummary, drift_rows, drift_title
from g4v.settings.flags import add_settings_flags, settings_from_args

#: The Evaluate tab's pictures (:func:`viz.evaluate.run_figures`, by name) and the PNG each becomes.
PLOT_FILES = {"accuracy": "accuracy.png", "paired": "paired.png", "kl": "kl.png", "divergence": "divergence.png"}
#: The token-budget sweep's picture (:func:`viz.token_budget.budget_figure`).
BUDGET_PLOT = "budget.png"
#: EvalConfig fields typed as their own flags (the rest come from add_settings_flags).
_OWN_FLAGS = ("a", "b", "data", "columns")
#: ``--b same``: arm B is arm A again (a noise-floor run).
SAME = "same"
#: Fields listed in the printed table (all are in summary.json).
FIELD_LINES = 20


def add_parser(subparsers):
    from g4v.evaluate.run import EvalConfig

    parser = subparsers.add_parser("eval", help="compare two arms (backend, model, adapter) over a dataset")
    parser.add_argument("--a", required=True, metavar="ARM", help="first arm, e.g. hf")
    parser.add_argument("--b", metavar="ARM",
                        help="second arm, e.g. hf:adapter=tiny-trained-french, hf:model=DIR,vision-lora=off, "
                             "hf:dtype=bfloat16, hf:quant=int8,quant-vision=no or hf:keep=50,policy=norm; "
                             "'same': arm A again (a noise-floor run); required unless --keep-sweep")
    parser.add_argument("--data", required=True, metavar="D",
                        help="dataset: imagefolder with metadata.jsonl/csv, .jsonl/.csv/.parquet, saved dataset, "
                             "or Hub id (assets/datasets/shapes-heldout is bundled)")
    parser.add_argument("--columns", default=None, metavar="MAP",
                        help="column mapping, e.g. image=img,prompt=question,reference=answer,category=kind")
    parser.add_argument("--out", required=True, type=output_folder, metavar="DIR", help="results folder (resumable)")
    add_settings_flags(parser, EvalConfig, exclude=_OWN_FLAGS)
    parser.add_argument("--keep-sweep", default=None, metavar="K,K,...",
                        help="token-budget sweep instead of A vs B: arm A against itself keeping each percent of "
                             "image tokens (e.g. 100,75,50,25,10), one run each in OUT/<policy>-keep<K>, then OUT/budget.png")
    parser.add_argument("--policy", default="norm", metavar="P[,P...]",
                        help="with --keep-sweep: which tokens are kept: norm, attention, attribution, random, or all")
    add_adapters_dir_flag(parser)
    return parser


def run(args) -> int:
    from tqdm import tqdm

    from g4v.evaluate import ArmSpec, Columns, EvalConfig, run_eval

    from g4v.errors import G4VError

    if args.b is None and args.keep_sweep is None:
        raise G4VError("give the second arm with --b ARM (or --keep-sweep K,K,... for a token-budget sweep of --a)")
    arm_a = ArmSpec.parse(args.a)
    if args.b is None:
        arm_b = arm_a
    else:
        arm_b = replace(arm_a, label=f"{arm_a.display} again") if args.b.strip() == SAME else ArmSpec.parse(args.b)
    config = settings_from_args(EvalConfig, args, exclude=_OWN_FLAGS, a=arm_a, b=arm_b, data=args.data,
                                columns=Columns.parse(args.columns))
    bars = []  # started at the first report, once the dataset and the arms are ready

    def progress(done: int, total: int) -> None:
        if not bars:
            # a resumed run starts at the rows already done (its rate counts only new rows)
            bars.append(tqdm(total=total, initial=done, unit="row", file=sys.stderr, desc="eval"))
        bars[0].n = done
        bars[0].refresh()

    def interrupted() -> int:
        for bar in bars:
            bar.close()
        kept = f"{bars[0].n} of {bars[0].total} rows are" if bars else "the finished rows are"
        print(f"error: interrupted; {kept} kept in {args.out}: run the same command again to resume",
              file=sys.stderr)
        return 130

    cancel = threading.Event()
    try:
        with ctrl_c_sets(cancel, rows_started=lambda: bool(bars)):
            if args.keep_sweep is not None:
                from g4v.evaluate.budget import run_budget_sweep

                curve = run_budget_sweep(config, args.out, args.keep_sweep, args.policy, adapters_dir=args.adapters_dir,
                                         progress=progress, cancel=cancel)
            else:
                result = run_eval(config, args.out, adapters_dir=args.adapters_dir, progress=progress, cancel=cancel,
                                  plan=lambda planned: print(plan_line(planned), file=sys.stderr, flush=True))
    except KeyboardInterrupt:  # the second Ctrl-C: the rows on disk are kept, the chunk in progress is not
        return interrupted()
    finally:
        for bar in bars:
            bar.close()
    if cancel.is_set():
        return interrupted()
    if args.keep_sweep is not None:
        return _report_sweep(curve, args.out)
    print(summary_table(result.summary))
    print(f"results: {args.out}")
    for path in write_plots(result, args.out):
        print(f"wrote {path}")
    return 0


@contextlib.contextmanager
def ctrl_c_sets(cancel: threading.Event, rows_started=lambda: True):
    """The first Ctrl-C sets ``cancel``: the run stops after the rows in progress, writes its tables
    and returns (the app's Stop button does the same). A KeyboardInterrupt raised at any bytecode can
    land in a finaliser, where Python prints it and goes on, so the run would finish as if nothing
    happened; a flag cannot be lost. The second Ctrl-C interrupts at once.

    Before ``rows_started()`` (the dataset opening, the model loading) there are no rows to finish
    and the flag would be read only once the load is done, so the first Ctrl-C interrupts at once,
    with the flag set too in case the interrupt is swallowed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum, frame):
        cancel.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not rows_started():
            raise KeyboardInterrupt
        print("\nstopping after the rows in progress (Ctrl-C again to stop now)", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _report_sweep(curve, out_dir: Path) -> int:
    """The curve as a table, then its picture."""
    from g4v.evaluate.budget import curve_table
    from viz.token_budget import budget_figure

    print(curve_table(curve.to_dict()))
    print(f"results: {out_dir}")
    budget_figure(curve.to_dict()).save(out_dir / BUDGET_PLOT)
    print(f"wrote {out_dir / BUDGET_PLOT}")
    return 0


def write_plots(result, out_dir: Path) -> list[Path]:
    """The pictures the Evaluate tab shows for this run, drawn by the same function, as PNG files."""
    from viz.evaluate import run_figures

    pictures = run_figures(result.summary, result.rows)
    paths = []
    for name, file_name in PLOT_FILES.items():
        pictures[name].save(out_dir / file_name)
        paths.append(out_dir / file_name)
    return paths


def summary_table(summary: RunSummary) -> str:
    """A few lines: each arm's accuracy with its interval, the paired test, agreement; per category."""
    from g4v.evaluate.budget import accuracy_text

    def accuracy(arm: ArmScore) -> str:
        return accuracy_text(arm.accuracy, arm.ci95)

    lines = [f"rows {summary.n} (errors {summary.n_errors}){'' if summary.complete else ', INCOMPLETE'}"]
    header = f"{'':<12}{'n':>5}  {'A acc':>16}  {'B acc':>16}  {'agree':>6}  {'A only':>6}  {'B only':>6}  {'McNemar p':>9}"
    lines += [f"A = {summary.arms.a.label}, B = {summary.arms.b.label}", header]
    groups = {"all": summary, **summary.by_category}
    for name, block in groups.items():
        paired = block.paired
        agreement = "-" if block.agreement is None else f"{100 * block.agreement:.1f}%"
        lines.append(f"{name:<12}{block.n:>5}  {accuracy(block.arms.a):>16}  {accuracy(block.arms.b):>16}"
                     f"  {agreement:>6}  {paired.a_only:>6}  {paired.b_only:>6}  {paired.mcnemar_p:>9.3g}")
    lines += equivalence_lines(summary)
    if summary.kl:
        kl = summary.kl
        lines.append(f"KL(a||b) per row: mean {kl.mean:.4g}, q90 {kl.q90:.4g}, q99 {kl.q99:.4g}, max {kl.max:.4g}")
    if summary.level_drift:
        lines += drift_lines(summary.level_drift)
    return "\n".join(lines)


def equivalence_lines(summary: RunSummary) -> list[str]:
    """The TOST verdict, the detectable difference, the noise floor, then the fields (most moved first)."""
    lines = summary_lines(summary)
    fields = summary.fields
    if fields:
        lines.append(f"fields of {fields.rows} structured rows (right/wrong/missing/extra), most moved first:")
        for name, rows, a, b, moved, change in field_rows(fields)[:FIELD_LINES]:
            lines.append(f"  {name:<24} A {a:<14} B {b:<14} moved in {moved} rows, right B-A {change:+d}")
        if len(fields.fields) > FIELD_LINES:
            lines.append(f"  ... {len(fields.fields) - FIELD_LINES} more in summary.json")
    return lines


def drift_lines(drift: DriftSummary) -> list[str]:
    """The per-level drift of a precision pair (the summary's ``level_drift``), one line per level
    (the rows of :func:`g4v.model.precision.drift_rows`, which the Evaluate tab shows too)."""
    def line(cells: list[str]) -> str:  # the level's name to the left, the numbers to the right
        return "".join(f"{cell:<{width}}" if i == 0 else f"{cell:>{width}}"
                       for i, (cell, width) in enumerate(zip(cells, (12, 14, 13, 13, 12))))

    return [drift_title(drift), line(DRIFT_HEADERS), *(line(row) for row in drift_rows(drift))]
