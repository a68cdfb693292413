"""Backends behind one interface (:class:`~g4v.engines.base.Engine`), and the choice between them."""

from g4v.engines.base import Engine, EngineInfo, Generation
from g4v.errors import G4VError

BACKENDS = ("auto", "hf")


def choose_backend(backend: str) -> str:
    """Resolve ``auto`` to a concrete backend name."""
    if backend not in BACKENDS:
        raise G4VError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    if backend == "auto":
        return "hf"
    return backend


def create_engine(backend: str = "auto", model: str | None = None, **options) -> Engine:
    """Load ``model`` (default: ``$G4V_MODEL`` or the bundled checkpoint) behind ``backend``."""
    from g4v.paths import default_model

    model = model or default_model()
    backend = choose_backend(backend)
    if backend == "hf":
        from g4v.engines.hf import TransformersEngine

        return TransformersEngine(model, device=options.get("device"), dtype=options.get("dtype"))
    raise G4VError(f"backend {backend!r} is not available")


__all__ = ["BACKENDS", "Engine", "EngineInfo", "Generation", "choose_backend", "create_engine"]
