"""Adapter activation: check a user's adapter against the engine's model and register it with the
engine. Every engine user of an adapter comes through here (the LoRA tab, ``chat --adapter``,
``lora-diff``, Evaluate's arms), so the checks hold everywhere.
"""

from g4v.loading import engine_config
from g4v.lora.checks import AdapterSpec, load_adapter_spec
from g4v.lora.folders import adapter_dirs


def activate_adapter(engine, choice: str, adapters_dir=None) -> AdapterSpec:
    """Resolve and check ``choice`` against the engine's model, and register it with the engine
    if it is new. Returns the checked adapter; ``spec.name`` is what to pass as ``adapter=``."""
    spec = load_adapter_spec(choice, engine_config(engine), adapter_dirs(adapters_dir))
    if spec.name not in engine.adapters():
        engine.register_adapter(spec.name, str(spec.path))
    return spec
