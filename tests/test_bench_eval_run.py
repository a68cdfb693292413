"""``python -m g4v bench eval --whole-run``: refusals in one line before anything loads, and the
report's ratios (computed here from the timings it is given)."""

from g4v.evaluate.bench_run import report
from g4v.evaluate.run import EvalConfig
from tests.cli import run_cli


def test_a_folder_that_is_no_checkout_is_one_line_before_any_run(tmp_path):
    result = run_cli("bench", "eval", "--whole-run", "--limit", "1", "--baseline-checkout", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == \
        f"error: {tmp_path.name}: not a checkout of this project (no g4v/evaluate/run.py)"
    assert "Traceback" not in result.stderr and "timing" not in result.stderr


def test_a_bad_arm_is_one_line(tmp_path):
    result = run_cli("bench", "eval", "--whole-run", "--b", "nope")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: arm") and "nope" in last and "backend must be one of" in last


def test_the_report_gives_rows_per_second_and_both_ratios():
    from g4v.engines.base import Generation

    def answer(ids):
        return Generation(text="x", token_ids=ids, finish_reason="stop")

    asked = {"a": "hf", "b": "hf:adapter=x", "max_new_tokens": EvalConfig.max_new_tokens}
    alone = [answer([1]), answer([2]), answer([3]), answer([4])]
    batched = [answer([1]), answer([2]), answer([9]), answer([4])]
    text = report(asked, {"rows": 30, "wall_s": 10.0, "cpu_s": 15.0, "errors": 0},
                  {"rows": 30, "wall_s": 40.0, "cpu_s": 60.0, "errors": 1},
                  [(1, 8.0, alone, 2.0), (8, 2.0, batched, 1.0)], "old")
    lines = text.splitlines()
    assert "| this checkout | 30 | 0 | 10.0 | 3.00 | 4.00x | 15.0 | 0.25x |" in lines  # 30/10 rows/s vs 30/40
    assert "| baseline (old) | 30 | 1 | 40.0 | 0.75 | 1.00x | 60.0 | 1.00x |" in lines
    assert "| 1 | 8.0 | 0.50 | 1.00x | 2.0 | 1.00x | 4/4 |" in lines
    # one answer differs; after encoding, 8 - 2 s one by one against 2 - 1 s batched
    assert "| 8 | 2.0 | 2.00 | 4.00x | 1.0 | 6.00x | 3/4 |" in lines
