"""tests/memory.py's machine_slot: the places that the vLLM suite's workers of every copy of the suite
on the machine share (tests/vllm/conftest.py), checked with real lock files and a second process."""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from g4v.paths import REPO_ROOT
from tests.memory import machine_slot, total_gib

HOLD = """
import sys, time
from tests.memory import machine_slot
with machine_slot(sys.argv[1], 1) as index:
    print(index, flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_total_memory_is_read_from_the_kernel():
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    assert total_gib() == int(fields["MemTotal"].split()[0]) / 1024 ** 2 > 0


@pytest.fixture
def name(tmp_path):
    """A name of this test's own, its lock files removed afterwards."""
    yield f"test-{tmp_path.name}"
    for lock in Path(tempfile.gettempdir()).glob(f"g4v-test-{tmp_path.name}-*.lock"):
        lock.unlink()


def test_a_free_place_is_taken_at_once_and_the_next_one_after_it(name):
    with machine_slot(name, 2) as first, machine_slot(name, 2) as second:
        assert (first, second) == (0, 1)
    with machine_slot(name, 2) as again:
        assert again == 0  # let go at the end of the block


def test_with_every_place_held_by_another_process_it_waits_for_it(name):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, name, "1.5"], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    assert holder.stdout.readline().strip() == "0"
    start = time.monotonic()
    with machine_slot(name, 1, poll=0.05) as index:
        waited = time.monotonic() - start
    assert index == 0 and waited > 1.0  # the holder keeps its place 1.5 s after saying so
    assert holder.wait(10) == 0


def test_past_its_timeout_it_runs_without_a_place(name):
    with machine_slot(name, 1):
        start = time.monotonic()
        with machine_slot(name, 1, timeout=0.3, poll=0.05) as index:
            assert index is None and time.monotonic() - start >= 0.3
