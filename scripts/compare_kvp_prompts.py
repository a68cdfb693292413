"""Both key-value wordings (presets ``kvp`` and ``kvp_varex``) on the same held-out key-value
pictures, with the documents checkpoint, batched greedy as ``python -m g4v.demo eval`` decodes them;
the numbers in docs/demo-model.md, "Which key-value prompt".

    OMP_NUM_THREADS=1 .venv/bin/python scripts/compare_kvp_prompts.py [--n 100]

About 1 minute per 100 pictures with ``kvp`` on 2 CPU cores, 3-6 minutes with ``kvp_varex`` (its
answers run on to the token limit).
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.demo import shapes as S  # noqa: E402
from g4v.demo.documents_data import KVP_SCHEMA, kvp_item  # noqa: E402
from g4v.demo.documents_eval import batched, score  # noqa: E402
from g4v.documents.presets import build_prompt  # noqa: E402
from g4v.engines.hf import TransformersEngine  # noqa: E402
from g4v.paths import DOCUMENTS_MODEL_DIR as CHECKPOINT  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="held-out key-value pictures (the first N)")
    args = parser.parse_args()
    engine = TransformersEngine(str(CHECKPOINT), device="cpu", dtype="float32")
    pictures = S.eval_set(args.n)
    for task in ("kvp", "kvp_varex"):
        prompt = build_prompt(task, schema_text=json.dumps(KVP_SCHEMA))
        items = [kvp_item(picture) for picture in pictures]
        items = [replace(item, qa=S.QA("kvp", prompt, item.qa.answer)) for item in items]
        scores = score(items, batched(engine, items))
        tokens = len(engine.tokenizer(prompt)["input_ids"])
        print(json.dumps({"task": task, "pictures": args.n, "prompt_tokens": tokens,
                          "valid": scores.kvp_valid, "fields": scores.kvp_fields}), flush=True)


if __name__ == "__main__":
    main()
