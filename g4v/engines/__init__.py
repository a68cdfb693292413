"""Backends behind one interface (:class:`~g4v.engines.base.Engine`), and the choice between them.

* ``hf``: transformers in this process, the reference every other backend is checked against.
* ``vllm``: vLLM in this process (its own ``granite4_vision`` model, continuous batching).
* ``openai``: an OpenAI-compatible server, such as ``vllm serve``, at ``base_url``.
* ``auto``: vLLM when it is installed and a GPU is present (where it is much faster), else
  transformers. vLLM's CPU build is only taken when asked for by name: on a CPU it needs its own
  environment and settings (``scripts/setup_vllm_cpu_env.sh``).
"""

import importlib.util
import os
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from g4v.engines.base import Engine, EngineInfo, Generation, gpu_present
from g4v.errors import G4VError

if TYPE_CHECKING:
    from g4v.engines.deferred import DeferredEngine

BACKENDS = ("auto", "hf", "vllm", "openai")


def vllm_installed() -> bool:
    """True when the real vLLM package imports here. A folder named ``vllm`` without
    ``__init__.py`` on the path (such as ``tests/vllm`` under pytest) is a namespace package,
    not vLLM, and does not count."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin not in (None, "namespace")


#: Where ``scripts/setup_vllm_cpu_env.sh`` builds vLLM's CPU environment.
VLLM_ENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> Path | None:
    """A Python interpreter that has vLLM, for work that runs vLLM in a process of its own (the port
    inspector, a local OpenAI-compatible server): ``$G4V_VLLM_PYTHON``, else this interpreter when
    vLLM imports here, else the project's vLLM CPU environment; None when there is none."""
    if os.environ.get("G4V_VLLM_PYTHON"):
        chosen = Path(os.environ["G4V_VLLM_PYTHON"]).expanduser()
        return chosen if chosen.is_file() else None
    if vllm_installed():
        return Path(sys.executable)
    return VLLM_ENV_PYTHON if VLLM_ENV_PYTHON.is_file() else None


def choose_backend(backend: str) -> str:
    """Resolve ``auto`` to a concrete backend name."""
    if backend not in BACKENDS:
        raise G4VError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    if backend == "auto":
        return "vllm" if vllm_installed() and gpu_present() else "hf"
    return backend


def describe_choice(requested: str, chosen: str) -> str:
    """One line saying which backend runs, and why when ``auto`` chose it."""
    if requested != "auto":
        return f"backend: {chosen}"
    if chosen == "vllm":
        return "backend: vllm (auto: vLLM is installed and a GPU is present)"
    reason = "no GPU" if vllm_installed() else "vLLM is not installed"
    return f"backend: hf (auto: {reason}; transformers)"


def create_engine(backend: str = "auto", model: str | None = None, defer: bool = False,
                  **options) -> "Engine | DeferredEngine":
    """Load ``model`` (default: ``$G4V_MODEL`` or the bundled checkpoint) behind ``backend``.

    ``defer``: for the transformers engine, check the model and describe it now, and load it when
    it is first used (a :class:`~g4v.engines.deferred.DeferredEngine`; the app serves its page
    meanwhile). The other backends start their worker processes or reach their server now, and
    an int8 engine (``quant``) loads now too (what it quantized is known only once it has).

    ``options``: ``device``/``dtype`` (hf), ``decode`` (hf: a :class:`~g4v.engines.decode_settings.DecodeSettings`),
    ``inline`` (hf: the decode loop in each request's thread, for ZeroGPU), ``vllm`` (a :class:`~g4v.engines.vllm_settings.VLLMSettings`),
    ``base_url``/``api_key`` (openai; there ``model`` is the served model name, default the
    server's first), ``vision_lora`` (hf, vllm: the mode of a checkpoint's vision LoRA), ``quant`` / ``quant_vision`` (hf:
    int8 weights, :mod:`g4v.model.precision`). The engine's ``info.details["auto"]`` records whether ``auto`` chose it.
    """
    from g4v.paths import default_model

    chosen = choose_backend(backend)
    details = {"auto": backend == "auto", "choice": describe_choice(backend, chosen)}
    loading = {key: options.get(key) for key in ("device", "dtype", "vision_lora")}  # the transformers engine's
    decoding = {"decode": options.get("decode"), "inline": bool(options.get("inline"))}
    if defer and chosen == "hf" and not options.get("quant"):
        from g4v.engines.deferred import defer_transformers

        return defer_transformers(model or default_model(), details, **decoding, **loading)
    if chosen == "openai":
        from g4v.engines.remote import RemoteEngine

        engine = RemoteEngine(options.get("base_url"), model=model, api_key=options.get("api_key"))
    elif chosen == "vllm":
        from g4v.engines.vllm_engine import VLLMEngine
        from g4v.engines.vllm_settings import VLLMSettings

        if not vllm_installed():
            raise G4VError("the vllm backend needs vLLM: pip install -r requirements-vllm.txt (GPU), "
                           "or scripts/setup_vllm_cpu_env.sh for the CPU build")
        settings = options.get("vllm") or VLLMSettings()
        if options.get("dtype") not in (None, "auto") and settings.dtype is None:
            settings.dtype = options["dtype"]
        engine = VLLMEngine(model or default_model(), settings, vision_lora=options.get("vision_lora"))
    else:
        from g4v.engines.hf import TransformersEngine

        engine = TransformersEngine(model or default_model(), **loading, **decoding, quant=options.get("quant"),
                                    quant_vision=options.get("quant_vision", True))
    engine.info.details.update(details)
    return engine


__all__ = ["BACKENDS", "Engine", "EngineInfo", "Generation", "choose_backend", "create_engine", "describe_choice",
           "vllm_python"]
