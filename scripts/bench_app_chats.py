"""Chats through the served app, as visitors send them: N chats one at a time, then all at once.

    .venv/bin/python scripts/bench_app_chats.py [--model DIR] [--chats 8] [--max-new-tokens 48] [--rounds 3] [APP FLAGS...]

Starts ``python app.py`` on a free port (loopback) with the flags given after the known ones, sends
each chat (its own picture, greedy) through ``gradio_client`` to ``/chat``, and prints, measured in
one run: tokens/s all at once over one at a time, and what the app adds to a chat over the engine
answering the same chat in this process (the same default settings). Token counts are the engine's
(greedy answers are the same tokens again).

Both ways are timed in two session modes: each visitor's session new at its chat (a client's first
call), and opened before the clock, as a browser's is (:func:`open_session`).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def open_session(client) -> None:
    """Open ``client``'s session on the server, as a visitor's page has before they send.

    In a browser, attaching the picture to the chat box uploads it and fires the box's change
    event, and the server makes the visitor's session state at that first event (Gradio copies the
    configuration of the page's 380 components: 27 ms of the server's CPU here, 40-55 ms with eight
    at once, one session after another on its event loop). A client's first call pays that inside the chat. The box's events
    are the page's own (not in the API), so the client sends the message the app refuses at once,
    an empty one: the session is made and its conversation stays empty."""
    from gradio_client.exceptions import AppError

    try:
        client.predict({"text": "", "files": []}, 1, 0.0, 1.0, 0, api_name="/chat")
    except AppError as err:
        if "empty" not in str(err):
            raise
    else:
        raise RuntimeError("the app answered an empty message: no session was opened without a turn")


def main(argv=None) -> int:
    from gradio_client import Client, handle_file

    from g4v.conversation import SamplingSettings
    from g4v.engines import create_engine
    from g4v.engines.bench import PROMPT, workload_images
    from g4v.engines.decode_bench import at_once
    from g4v.paths import BUNDLED_MODEL_DIR
    # Importing the tests' conftest also sets the test processes' environment (OpenMP's passive
    # wait, for two processes on two cores), which made the app's chats 20-35 % slower here: the
    # app started below runs with the environment a user's `python app.py` has.
    environment = dict(os.environ)
    from tests.conftest import running_app

    os.environ.clear()
    os.environ.update(environment)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(BUNDLED_MODEL_DIR))
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of both ways in both session modes (the fastest of each counts)")
    args, app_flags = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        pictures = []
        for index, image in enumerate(workload_images(args.chats)):
            pictures.append(Path(folder) / f"chat{index}.png")
            image.save(pictures[-1])
        engine = create_engine("hf", args.model, device="cpu")
        settings = SamplingSettings(max_new_tokens=args.max_new_tokens)
        from g4v.conversation import Message
        from g4v.images import open_image

        conversations = [[Message("user", PROMPT, [open_image(str(p))])] for p in pictures]
        engine.generate(conversations[0], settings)  # warm-up
        began = time.perf_counter()
        expected = [engine.generate(c, settings) for c in conversations]
        engine_s = time.perf_counter() - began
        tokens = sum(len(answer.token_ids) for answer in expected)
        engine.close()
        with running_app("--model", args.model, *app_flags) as url:
            def visitor() -> Client:
                """A client of the app at ``url`` (loopback HTTP). The visitors run on the app's own cores
                here, where a real visitor's browser is another machine: ``gradio_client`` makes an HTTP
                client for each call it sends, and with certificates to load (for HTTPS, which a loopback
                URL never uses) that is about 20 ms of this machine's CPU a call, several calls a chat."""
                return Client(url, verbose=False, ssl_verify=False)

            def visitors(opened: bool) -> list:
                """One page (a session of its own) per chat, loaded before the clock starts, as a
                visitor's page is before they send; with ``opened``, its session too."""
                clients = [visitor() for _ in range(args.chats)]
                for client in clients if opened else []:
                    open_session(client)
                return clients

            def chat(clients: list, index: int) -> str:
                return clients[index].predict({"text": PROMPT, "files": [handle_file(str(pictures[index]))]},
                                              args.max_new_tokens, 0.0, 1.0, 0, api_name="/chat")

            chat([visitor()], 0)  # warm-up
            timed = {opened: ([], [], [], []) for opened in (False, True)}  # alone s, together s, their answers
            for round_ in range(args.rounds):  # all take turns (the modes' order alternates); the fastest counts
                for opened in (False, True) if round_ % 2 == 0 else (True, False):
                    alone_s, together_s, alone, together = timed[opened]
                    first, second = visitors(opened), visitors(opened)
                    began = time.perf_counter()
                    alone.append([chat(first, index) for index in range(args.chats)])
                    alone_s.append(time.perf_counter() - began)
                    together.append([None] * args.chats)

                    def send(index: int, answers=together[-1], clients=second) -> None:
                        answers[index] = chat(clients, index)

                    together_s.append(at_once(send, args.chats))
    print(f"{args.chats} chats, {tokens} tokens, {args.max_new_tokens} new tokens each")
    print(f"engine in this process, one at a time: {engine_s:.2f} s ({tokens / engine_s:.1f} tokens/s)")
    for opened, (alone_s, together_s, alone, together) in timed.items():
        one_at_a_time, at_once_s = min(alone_s), min(together_s)
        same = min(sum(a == b == answer.text for a, b, answer in zip(*texts, expected))
                   for texts in zip(alone, together))
        print("sessions opened before the clock, as a browser's page opens its own:" if opened else
              "sessions new at the chat (each client's first call):")
        print(f"  app, one at a time: {one_at_a_time:.2f} s ({tokens / one_at_a_time:.1f} tokens/s); "
              f"the app adds {100 * (one_at_a_time / engine_s - 1):.0f} % per chat")
        print(f"  app, all at once: {at_once_s:.2f} s ({tokens / at_once_s:.1f} tokens/s): "
              f"{one_at_a_time / at_once_s:.2f}x one at a time; {same} of {args.chats} answers the engine's "
              "answer alone in every round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
