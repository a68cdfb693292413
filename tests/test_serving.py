"""``g4v.engines.serving``: the one wait for a server process (duplicate D1 of issue 31's hardening
2: the tests' app fixture and the start-up benchmark each had their own loop). Real sockets and a
real child process; nothing else starts."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from g4v.engines.serving import free_port, wait_until_serving
from g4v.errors import G4VError
from g4v.paths import REPO_ROOT


def test_returns_once_a_port_accepts_connections():
    port = free_port()
    listener = socket.socket()

    def listen_later():
        time.sleep(0.5)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        waited = wait_until_serving(port, timeout=10, interval=0.05)
    finally:
        thread.join()
        listener.close()
    assert 0.4 <= waited < 10


def test_a_server_that_exits_first_is_one_line():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        with pytest.raises(G4VError, match="^the server exited with code 3 before serving$"):
            wait_until_serving(free_port(), timeout=30, process=process, interval=0.05)
    finally:
        process.wait(10)


def test_a_silent_port_times_out_in_one_line():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(G4VError, match=f"^the server did not serve on port {port} within 0.3 s$"):
        wait_until_serving(port, timeout=0.3, interval=0.05)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("path", ["tests/conftest.py", "scripts/bench_startup.py", "g4v/engines/vllm_server.py"])
def test_the_wait_and_the_free_port_are_written_once(path):
    """The callers use the helper: none opens its own probing connection or binds its own port."""
    source = (Path(REPO_ROOT) / path).read_text()
    assert "create_connection" not in source and "def free_port" not in source
