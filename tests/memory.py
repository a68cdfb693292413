"""Running a check under a memory limit: an allocation past the limit fails the check (MemoryError
from Python and numpy, RuntimeError from torch) instead of taking the machine with it. And places
shared by every process on the machine, so that the vLLM suite's workers of two copies side by side
take turns instead of running it out of memory (:func:`machine_slot`)."""

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


def total_gib() -> float:
    """This machine's memory (``MemTotal``), in GiB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    raise RuntimeError("no MemTotal in /proc/meminfo")


@contextmanager
def machine_slot(name: str, slots: int, timeout: float = 3600.0, poll: float = 2.0):
    """Hold one of ``slots`` places that every process on the machine shares (a lock file per
    place in the temporary folder) for the block: with all of them held, wait until one is let go,
    or until ``timeout`` seconds have passed, then run anyway.

    A holder waits on nothing else while it holds its place, so the waiting always ends: unlike a
    check of free memory before each test, which a second copy of the suite failed (every worker
    held its engines and waited for the others' memory)."""
    folder = Path(tempfile.gettempdir())
    deadline = time.monotonic() + timeout
    while True:
        for index in range(slots):
            handle = open(folder / f"g4v-{name}-{index}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield index
            finally:
                handle.close()
            return
        if time.monotonic() >= deadline:
            yield None
            return
        time.sleep(poll)
