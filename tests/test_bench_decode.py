"""``bench decode``: the transformers engine's chat decoding against a bare ``generate``, and N chats
at once against one at a time. Timings are not asserted (a shared machine); the paths, the ratios'
arithmetic, the token counts and the answers are: each chat writes exactly ``--max-new-tokens``
tokens, and the chats run together get the tokens the engine gives each one alone (asked here
directly)."""

import json
import math

import pytest

from tests.cli import run_cli

TOKENS = 6
CHATS = 2


@pytest.mark.slow  # about 10 s on a quiet 2-core machine
def test_bench_decode_reports_paths_ratios_and_chats(tmp_path):
    from g4v.engines.bench import workload
    from g4v.engines.decode_bench import forced
    from g4v.engines.hf import TransformersEngine
    from g4v.paths import BUNDLED_MODEL_DIR

    out = tmp_path / "decode.json"
    done = run_cli("bench", "decode", "--device", "cpu", "--dtype", "float32", "--max-new-tokens", str(TOKENS),
                   "--chats", str(CHATS), "--repeats", "1", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    rates = figures["decode_tok_s"]
    assert set(rates) == {"bare generate", "engine (reference path)", "engine (decode loop)"}
    assert rates["bare generate"] > 0  # generate's streamer notes every token by itself
    for path, rate in rates.items():  # positive, or NaN where a short answer's tokens came in one piece
        assert math.isnan(rate) or rate > 0
        ratio = figures["ratios_over_bare_generate"][path]
        expected = rate / rates["bare generate"]
        assert (math.isnan(ratio) and math.isnan(expected)) or ratio == pytest.approx(expected)
    assert figures["chats"] == CHATS and figures["new_tokens"] == TOKENS
    assert figures["chat_tokens"] == CHATS * TOKENS  # every chat wrote all its tokens
    assert figures["same_as_alone"] == CHATS
    assert figures["together_over_one_at_a_time"] == pytest.approx(figures["one_at_a_time_s"] / figures["together_s"])
    assert f"{CHATS} chats, {CHATS * TOKENS} tokens" in done.stdout

    # the chats' answers, asked of an engine directly: exactly TOKENS tokens each, and the bench's
    # "same as alone" compared against these (its own alone run) held for all of them
    engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
    try:
        answers = [engine.generate(conversation, forced(TOKENS)) for conversation in workload(CHATS)]
    finally:
        engine.close()
    assert [len(answer.token_ids) for answer in answers] == [TOKENS] * CHATS


def test_decode_rates_keep_each_paths_fastest_round_and_say_nan_only_where_nothing_was_timed():
    """:func:`~g4v.engines.decode_bench.decode_rates` over answer paths whose ``(seconds, tokens)``
    are given, against rates worked out by hand: the first call is the untimed warm-up, each path's
    fastest round counts, a round that timed nothing (all tokens in one piece) never replaces a
    measured one, and a path that timed nothing in any round is NaN."""
    import torch

    from g4v.engines.decode_bench import _span, decode_rates

    asked = []

    def path(*spans):
        answers = iter(spans)

        def answer(tokens: int):
            asked.append(tokens)
            return next(answers)
        return answer

    warm_up = (100.0, 1)  # the fastest of all, were it counted
    rates = decode_rates({"fastest round": path(warm_up, (1.0, 4), (0.5, 4), (2.0, 4)),
                          "one round timed": path(warm_up, (0.0, 0), (1.0, 5), (0.0, 0)),
                          "nothing timed": path(warm_up, (0.0, 0), (0.0, 0), (0.0, 0))},
                         new_tokens=5, repeats=3, device=torch.device("cpu"))
    assert rates["fastest round"] == 8.0 and rates["one round timed"] == 5.0
    assert math.isnan(rates["nothing timed"])
    assert asked == [2, 2, 2] + [5] * 9  # the warm-ups are 2-token answers; every round asks for 5

    # an answer's span: from the first arrival to the last, the first arrival's tokens not counted
    assert _span([10.0, 10.5, 12.0], [2, 1, 3]) == (2.0, 4)
    assert _span([3.0], [5]) == (0.0, 0) and _span([], []) == (0.0, 0)
