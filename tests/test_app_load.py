"""Eight users chat at once: each gets its own complete answer, and the app serves on afterwards."""

import importlib.util
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client, handle_file

from g4v.conversation import Message, SamplingSettings
from g4v.images import open_image
from g4v.paths import REPO_ROOT
from tests.conftest import make_image

CLIENTS = 8
MAX_NEW_TOKENS = 16


def test_eight_concurrent_chats_with_images(app_url, hf_engine, tmp_path):
    requests = []
    for i in range(CLIENTS):
        path = tmp_path / f"user{i}.png"
        make_image(96 + 40 * i, 300 - 20 * i, seed=i).save(path)
        requests.append((path, f"User {i}: what do you see?"))

    def one_user(request):
        path, prompt = request
        client = Client(app_url, verbose=False)
        message = {"text": prompt, "files": [handle_file(str(path))]}
        return client.predict(message, MAX_NEW_TOKENS, 0.0, 1.0, 0, api_name="/chat")

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(one_user, requests))

    # Greedy decoding: each user's answer must be exactly what the model says to that user alone.
    settings = SamplingSettings(max_new_tokens=MAX_NEW_TOKENS)
    for (path, prompt), answer in zip(requests, answers):
        expected = hf_engine.generate([Message("user", prompt, [open_image(path)])], settings).text
        assert answer == expected
    assert len(set(answers)) > 1  # different inputs, different answers: nobody got someone else's

    after = Client(app_url, verbose=False).predict({"text": "Hello again", "files": []}, 8, 0.0, 1.0, 0, api_name="/chat")
    assert isinstance(after, str) and after


def test_the_chat_after_a_refused_message_is_answered_as_that_message_alone(app_url, hf_engine, tmp_path):
    """``scripts/bench_app_chats.py`` opens each visitor's session before its clock with a message
    the app refuses (as a browser's page opens its own when the picture is attached): the refusal
    must come, and write nothing into the session's conversation, so the chat after it is answered
    as the model answers that message alone."""
    spec = importlib.util.spec_from_file_location("bench_app_chats", REPO_ROOT / "scripts" / "bench_app_chats.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    open_session = bench.open_session

    path = tmp_path / "visitor.png"
    make_image(200, 150, seed=7).save(path)
    client = Client(app_url, verbose=False)
    open_session(client)  # raises unless the app refused the empty message
    answer = client.predict({"text": "What is it?", "files": [handle_file(str(path))]}, MAX_NEW_TOKENS, 0.0, 1.0, 0,
                            api_name="/chat")
    alone = hf_engine.generate([Message("user", "What is it?", [open_image(path)])],
                               SamplingSettings(max_new_tokens=MAX_NEW_TOKENS))
    assert answer == alone.text
