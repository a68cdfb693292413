"""``python -m g4v eval --a ARM --b ARM --data D [--columns ...] --out DIR``: two arms over a dataset.

Arms: ``hf``, ``hf:adapter=NAME``, ``hf:model=DIR``, ``vllm[:adapter=NAME]``,
``openai:URL[,model=NAME][,adapter=NAME]``; ``vision-lora=MODE`` on an hf or vllm arm. Writes ``samples.jsonl`` as rows finish (run the same
command again to resume), then ``samples.parquet``, ``samples.csv`` and ``summary.json``, and the
Evaluate tab's pictures as PNG (:data:`PLOT_FILES`); prints a short summary table and the files.
``--keep-sweep 100,75,50,25,10 [--policy P,...|all]`` runs a token-budget sweep of ``--a`` instead
(:mod:`g4v.evaluate.budget`; ``--b`` is not needed) and writes its curve (:data:`BUDGET_PLOT`).
See ``docs/evaluate.md`` and ``docs/token-budget.md``.
"""

import sys
from pathlib import Path

from g4v.commands.common import add_adapters_dir_flag
from g4v.commands.settings_flags import add_settings_flags, settings_from_args

#: The Evaluate tab's pictures (:func:`viz.evaluate.run_figures`, by name) and the PNG each becomes.
PLOT_FILES = {"accuracy": "accuracy.png", "paired": "paired.png", "kl": "kl.png", "divergence": "divergence.png"}
#: The token-budget sweep's picture (:func:`viz.token_budget.budget_figure`).
BUDGET_PLOT = "budget.png"
#: EvalConfig fields typed as their own flags (the rest come from add_settings_flags).
_OWN_FLAGS = ("a", "b", "data", "columns")


def add_parser(subparsers):
    from g4v.evaluate.run import EvalConfig

    parser = subparsers.add_parser("eval", help="compare two arms (backend, model, adapter) over a dataset")
    parser.add_argument("--a", required=True, metavar="ARM", help="first arm, e.g. hf")
    parser.add_argument("--b", metavar="ARM", help="second arm, e.g. hf:adapter=tiny-trained-french, hf:model=DIR,vision-lora=off "
                        "or hf:keep=50,policy=norm (required unless --keep-sweep)")
    parser.add_argument("--data", required=True, metavar="D",
                        help="dataset: imagefolder with metadata.jsonl/csv, .jsonl/.csv/.parquet, saved dataset, "
                             "or Hub id (assets/datasets/shapes-heldout is bundled)")
    parser.add_argument("--columns", default=None, metavar="MAP",
                        help="column mapping, e.g. image=img,prompt=question,reference=answer,category=kind")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="results folder (resumable)")
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
    a = ArmSpec.parse(args.a)
    config = settings_from_args(EvalConfig, args, exclude=_OWN_FLAGS, a=a, b=ArmSpec.parse(args.b) if args.b else a,
                                data=args.data, columns=Columns.parse(args.columns))
    bars = []  # started at the first report, once the dataset and the arms are ready

    def progress(done: int, total: int) -> None:
        if not bars:
            # a resumed run starts at the rows already done (its rate counts only new rows)
            bars.append(tqdm(total=total, initial=done, unit="row", file=sys.stderr, desc="eval"))
        bars[0].n = done
        bars[0].refresh()

    try:
        if args.keep_sweep is not None:
            from g4v.evaluate.budget import run_budget_sweep

            curve = run_budget_sweep(config, args.out, args.keep_sweep, args.policy, adapters_dir=args.adapters_dir,
                                     progress=progress)
        else:
            result = run_eval(config, args.out, adapters_dir=args.adapters_dir, progress=progress)
    except KeyboardInterrupt:
        for bar in bars:
            bar.close()
        kept = f"{bars[0].n} of {bars[0].total} rows are" if bars else "the finished rows are"
        print(f"error: interrupted; {kept} kept in {args.out}: run the same command again to resume",
              file=sys.stderr)
        return 130
    finally:
        for bar in bars:
            bar.close()
    if args.keep_sweep is not None:
        return _report_sweep(curve, args.out)
    print(summary_table(result.summary))
    print(f"results: {args.out}")
    for path in write_plots(result, args.out):
        print(f"wrote {path}")
    return 0


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
    from dataclasses import asdict

    from viz.evaluate import run_figures

    pictures = run_figures(result.summary, [asdict(row) for row in result.rows])
    paths = []
    for name, file_name in PLOT_FILES.items():
        pictures[name].save(out_dir / file_name)
        paths.append(out_dir / file_name)
    return paths


def summary_table(summary: dict) -> str:
    """A few lines: each arm's accuracy with its interval, the paired test, agreement; per category."""
    from g4v.evaluate.budget import accuracy_text as _accuracy

    lines = [f"rows {summary['n']} (errors {summary['n_errors']}){'' if summary['complete'] else ', INCOMPLETE'}"]
    header = f"{'':<12}{'n':>5}  {'A acc':>16}  {'B acc':>16}  {'agree':>6}  {'A only':>6}  {'B only':>6}  {'McNemar p':>9}"
    lines += [f"A = {summary['arms']['a']['label']}, B = {summary['arms']['b']['label']}", header]
    groups = {"all": summary, **summary["by_category"]}
    for name, block in groups.items():
        paired = block["paired"]
        agreement = "-" if block["agreement"] is None else f"{100 * block['agreement']:.1f}%"
        lines.append(f"{name:<12}{block['n']:>5}  {_accuracy(block['arms']['a']):>16}  {_accuracy(block['arms']['b']):>16}"
                     f"  {agreement:>6}  {paired['a_only']:>6}  {paired['b_only']:>6}  {paired['mcnemar_p']:>9.3g}")
    if summary.get("kl"):
        kl = summary["kl"]
        lines.append(f"KL(a||b) per row: mean {kl['mean']:.4g}, q90 {kl['q90']:.4g}, q99 {kl['q99']:.4g}, max {kl['max']:.4g}")
    return "\n".join(lines)
