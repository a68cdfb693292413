"""``python -m g4v.demo build [--out DIR]``: regenerate the bundled checkpoint.

``python -m g4v.demo build-adapter [--out DIR]``: regenerate the demo LoRA adapter for it.

``python -m g4v.demo build-vlora [--out DIR]``: regenerate the layout checkpoint (base weights plus
the vision LoRA beside them, :mod:`g4v.demo.vlora`; a short LoRA training, flags: the fields of
:class:`g4v.demo.recipe.VisionLoraSettings`); ``build-layout-adapters --out DIR``: a user's two
kinds of adapter for it (:mod:`g4v.demo.layout_adapters`).

``python -m g4v.demo dataset [--out DIR]``: regenerate the bundled dataset for dataset runs.

``python -m g4v.demo train`` / ``train-adapter``: train the bundled trained checkpoint and its
French-colours adapter (their flags are the fields of :mod:`g4v.demo.recipe`); ``train-documents``:
its document stages, charts to CSV and key-value extraction (:mod:`g4v.demo.documents_training`);
``eval``: measure them on held-out pictures (:mod:`g4v.demo.evaluate`).

``python -m g4v.demo examples``: draw the Chat examples of the document tasks (:mod:`g4v.demo.examples`)."""

import argparse
from contextlib import contextmanager
from pathlib import Path

from g4v.paths import (BUNDLED_MODEL_DIR, DOCUMENTS_MODEL_DIR, FRENCH_ADAPTER_DIR, REPO_ROOT, TRAINED_MODEL_DIR,
                       VLORA_MODEL_DIR)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m g4v.demo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build the tiny random-weight checkpoint")
    build_cmd.add_argument("--out", type=Path, default=BUNDLED_MODEL_DIR, help="output folder")
    adapter_cmd = sub.add_parser("build-adapter", help="build the demo LoRA adapter for the bundled checkpoint")
    adapter_cmd.add_argument("--out", type=Path, default=None, help="output folder (default: assets/adapters/demo-lora)")
    layout_cmd = sub.add_parser("build-layout-adapters",
                                help="build a replacement and an on-the-vision-model adapter for the layout checkpoint")
    layout_cmd.add_argument("--out", type=Path, required=True, help="new output folder")
    dataset_cmd = sub.add_parser("dataset", help="build the bundled dataset for dataset runs (held-out pictures)")
    dataset_cmd.add_argument("--out", type=Path, default=None, help="output folder (default: assets/datasets/shapes-heldout)")
    sub.add_parser("examples", help="draw the chart and key-value Chat examples into assets/examples")
    _add_training_commands(sub)
    args = parser.parse_args(argv)

    if args.command == "build":
        from g4v.demo.build import build

        sha = build(args.out)
        print(f"wrote {args.out} (weights sha256 {sha})")
    elif args.command == "build-layout-adapters":
        from g4v.demo.layout_adapters import build_layout_adapters

        folders = build_layout_adapters(args.out)
        print(f"wrote {folders['adapters']} (use it as --adapters-dir) and {folders['vision-model']}")
    elif args.command == "dataset":
        from g4v.demo.dataset import build_dataset
        from g4v.evaluate.data import BUNDLED_DATASET

        print(f"wrote {build_dataset(args.out or BUNDLED_DATASET)}")
    elif args.command == "build-adapter":
        from g4v.lora.folders import DEFAULT_ADAPTERS_DIR
        from g4v.demo.adapter import ADAPTER_NAME, build_adapter

        out = build_adapter(args.out or DEFAULT_ADAPTERS_DIR / ADAPTER_NAME)
        print(f"wrote {out}")
    elif args.command == "examples":
        from g4v.demo.examples import write_examples

        for path in write_examples():
            print(f"wrote {path}")
    elif args.command in ("train", "train-adapter", "train-documents", "build-vlora", "eval"):
        with _loading_bars(not args.no_progress):
            return _run_training_command(args, argv)
    return 0


@contextmanager
def _loading_bars(shown: bool):
    """``--no-progress`` also hides transformers' "Loading weights" bars (a global switch, so it is
    put back as it was: tests call :func:`main` in one process)."""
    from transformers.utils import logging

    was_shown = logging.is_progress_bar_enabled()
    if not shown:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_shown:
            logging.enable_progress_bar()


# ── train / train-adapter / eval (g4v.demo.loop, g4v.demo.adapter_training, g4v.demo.evaluate) ──


def _add_training_commands(sub) -> None:
    """The training commands' flags: one per settings field (:mod:`g4v.settings.flags`)."""
    from g4v.settings.flags import add_settings_flags
    from g4v.demo.evaluate import DemoEvalSettings
    from g4v.demo.recipe import AdapterSettings, DocumentsSettings, TrainSettings, VisionLoraSettings

    train_cmd = sub.add_parser("train", help="train the tiny checkpoint from scratch on synthetic shapes (CPU)")
    train_cmd.add_argument("--out", type=Path, default=TRAINED_MODEL_DIR, help="output folder")
    add_settings_flags(train_cmd, TrainSettings)
    train_cmd.add_argument("--no-progress", action="store_true", help="no progress bar")

    adapter_cmd = sub.add_parser("train-adapter", help="train the French-colours LoRA adapter on the trained checkpoint")
    adapter_cmd.add_argument("--base", type=Path, default=TRAINED_MODEL_DIR, help="trained checkpoint folder")
    adapter_cmd.add_argument("--out", type=Path, default=FRENCH_ADAPTER_DIR, help="output folder")
    add_settings_flags(adapter_cmd, AdapterSettings)
    adapter_cmd.add_argument("--no-progress", action="store_true", help="no progress bar")

    vlora_cmd = sub.add_parser("build-vlora", help="build the layout checkpoint: base weights and the vision LoRA "
                                                    "(trains a blind LoRA on the trained checkpoint)")
    vlora_cmd.add_argument("--out", type=Path, default=VLORA_MODEL_DIR, help="output folder")
    add_settings_flags(vlora_cmd, VisionLoraSettings)
    vlora_cmd.add_argument("--no-progress", action="store_true", help="no progress bar")

    documents_cmd = sub.add_parser("train-documents",
                                   help="a document stage: charts to CSV and key-value extraction, from the trained "
                                        "checkpoint or an earlier document stage")
    documents_cmd.add_argument("--out", type=Path, default=DOCUMENTS_MODEL_DIR,
                               help=f"output folder (default: {DOCUMENTS_MODEL_DIR.relative_to(REPO_ROOT)})")
    add_settings_flags(documents_cmd, DocumentsSettings)
    documents_cmd.add_argument("--no-progress", action="store_true", help="no progress bar")

    eval_cmd = sub.add_parser("eval", help="accuracy per question type on held-out pictures, ablations, adapter")
    add_settings_flags(eval_cmd, DemoEvalSettings)


def _run_training_command(args, argv) -> int:
    import shlex
    import sys

    command = "python -m g4v.demo " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if args.command == "train":
        from g4v.settings.flags import settings_from_args
        from g4v.demo.loop import train
        from g4v.demo.recipe import TrainSettings

        sha = train(args.out, settings_from_args(TrainSettings, args), command, progress=not args.no_progress)
        print(f"wrote {args.out} (weights sha256 {sha})")
    elif args.command == "train-adapter":
        from g4v.settings.flags import settings_from_args
        from g4v.demo.adapter_training import train_adapter
        from g4v.demo.recipe import AdapterSettings

        settings = settings_from_args(AdapterSettings, args)
        info = train_adapter(args.base, args.out, settings, command, progress=not args.no_progress)
        print(f"wrote {args.out} (adapter sha256 {info['weights_sha256']})")
    elif args.command == "build-vlora":
        from g4v.settings.flags import settings_from_args
        from g4v.demo.recipe import VisionLoraSettings
        from g4v.demo.vlora import build_vlora

        info = build_vlora(args.out, settings=settings_from_args(VisionLoraSettings, args), command=command,
                           progress=not args.no_progress)
        print(f"wrote {args.out} (base weights sha256 {info['weights_sha256']}, "
              f"vision LoRA sha256 {info['adapter_sha256']})")
    elif args.command == "train-documents":
        from g4v.settings.flags import settings_from_args
        from g4v.demo.documents_training import train_documents
        from g4v.demo.recipe import DocumentsSettings

        sha = train_documents(args.out, settings_from_args(DocumentsSettings, args), command,
                              progress=not args.no_progress)
        print(f"wrote {args.out} (weights sha256 {sha})")
    else:
        from g4v.demo.evaluate import DemoEvalSettings, main as eval_main
        from g4v.settings.flags import settings_from_args

        return eval_main(settings_from_args(DemoEvalSettings, args))
    return 0


def run(argv=None) -> int:
    """:func:`main`, with a refused input as one ``error:`` line instead of a traceback."""
    import sys

    from g4v.errors import G4VError

    try:
        return main(argv)
    except G4VError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(run())
