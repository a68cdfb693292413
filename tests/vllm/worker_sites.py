"""Run inside vLLM's worker (tests only): every capture point g4v names, against vLLM's own mapping
of transformers' module names (``hf_to_vllm_mapper``, the one vLLM loads the weights with).

``LLM.apply_model`` pickles this function by reference, so it lives in this importable module (the
worker processes share the test run's ``sys.path``), not in a test file.
"""


def transformers_path(name: str) -> str:
    """Where transformers' ``Granite4VisionForConditionalGeneration`` keeps capture point ``name``."""
    if name == "language_model":
        return "model.language_model"
    if name.startswith("layers."):
        return f"model.language_model.{name}"
    return f"model.{name}"


def resolved_sites(model) -> dict:
    """``{name: (vLLM's path for it, resolved to that very module?, the module's class name)}``."""
    from g4v.model.sites import site, site_names
    from g4v.port.worker import granite_model

    granite = granite_model(model)
    modules = dict(granite.named_modules())
    mapper = type(granite).hf_to_vllm_mapper
    found = {}
    for name in site_names(model):
        path = mapper.map_name(transformers_path(name) + ".").removesuffix(".")
        module = site(model, name)
        found[name] = (path, module is modules.get(path), type(module).__name__)
    return found
