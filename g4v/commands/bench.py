"""``python -m g4v bench TARGET ...``: benchmarks that print speed ratios measured in one run.

A small dispatcher: each target is a function pair below (``add_arguments``, ``run``) listed in
``TARGETS``. Speed targets live here, not in timed unit tests, because timings on a shared machine
vary too much to assert on.
"""

import sys

from g4v.commands.common import add_model_flags, output_file
from g4v.commands.engine_flags import add_engine_flags, engine_options
from g4v.errors import read_whole

#: New tokens each answer of ``bench decode`` has, unless told (the issue's concurrent-chats figure).
DECODE_BENCH_TOKENS = 48
#: New tokens each conversation answers with in ``bench engines``, unless told.
ENGINE_BENCH_TOKENS = 64


def add_engines_arguments(parser) -> None:
    add_model_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--backends", default=None,
                        help="comma-separated, from hf, vllm, openai (default: every one available here)")
    parser.add_argument("--chats", type=read_whole, default=8, help="conversations submitted at once")
    parser.add_argument("--max-new-tokens", type=read_whole, default=ENGINE_BENCH_TOKENS,
                        help="new tokens per conversation")
    parser.add_argument("--serve", action="store_true",
                        help="for the openai backend, start a local vLLM server (127.0.0.1) for the run")
    parser.add_argument("--vision-lora-modes", default=None, metavar="MODES",
                        help="run each backend once per mode of the checkpoint's vision LoRA, e.g. native,merged,off")
    parser.add_argument("--markdown", default=None, type=output_file, metavar="PATH", help="also write the table to PATH")


def run_engines(args) -> int:
    from tqdm import tqdm

    from g4v.engines import bench as engine_bench
    from g4v.conversation import SamplingSettings
    from g4v.errors import check_value, whole_number

    backends = args.backends.split(",") if args.backends else engine_bench.default_backends(args.base_url, args.serve)
    engine_bench.check_backends(backends, args.base_url, args.serve)
    check_value("--chats", args.chats, whole_number(1))
    settings = SamplingSettings(max_new_tokens=args.max_new_tokens).validated()
    conversations = engine_bench.workload(args.chats)
    options = engine_options(args)
    runs = engine_bench.runs(backends, args.vision_lora_modes, args.model, args.serve)
    results = []
    with tqdm(total=args.chats * len(runs), unit="chat", file=sys.stderr) as progress:
        for name, backend, mode in runs:
            progress.set_description(f"{name}: starting")
            starter = _starter(backend, args.model, engine_bench.mode_options(options, mode), args.serve)
            results.append(engine_bench.bench_backend(name, starter, conversations, settings, progress))
    report = engine_bench.table(results, args.chats, args.max_new_tokens)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(report + "\n")
    return 0


def _starter(backend: str, model: str | None, options: dict, serve: bool):
    """A function that starts ``backend`` and returns ``(engine, cleanup)``."""

    def start():
        from g4v.engines import create_engine
        from g4v.paths import default_model

        if backend == "openai" and serve:
            from g4v.engines.vllm_server import VLLMServer

            server = VLLMServer(model or default_model(), options["vllm"], python=_server_python(),
                                vision_lora=options["vision_lora"]).start()
            try:
                engine = create_engine("openai", None, base_url=server.base_url)
            except BaseException:
                server.stop()
                raise
            return engine, server.stop
        kwargs = dict(options)
        if backend == "openai":
            return create_engine("openai", model, **kwargs), lambda: None
        return create_engine(backend, model, **kwargs), lambda: None

    return start


def add_decode_arguments(parser) -> None:
    add_model_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--max-new-tokens", type=read_whole, default=DECODE_BENCH_TOKENS, help="new tokens per answer")
    parser.add_argument("--chats", type=read_whole, default=8, help="chats submitted at once (each with its own picture)")
    parser.add_argument("--repeats", type=read_whole, default=3, help="interleaved rounds of the batch-of-one timings")
    parser.add_argument("--compile", action="store_true",
                        help="also time the loop with its decode step compiled, and the first request's compile "
                             "(always on a GPU)")
    parser.add_argument("--markdown", default=None, type=output_file, metavar="PATH", help="also write the table to PATH")
    parser.add_argument("--json", default=None, type=output_file, metavar="PATH", help="also write the figures to PATH as JSON")


def run_decode(args) -> int:
    import json

    from g4v.engines import create_engine
    from g4v.engines.capabilities import Instrumentable, require
    from g4v.engines.decode_bench import measure, table
    from g4v.errors import check_value, whole_number

    for flag, value, low in (("--max-new-tokens", args.max_new_tokens, 2), ("--chats", args.chats, 1),
                             ("--repeats", args.repeats, 1)):
        check_value(flag, value, whole_number(low))
    options = engine_options(args)
    engine = require(create_engine("hf", args.model, **options), Instrumentable, "bench decode")
    try:
        report = measure(engine, args.max_new_tokens, args.repeats, args.chats,
                         compile_too=args.compile or engine.loaded.device.type == "cuda")
    finally:
        engine.close()
    text = table(report)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(text + "\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.to_dict(), handle, indent=2)
    return 0


def add_inspect_arguments(parser) -> None:
    from g4v.inspect import bench as inspect_bench

    inspect_bench.add_arguments(parser)


def run_inspect(args) -> int:
    from g4v.inspect import bench as inspect_bench

    return inspect_bench.run(args)


def add_eval_arguments(parser) -> None:
    from g4v.evaluate import bench as eval_bench

    eval_bench.add_arguments(parser)


def run_eval(args) -> int:
    from g4v.evaluate import bench as eval_bench

    return eval_bench.run(args)


def add_attribute_arguments(parser) -> None:
    from g4v.attribution import bench as attribution_bench

    attribution_bench.add_arguments(parser)


def run_attribute(args) -> int:
    from g4v.attribution import bench as attribution_bench

    if args.pointing_game:  # the demo's pictures are drawn by the front door, not the library
        from g4v.commands.attribute import run_pointing_game

        return run_pointing_game(args)
    return attribution_bench.run(args)


def add_token_budget_arguments(parser) -> None:
    from g4v.model import token_budget_bench

    token_budget_bench.add_arguments(parser)


def run_token_budget(args) -> int:
    from g4v.model import token_budget_bench

    return token_budget_bench.run(args)


def add_training_arguments(parser) -> None:
    from g4v.training import bench as training_bench

    training_bench.add_arguments(parser)


def run_training(args) -> int:
    from g4v.training import bench as training_bench

    return training_bench.run(args)


#: name -> (help, add_arguments, run)
TARGETS = {
    "engines": ("time the same chats through each backend (hf, vllm, openai)", add_engines_arguments, run_engines),
    "decode": ("the transformers engine's chat decoding: engine vs bare generate, the decode loop vs one request "
               "at a time, compiled vs eager, N chats at once vs one at a time", add_decode_arguments, run_decode),
    "inspect": ("forward time and peak memory of the deepstack inspector's capture (off / norms / full)",
                add_inspect_arguments, run_inspect),
    "eval": ("samples/s of each dataset-run arm (hf one by one, vllm batched) on the bundled dataset",
             add_eval_arguments, run_eval),
    "attribute": ("time and peak memory of gradient x input against a plain forward pass",
                  add_attribute_arguments, run_attribute),
    "token-budget": ("prefill time against the kept fraction of image tokens, and each policy's ranking cost",
                     add_token_budget_arguments, run_token_budget),
    "training": ("training-step time with the training monitor at its default interval against none",
                 add_training_arguments, run_training),
}


def add_parser(subparsers):
    parser = subparsers.add_parser("bench", help="benchmarks that print speed ratios")
    targets = parser.add_subparsers(dest="target", required=True, parser_class=_flags_when_chosen(type(parser)))
    for name, (help_text, add_arguments, run_target) in TARGETS.items():
        target = targets.add_parser(name, help=help_text)
        target.add_flags = add_arguments
        target.set_defaults(bench_run=run_target)
    return parser


def _flags_when_chosen(parser_class):
    """A parser class whose flags are added only when its target is parsed: a benchmark's flags come
    from its own module, which imports torch, and ``python -m g4v --help`` should not pay for five."""
    class Target(parser_class):
        add_flags = None

        def parse_known_args(self, args=None, namespace=None):
            if self.add_flags is not None:
                add_flags, self.add_flags = self.add_flags, None
                add_flags(self)
            return super().parse_known_args(args, namespace)

    return Target


def run(args) -> int:
    return args.bench_run(args)


def _server_python() -> str:
    from g4v.engines import vllm_python
    from g4v.errors import G4VError

    python = vllm_python()
    if python is None:
        raise G4VError("no vLLM to serve with: install requirements-vllm.txt or run scripts/setup_vllm_cpu_env.sh")
    return str(python)
