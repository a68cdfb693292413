"""Where the app's inspector exports live: a bounded, self-cleaning temporary folder.

Exports without an ``out_dir`` (the app's) go to an :class:`ExportStore`: a server answering many
requests must not fill the temporary folder with one export (several MB with full tensors) each.
"""

import shutil
import tempfile
import threading
import weakref
from collections import deque
from pathlib import Path

from g4v.errors import G4VError

DEFAULT_KEEP = 8  # exports an ExportStore keeps unless told otherwise


class ExportStore:
    """A bounded home for exports: one temporary root folder, one subfolder per export, and only the
    newest ``keep`` of them on disk (each export's zip lives inside its own subfolder, so it goes
    with it). ``close()`` removes the root; so does interpreter exit, or garbage collection of the
    store, whichever comes first.

    The root is created inside ``parent`` (the system's temporary folder when None) and only the
    root is ever deleted, never ``parent``. Keep ``keep`` at least as large as the number of
    requests that may run at once, so no export is deleted while it is still being written.
    """

    def __init__(self, parent: str | Path | None = None, keep: int = DEFAULT_KEEP):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise G4VError(f"an export store must keep at least 1 export (a whole number), got {keep!r}")
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="g4v-inspect-", dir=parent))
        self.keep = keep
        self._folders: deque[Path] = deque()
        self._made = 0
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
            self._made += 1
            folder = self.root / f"inspect-{self._made:04d}"
            folder.mkdir()
            self._folders.append(folder)
            while len(self._folders) > self.keep:
                shutil.rmtree(self._folders.popleft(), ignore_errors=True)
            return folder

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
