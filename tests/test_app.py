"""The app, launched as a user would (``python app.py``), answered through gradio_client."""

import socket

import pytest
from gradio_client import Client, handle_file

from g4v.paths import EXAMPLES_DIR


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def chat(client, text, files=(), max_new_tokens=12, temperature=0.0):
    message = {"text": text, "files": [handle_file(str(f)) for f in files]}
    return client.predict(message, max_new_tokens, temperature, 1.0, 0, api_name="/chat")


def engine_answer(engine, text, files=(), max_new_tokens=12) -> str:
    """What the model says to this one message, straight from the engine (greedy: deterministic)."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.images import open_image

    message = Message("user", text, [open_image(f) for f in files])
    return engine.generate([message], SamplingSettings(max_new_tokens=max_new_tokens)).text


def test_app_answers_a_message_with_an_image(app_url, hf_engine):
    image = EXAMPLES_DIR / "shapes-wide.png"
    answer = chat(Client(app_url, verbose=False), "What colour is the shape?", [image])
    assert answer == engine_answer(hf_engine, "What colour is the shape?", [image])


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port``, read from /proc/net/tcp (Linux)."""
    addresses = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address_hex, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A = LISTEN
            addresses.add(socket.inet_ntoa(bytes.fromhex(address_hex)[::-1]))
    return addresses


def test_app_binds_to_loopback_only(app_url):
    port = int(app_url.rstrip("/").rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_bad_input_is_one_line_and_the_app_keeps_serving(client, hf_engine, tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not a picture")
    with pytest.raises(Exception) as err:
        chat(client, "What is it?", [not_an_image])
    assert "not an image" in str(err.value)
    with pytest.raises(Exception) as err:
        chat(client, "   ")
    assert "prompt is empty" in str(err.value)
    assert chat(Client(client.src, verbose=False), "Still there?") == engine_answer(hf_engine, "Still there?")


@pytest.mark.parametrize("path", ["/etc/passwd", "app.py", "g4v/paths.py"])
def test_app_serves_no_files_outside_its_folders(app_url, path):
    import httpx

    from g4v.paths import REPO_ROOT

    target = path if path.startswith("/") else str(REPO_ROOT / path)
    response = httpx.get(f"{app_url}gradio_api/file={target}", timeout=10)
    assert response.status_code in (403, 404)
    assert "root:" not in response.text and "def " not in response.text


def test_app_serves_its_example_images(app_url):
    import httpx

    from g4v.paths import EXAMPLES_DIR

    example = EXAMPLES_DIR / "shapes-wide.png"
    response = httpx.get(f"{app_url}gradio_api/file={example}", timeout=10)
    assert response.status_code == 200 and response.content == example.read_bytes()


def test_one_client_is_one_conversation_and_a_new_client_starts_afresh(app_url, hf_engine):
    """As docs/app.md's API section says: ``/chat`` keeps the conversation per client session, so a
    second call on the same Client is answered after the first turn, and a new Client starts anew."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.images import open_image

    image = EXAMPLES_DIR / "shapes-wide.png"
    client = Client(app_url, verbose=False)
    first = chat(client, "What colour is the shape?", [image])
    second = chat(client, "What shape is it?")
    turns = [Message("user", "What colour is the shape?", [open_image(image)]), Message("assistant", first),
             Message("user", "What shape is it?")]
    assert second == hf_engine.generate(turns, SamplingSettings(max_new_tokens=12)).text
    assert chat(Client(app_url, verbose=False), "What shape is it?") == engine_answer(hf_engine, "What shape is it?")


def test_a_port_in_use_ends_the_app_with_one_line():
    """Another server on the port: one line that says so and how to choose another, not Gradio's
    traceback (which named its own launch() parameters)."""
    import socket
    import subprocess
    import sys

    from g4v.paths import REPO_ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (f"error: cannot serve on 127.0.0.1 port {port} (in use, or not "
                                                    "this machine's): choose another with --port or G4V_PORT")
    assert "Traceback" not in done.stderr


def test_weights_that_do_not_load_end_the_app_with_one_line(tmp_path):
    """The page is served while the model loads (g4v.engines.deferred); weights that then fail to
    load stop the server, and the app exits with one line, not a traceback or a page that hangs."""
    import os
    import shutil
    import subprocess
    import sys

    from g4v.engines.serving import free_port
    from g4v.paths import BUNDLED_MODEL_DIR, REPO_ROOT

    folder = tmp_path / "broken"
    shutil.copytree(BUNDLED_MODEL_DIR, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    env = {**os.environ, "GRADIO_SERVER_PORT": str(free_port())}
    done = subprocess.run([sys.executable, "app.py", "--model", str(folder)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: could not load model ")
    assert "Traceback" not in done.stderr and "Model loaded" not in done.stdout
    assert "* Loading the model" in done.stdout  # after the page was served
