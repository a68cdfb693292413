"""Running a check under a memory limit: an allocation past the limit fails the check (MemoryError
from Python and numpy, RuntimeError from torch) instead of taking the machine with it."""

import resource
from contextlib import contextmanager

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
