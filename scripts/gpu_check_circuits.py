"""The GPU check's circuits step (listed in ``gpu_check_steps.panel_steps``): attention over image
tokens, attention knockout and two-picture patching per level, through the library functions the
CLI calls (:mod:`g4v.circuits`), at the real geometry (1320 image tokens, 40 layers)."""

from __future__ import annotations

import time

import torch

from g4v.circuits.common import CircuitSettings
from gpu_check_model import PROMPT, noise_picture, synchronize

#: What the step patches: on the GPU every level both ways with 8 new tokens per run (20 runs); the
#: smoke run, whose timings mean nothing, one level one way without continuations (4 runs).
PATCHING = {"gpu": CircuitSettings(max_new_tokens=8),
            "smoke": CircuitSettings(levels="deepstack0", direction="a_from_b", max_new_tokens=0)}


def step_circuits(check) -> dict:
    """Times the three circuits views on the check's picture (and, for patching, a second noise
    picture of the same size, so the same token layout): attention of the last prompt token at all
    40 layers (one eager pass), the knockout of a window of 1 around every injection layer, and
    patching (:data:`PATCHING`) with the all-levels bound. Patching every level from B must give
    B's own next-token distribution: the largest log-probability difference between the bound and
    B's recorded run is reported (0 up to the device's float rounding)."""
    from g4v.circuits.attention import image_attention
    from g4v.circuits.knockout import attention_knockout
    from g4v.circuits.patching import patch_levels

    engine = check.engine
    height, width = check.sizes.image_hw
    picture_a, picture_b = noise_picture(height, width, seed=0), noise_picture(height, width, seed=1)
    settings = PATCHING["smoke" if check.smoke else "gpu"]
    seconds = {}

    def timed(name, work):
        synchronize(check.device)
        start = time.perf_counter()
        result = work()
        synchronize(check.device)
        seconds[name] = time.perf_counter() - start
        return result

    attention = timed("attention", lambda: image_attention(engine, picture_a, PROMPT, CircuitSettings()))
    knockout = timed("knockout", lambda: attention_knockout(engine, picture_a, PROMPT,
                                                             CircuitSettings(window=1, max_new_tokens=settings.max_new_tokens)))
    patching = timed("patching", lambda: patch_levels(engine, picture_a, picture_b, PROMPT, settings))
    own_b, bound = patching.directions[0].donor_logprobs, patching.directions[0].all_levels.logprobs
    finite = torch.isfinite(own_b) & torch.isfinite(bound)
    return {"image_tokens": len(attention.image_positions), "layers": len(attention.layers),
            "attention_s": seconds["attention"], "knockout_s": seconds["knockout"], "patching_s": seconds["patching"],
            "circuits_s": sum(seconds.values()), "knockout_layers": len(knockout.layers),
            "patching_runs": 2 + sum(len(d.levels) + 1 for d in patching.directions), "new_tokens": settings.max_new_tokens,
            "image_share_max": float(attention.image_share.max()),
            "bound_vs_donor_max_abs": float((bound - own_b)[finite].abs().max())}
