"""Several visitors chatting at once with the served app (``python app.py``, the transformers
engine's decode loop): each gets the answer it gets alone, and a short answer asked while a long
one streams is not kept waiting for it (one at a time, it waited for the whole long answer)."""

import re
import threading
import time

import pytest
from gradio_client import Client

from g4v.conversation import Message, SamplingSettings
from tests.test_app_bad_input import assert_one_clean_line

QUESTIONS = ["What colour is the shape?", "How many shapes are there?", "Where is the star?", "Hi.",
             "Tell me about red squares.", "Is it big?"]


def alone(engine, text: str, max_new_tokens: int) -> str:
    return engine.generate([Message("user", text)], SamplingSettings(max_new_tokens=max_new_tokens)).text


def send_while_streaming(client: Client, text: str, max_new_tokens: int):
    """``text``'s job on ``client``, once the first piece of its answer has come (or it failed)."""
    job = client.submit({"text": text, "files": []}, max_new_tokens, 0.0, 1.0, 0, api_name="/chat")
    while not job.outputs() and not job.done():
        time.sleep(0.05)
    return job


def test_visitors_at_once_each_get_their_answer_alone(app_url, hf_engine):
    answers = [None] * len(QUESTIONS)

    def visit(index: int) -> None:
        client = Client(app_url, verbose=False)  # a visitor of its own: its own session
        answers[index] = client.predict({"text": QUESTIONS[index], "files": []}, 24, 0.0, 1.0, 0, api_name="/chat")

    threads = [threading.Thread(target=visit, args=(index,)) for index in range(len(QUESTIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert answers == [alone(hf_engine, text, 24) for text in QUESTIONS]


def test_a_short_answer_is_not_kept_waiting_for_a_long_one(app_url, hf_engine):
    """The random-weight checkpoint answers "Write a long story." with the whole ``max_new_tokens``
    (checked first, on the engine: "Tell me everything." ends after 23): a 900-token answer is
    streaming when a 4-token one is asked for; the short one ends first."""
    long_prompt = "Write a long story."
    assert len(hf_engine.generate([Message("user", long_prompt)], SamplingSettings(max_new_tokens=900)).token_ids) == 900
    long_client, short_client = Client(app_url, verbose=False), Client(app_url, verbose=False)
    long_job = send_while_streaming(long_client, long_prompt, 900)
    short = short_client.predict({"text": "Hi.", "files": []}, 4, 0.0, 1.0, 0, api_name="/chat")
    assert not long_job.done(), "the long answer ended before the short one: nothing was shown"
    assert short == alone(hf_engine, "Hi.", 4)
    long_job.cancel()


STILL_ANSWERING = "^this session is still answering its previous message"


def test_one_session_takes_one_message_at_a_time(app_url, hf_engine):
    """Each ``/chat`` call reads its session's conversation as it starts and writes it as it ends:
    a second message of the same session sent while the first streams would not see the first turn
    and would write over it. It is refused in one line; the first answer and its turn are kept, and
    the session's next message is answered after that turn. (The random-weight checkpoint writes
    all 300 tokens for the story, several seconds: the second message arrives while it streams.)"""
    story = "Write a long story."
    client = Client(app_url, verbose=False)
    first = send_while_streaming(client, story, 300)
    with pytest.raises(Exception) as refused:
        second = client.predict({"text": "Hi.", "files": []}, 4, 0.0, 1.0, 0, api_name="/chat")
        pytest.fail(f"the second message was answered ({second!r})"
                    + (", but the first had already ended: nothing was tested" if first.done() else ""))
    assert_one_clean_line(str(refused.value), STILL_ANSWERING)
    story_answer = first.result(timeout=300)
    assert story_answer == alone(hf_engine, story, 300)
    turns = [Message("user", story), Message("assistant", story_answer), Message("user", "Hi.")]
    assert (client.predict({"text": "Hi.", "files": []}, 4, 0.0, 1.0, 0, api_name="/chat")
            == hf_engine.generate(turns, SamplingSettings(max_new_tokens=4)).text)


def test_a_cancelled_answer_frees_its_session(app_url, hf_engine):
    """A client that cancels its answer may send the next message: the session is released once
    the server has closed the answer (asynchronously, so the client tries again for up to 60 s),
    and the cancelled answer is no turn of the conversation."""
    client = Client(app_url, verbose=False)
    first = send_while_streaming(client, "Write a long story.", 900)
    assert not first.done(), "the long answer ended before it was cancelled: nothing was tested"
    first.cancel()
    deadline, answer = time.monotonic() + 60, None
    while answer is None:
        try:
            answer = client.predict({"text": "Hi.", "files": []}, 4, 0.0, 1.0, 0, api_name="/chat")
        except Exception as refused:
            assert re.search(STILL_ANSWERING, str(refused)) and time.monotonic() < deadline, str(refused)
            time.sleep(0.2)
    assert answer == alone(hf_engine, "Hi.", 4)
