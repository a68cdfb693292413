"""``bench eval`` and ``bench engines`` with ``--vision-lora-modes``: native, merged and off of the
layout checkpoint timed in one run, decode tokens/s with ratios to the first. Timings are not
asserted (a shared machine); the rows, the ratios' arithmetic and the token counts are: merged gives
native's greedy tokens, so its row agrees on every sample, and the token counts equal those of
the engines asked directly."""

import re

import pytest

from g4v.conversation import SamplingSettings
from g4v.paths import VLORA_MODEL_DIR
from tests.cli import run_cli

LAYOUT = str(VLORA_MODEL_DIR)
MODES = ("native", "merged", "off")


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| arm") and not line.startswith("| backend")]


def number(cell: str) -> float:
    return float(cell.rstrip("x"))


def assert_ratio(decode: str, reference: str, ratio: str) -> None:
    """A decode rate is positive or n/a (too few tokens to time on a loaded machine), and its ratio
    is the rate over the reference's (from the printed, rounded numbers)."""
    assert decode == "n/a" or number(decode) > 0
    if "n/a" in (decode, reference):
        assert ratio == "n/a"
    else:
        assert number(ratio) == pytest.approx(number(decode) / number(reference), rel=0.05, abs=0.01)


@pytest.mark.slow  # about 7 s on a quiet 2-core machine
def test_bench_eval_times_each_mode():
    done = run_cli("bench", "eval", "--backends", f"hf:model={LAYOUT}", "--vision-lora-modes", ",".join(MODES),
                   "--limit", "4", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = table_rows(done.stdout)
    assert [row[0] for row in rows] == [f"hf({VLORA_MODEL_DIR.name})[vision LoRA {mode}]" for mode in MODES]
    for row in rows:  # the answers are a word or two: decode may be too short to time (n/a), never <= 0
        assert_ratio(row[6], rows[0][6], row[7])
    assert rows[1][8] == "4/4" and rows[1][5] == rows[0][5]  # merged: native's greedy tokens on every sample


@pytest.mark.slow  # about 11 s on a quiet 2-core machine
def test_bench_engines_times_each_mode():
    from g4v.engines.bench import workload
    from g4v.engines.hf import TransformersEngine

    done = run_cli("bench", "engines", "--backends", "hf", "--model", LAYOUT, "--vision-lora-modes", ",".join(MODES),
                   "--chats", "2", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = table_rows(done.stdout)
    assert [row[0] for row in rows] == [f"hf [{mode}]" for mode in MODES]
    settings = SamplingSettings(max_new_tokens=6).validated()
    for mode, row in zip(MODES, rows):
        engine = TransformersEngine(LAYOUT, device="cpu", dtype="float32", vision_lora=mode)
        assert int(row[3]) == sum(len(engine.generate(chat, settings).token_ids) for chat in workload(2))
        assert_ratio(row[6], rows[0][6], row[9])


def test_modes_need_a_checkpoint_with_a_vision_lora():
    done = run_cli("bench", "engines", "--backends", "hf", "--vision-lora-modes", "native,off", "--chats", "1")
    assert done.returncode == 1 and re.fullmatch(r"error: --vision-lora-modes needs a checkpoint .*has none\n", done.stderr)
