"""The LoRA workbench side by side: pick an adapter, see the base and the adapter answer as they stream.

Plain functions (no Gradio) that the app's LoRA tab and the CLI call. An adapter name typed or
picked by a user always goes through :mod:`g4v.lora.folders` and :mod:`g4v.lora.checks`
(configured folders only, checked against the engine's model) before an engine loads it; a bad
adapter raises a one-line :class:`~g4v.errors.G4VError` and leaves the engine serving as before.

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
from g4v.lora.folders import adapter_base, adapter_dirs, folder_label, list_adapters, same_base


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


@dataclass(frozen=True)
class AdapterChoice:
    """One adapter as the LoRA tab offers it: which base it was made for, and whether that is the
    model being served (an adapter trained on another base loads, but answers gibberish)."""

    name: str  # what to pass as ``adapter=`` (its path under the adapter folder)
    base: str | None  # the config's base_model_name_or_path as written; None: it names none
    matches: bool  # made for the model being served

    @property
    def label(self) -> str:
        """``demo-lora (made for assets/granite4-vision-tiny)``, for a dropdown entry."""
        return f"{self.name} (made for {self.base})" if self.base else f"{self.name} (base not named)"


def describe_adapter(name: str, adapters_dir=None, model: str | None = None) -> AdapterChoice:
    """Which base ``name`` was made for, and whether it is ``model`` (None: no model to match)."""
    base = adapter_base(name, adapter_dirs(adapters_dir))
    return AdapterChoice(name=name, base=base, matches=model is not None and same_base(base, model))


def describe_adapters(adapters_dir=None, model: str | None = None) -> list[AdapterChoice]:
    """Every adapter in the adapter folders, those made for ``model`` first, each group by name."""
    found = [describe_adapter(name, adapters_dir, model) for name in list_adapters(adapter_dirs(adapters_dir))]
    return sorted(found, key=lambda choice: (not choice.matches, choice.name))


def base_warning(name: str | None, adapters_dir=None, model: str | None = None) -> str:
    """One line when adapter ``name`` names another base than ``model``: it loads and runs (the
    layer shapes match), but its answers likely mean nothing. Empty when it was made for ``model``,
    names no base, or cannot be found (using it then says why)."""
    if not name or model is None:
        return ""
    choice = describe_adapter(name, adapters_dir, model)
    if choice.matches or choice.base is None:
        return ""
    return f"warning: adapter {name} was made for {choice.base}, not for the model in use; its answers are likely meaningless"


def adapter_choices(adapters_dir=None, model: str | None = None) -> list[str]:
    """Adapter names for a dropdown, those made for ``model`` first (no model: by name)."""
    return [choice.name for choice in describe_adapters(adapters_dir, model)]


def preselected_adapter(adapters_dir=None, model: str | None = None) -> str | None:
    """The adapter a dropdown should start on: the first one made for ``model``, else none
    (preselecting an adapter made for another base would show gibberish as its first answer)."""
    return next((choice.name for choice in describe_adapters(adapters_dir, model) if choice.matches), None)


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


def adapter_folder_help(adapters_dir=None) -> str:
    """One line for the tab: where adapters are looked up."""
    return "Adapters are read from: " + ", ".join(folder_label(d) for d in adapter_dirs(adapters_dir))
