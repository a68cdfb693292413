"""Faults planted inside vLLM's worker, to prove the port inspector catches them (tests only).

``LLM.apply_model`` pickles these functions by reference, so they live in this importable module
(the worker processes share the test run's ``sys.path``), not in a test file.
"""

import torch


def plant_scaled_level(model, index: int, factor: float) -> None:
    """From now on ``embed_multimodal`` returns level ``index`` times ``factor``, for the probe and
    for real requests alike."""
    from g4v.port.worker import granite_model

    model = granite_model(model)
    hidden = model.config.text_config.hidden_size
    honest = type(model).embed_multimodal.__get__(model)

    def faulty(**kwargs):
        packed = []
        for features in honest(**kwargs):
            levels = list(features.split(hidden, dim=-1))
            levels[index] = levels[index] * factor
            packed.append(torch.cat(levels, dim=-1))
        return packed

    model.embed_multimodal = faulty  # an instance attribute shadows the method


def remove_planted_fault(model) -> None:
    from g4v.port.worker import granite_model

    granite_model(model).__dict__.pop("embed_multimodal", None)
