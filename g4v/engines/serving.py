"""Waiting for a server process to serve: the one loop the tests' app fixture and the start-up
benchmark share (``tests/conftest.py``'s ``running_app``, ``scripts/bench_startup.py``), and the
free port they start it on. Standard library only, so it costs a caller nothing to import."""

import socket
import subprocess
import time

from g4v.errors import G4VError

HOST = "127.0.0.1"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the system picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_until_serving(port: int, timeout: float, process: subprocess.Popen | None = None,
                       interval: float = 0.1) -> float:
    """Seconds until something accepts connections on 127.0.0.1:``port``. One :class:`G4VError`
    line when ``process`` (the server, if given) exits first, or after ``timeout`` seconds."""
    start = time.monotonic()
    while True:
        if process is not None and process.poll() is not None:
            raise G4VError(f"the server exited with code {process.returncode} before serving")
        try:
            with socket.create_connection((HOST, port), timeout=min(1.0, max(interval, 0.05))):
                return time.monotonic() - start
        except OSError:
            if time.monotonic() - start > timeout:
                raise G4VError(f"the server did not serve on port {port} within {timeout:g} s") from None
            time.sleep(interval)
