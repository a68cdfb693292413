"""Running a check under a memory limit: an allocation past the limit fails the check (MemoryError
from Python and numpy, RuntimeError from torch) instead of taking the machine with it. And waiting
for room before a test that starts vLLM engines, so that two copies of the suite side by side take
turns instead of running the machine out of memory (:func:`room_for`)."""

import fcntl
import resource
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

MB = 1024 * 1024


def address_space() -> int:
    """The address space this process holds now, in bytes (``VmSize``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextmanager
def address_space_limit(headroom_mb: int):
    """The block runs with at most ``headroom_mb`` more address space than the process holds when it
    starts (``RLIMIT_AS``); the previous limit comes back afterwards, whatever happens."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = address_space() + headroom_mb * MB
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def available_gib() -> float:
    """Memory the kernel can still hand out without swapping (``MemAvailable``), in GiB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1024 * 1024)
    raise RuntimeError("no MemAvailable in /proc/meminfo")


@contextmanager
def room_for(gib: float, timeout: float = 900.0, poll: float = 2.0):
    """Run the block at once when ``gib`` GiB are available; otherwise first wait, one waiter at a
    time on the whole machine (a lock file in the temporary folder, held through the block), until
    they are or ``timeout`` seconds have passed.

    The block is a test's setup: the engines it starts take their memory there, so the next waiter
    sees what is left after them. Without the lock, waiters of two copies would all see the same
    free memory and start together. The timeout keeps two waiters that hold what the other waits
    for from waiting forever: past it, the block runs and may fail as it would have without this."""
    if available_gib() >= gib:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "g4v-tests-memory.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deadline = time.monotonic() + timeout
        while available_gib() < gib and time.monotonic() < deadline:
            time.sleep(poll)
        yield
