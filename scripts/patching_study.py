"""Two-picture patching per level on the trained demo checkpoint, over pairs of held-out pictures
that differ in one property (colour, or place; :mod:`g4v.demo.pairs`): which level carries the
difference. Prints a Markdown table (the one in docs/circuits.md) and writes the raw numbers.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/patching_study.py [--pairs 60] [--complement] [--json OUT.json]

Both directions of every pair are counted (A with B's features, B with A's), over the pairs whose
two pictures the model answers right with different first answer tokens. Per level: the mean and
median share of the way the log-odds moved from the receiver's answer to the donor's, and how often
the patched run's first answer token became the donor's. About 3 minutes of CPU time on 1 core for
60 + 60 pairs (60 colour pairs give the 50 or more that count: blue and black share a first token).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g4v.circuits.common import CircuitSettings  # noqa: E402
from g4v.circuits.patching import patch_levels  # noqa: E402
from g4v.demo.pairs import PROPERTIES, picture_pairs  # noqa: E402
from g4v.engines.hf import TransformersEngine  # noqa: E402
from g4v.paths import TRAINED_MODEL_DIR  # noqa: E402


def first_token(tokenizer, answer: str) -> int:
    """The first token of a one-word answer as the model writes it (right after the assistant turn)."""
    return tokenizer(answer, add_special_tokens=False)["input_ids"][0]


def study(engine, pairs: int, complement: bool = False) -> dict:
    """Per property: the qualifying pair count and, per level (and "all levels"), the moved shares
    and flips of every qualifying direction."""
    tokenizer = engine.tokenizer
    report = {}
    for changed in PROPERTIES:
        rows: dict[str, list[tuple[float, bool]]] = {}
        used = 0
        for number, pair in enumerate(picture_pairs(pairs, changed)):
            result = patch_levels(engine, pair.a, pair.b, pair.prompt, CircuitSettings(max_new_tokens=0, complement=complement))
            a_from_b = result.directions[0]
            right = (a_from_b.receiver_token_id == first_token(tokenizer, pair.answer_a)
                     and a_from_b.donor_token_id == first_token(tokenizer, pair.answer_b))
            print(f"{changed} pair {number + 1}/{pairs}: {pair.answer_a} / {pair.answer_b}"
                  f"{'' if right and not a_from_b.same_first_token else ' (left out)'}", file=sys.stderr)
            if not right or a_from_b.same_first_token:
                continue
            used += 1
            for direction in result.directions:
                for run in [*direction.levels, direction.all_levels]:
                    rows.setdefault(run.label, []).append((run.moved, run.top_token_id == direction.donor_token_id))
        report[changed] = {"pairs": pairs, "pairs_used": used, "levels": {
            name: {"mean_moved": statistics.fmean(m for m, _ in values),
                   "median_moved": statistics.median(m for m, _ in values),
                   "flipped": sum(f for _, f in values) / len(values), "runs": len(values)}
            for name, values in rows.items()}}
    return report


def table(report: dict, llm_layers: dict[str, int]) -> str:
    properties = list(report)
    head = "| level patched | " + " | ".join(f"{p}: mean moved | {p}: median | {p}: flipped" for p in properties) + " |"
    lines = [head, "|---" + "|---:" * (3 * len(properties)) + "|"]
    for name in report[properties[0]]["levels"]:
        label = (f"{name} (→ LLM {llm_layers[name]})" if name in llm_layers
                 else f"**{name}** (the bound)" if name == "all levels" else name)
        cells = []
        for p in properties:
            row = report[p]["levels"][name]
            cells += [f"{row['mean_moved']:.2f}", f"{row['median_moved']:.2f}", f"{row['flipped']:.0%}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    used = ", ".join(f"{p}: {report[p]['pairs_used']} of {report[p]['pairs']} pairs" for p in properties)
    return "\n".join(lines) + f"\n\nPairs used (both answered right, different first tokens): {used}; both directions each."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=60, help="pairs per property (default 60)")
    parser.add_argument("--complement", action="store_true",
                        help="patch every level but each one (is the one kept needed?) instead of each alone")
    parser.add_argument("--json", default=None, metavar="OUT.json", help="also write the numbers here")
    args = parser.parse_args()
    from g4v.model.levels import describe_levels

    engine = TransformersEngine(str(TRAINED_MODEL_DIR), device="cpu", dtype="float32")
    try:
        report = study(engine, args.pairs, args.complement)
        layers = {level.name: level.llm_layer for level in describe_levels(engine.model.config)}
    finally:
        engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(table(report, layers))


if __name__ == "__main__":
    main()
