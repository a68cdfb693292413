"""``python -m g4v.demo build [--out DIR]``: regenerate the bundled checkpoint.

``python -m g4v.demo build-adapter [--out DIR]``: regenerate the demo LoRA adapter for it."""

import argparse
from pathlib import Path

from g4v.paths import BUNDLED_MODEL_DIR


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m g4v.demo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build the tiny random-weight checkpoint")
    build_cmd.add_argument("--out", type=Path, default=BUNDLED_MODEL_DIR, help="output folder")
    adapter_cmd = sub.add_parser("build-adapter", help="build the demo LoRA adapter for the bundled checkpoint")
    adapter_cmd.add_argument("--out", type=Path, default=None, help="output folder (default: assets/adapters/demo-lora)")
    _add_training_commands(sub)
    args = parser.parse_args(argv)

    if args.command == "build":
        from g4v.demo.build import build

        sha = build(args.out)
        print(f"wrote {args.out} (weights sha256 {sha})")
    elif args.command == "build-adapter":
        from g4v.adapters import DEFAULT_ADAPTERS_DIR
        from g4v.demo.adapter import ADAPTER_NAME, build_adapter

        out = build_adapter(args.out or DEFAULT_ADAPTERS_DIR / ADAPTER_NAME)
        print(f"wrote {out}")
    elif args.command in ("train", "train-adapter", "eval"):
        return _run_training_command(args, argv)
    return 0


# ── train / train-adapter / eval (g4v.demo.train, g4v.demo.evaluate) ────────────────────────────


def _add_training_commands(sub) -> None:
    from g4v.demo.train import ADAPTER_DIR, TRAINED_MODEL_DIR, AdapterSettings, TrainSettings

    t, a = TrainSettings(), AdapterSettings()
    train_cmd = sub.add_parser("train", help="train the tiny checkpoint from scratch on synthetic shapes (CPU)")
    train_cmd.add_argument("--out", type=Path, default=TRAINED_MODEL_DIR, help="output folder")
    train_cmd.add_argument("--steps", type=int, default=t.steps)
    train_cmd.add_argument("--batch-size", type=int, default=t.batch_size)
    train_cmd.add_argument("--lr", type=float, default=t.lr)
    train_cmd.add_argument("--seed", type=int, default=t.seed)
    train_cmd.add_argument("--threads", type=int, default=t.threads, help="torch CPU threads")
    train_cmd.add_argument("--init", default=None, help="continue from this trained checkpoint (a second stage)")
    train_cmd.add_argument("--aux-weight", type=float, default=t.aux_weight, help="weight of the dense probe loss")
    train_cmd.add_argument("--aux-place", action=argparse.BooleanOptionalAction, default=t.aux_place,
                           help="the probe also predicts each cell's place")
    train_cmd.add_argument("--warmup-steps", type=int, default=t.warmup_steps)
    train_cmd.add_argument("--qk-scale", type=float, default=t.qk_scale,
                           help="multiply the LM's q/k projection weights by this first (sharper attention)")
    train_cmd.add_argument("--max-turns", type=int, default=t.max_turns, help="questions per picture (vision pass)")
    train_cmd.add_argument("--shape-share", type=float, default=t.shape_share,
                           help="share of 'What shape is X?' among later turns' identity questions")
    train_cmd.add_argument("--single-shape-start", type=float, default=t.single_shape_start,
                           help="share of one-shape pictures at the start of the curriculum")
    train_cmd.add_argument("--three-shape-share", type=float, default=t.three_shape_share,
                           help="after the curriculum, share of pictures forced to hold three shapes")
    train_cmd.add_argument("--pointer-weight", type=float, default=t.pointer_weight,
                           help="weight of the attention-pointer loss (binding)")
    train_cmd.add_argument("--pointer-layer", type=int, default=t.pointer_layer)
    train_cmd.add_argument("--shape-pointer-layer", type=int, default=t.shape_pointer_layer,
                           help="a second pointer, for 'What shape is ...?' questions only, at this layer")
    train_cmd.add_argument("--shape-pointer-head", type=int, default=t.shape_pointer_head)
    train_cmd.add_argument("--count-pointer-layer", type=int, default=t.count_pointer_layer,
                           help="a pointer for 'How many shapes?', spread evenly over every shape, at this layer")
    train_cmd.add_argument("--count-pointer-head", type=int, default=t.count_pointer_head)
    train_cmd.add_argument("--readout-weight", type=float, default=t.readout_weight,
                           help="weight of the pointer's readout loss (what the pointed-at shape is)")
    train_cmd.add_argument("--vision-warmup-steps", type=int, default=t.vision_warmup_steps,
                           help="vision-only shape warm-up steps before the joint training (0: none)")
    train_cmd.add_argument("--vision-warmup-lr", type=float, default=t.vision_warmup_lr)
    train_cmd.add_argument("--vision-lr", type=float, default=t.vision_lr,
                           help="learning rate of the vision tower in the joint training")
    train_cmd.add_argument("--device", default=t.device, help="torch device (the bundled recipe is cpu)")
    train_cmd.add_argument("--eval-every", type=int, default=t.eval_every,
                           help="print validation accuracy every N steps (0: never)")
    train_cmd.add_argument("--eval-n", type=int, default=t.eval_n, help="validation pictures")
    train_cmd.add_argument("--no-progress", action="store_true", help="no progress bar")

    adapter_cmd = sub.add_parser("train-adapter", help="train the French-colours LoRA adapter on the trained checkpoint")
    adapter_cmd.add_argument("--base", type=Path, default=TRAINED_MODEL_DIR, help="trained checkpoint folder")
    adapter_cmd.add_argument("--out", type=Path, default=ADAPTER_DIR, help="output folder")
    adapter_cmd.add_argument("--steps", type=int, default=a.steps)
    adapter_cmd.add_argument("--seed", type=int, default=a.seed)
    adapter_cmd.add_argument("--lr", type=float, default=a.lr)
    adapter_cmd.add_argument("--threads", type=int, default=a.threads)
    adapter_cmd.add_argument("--no-progress", action="store_true")

    eval_cmd = sub.add_parser("eval", help="accuracy per question type on held-out pictures, ablations, adapter")
    eval_cmd.add_argument("--model", type=Path, default=TRAINED_MODEL_DIR)
    eval_cmd.add_argument("--adapter", default=str(ADAPTER_DIR), help="adapter folder ('' to skip)")
    eval_cmd.add_argument("--n", type=int, default=300, help="held-out pictures")
    eval_cmd.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    eval_cmd.add_argument("--ablation-n", type=int, default=100, help="pictures for the single-level ablations")
    eval_cmd.add_argument("--no-ablations", action="store_true")
    eval_cmd.add_argument("--adapter-only", action="store_true", help="(hf) only the adapter checks")
    eval_cmd.add_argument("--threads", type=int, default=None)
    eval_cmd.add_argument("--json", type=Path, default=None, help="also write the results here")


def _run_training_command(args, argv) -> int:
    import shlex
    import sys

    command = "python -m g4v.demo " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if args.command == "train":
        from g4v.demo.train import TrainSettings, train

        settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                                 threads=args.threads, init=args.init, aux_weight=args.aux_weight,
                                 aux_place=args.aux_place, warmup_steps=args.warmup_steps, qk_scale=args.qk_scale,
                                 max_turns=args.max_turns, shape_share=args.shape_share,
                                 single_shape_start=args.single_shape_start,
                                 three_shape_share=args.three_shape_share,
                                 pointer_weight=args.pointer_weight, pointer_layer=args.pointer_layer,
                                 readout_weight=args.readout_weight,
                                 shape_pointer_layer=args.shape_pointer_layer,
                                 shape_pointer_head=args.shape_pointer_head,
                                 count_pointer_layer=args.count_pointer_layer,
                                 count_pointer_head=args.count_pointer_head,
                                 vision_warmup_steps=args.vision_warmup_steps,
                                 vision_warmup_lr=args.vision_warmup_lr, vision_lr=args.vision_lr,
                                 device=args.device, eval_every=args.eval_every, eval_n=args.eval_n)
        sha = train(args.out, settings, command, progress=not args.no_progress)
        print(f"wrote {args.out} (weights sha256 {sha})")
    elif args.command == "train-adapter":
        from g4v.demo.train import AdapterSettings, train_adapter

        settings = AdapterSettings(steps=args.steps, seed=args.seed, threads=args.threads, lr=args.lr)
        info = train_adapter(args.base, args.out, settings, command, progress=not args.no_progress)
        print(f"wrote {args.out} (adapter sha256 {info['weights_sha256']})")
    else:
        from g4v.demo.evaluate import main as eval_main

        return eval_main(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
