"""Shared fixtures: one loaded engine per test session, example images, output folder."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

# Before torch loads (libgomp reads it once): OpenMP threads that wait for work sleep instead of
# spinning. With spinning, two test processes on a 2-core machine (a second suite, an app server,
# a vLLM worker) steal each other's cores at every parallel region: one generation ran 5-8x slower
# under load (scripts/bench_threads.py). Results are unchanged: only how idle threads wait differs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Under pytest-xdist (``make test-fast`` runs its tier on every core) each worker gets its share of
# the cores, not all of them: N workers each running torch on every core would oversubscribe them.
# Processes a test starts (the CLI, a server) inherit the share.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's CPU worker binds its OpenMP threads, its main thread included, to cores it picks itself:
# with two cores, every engine takes core 0. Two workers that start vLLM engines (the vLLM suite,
# the Port and Evaluate tests of the serial tier) would queue all of them on core 0 (the vLLM suite
# ran 1.9x slower per test, at 144 % of the two cores). Each worker's engines and servers take a
# core of their own instead (gw0 core 0, gw1 core 1): one thread per engine either way, so the
# numbers are the same. A test that needs more (tests/vllm/test_tensor_parallel.py) sets its own.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                          str(int(os.environ["PYTEST_XDIST_WORKER"][2:]) % (os.cpu_count() or 1)))

import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from g4v.engines.serving import free_port, wait_until_serving  # noqa: E402,F401 (tests import free_port from here)
from g4v.errors import G4VError  # noqa: E402
from g4v.paths import BUNDLED_MODEL_DIR, REPO_ROOT  # noqa: E402

#: The test tiers. ``make test-fast`` (the edit loop) deselects every tier below; ``make test`` runs
#: them all. A module is put in a tier here, once, rather than marked in each file; so is a fixture
#: whose tests are in a tier wherever they live (:data:`FIXTURE_TIERS`).
TIERS = {
    "browser": "drives Chromium against a served app",
    "server": "starts the app (or another server) as a process",
    "training": "trains, or scores a checkpoint on many items",
    "vllm": "needs the vLLM CPU environment",
}
MODULE_TIERS = {
    "test_browser": "browser", "test_browser_ux": "browser", "test_attribution_browser": "browser",
    "test_evaluate_app": "browser", "test_lora_browser": "browser", "test_evaluate_budget_browser": "browser",
    "test_circuits_browser": "browser",
    "test_app": "server", "test_app_bad_input": "server", "test_app_exports": "server",
    "test_app_load": "server", "test_app_tabs": "server", "test_attribution_app": "server",
    "test_spaces": "server", "test_mcp": "server",
    "test_demo_training": "training", "test_demo_documents": "training", "test_documents_checkpoint": "training",
    "test_checkpoint": "training", "test_attribution_pointing": "training", "test_adapter_init": "training",
    "test_training_monitor": "training", "test_training_browser": "browser",
    "test_evaluate_vllm": "vllm", "test_port_diff_cli": "vllm", "test_browser_documents_ux": "browser",
    "test_evaluate_equivalence_browser": "browser", "test_browser_markup": "browser", "test_browser_walk": "browser",
}
#: Fixtures that put a test in a tier wherever it lives: a served app, or a page driven in Chromium.
FIXTURE_TIERS = {"app_url": "server", "picker": "browser", "tabs_url": "browser"}


def pytest_configure(config):
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what} (deselected by make test-fast)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        tier = MODULE_TIERS.get(module)
        if item.path.parent.name == "vllm":
            tier = "vllm"
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in FIXTURE_TIERS:
                item.add_marker(getattr(pytest.mark, FIXTURE_TIERS[fixture]))


TEST_OUTPUT = Path(__file__).resolve().parent.parent / "test-output"


def once_per_run(tmp_path_factory, name: str, compute: Callable[[Path], dict]) -> dict:
    """``compute(scratch)`` once for the whole run, however many pytest-xdist workers ask.

    A module fixture runs in every worker that draws one of the module's tests; for the few that
    take minutes (the GPU check's CPU smoke, the pip resolves) that is minutes of the two cores
    spent twice. The first worker computes under a file lock in the run's shared temporary folder
    and leaves the result there as JSON; the others wait on the lock and read it (the pattern
    pytest-xdist documents for session fixtures). A compute that raises leaves no result, so the
    next worker tries again and fails the same way. The result must survive JSON: tuples come
    back as lists."""
    from filelock import FileLock

    scratch = tmp_path_factory.mktemp(name)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute(scratch)
    shared = tmp_path_factory.getbasetemp().parent
    result = shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not result.is_file():
            result.write_text(json.dumps(compute(scratch)))
        return json.loads(result.read_text())


@pytest.fixture(scope="session")
def hf_engine():
    """The transformers engine on the bundled checkpoint, loaded once for the whole session."""
    from g4v.engines.hf import TransformersEngine

    return TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where tests leave artefacts people may want to look at (screenshots, PNGs)."""
    TEST_OUTPUT.mkdir(exist_ok=True)
    return TEST_OUTPUT


def make_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """A deterministic picture: a coloured square on a gradient, so every tile has content."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], axis=-1)
    noise = rng.integers(0, 32, size=base.shape)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def wait_until_loaded(log: Path, process, timeout: float) -> None:
    """Until the app's model is in memory: app.py serves its page first and says, with its address,
    whether a load follows ("* Loading the model"), then "* Model loaded". Tests of a served app
    start on a loaded model, so no request meets the "still loading" toast (tests/test_deferred_engine.py
    tests that toast)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        text = log.read_text(errors="replace")
        if "* Running on local URL" in text and ("* Loading the model" not in text or "* Model loaded" in text):
            return
        time.sleep(0.2)
    raise RuntimeError(f"app.py did not load its model (exit code {process.poll()}); see {log}")


@contextmanager
def running_app(*args: str, env: dict | None = None, timeout: float = 240, app_file: str = "app.py"):
    """Start ``python app.py ARGS`` on a free port as a user would; yield its URL; stop it after.

    The port comes through ``GRADIO_SERVER_PORT``, as on Spaces, so ``app_file`` runs unchanged."""
    port = free_port()
    TEST_OUTPUT.mkdir(exist_ok=True)
    log = open(TEST_OUTPUT / f"app-{port}.log", "w")
    process = subprocess.Popen(
        [sys.executable, app_file, *args], cwd=REPO_ROOT,
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GRADIO_SERVER_PORT": str(port), **(env or {})},
    )
    try:
        try:
            wait_until_serving(port, timeout, process, interval=1)
        except G4VError as err:
            raise RuntimeError(f"app.py: {err}; see {log.name}") from None
        wait_until_loaded(Path(log.name), process, timeout)
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="session")
def app_url():
    """One app on the random-weight bundled checkpoint (the one ``hf_engine`` loads, so answers can be
    compared), shared by the API, browser and load tests."""
    with running_app("--model", str(BUNDLED_MODEL_DIR)) as url:
        yield url
