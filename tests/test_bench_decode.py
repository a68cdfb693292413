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
