"""Huge text is refused by its length in characters before any tokenizer sees it (issue 31, H1 and
H4): chat messages (engine, app, CLI), dataset rows, Attribution's answer to explain and answers to
contrast with. Each check runs under an address-space limit far below what tokenizing the text
would take (about 300 bytes a character), watches the real tokenizer's calls, and ends in one line."""

import json

import pytest
from PIL import Image

from g4v.cli import main
from g4v.conversation import Message, SamplingSettings, max_text_chars
from g4v.errors import G4VError
from g4v.paths import BUNDLED_MODEL_DIR
from tests.conftest import make_image
from tests.memory import address_space_limit

HUGE = "a " * 2_000_000  # 4 million characters: tokenizing it took 1.1 GB more here
HEADROOM_MB = 512  # far less than that
TEMPLATE_CHARS = 2_000  # what a chat template adds around the text, at most


@pytest.fixture()
def tokenized(hf_engine, monkeypatch) -> list[int]:
    """The length in characters of every text the engine's real tokenizer is called with. A text
    past the bound fails the test there, before the tokenizer allocates for it (under the address
    space limit, the tokenizer's own allocation failure aborts the whole process)."""
    cls = type(hf_engine.tokenizer)
    real = cls.__call__
    lengths = []
    bound = max_text_chars(hf_engine.context_window()) + TEMPLATE_CHARS

    def recording(self, text=None, *args, **kwargs):
        texts = [text] if isinstance(text, str) else list(text or [])
        lengths.extend(len(t) for t in texts if isinstance(t, str))
        assert not lengths or max(lengths) <= bound, f"the tokenizer was called with {max(lengths):,} characters"
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", recording)
    return lengths


def one_line(call, *words) -> str:
    with pytest.raises(G4VError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_chat_text_is_cut_before_the_tokenizer(hf_engine, tokenized):
    from webapp.chat import answer
    from webapp.chat_history import read_message

    limit = max_text_chars(hf_engine.context_window())
    image = make_image(64, 48)
    with address_space_limit(HEADROOM_MB):
        one_line(lambda: hf_engine.generate([Message("user", HUGE, [image])], SamplingSettings(max_new_tokens=2)),
                 "too long", "4,000,000 characters", f"{limit:,}")
        one_line(lambda: read_message({"text": HUGE, "files": []}), "too long")  # the app's /chat, before the engine
        history = [{"role": "user", "content": HUGE}, {"role": "assistant", "content": "ok"}]
        one_line(lambda: next(answer(hf_engine, Message("user", "and now?"), history, SamplingSettings(2), None)),
                 "too long")
        hf_engine.generate([Message("user", "What is it?", [image])], SamplingSettings(max_new_tokens=2))
    assert tokenized and max(tokenized) <= limit + TEMPLATE_CHARS


def test_a_conversation_too_long_in_characters_drops_its_oldest_turns(hf_engine, tokenized):
    """Each message fits, together they do not: the chat leaves out the oldest turn, as it does for
    a prompt too long in tokens, and the tokenizer never sees the whole conversation."""
    import threading

    from webapp.chat import start_answer

    limit = max_text_chars(hf_engine.context_window())
    half = " the" * (limit // 8 + 3)  # one token every 4 characters: it fits the window on its own
    messages = [Message("user", half), Message("assistant", "ok"), Message("user", half)]
    with address_space_limit(HEADROOM_MB):
        stream, dropped = start_answer(hf_engine, messages, SamplingSettings(max_new_tokens=2), threading.Event())
        "".join(stream)
    assert dropped == 1 and max(tokenized) < limit  # the whole conversation, template and all, is longer


def test_cli_chat_refuses_a_huge_prompt_in_one_line(tokenized, capsys):
    with address_space_limit(HEADROOM_MB):
        code = main(["chat", "--model", str(BUNDLED_MODEL_DIR), HUGE])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "too long" in err[0] and "4,000,000 characters" in err[0]


def test_a_too_long_dataset_row_is_that_rows_error(hf_engine, tokenized, tmp_path):
    from g4v.conversation import PREVIEW_CHARS
    from g4v.evaluate import ArmSpec, EvalConfig, run_eval
    from g4v.evaluate.store import ROWS_FILE

    Image.new("RGB", (48, 48), (200, 30, 30)).save(tmp_path / "red.png")
    over_the_model = "b " * (max_text_chars(hf_engine.context_window()) // 2 + 1)  # fine for a dataset, not this model
    rows = [{"file_name": "red.png", "prompt": HUGE, "answer": "red"},
            {"file_name": "red.png", "prompt": "What colour?", "answer": HUGE},
            {"file_name": "red.png", "prompt": "What colour?", "answer": "red"},
            {"file_name": "red.png", "prompt": over_the_model, "answer": "red"}]
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = EvalConfig(a=ArmSpec("hf"), b=ArmSpec("hf"), data=str(tmp_path), max_new_tokens=2)
    with address_space_limit(HEADROOM_MB):
        result = run_eval(config, tmp_path / "out", reuse={ArmSpec("hf"): hf_engine})
    errors = [row.error for row in result.rows]
    assert errors[0] == "the prompt is too long: 4,000,000 characters (the limit is 524,288)"
    assert errors[1] == "the reference is too long: 4,000,000 characters (the limit is 524,288)"
    assert errors[2] is None and "too long" in errors[3]
    for row in result.rows[:2]:  # previews only, in the table and in the export
        assert len(row.prompt) < PREVIEW_CHARS + 50 and len(row.reference) < PREVIEW_CHARS + 50
    assert (tmp_path / "out" / ROWS_FILE).stat().st_size < 2 * len(over_the_model) + 20_000
    assert max(tokenized) <= max_text_chars(hf_engine.context_window()) + TEMPLATE_CHARS


def test_attribution_answers_are_bounded_before_the_tokenizer(hf_engine, tokenized, tmp_path):
    from g4v.attribution.run import MAX_ANSWER_TOKENS, AttributionSettings, run_attribution

    image = make_image(96, 64, seed=2)

    def explain(prompt="What is it?", **settings):
        return lambda: run_attribution(hf_engine, image, prompt, AttributionSettings(**settings), out_dir=tmp_path / "o")

    with address_space_limit(HEADROOM_MB):
        one_line(explain(target="a " * 200_000), "answer to explain is too long", "400,000 characters")
        one_line(explain(target="the <image> shape"), "answer to explain", "image placeholder")
        one_line(explain(target="red", against=("blue <image>",)), "answer to contrast with", "image placeholder")
        emoji = "\U0001f642" * 200  # 200 characters, more tokens than an answer may have
        assert len(hf_engine.tokenizer(emoji, add_special_tokens=False)["input_ids"]) > MAX_ANSWER_TOKENS
        one_line(explain(target=emoji), "answer to explain is too long", f"the limit is {MAX_ANSWER_TOKENS}")
        # A prompt that leaves fewer free tokens than the answer has: measured on the engine's own inputs.
        target = " red" * 100
        target_tokens = len(hf_engine.tokenizer(target, add_special_tokens=False)["input_ids"])
        window = hf_engine.context_window()
        prompt = "word " * 100
        prompt_tokens = hf_engine.prepare_inputs([Message("user", prompt, [image])])["input_ids"].shape[1]
        per_word = (hf_engine.prepare_inputs([Message("user", prompt * 2, [image])])["input_ids"].shape[1]
                    - prompt_tokens) / 100
        words = 100 + int((window - target_tokens // 2 - prompt_tokens) / per_word)
        long_prompt = "word " * words
        long_tokens = hf_engine.prepare_inputs([Message("user", long_prompt, [image])])["input_ids"].shape[1]
        assert long_tokens <= window < long_tokens + target_tokens
        one_line(explain(long_prompt, target=target),
                 f"the prompt ({long_tokens} tokens with the image)", f"({target_tokens} tokens)",
                 f"context window of {window} tokens")
    assert max(tokenized) <= max_text_chars(window) + TEMPLATE_CHARS
    assert not (tmp_path / "o").exists()


def test_cli_attribute_refuses_a_huge_target_before_loading(tokenized, tmp_path, capsys):
    make_image(64, 48).save(tmp_path / "p.png")
    with address_space_limit(HEADROOM_MB):
        code = main(["attribute", "--image", str(tmp_path / "p.png"), "--prompt", "What?", "--target", HUGE,
                     "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "answer to explain is too long" in err[0]
    assert not (tmp_path / "o").exists()
