"""``python -m g4v port-diff [--model M] --image IMG --prompt P [--atol A] [--rtol R] [--json] [--png OUT]
[--fail-on-diff]``: where vLLM's port of Granite 4 Vision departs from transformers (per level, per
layer, per config field).

Runs only where vLLM is installed (the vLLM CPU environment: ``.venv-vllm``); both sides run in
that one environment so they share the image processor.

Exit status: 0 when the report was printed, 1 for bad input (one ``error:`` line), 2 for bad flags;
with ``--fail-on-diff``, :data:`EXIT_DIFFERS` when the verdict is DIFFERS (the report is printed
all the same), so CI can tell "the port departs" from "the tool could not run"."""

import json
import os

from g4v.commands.common import output_file
from g4v.commands.inputs import add_picture_flags
from g4v.errors import G4VError
from g4v.port.settings import PortDiffSettings
from g4v.settings.flags import add_settings_flags, settings_from_args

#: ``--fail-on-diff``'s exit status when the verdict is DIFFERS (1 and 2 are taken by errors).
EXIT_DIFFERS = 3


def add_parser(subparsers):
    parser = subparsers.add_parser("port-diff", help="compare vLLM's granite4_vision with transformers, level by level")
    parser.add_argument("--model", default=None,
                        help="model folder or hub id (default: $G4V_MODEL, else the bundled checkpoint)")
    add_picture_flags(parser)
    add_settings_flags(parser, PortDiffSettings)  # --max-new-tokens, the tolerances, the vision LoRA's options
    parser.add_argument("--fail-on-diff", action="store_true",
                        help=f"exit with status {EXIT_DIFFERS} when the verdict is DIFFERS (for CI)")
    parser.add_argument("--json", action="store_true", help="print the full result as JSON")
    parser.add_argument("--png", default=None, type=output_file, metavar="PATH", help="also save heatmaps and trajectories as a PNG")
    parser.add_argument("--progress", action="store_true",
                        help="write a line on stderr as each stage starts (the app's vLLM port tab reads them)")
    return parser


def run(args) -> int:
    from g4v.engines import vllm_installed
    from g4v.commands.inputs import open_single

    if not vllm_installed():
        from g4v.port.in_vllm_env import SETUP_COMMAND

        raise G4VError(f"port-diff needs vLLM: run it from the vLLM environment "
                       f"({SETUP_COMMAND}, then .venv-vllm/bin/python -m g4v port-diff ...)")
    from g4v.port.lora_audit import parse_serving

    settings = settings_from_args(PortDiffSettings, args)
    serving = parse_serving(settings.vllm_serving)
    picture = open_single(args.image, args.pages, args.dpi)  # check the input before the (slow) model loads
    # vLLM logs to stdout by default (its engine processes inherit this); keep stdout for the report.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from g4v.port.in_vllm_env import progress_line
    from g4v.port.run import run_port_diff

    # On stderr as it is now (the app reads the lines there): while vLLM runs, the comparison sends
    # file descriptor 2 elsewhere to hold back vLLM's logs (g4v.port.probe).
    stderr = os.fdopen(os.dup(2), "w", buffering=1) if args.progress else None

    def progress(fraction: float, text: str) -> None:
        print(progress_line(fraction, text), file=stderr, flush=True)

    result = run_port_diff(picture, args.prompt, model=args.model, max_new_tokens=settings.max_new_tokens,
                           atol=settings.atol, rtol=settings.rtol, draw=bool(args.png),
                           vision_lora=settings.vision_lora, vllm_vision_lora=settings.vllm_vision_lora,
                           vllm_serving=serving, progress=progress if args.progress else None)
    if args.png:
        result.figure.save(args.png)
    print(json.dumps(result.summary.to_dict(), indent=2) if args.json else report(result.summary))
    return exit_status(result.summary, args.fail_on_diff)


def exit_status(summary, fail_on_diff: bool) -> int:
    """0, or :data:`EXIT_DIFFERS` when asked to fail and the verdict is DIFFERS."""
    return EXIT_DIFFERS if fail_on_diff and not summary.ok else 0


#: The table's headers as the report prints them (:data:`g4v.port.table.LEVEL_COLUMNS`, short), and widths.
CLI_COLUMNS = ("level", "LLM", "max |diff|", "max rel", "share of tol. used", "verdict")
CLI_WIDTHS = (13, 3, 10, 9, 18, 0)


def report(summary) -> str:
    """The summary (a :class:`~g4v.port.summary.PortDiffSummary`) as the command prints it."""
    from g4v.port.table import level_rows
    from g4v.tiling import pixels

    lines = [f"model: {summary.model}", f"verdict: {'OK' if summary.ok else 'DIFFERS'}: {summary.message}"]
    size = summary.image_size
    if size:
        lines.insert(1, f"image: {pixels(size['width'], size['height'])}")
    vision = summary.vision_lora
    if vision and vision.checkpoint:
        lines.append(f"vision LoRA (rank {vision.checkpoint.rank}): transformers {vision.transformers}, "
                     f"vLLM {vision.vllm} ({'applied' if vision.vllm_applies else 'not applied'})")
    lines += [f"finding: {line}" for line in (vision.findings if vision else [])]
    for name, error in (("load error", summary.load_error), ("vllm error", summary.vllm_error)):
        if error:
            lines.append(f"{name}: {error}")
    if summary.levels:
        tolerance = summary.tolerance
        lines.append(f"\nper-level tolerance: {tolerance and tolerance.rule} ({tolerance and tolerance.source})")
        lines += [_table_line(cells) for cells in [CLI_COLUMNS, *level_rows(summary.levels)]]
    trajectory = summary.trajectory
    if trajectory and trajectory.transformers:
        lines.append("\nlayer  image(hf)  image(vllm)  text(hf)  text(vllm)  max token rel")
        hf, vl = trajectory.transformers, trajectory.vllm
        for i in trajectory.layers:
            lines.append(f"  {i:3}  {_f(hf.image_norm[i]):>9}  {_f(vl.image_norm[i]):>11}  "
                         f"{_f(hf.text_norm[i]):>8}  {_f(vl.text_norm[i]):>10}  "
                         f"{trajectory.max_token_rel_diff[i]:.2e}")
    elif trajectory:
        lines.append(f"\ntrajectory: {trajectory.problem}")
    nt = summary.next_token
    if nt:
        lines.append(f"\nnext token: KL {nt.kl_divergence:.3g} ({nt.kl_over}), top-5 overlap "
                     f"{nt.top5_overlap}/5, argmax {'agrees' if nt.argmax_agrees else 'differs'}")
        lines.append(f"  transformers: {nt.continuation_transformers!r}")
        lines.append(f"  vLLM:         {nt.continuation_vllm!r}")
        first = nt.first_divergence
        lines.append(f"  first divergence: {'none' if first is None else 'token ' + str(first)}")
    audit = summary.config_audit
    if audit:
        lines.append(f"\nconfig audit ({audit.vllm_source}): {audit.message}")
        for row in audit.fields:
            mark = {True: "ok", False: "DIFFERS", None: "?"}[row.ok]
            lines.append(f"  {mark:7} {row.field}: checkpoint {_short(row.checkpoint)}, "
                         f"transformers {_short(row.transformers)}, vLLM {_short(row.vllm)}")
    return "\n".join(lines)


def _table_line(cells) -> str:
    """Names left-aligned, numbers right-aligned, in :data:`CLI_WIDTHS`."""
    return "  " + "  ".join(f"{cell:<{width}}" if i in (0, 5) else f"{cell:>{width}}"
                            for i, (cell, width) in enumerate(zip(cells, CLI_WIDTHS))).rstrip()


def _f(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
