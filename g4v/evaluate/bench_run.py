"""``python -m g4v bench eval --whole-run``: a whole dataset run timed, and batched vs one-by-one answers.

Two numbers, measured in one command:

* **rows/s of a whole run**: :func:`~g4v.evaluate.run.run_eval` with two ``hf`` arms (default: the
  base model and its adapter, sharing one engine) and teacher-forced scoring, on the bundled
  dataset. It runs in a fresh interpreter from a small script (:data:`RUN_SCRIPT`) that uses only
  the API the project has had since dataset runs exist, so the same script times an older commit
  checked out beside this one (``--baseline-checkout DIR``, e.g. made with
  ``git worktree add DIR COMMIT``), and the two rows/s are printed side by side. The engine loads
  and answers one warm-up request before the clock starts.
* **batched vs one by one**: one ``hf`` arm answers every row with ``batch_size`` 1 and with
  :data:`~g4v.model.BATCH_SIZE`, on one engine, taking turns twice (the fastest of each
  kept), and the greedy tokens are compared.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from g4v.errors import G4VError
from g4v.paths import REPO_ROOT

#: Times one whole run inside the checkout it is started in (cwd), printing one JSON line. Kept
#: to ``EvalConfig``'s oldest fields and ``run_eval(..., reuse=...)`` so older commits run it too.
RUN_SCRIPT = """
import json, sys, tempfile, time
from g4v.conversation import Message, SamplingSettings
from g4v.engines.hf import TransformersEngine
from g4v.evaluate.arms import ArmSpec
from g4v.evaluate.run import EvalConfig, run_eval
from g4v.paths import default_model
asked = json.loads(sys.argv[1])
engine = TransformersEngine(default_model(), device="cpu", dtype="float32")
engine.generate([Message("user", "Warm up.")], SamplingSettings(max_new_tokens=2))
config = EvalConfig(a=ArmSpec.parse(asked["a"]), b=ArmSpec.parse(asked["b"]), data=asked["data"],
                    limit=asked["limit"], max_new_tokens=asked["max_new_tokens"])
with tempfile.TemporaryDirectory() as out:
    began, cpu = time.perf_counter(), time.process_time()
    result = run_eval(config, out, reuse={ArmSpec("hf"): engine})
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
print(json.dumps({"rows": len(result.rows), "wall_s": wall, "cpu_s": cpu, "errors": sum(bool(r.error) for r in result.rows)}))
"""


def checked_checkout(folder) -> Path:
    """``folder`` resolved, or one line when it holds no checkout of this project."""
    checkout = Path(folder).expanduser().resolve()
    if not (checkout / "g4v" / "evaluate" / "run.py").is_file():
        raise G4VError(f"{checkout.name or checkout}: not a checkout of this project (no g4v/evaluate/run.py)")
    return checkout


def time_whole_run(checkout: Path, asked: dict, timeout_s: float) -> dict:
    """:data:`RUN_SCRIPT` in a fresh interpreter inside ``checkout``: ``{"rows", "wall_s", "errors"}``."""
    checkout = checked_checkout(checkout)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        done = subprocess.run([sys.executable, "-c", RUN_SCRIPT, json.dumps(asked)], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise G4VError(f"the timed run in {checkout.name} took over {timeout_s:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise G4VError(f"the timed run in {checkout.name} failed: {last}")
    return json.loads(lines[-1])


def time_batching(spec, samples: list, config, rounds: int = 2,
                  reuse: dict | None = None) -> list[tuple[int, float, list, float]]:
    """``(batch_size, wall s, answers, encoding s)`` of one hf arm answering ``samples`` one by one
    and batched, on one engine (loaded and warmed up before the clock starts); ``encoding s`` is
    the part spent in the vision tower and projectors (the pictures encoded first, then answered).
    The two take turns ``rounds`` times and each keeps its fastest time, so a burst of load on a
    shared machine slows one round, not one side of the ratio. ``reuse`` is ``open_arm``'s (the GPU
    check times the engine it built)."""
    from g4v.model import BATCH_SIZE
    from g4v.evaluate.arms import open_arm
    from g4v.evaluate.requests import Requests

    settings = config.settings()
    best: dict[int, tuple[int, float, list, float]] = {}
    with open_arm(spec, reuse=reuse) as arm:
        arm.answer(samples[:1], settings)  # warm-up, untimed
        for _ in range(rounds):
            for batch_size in (1, BATCH_SIZE):
                arm.batch_size, requests = batch_size, Requests()
                began = time.perf_counter()
                requests.encode(arm.engine, samples, batch_size)
                encoded = time.perf_counter()
                answers = arm.answer(samples, settings, requests=requests)
                wall = time.perf_counter() - began
                if batch_size not in best or wall < best[batch_size][1]:
                    best[batch_size] = (batch_size, wall, answers, encoded - began)
    return [best[1], best[BATCH_SIZE]]


def report(asked: dict, current: dict, baseline: dict | None, batching: list, baseline_name: str = "") -> str:
    """The Markdown tables: whole-run rows/s (and vs the baseline), batched vs one by one."""
    from g4v.evaluate.scoring import agreement

    def rate(timing: dict) -> float:
        return timing["rows"] / timing["wall_s"] if timing["wall_s"] else 0.0

    lines = [f"whole run: arms {asked['a']} vs {asked['b']}, scoring on, {current['rows']} rows, greedy, "
             f"at most {asked['max_new_tokens']} new tokens", "",
             "| checkout | rows | errors | wall s | rows/s | vs baseline | CPU s (all threads) | CPU s vs baseline |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    runs = [("this checkout", current)] + ([(f"baseline ({baseline_name})", baseline)] if baseline else [])
    for name, timing in runs:
        ratio = f"{rate(timing) / rate(baseline):.2f}x" if baseline and rate(baseline) else "-"
        cpu = f"{timing['cpu_s'] / baseline['cpu_s']:.2f}x" if baseline and baseline.get("cpu_s") else "-"
        lines.append(f"| {name} | {timing['rows']} | {timing['errors']} | {timing['wall_s']:.1f} | {rate(timing):.2f} | "
                     f"{ratio} | {timing.get('cpu_s', 0):.1f} | {cpu} |")
    (_, alone_s, alone, alone_encoding), *batched_runs = batching
    lines += ["", f"one hf arm ({asked['a']}), {len(alone)} rows: batched vs one by one", "",
              "| batch size | wall s | samples/s | vs one by one | of which encoding s | answers after encoding, vs one by one "
              "| same greedy tokens as one by one |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for batch_size, wall, answers, encoding in batching:
        same = sum(agreement(a, b)[0] for a, b in zip(alone, answers) if a and b)
        after = (alone_s - alone_encoding) / (wall - encoding) if wall > encoding else 0.0
        lines.append(f"| {batch_size} | {wall:.1f} | {len(answers) / wall:.2f} | {alone_s / wall:.2f}x | {encoding:.1f} | "
                     f"{after:.2f}x | {same}/{len(alone)} |")
    return "\n".join(lines)


def run(args, config, samples) -> str:
    """The ``--whole-run`` mode of ``bench eval``: the report's text."""
    from g4v.evaluate.arms import ArmSpec

    ArmSpec.parse(args.a), ArmSpec.parse(args.b)  # a typo is one line before anything loads
    if args.baseline_checkout:
        checked_checkout(args.baseline_checkout)
    asked = {"a": args.a, "b": args.b, "data": config.data, "limit": config.limit,
             "max_new_tokens": config.max_new_tokens}
    print("timing a whole run in this checkout...", file=sys.stderr)
    current = time_whole_run(REPO_ROOT, asked, args.timeout)
    baseline = None
    if args.baseline_checkout:
        print(f"timing the same run in {Path(args.baseline_checkout).name}...", file=sys.stderr)
        baseline = time_whole_run(Path(args.baseline_checkout), asked, args.timeout)
    print("timing one hf arm batched and one by one...", file=sys.stderr)
    batching = time_batching(ArmSpec.parse(args.a), samples, config)
    return report(asked, current, baseline, batching, Path(args.baseline_checkout or "").name)
