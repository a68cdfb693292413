"""The Chat tab's conversation handling, on the real transformers engine: long conversations are
trimmed to what fits (and the answer is the engine's own answer to the trimmed conversation), only
the pictures of the turns kept are decoded, each reduced to the size the processor resizes it to, a
history picture that has gone is left out, and bad values get one line."""

import math
import threading

import pytest

from g4v.conversation import MAX_IMAGES_PER_CONVERSATION, Message, SamplingSettings
from g4v.errors import G4VError, PromptTooLong
from tests.conftest import make_image
from webapp.chat import answer, start_answer
from webapp.chat_history import drop_oldest_turn, read_history, read_message, within_image_limit
from webapp.common import sampling_settings

GREEDY = SamplingSettings(max_new_tokens=6)


@pytest.fixture(scope="module")
def picture_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat-pictures")
    paths = []
    for i in range(12):
        paths.append(folder / f"p{i}.png")
        make_image(64 + 8 * i, 48, seed=i).save(paths[-1])
    return [str(p) for p in paths]


def entry(role, text, files=()):
    return {"role": role, "content": [*({"type": "file", "file": {"path": f}} for f in files),
                                      {"type": "text", "text": text}]}


def image_turns(files, answer_text="It is a shape."):
    history = []
    for i, path in enumerate(files):
        history += [entry("user", f"Picture {i}?", [path]), entry("assistant", answer_text)]
    return history


def test_drop_oldest_turn_keeps_the_system_message_and_drops_one_exchange():
    conversation = [Message("system", "Be brief."), Message("user", "a"), Message("assistant", "b"),
                    Message("user", "c"), Message("assistant", "d"), Message("user", "e")]
    assert [m.text for m in drop_oldest_turn(conversation)] == ["Be brief.", "c", "d", "e"]


def test_too_many_pictures_drop_the_oldest_turns(picture_files):
    history = read_history(image_turns(picture_files[:10])).messages
    messages, dropped = within_image_limit(history + [read_message({"text": "And now?", "files": picture_files[10:12]})])
    assert sum(len(m.images) for m in messages) <= MAX_IMAGES_PER_CONVERSATION
    assert dropped == 12 - MAX_IMAGES_PER_CONVERSATION  # one picture per dropped turn
    assert messages[0].text == f"Picture {dropped}?" and messages[-1].text == "And now?"


def test_a_conversation_past_the_context_window_is_answered_on_its_newest_turns(hf_engine, picture_files):
    """Each turn's long text pushes the prompt past the 4096-token window; the answer must equal the
    engine's own answer to the newest turns that fit, which the test finds by itself."""
    long_text = "shape " * 700
    history = []
    for i in range(8):
        history += [entry("user", f"{long_text} {i}?"), entry("assistant", "Yes.")]
    message = read_message({"text": "Which one?", "files": []})
    streamed = "".join(list(answer(hf_engine, message, history, GREEDY, threading.Event()))[-1:])

    full = read_history(history).messages + [message]
    with pytest.raises(PromptTooLong):
        hf_engine.prepare_inputs(full, GREEDY.max_new_tokens)
    fitting = full
    while True:  # the longest tail that fits, found independently of the app's loop
        try:
            hf_engine.prepare_inputs(fitting, GREEDY.max_new_tokens)
            break
        except PromptTooLong:
            fitting = fitting[2:]
    assert 1 < len(fitting) < len(full)
    assert streamed == hf_engine.generate(fitting, GREEDY).text


def test_a_message_too_long_on_its_own_is_refused_in_one_line(hf_engine):
    message = read_message({"text": "shape " * 6000, "files": []})
    with pytest.raises(G4VError, match="too long") as err:
        start_answer(hf_engine, [message], GREEDY, threading.Event())
    assert "\n" not in str(err.value)


def test_a_history_picture_that_is_gone_is_left_out(hf_engine, tmp_path, picture_files):
    gone = tmp_path / "deleted.png"
    make_image(80, 60).save(gone)
    history = [entry("user", "What is it?", [str(gone)]), entry("assistant", "A square.")]
    gone.unlink()
    past = read_history(history)
    assert past.missing_images == 1 and past.messages[0].images == []
    message = read_message({"text": "And this one?", "files": [picture_files[0]]})
    streamed = list(answer(hf_engine, message, history, GREEDY, threading.Event()))[-1]
    assert streamed == hf_engine.generate(past.messages + [message], GREEDY).text


def test_only_the_pictures_of_the_turns_kept_are_decoded(hf_engine, tmp_path, picture_files):
    """A conversation's oldest turns past the picture limit are left out before any picture is
    decoded: here the oldest picture is no longer a picture at all, and the answer is still the
    engine's own answer to the newest turns (a long conversation decodes at most 8 pictures)."""
    from PIL import Image

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    files = [str(broken), *picture_files[:8]]
    message = read_message({"text": "And now?", "files": picture_files[8:9]})
    streamed = list(answer(hf_engine, message, image_turns(files), GREEDY, threading.Event()))[-1]
    kept = []  # the turns of pictures 2 to 8, read independently of the app
    for i in range(2, 9):
        kept += [Message("user", f"Picture {i}?", [Image.open(files[i]).convert("RGB")]),
                 Message("assistant", "It is a shape.")]
    assert sum(len(m.images) for m in kept) + 1 == MAX_IMAGES_PER_CONVERSATION
    assert streamed == hf_engine.generate(kept + [message], GREEDY).text


def test_a_huge_chat_picture_is_kept_at_the_size_the_processor_resizes_it_to(hf_engine, tmp_path):
    """As dataset pictures are (docs/limits.md): reduced as soon as it is decoded, to the processor's
    fit into the pinpoint the model picks (the tiling plan of the original), not held at full size."""
    from PIL import Image

    from g4v.tiling import plan_tiling

    big = tmp_path / "big.png"
    Image.new("RGB", (3000, 2000), (10, 20, 30)).save(big)
    accepted = chat_handler(hf_engine, "accept")({"text": "What colour is it?", "files": [str(big)]}, [])
    [picture] = next(value for value in accepted.values() if isinstance(value, Message)).images
    assert picture.size == plan_tiling((2000, 3000), hf_engine.model_config()).resized_size[::-1] != (3000, 2000)
    assert picture.getpixel((5, 5)) == (10, 20, 30)


@pytest.mark.parametrize("value, words", [
    ({"text": "What is <image>?", "files": []}, "image placeholder"),
    ({"text": "lone \udc80 surrogate", "files": []}, "not valid Unicode"),
    (None, "message is empty"),
    ({"text": "   ", "files": []}, "prompt is empty"),
])
def test_bad_messages_get_one_line(value, words):
    with pytest.raises(G4VError, match=words) as err:
        read_message(value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("settings, words", [
    ((math.nan, 0.0, 1.0, 0), "max_new_tokens must be a finite number"),
    ((8.5, 0.0, 1.0, 0), "max_new_tokens must be a whole number"),
    ((8, math.inf, 1.0, 0), "temperature must be a finite number"),
    ((8, 0.0, "x", 0), "top_p must be a finite number"),
    ((8, 0.0, 1.0, math.nan), "seed must be a finite number"),
    ((10**6, 0.0, 1.0, 0), "max_new_tokens must be a whole number from 1 to 1024, got 1000000"),
    ((8, 10**330, 1.0, 0), "temperature must be a finite number"),  # too large for a float
    ((8, 0.0, 1.0, 10**330), r"seed must be -1 \(a fresh one each time\) or a whole number from 0 to 4294967295"),
])
def test_bad_sampling_values_get_one_line(settings, words):
    with pytest.raises(G4VError, match=words):
        sampling_settings(*settings)


def chat_handler(engine, name):
    """The Chat tab's own handler ``name``, as the page wires it to this engine."""
    import gradio as gr

    from webapp.chat import chat_tab

    from webapp.layout import local_config

    with gr.Blocks() as page:
        chat_tab(engine, gr.State(None), [], config=local_config(engine))
    return next(block.fn for block in page.fns.values() if getattr(block.fn, "__name__", "") == name)


def checked_settings(accepted: dict):
    """The sampling settings among what the box's check returned, by box."""
    return next(value for value in accepted.values() if isinstance(value, SamplingSettings))


def test_the_box_refuses_bad_sampling_settings_before_the_model_queue(hf_engine):
    """A seed or temperature out of range is refused by the box's first check (not queued behind
    other visitors' answers), in the words SamplingSettings uses; good settings reach the answer step
    as SamplingSettings checked once."""
    import gradio as gr

    from g4v.conversation import SamplingSettings

    accept = chat_handler(hf_engine, "accept")
    message = {"text": "What shape is green?", "files": []}
    for bad, words in [({"temperature": 9.0}, "temperature must be 0 (greedy) or from 0.01 to 5"),
                       ({"temperature": 5e-38}, "temperature must be 0 (greedy) or from 0.01 to 5"),
                       ({"max_new_tokens": 0.5}, "max_new_tokens")]:
        with pytest.raises(gr.Error) as refused:
            accept(message, [], **bad)
        assert words in refused.value.message, refused.value.message
        with pytest.raises(G4VError) as direct:  # the same words as the settings' own check
            SamplingSettings(**{"max_new_tokens": 8, **bad}).validated()
        assert words in str(direct.value)
    # The seed box's label offers -1 for a fresh seed: its refusal says so, where the settings' own
    # check (the CLI's --seed) names the seeds it takes.
    for seed in (2**32, -2):
        with pytest.raises(gr.Error) as refused:
            accept(message, [], seed=seed)
        assert refused.value.message == f"seed must be -1 (a fresh one each time) or a whole number from 0 to {2**32 - 1}, got {seed}"
        with pytest.raises(G4VError, match=f"seed must be a whole number from 0 to {2**32 - 1}, got {seed}"):
            SamplingSettings(max_new_tokens=8, seed=seed).validated()
    with pytest.raises(gr.Error) as refused:  # what a box holds of 32 typed nines: not 1000...05366162204393472
        accept(message, [], seed=float("9" * 32))
    assert refused.value.message == f"seed must be -1 (a fresh one each time) or a whole number from 0 to {2**32 - 1}, got 1e+32"
    with pytest.raises(G4VError) as refused:  # a float's whole number past 2**53 is not the one typed
        sampling_settings(float("9" * 20))
    assert str(refused.value) == "max_new_tokens must be a whole number of at most 9,007,199,254,740,992, got 1e+20"
    settings = checked_settings(accept(message, [], 7, 0.5, 0.9, 3))
    assert settings == SamplingSettings(max_new_tokens=7, temperature=0.5, top_p=0.9, seed=3)


def test_the_chat_box_refuses_long_text_at_the_engines_own_limit(hf_engine):
    """A message longer than the engine's context window allows is refused by the box's first
    check, naming that limit (the one the engine itself would name), whatever else it carries."""
    import gradio as gr

    from g4v.conversation import max_text_chars

    limit = max_text_chars(hf_engine.context_window())
    accept = chat_handler(hf_engine, "accept")
    with pytest.raises(gr.Error) as refused:
        accept({"text": "a" * (limit + 1), "files": []}, [])
    assert f"the limit is {limit:,}" in refused.value.message, refused.value.message
    with pytest.raises(G4VError) as engine_refused:  # the engine's own words
        hf_engine.generate([Message("user", "a" * (limit + 1))], GREEDY)
    assert f"the limit is {limit:,}" in str(engine_refused.value)


def test_the_seed_defaults_to_a_fresh_one_and_0_is_a_seed(hf_engine):
    """The box's handler, given no seed, checks SamplingSettings' default (a fresh seed each run);
    0 is a seed like any other, not "random" (tests/test_request_defaults.py: the box starts at it)."""
    settings = checked_settings(chat_handler(hf_engine, "accept")({"text": "Hi", "files": []}, []))
    assert settings.seed is SamplingSettings.seed is None
    assert sampling_settings(8, seed=0).seed == 0


def test_chat_history_shows_markup_as_text_and_reads_it_back_as_written():
    """The chat renders Markdown and HTML: a message or an answer carrying an image tag, a link or
    emphasis is kept escaped in the history (it shows as written) and read back as written."""
    from markdown_it import MarkdownIt

    from webapp.chat_history import answer_entry, user_entry

    text = 'Is <img src="http://x/b.png"> a *star* [link](http://x) `tick` \\* & | _x_?'
    history = [user_entry({"text": text, "files": []}), answer_entry(f"It is <a href='x'>{text}</a>")]
    rendered = MarkdownIt().render(history[0]["content"][0]["text"] + "\n\n" + history[1]["content"])
    assert "<img" not in rendered and "<a " not in rendered and "<em>" not in rendered and "<code>" not in rendered
    assert [message.text for message in read_history(history).messages] == [text, f"It is <a href='x'>{text}</a>"]


# ── streaming to the page ───────────────────────────────────────────────────────────────────────


def test_the_page_gets_the_text_at_most_every_interval_and_always_the_last(monkeypatch):
    """Pieces arriving faster than the interval are sent together (the newest text so far), the
    first at once and the last always; closing the stream closes the engine's stream."""
    from webapp import chat

    import itertools

    clock = itertools.cycle([0.0, 0.01, 0.02, 0.06, 0.07, 0.2, 0.21])
    monkeypatch.setattr(chat.time, "monotonic", lambda: next(clock))
    texts = ["a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg"]
    assert list(chat.at_most_every(iter_closing(texts, []), 0.05)) == ["a", "abcd", "abcdef", "abcdefg"]
    closed = []
    sent = chat.at_most_every(iter_closing(texts, closed), 0.05)
    assert next(sent) == "a"
    sent.close()  # the stop button
    assert closed == [True]


def iter_closing(texts, closed):
    try:
        yield from texts
    finally:
        closed.append(True)


def test_a_streamed_answer_ends_with_the_engines_whole_answer(hf_engine):
    """However the pieces were grouped on the way, the last text sent is the engine's answer."""
    message = read_message({"text": "Describe the picture in detail.", "files": []})
    settings = SamplingSettings(max_new_tokens=24, min_new_tokens=24)
    sent = list(answer(hf_engine, message, [], settings, threading.Event()))
    assert sent[-1] == hf_engine.generate([message], settings).text
    assert all(sent[-1].startswith(text) for text in sent)
