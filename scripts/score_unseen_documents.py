"""The documents checkpoint once on a fresh held-out set whose answers never occur in training
(:mod:`g4v.demo.unseen`), batched greedy as ``python -m g4v.demo eval`` decodes (its batched answers
equal the engine's on all 600 old held-out documents); the numbers in docs/demo-model.md.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/score_unseen_documents.py [--n 300]

About 10 minutes on 2 cores (the replay of the stages about 2, the 600 answers the rest).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.demo.documents_data import held_out_items  # noqa: E402
from g4v.demo.documents_eval import batched, score  # noqa: E402
from g4v.demo.unseen import describe, replay, unseen_items  # noqa: E402
from g4v.engines.hf import TransformersEngine  # noqa: E402
from g4v.paths import DOCUMENTS_MODEL_DIR as CHECKPOINT  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="charts and key-value pictures (each)")
    args = parser.parse_args()
    seen, steps = replay(CHECKPOINT)
    old = held_out_items(args.n)
    print(json.dumps({"training_answers": {task: len(answers) for task, answers in seen.items()},
                      "replayed_steps_per_stage": steps,
                      "old_held_out_answers_in_training": {
                          kind: sum(item.qa.answer in seen[kind] for item in old if item.qa.kind == kind)
                          for kind in ("chart", "kvp")},
                      "old_held_out": describe(old)}), flush=True)
    items = unseen_items(args.n, seen)
    engine = TransformersEngine(str(CHECKPOINT), device="cpu", dtype="float32")
    scores = score(items, batched(engine, items))
    print(json.dumps({"unseen": describe(items), "scores": scores.to_dict()}), flush=True)


if __name__ == "__main__":
    main()
