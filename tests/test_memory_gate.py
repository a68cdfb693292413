"""tests/memory.py's room_for: the wait a test of the vllm tier makes before its setup when memory is
short (two copies of the suite side by side), checked against /proc/meminfo and a real lock file."""

import fcntl
import tempfile
import threading
import time
from pathlib import Path

from tests.memory import available_gib, room_for


def test_available_memory_is_read_from_the_kernel():
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    total_gib = int(fields["MemTotal"].split()[0]) / 1024 ** 2
    assert 0 < available_gib() <= total_gib


def test_with_room_the_block_runs_at_once():
    start = time.monotonic()
    with room_for(0.001, timeout=30):
        pass
    assert time.monotonic() - start < 1


def test_without_room_it_waits_its_timeout_then_runs_the_block():
    ran = []
    start = time.monotonic()
    with room_for(available_gib() * 1000, timeout=0.5, poll=0.05):
        ran.append(time.monotonic() - start)
    assert ran and ran[0] >= 0.5


def test_waiters_take_turns_on_the_machine_wide_lock():
    """A second waiter (here: a lock taken by hand, as another copy's waiter would hold it) keeps
    this one out of its block until it lets go, even past this one's own timeout."""
    entered = threading.Event()

    def waiter():
        with room_for(available_gib() * 1000, timeout=0.1, poll=0.05):
            entered.set()

    with open(Path(tempfile.gettempdir()) / "g4v-tests-memory.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        thread = threading.Thread(target=waiter)
        thread.start()
        assert not entered.wait(1.0)
        fcntl.flock(held, fcntl.LOCK_UN)
    assert entered.wait(5.0)
    thread.join()
