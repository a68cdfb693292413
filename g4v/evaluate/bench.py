"""``python -m g4v bench eval``: samples per second of each arm backend over a dataset, in one run.

Each backend answers the same rows (default: the whole bundled dataset) the way a dataset run has
it answer them: ``hf`` in left-padded batches, ``vllm`` every sample in flight at once (vLLM's
continuous batching schedules them), ``openai`` from a bounded pool. Start-up (model load, server
start) and picture decoding are outside the timing, and each backend gets one untimed warm-up
request first. Backends run one after the other and are closed in between, so none is timed while
another holds the machine. The greedy answers of all backends are compared token for token too.

``--vision-lora-modes native,merged,off`` runs each arm once per mode of the checkpoint's vision
LoRA. Decode tokens/s is measured as (tokens beyond each answer's first) / (the answers' wall time
minus the wall time of the same rows answered with one new token), so prefill is left out.
``--whole-run`` times a whole dataset run instead (two ``hf`` arms and scoring, optionally against an
older checkout) and an ``hf`` arm batched vs one by one: :mod:`g4v.evaluate.bench_run`.
"""

import sys
import time
from dataclasses import dataclass, replace

from g4v.checkpoint.vision_lora import check_mode
from g4v.conversation import SamplingSettings
from g4v.engines.bench import known
from g4v.errors import G4VError, read_decimal, read_whole
from g4v.evaluate.arms import ARM_KEYS, ArmSpec, check_arms, open_arm
from g4v.evaluate.data import BUNDLED_DATASET, Columns, open_dataset
from g4v.evaluate.run import EvalConfig, row_order
from g4v.evaluate.scoring import agreement


@dataclass
class ArmTiming:
    backend: str
    startup_s: float
    wall_s: float
    samples: int
    answers: list  # Generation per sample
    first_token_s: float = 0.0  # wall time of the same samples answered with one new token

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s else 0.0

    @property
    def tokens(self) -> int:
        return sum(len(answer.token_ids) for answer in self.answers if answer is not None)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after each answer's first, over the time spent after the first tokens."""
        decode_s = self.wall_s - self.first_token_s
        later = self.tokens - sum(bool(answer and answer.token_ids) for answer in self.answers)
        return later / decode_s if decode_s > 0 and later > 0 else float("nan")


def add_arguments(parser) -> None:
    parser.add_argument("--backends", default="hf,vllm", help="arms to time, comma-separated (default hf,vllm)")
    parser.add_argument("--data", default=str(BUNDLED_DATASET), help="dataset (default: the bundled one)")
    parser.add_argument("--columns", default=None, help="column mapping, as for eval")
    parser.add_argument("--limit", type=read_whole, default=None, help="only the first N rows (default: all)")
    parser.add_argument("--max-new-tokens", type=read_whole, default=EvalConfig.max_new_tokens)
    parser.add_argument("--concurrency", type=read_whole, default=EvalConfig.concurrency, help="openai arms' pool size")
    parser.add_argument("--vision-lora-modes", default=None, metavar="MODES",
                        help="run each hf/vllm arm once per vision LoRA mode, e.g. native,merged,off "
                             "(the arms' model must carry a vision LoRA)")
    parser.add_argument("--markdown", default=None, metavar="PATH", help="also write the table to PATH")
    parser.add_argument("--whole-run", action="store_true",
                        help="time a whole dataset run (arms --a and --b, scoring on) and an hf arm batched vs one by one")
    parser.add_argument("--a", default="hf", help="--whole-run: first arm (default hf)")
    parser.add_argument("--b", default="hf:adapter=tiny-trained-french", help="--whole-run: second arm (default: the adapter)")
    parser.add_argument("--baseline-checkout", default=None, metavar="DIR",
                        help="--whole-run: also time the same run in this checkout of an older commit (git worktree add DIR COMMIT)")
    parser.add_argument("--timeout", type=read_decimal, default=1800, help="--whole-run: longest a timed whole run may take, in s")


def run(args) -> int:
    from tqdm import tqdm

    specs = with_modes([ArmSpec.parse(text) for text in split_arms(args.backends)], args.vision_lora_modes)
    config = EvalConfig(a=specs[0], b=specs[-1], data=args.data, columns=Columns.parse(args.columns),
                        limit=args.limit, max_new_tokens=args.max_new_tokens, concurrency=args.concurrency)
    config.check()
    check_arms(specs)
    dataset = open_dataset(config.data, config.columns)
    samples = [dataset.sample(i) for i in row_order(len(dataset), config.limit, None)]
    samples = [sample for sample in samples if sample.error is None]
    if args.whole_run:
        from g4v.evaluate import bench_run

        report = bench_run.run(args, config, samples)
        return _print(report, args.markdown)
    timings = []
    with tqdm(total=len(samples) * len(specs), unit="sample", file=sys.stderr) as bar:
        for spec in specs:
            bar.set_description(f"{spec.display}: starting")

            def done(*_, name=spec.display):
                bar.set_description(name, refresh=False)
                bar.update()

            timings.append(time_arm(spec, samples, config, done))
    return _print(table(timings, len(samples), config.max_new_tokens), args.markdown)


def _print(report: str, markdown: str | None) -> int:
    print(report)
    if markdown:
        with open(markdown, "w") as handle:
            handle.write(report + "\n")
    return 0


def split_arms(text: str) -> list[str]:
    """``--backends``' arms: split at commas that start a new arm (``hf:model=M,vision-lora=off,vllm``
    is two arms), since an arm's own options are comma-separated too."""
    arms: list[str] = []
    for part in text.split(","):
        if arms and "=" in part and part.partition("=")[0].strip() in ARM_KEYS:
            arms[-1] += "," + part
        else:
            arms.append(part)
    return arms


def with_modes(specs: list[ArmSpec], modes: str | None) -> list[ArmSpec]:
    """Each hf/vllm arm once per vision LoRA mode in ``modes`` (comma-separated); as given without."""
    if not modes:
        return specs
    if any(spec.backend == "openai" for spec in specs):
        raise G4VError("--vision-lora-modes: an openai arm's vision LoRA is the server's choice; time hf or vllm arms")
    checked = [check_mode(mode.strip()) for mode in modes.split(",")]
    return [replace(spec, vision_lora=mode) for spec in specs for mode in checked]


def time_arm(spec: ArmSpec, samples: list, config: EvalConfig, on_done) -> ArmTiming:
    """Open ``spec``, warm it up on one sample, time its answers to ``samples``, close it."""
    settings: SamplingSettings = config.settings()
    began = time.perf_counter()
    with open_arm(spec, concurrency=config.concurrency) as arm:
        arm.answer(samples[:1], settings)  # warm-up, untimed
        startup = time.perf_counter() - began
        began = time.perf_counter()
        answers = arm.answer(samples, settings, on_done=on_done)
        wall = time.perf_counter() - began
        began = time.perf_counter()
        arm.answer(samples, replace(settings, max_new_tokens=1))  # prefill and one token: what decode is not
        first_token = time.perf_counter() - began
    return ArmTiming(spec.display, startup, wall, len(samples), answers, first_token)


def table(timings: list[ArmTiming], samples: int, max_new_tokens: int) -> str:
    """A Markdown table, ratios relative to the first backend, and the greedy agreement."""
    reference = timings[0]
    lines = [f"{samples} samples, greedy, at most {max_new_tokens} new tokens", "",
             f"| arm | start-up s | wall s | samples/s | vs {reference.backend} | tokens | decode tokens/s | "
             f"decode vs {reference.backend} | same greedy tokens as {reference.backend} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for timing in timings:
        ratio = timing.samples_per_s / reference.samples_per_s if reference.samples_per_s else float("nan")
        decode = timing.decode_tokens_per_s / reference.decode_tokens_per_s
        same = sum(agreement(a, b)[0] for a, b in zip(reference.answers, timing.answers) if a and b)
        lines.append(f"| {timing.backend} | {timing.startup_s:.1f} | {timing.wall_s:.1f} | {timing.samples_per_s:.2f} | "
                     f"{ratio:.2f}x | {timing.tokens} | {known(timing.decode_tokens_per_s, '.1f')} | "
                     f"{known(decode, '.2f', 'x')} | {same}/{samples} |")
    return "\n".join(lines)

