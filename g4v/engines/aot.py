"""The decode step compiled ahead of time (``torch.export`` + AOTInductor), for ZeroGPU Spaces.

Why: on a ZeroGPU Space every request's GPU work runs in a short-lived process, and ``torch.compile``
at run time is refused there (each process would compile again). The ``spaces`` package compiles
ahead of time instead: a program exported once at start-up, compiled by AOTInductor, and called in
every request's process (Hugging Face's "ZeroGPU ahead-of-time compilation" guide; ``spaces`` 0.51's
``aoti_compile``). Elsewhere the loop uses ``torch.compile`` (CUDA graphs) or eager.

What is exported: :func:`g4v.engines.decode_loop.decode_step` for one shape, a batch of one (a
ZeroGPU Space answers one request per GPU call) reading the slots' first :data:`WINDOW` positions,
with the slot buffers as its inputs (the compiled program writes each new key and value into them
in place). The prefill stays eager: the 8 levels are injected there, once per request. A request
whose shape has no compiled step (a conversation past the window) is decoded eagerly.

    program = export_step(engine)            # on the engine's device
    compiled = spaces.aoti_compile(program)  # inside a spaces.GPU call at start-up
    install(engine, compiled)

:func:`compile_here` does the same without ``spaces`` (AOTInductor's own package), which is how the
tests check the path on a CPU.
"""

import torch

from g4v.engines.decode_loop import Variant, decode_step
from g4v.engines.slots import StepCache

#: Key positions the compiled step reads: room for a 1320-token picture and a conversation.
WINDOW = 4096
BATCH = 1


class _Step(torch.nn.Module):
    """The module torch.export traces: the model (a twin, see :mod:`g4v.engines.twins`) and one
    step shape's cache; the slot buffers come in as inputs."""

    def __init__(self, model: torch.nn.Module, cache: StepCache):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, ids, positions, mask, keys: list[torch.Tensor], values: list[torch.Tensor]):
        return decode_step(self.model, self.cache, ids, positions, mask, keys, values)


def variants(engine) -> list[Variant]:
    """The variants the engine's default requests run on: an image request's, and a text-only one's."""
    made = [engine.variant(None, image=True), engine.variant(None, image=False)]
    return list(dict.fromkeys(made))


def window_of(engine) -> int:
    return min(WINDOW, engine.context_window())


def export_step(engine, variant: Variant | None = None) -> torch.export.ExportedProgram:
    """``decode_step`` of ``variant`` (default: an image request's) for a batch of one over
    :data:`WINDOW` positions, exported with example inputs on the engine's device."""
    loop = engine._loop
    variant = variant or engine.variant(None, image=True)
    model, compilable = engine.weights(variant)
    if not compilable:
        raise ValueError(f"{variant} runs through PEFT's layers, which are not exported")
    window = window_of(engine)
    loop.slots.reserve(window)
    device = loop.slots.device
    ids = torch.zeros((BATCH, 1), dtype=torch.long, device=device)
    positions = torch.zeros(BATCH, dtype=torch.long, device=device)
    mask = torch.zeros((BATCH, 1, 1, window), dtype=torch.bool, device=device)
    mask[:, :, :, 0] = True
    step = _Step(model, StepCache(loop.slots.layers, BATCH, window))
    with torch.no_grad():
        return torch.export.export(step, (ids, positions, mask, loop.slots.keys, loop.slots.values), strict=False)


def install(engine, compiled, variant: Variant | None = None) -> None:
    """Use ``compiled`` (``compiled(ids, positions, mask, keys, values)``, as :func:`export_step`
    exported it) for ``variant``'s steps of that shape."""
    variant = variant or engine.variant(None, image=True)
    engine._loop.ahead[(variant, BATCH, window_of(engine))] = compiled


def installed(engine) -> list[tuple]:
    """The (variant, batch, window) shapes whose steps are compiled ahead of time."""
    return list(engine._loop.ahead) if engine._loop is not None else []


def compile_here(engine, folder, variant: Variant | None = None):
    """Export, compile with AOTInductor into ``folder`` and install one variant's step, without
    ``spaces``; returns the compiled step."""
    from pathlib import Path

    program = export_step(engine, variant)
    path = Path(folder) / "decode_step.pt2"
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    compiled = torch._inductor.aoti_load_package(str(path))
    install(engine, compiled, variant)
    return compiled


#: Seconds of GPU a Space may spend compiling at start-up (ZeroGPU's start-up allowance).
ZERO_GPU_SECONDS = 1500


def compile_on_zero_gpu(engine, spaces) -> str:
    """On a ZeroGPU Space: export and compile every default variant's step inside one start-up GPU
    call (``spaces.GPU``, ``spaces.aoti_compile``) and install them; one line saying what was done,
    or why the steps stay eager (a failure here never stops the app)."""
    import time

    from g4v.errors import first_line

    @spaces.GPU(duration=ZERO_GPU_SECONDS)
    def build():
        return [(variant, spaces.aoti_compile(export_step(engine, variant))) for variant in variants(engine)]

    began = time.monotonic()
    try:
        built = build()
    except Exception as err:  # noqa: BLE001 - the Space still answers, eagerly
        return f"decode step: eager (the ahead-of-time compile failed: {first_line(err)})"
    for variant, compiled in built:
        install(engine, compiled, variant)
    return f"decode step: compiled ahead of time for {len(built)} variant(s) in {time.monotonic() - began:.0f} s"
