"""The LoRA workbench side by side: pick an adapter, see the base and the adapter answer as they stream.

Plain functions (no Gradio) that the app's LoRA tab and the CLI call. An adapter name typed or
picked by a user always goes through :mod:`g4v.lora.activation` (configured folders only, checked
against the engine's model) before an engine loads it; a bad adapter raises a one-line
:class:`~g4v.errors.G4VError` and leaves the engine serving as before. The tabs' adapter lists are
:mod:`g4v.lora.choices`.

Side by side works on any engine with adapters: the transformers engine runs both requests on its
one loaded model (adapter disabled, then enabled), vLLM with a per-request LoRA. Both requests get
the same settings, seed included, so each column equals a separate run of the same request.
"""

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from g4v.conversation import Message, SamplingSettings, validate_conversation
from g4v.errors import G4VError
from g4v.images import open_image
from g4v.engines.base import WITHOUT_VISION_LORA
from g4v.lora.models import DEFAULT_LEFT, DEFAULT_RIGHT, resolve_sides


@dataclass
class SideBySide:
    """Both answers so far."""

    base: str = ""
    adapter: str = ""
    base_done: bool = False
    adapter_done: bool = False


def stream_side_by_side(
    engine,
    messages: list[Message],
    settings: SamplingSettings,
    adapter: str | None,
    cancel: threading.Event | None = None,
    concurrent: bool = False,
    left: str | None = None,
) -> Iterator[SideBySide]:
    """Stream the base answer, then the adapter answer; yields the updated pair after each piece.
    ``left`` and ``adapter`` are the two requests' ``adapter=`` values (``g4v.lora.models``: the
    ``base`` column is the left one, ``adapter`` the right one; by default the model Chat runs
    against the adapter).

    ``concurrent=True`` runs both requests at once, so a batching backend (vLLM) serves them
    together. It is off by default because vLLM's CPU build (0.32) gives a wrong base answer when
    that request shares a batch with a LoRA request while more than one adapter is loaded (seen
    here); one after the other, each column equals a separate run on every engine. Bad input
    raises here, before anything streams. Closing the iterator or setting ``cancel`` stops both.
    """
    cancel = cancel or threading.Event()
    if adapter not in (None, WITHOUT_VISION_LORA, *engine.adapters()):
        raise G4VError(f"unknown adapter {adapter!r}")
    base = engine.stream(messages, settings, cancel=cancel, adapter=left)  # validates the input now

    def adapter_stream():  # submitted only when its turn comes, and not at all after a cancel
        return iter(()) if cancel.is_set() else engine.stream(messages, settings, cancel=cancel, adapter=adapter)

    if concurrent:
        groups = [[("base", lambda: base)], [("adapter", adapter_stream)]]
    else:
        groups = [[("base", lambda: base), ("adapter", adapter_stream)]]
    return _merge_streams(groups, cancel)


_DONE = object()


def _merge_streams(groups: list[list], cancel: threading.Event) -> Iterator[SideBySide]:
    """Run each group of ``(side, make_stream)`` on its own thread, in order within a group, and
    yield the combined state after every piece."""
    pieces: queue.Queue = queue.Queue()

    def pump(group):
        for side, make_stream in group:
            try:  # a cancelled stream still runs briefly: that is how it ends its request
                for piece in make_stream():
                    pieces.put((side, piece))
            except BaseException as err:  # re-raised in the consumer's thread
                pieces.put((side, err))
            finally:
                pieces.put((side, _DONE))

    workers = [threading.Thread(target=pump, args=(group,), daemon=True, name="g4v-lora-side-by-side") for group in groups]
    for worker in workers:
        worker.start()
    state, running = SideBySide(), {side for group in groups for side, _ in group}
    try:
        while running:
            side, piece = pieces.get()
            if piece is _DONE:
                running.discard(side)
                setattr(state, f"{side}_done", True)
            elif isinstance(piece, BaseException):
                raise piece
            else:
                setattr(state, side, getattr(state, side) + piece)
            yield SideBySide(**vars(state))
    finally:
        cancel.set()
        for worker in workers:
            worker.join()


# ── what the app's LoRA tab calls ──────────────────────────────────────────────────────────────


def chat_input(prompt: str, images=()) -> list[Message]:
    """One user turn from the tab's prompt box and images (PIL images or paths)."""
    messages = [Message("user", prompt or "", [open_image(image) for image in images or ()])]
    validate_conversation(messages)
    return messages


def lora_side_by_side(
    engine,
    adapter: str,
    prompt: str,
    images=(),
    settings: SamplingSettings | None = None,
    adapters_dir=None,
    cancel: threading.Event | None = None,
    left: str = DEFAULT_LEFT,
    right: str = DEFAULT_RIGHT,
) -> Iterator[tuple[str, str]]:
    """For the LoRA tab: yields ``(left_text, right_text)`` as both answers stream; ``left`` and
    ``right`` name models (``g4v.lora.models``: base, vision or adapter)."""
    messages = chat_input(prompt, images)
    settings = (settings or SamplingSettings()).validated()
    first, second = resolve_sides(engine, left, right, adapter, adapters_dir)
    for pair in stream_side_by_side(engine, messages, settings, second.adapter, cancel, left=first.adapter):
        yield pair.base, pair.adapter
