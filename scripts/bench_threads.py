"""How the test suite's processes share this machine's cores: one model workload timed alone and
beside a second copy of itself, with OpenMP's idle threads spinning (libgomp's default) and sleeping
(``OMP_WAIT_POLICY=PASSIVE``, what tests/conftest.py sets). Prints the ratios measured in this run.

    .venv/bin/python scripts/bench_threads.py [--requests 4]

The workload is the bundled checkpoint answering one picture greedily (48 new tokens), as the tests
do; each measurement is a fresh process, so each policy is read by libgomp at start.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = """
import sys, time
sys.path.insert(0, {root!r})
from PIL import Image
from g4v.conversation import Message, SamplingSettings
from g4v.engines.hf import TransformersEngine
from g4v.paths import BUNDLED_MODEL_DIR
engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
messages = [Message("user", "What colour is the shape?", [Image.new("RGB", (300, 200), (200, 30, 30))])]
settings = SamplingSettings(max_new_tokens=48)
engine.generate(messages, settings)
start = time.perf_counter()
for _ in range({requests}):
    engine.generate(messages, settings)
print(time.perf_counter() - start)
"""


def timed(policy: str, copies: int, requests: int) -> float:
    """Seconds the first of ``copies`` simultaneous workloads took (the others only compete)."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "TOKENIZERS_PARALLELISM": "false"}
    code = WORKLOAD.format(root=str(ROOT), requests=requests)
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True) for _ in range(copies)]
    outputs = [run.communicate()[0] for run in runs]
    if any(run.returncode for run in runs):
        raise SystemExit("error: the workload failed (run it alone to see why)")
    return float(outputs[0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; {args.requests} generations of 48 tokens per measurement")
    results = {}
    for policy in ("ACTIVE", "PASSIVE"):
        alone = timed(policy, 1, args.requests)
        beside = timed(policy, 2, args.requests)
        results[policy] = (alone, beside)
        print(f"{policy:8s} alone {alone:6.2f} s   beside a second copy {beside:6.2f} s   "
              f"slowdown {beside / alone:4.1f}x")
    (active_alone, active_beside), (passive_alone, passive_beside) = results["ACTIVE"], results["PASSIVE"]
    print(f"PASSIVE vs ACTIVE: alone {passive_alone / active_alone:.2f}x the time, "
          f"beside a second copy {passive_beside / active_beside:.2f}x the time")


if __name__ == "__main__":
    main()
