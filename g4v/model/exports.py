"""Where the app's exports live (Deepstack, Attribution, and every visitor's stores in
``webapp.sessions``, Evaluate's runs among them): a bounded, self-cleaning temporary folder.

Exports without an ``out_dir`` (the app's) go to an :class:`ExportStore`: a server answering many
requests must not fill the temporary folder with one export (several MB with full tensors) each.
A web server serves whatever lies under its cache by path, so every folder name carries 128 random
bits (``secrets``): knowing one export's address tells nothing about another's.

:func:`draw_in_turn` draws an export's pictures one by one, each told to the progress bar.
"""

import os
import secrets
import shutil
import tempfile
import threading
import weakref
from collections import Counter, deque
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from g4v.errors import G4VError

DEFAULT_KEEP = 8  # exports an ExportStore keeps unless told otherwise
NAME_BYTES = 16  # random bytes in every folder name: 128 bits, not guessable


def unguessable_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(NAME_BYTES)}"


class ExportStore:
    """A bounded home for exports: one temporary root folder, one subfolder per export, and only the
    newest ``keep`` of them on disk (each export's zip lives inside its own subfolder, so it goes
    with it). ``close()`` removes the root; so does interpreter exit, or garbage collection of the
    store, whichever comes first.

    The root is created inside ``parent`` (the system's temporary folder when None) and only the
    root is ever deleted, never ``parent``. A folder in use (:meth:`lease`, e.g. a running
    evaluation's dataset) is never pruned; the store then holds more than ``keep`` for a while.
    Keep ``keep`` at least as large as the number of requests that may run at once, so no export
    is deleted while it is still being written.
    """

    def __init__(self, parent: str | Path | None = None, keep: int = DEFAULT_KEEP, prefix: str = "inspect"):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise G4VError(f"an export store must keep at least 1 export (a whole number), got {keep!r}")
        parent = Path(parent if parent is not None else tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.root = parent / unguessable_name(f"g4v-{prefix}")
        self.root.mkdir(mode=0o700)
        self.keep, self.prefix = keep, prefix
        self._folders: deque[Path] = deque()
        self._leases: Counter[Path] = Counter()
        self._lock = threading.Lock()
        # A finalizer rather than __del__: it also runs at interpreter exit (atexit), and only once.
        self._remove_root = weakref.finalize(self, shutil.rmtree, str(self.root), ignore_errors=True)

    @property
    def closed(self) -> bool:
        return not self._remove_root.alive

    def new_folder(self) -> Path:
        """A new, empty subfolder for one export; the oldest beyond ``keep`` are deleted."""
        with self._lock:
            if self.closed:
                raise G4VError("the export store is closed")
            folder = self.root / unguessable_name(self.prefix)
            folder.mkdir()
            self._folders.append(folder)
            self._prune()
            return folder

    def _prune(self) -> None:
        """Delete the oldest folders beyond ``keep``, skipping those leased and the newest (the
        lock is held)."""
        excess = len(self._folders) - self.keep
        for folder in [f for f in list(self._folders)[:-1] if not self._leases[f]][:max(excess, 0)]:
            self._folders.remove(folder)
            shutil.rmtree(folder, ignore_errors=True)

    def folder_of(self, path: str | Path) -> Path | None:
        """This store's folder holding ``path`` (or being it), or None."""
        path = Path(path)
        with self._lock:
            return next((f for f in self._folders if path == f or f in path.parents), None)

    @contextmanager
    def lease(self, path: str | Path):
        """Keep the folder holding ``path`` from being pruned while the block runs (a path outside
        the store leases nothing)."""
        folder = self.folder_of(path)
        with self._lock:
            if folder is not None:
                self._leases[folder] += 1
        try:
            yield folder
        finally:
            with self._lock:
                if folder is not None:
                    self._leases[folder] -= 1
                    self._prune()

    def leased(self) -> bool:
        with self._lock:
            return any(count > 0 for count in self._leases.values())

    def size(self) -> int:
        """Bytes of every file in the store."""
        total = 0
        for top, _, names in os.walk(self.root):
            for name in names:
                try:
                    total += os.lstat(os.path.join(top, name)).st_size
                except OSError:
                    pass
        return total

    def close(self) -> None:
        """Delete the root folder and every export in it (later calls do nothing)."""
        with self._lock:
            self._remove_root()
            self._folders.clear()


_default_store: ExportStore | None = None
_default_store_lock = threading.Lock()


def default_export_store() -> ExportStore:
    """The process's own store, for callers that pass neither ``out_dir`` nor ``exports``."""
    global _default_store
    with _default_store_lock:
        if _default_store is None or _default_store.closed:
            _default_store = ExportStore()
        return _default_store


def draw_in_turn(drawings: dict[str, Callable[[], object]], steps: dict[str, tuple[float, str]],
                 start: float, end: float, tell: Callable[[float, str], None]) -> dict[str, object]:
    """An export's pictures, each of ``drawings`` (name -> draw) drawn in turn, with
    ``tell(fraction, "drawing <what>")`` before each: they take most of a run on a small model,
    and one "drawing" stage looked stuck. ``steps`` maps a name to its share of the bar from
    ``start`` to ``end`` (its time there, measured) and to what the line calls it; the shares of
    the pictures drawn fill that stretch."""
    total = sum(steps[name][0] for name in drawings)
    figures, at = {}, start
    for name, draw in drawings.items():
        share, what = steps[name]
        tell(at, f"drawing {what}")
        figures[name] = draw()
        at += (end - start) * share / total
    return figures
