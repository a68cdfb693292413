"""``python -m g4v training RUN_DIR [--json] [--png OUT]``: the 8 levels over a training run.

``RUN_DIR`` is a run folder inside the run folders (``--runs-dir``, else ``$G4V_RUNS_DIR``, else
``assets``): the demo trainer's log, a Trainer's ``trainer_state.json`` or its TensorBoard events;
a run without Deepstack metrics (or ``--measure``) has its checkpoints measured on the probe set,
a progress bar with the time left on stderr. The table (or ``--json``: every record) goes to stdout,
the curves to ``--png``. The Training tab shows the same numbers (``g4v.training.report``).
"""

import json
import sys
from pathlib import Path

from g4v.errors import G4VError


def add_parser(subparsers):
    parser = subparsers.add_parser("training", help="the 8 levels over a training run (logged, or measured on its "
                                                    "checkpoints)")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run folder, by its name inside the run folders, or a path there")
    parser.add_argument("--runs-dir", default=None, metavar="DIR",
                        help="folder(s) runs may be read from, os.pathsep-separated "
                             "(default: $G4V_RUNS_DIR, else assets)")
    parser.add_argument("--json", action="store_true", help="print every record as JSON instead of the table")
    parser.add_argument("--png", default=None, metavar="OUT", help="write the curves here (a PNG file)")
    parser.add_argument("--measure", action="store_true",
                        help="measure the run's checkpoints on the probe set even where it logged its levels")
    parser.add_argument("--device", default=None, help="device the checkpoints are measured on (cpu, cuda, ...)")
    return parser


def run(args) -> int:
    from g4v.training.report import COLUMNS, alert_lines, headline, kept_line, open_run, summary_rows
    from g4v.training.runs import runs_dirs

    png = Path(args.png) if args.png else None
    if png is not None and (png.is_dir() or not png.parent.is_dir()):
        raise G4VError(f"--png must name a file in an existing folder, got {args.png}")
    curves = open_run(args.run_dir, runs_dirs(args.runs_dir), measure=args.measure, device=args.device,
                      progress=_progress_bar())
    if png is not None:
        from viz.training import curves_figure

        curves_figure(curves.to_dict()).save(png)
    if args.json:
        print(json.dumps(curves.to_dict(), indent=1))
        return 0
    print(headline(curves))
    widths = [max(len(str(c)), 12) for c in COLUMNS]
    print("  ".join(f"{c:>{w}}" for c, w in zip(COLUMNS, widths)))
    for row in summary_rows(curves):
        print("  ".join(f"{str(v):>{w}}" for v, w in zip(row, widths)))
    for line in alert_lines(curves):
        print(line)
    print(kept_line(curves))
    if png is not None:
        print(f"wrote {png}")
    return 0


def _progress_bar():
    """A tqdm bar on stderr for measured checkpoints (its own time-left estimate), created at the first one."""
    state = {}

    def progress(done: int, total: int, elapsed: float) -> None:
        from tqdm.auto import tqdm

        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc="checkpoints measured", file=sys.stderr)
        state["bar"].update(done - state["bar"].n)
        if done == total:
            state["bar"].close()

    return progress
