"""The app's own temporary folder: one per server process, named with its process id, deleted at
exit; one left behind by a server that died (killed, crashed) is deleted when the next one starts.

Gradio's cache (``GRADIO_TEMP_DIR``, set by ``app.py`` before Gradio is imported) and the PDF
picker's rendered pages are folders inside it, so nothing of a visitor's outlives the app in a
shared ``/tmp/g4v-pages``. No Gradio import here: ``app.py`` needs this before Gradio loads.
"""

import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "g4v-app-"
_OWN = re.compile(re.escape(PREFIX) + r"(\d+)-")
_root: Path | None = None


def own_folder(name: str) -> Path:
    """``name`` inside this process's app folder (made on first use, stale ones removed then)."""
    global _root
    if _root is None or not _root.is_dir():
        remove_stale(Path(tempfile.gettempdir()))
        _root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, _root, ignore_errors=True)
    folder = _root / name
    folder.mkdir(exist_ok=True)
    return folder


def remove_stale(parent: Path) -> None:
    """Delete this user's app folders in ``parent`` whose process is gone."""
    for folder in parent.glob(PREFIX + "*"):
        named = _OWN.match(folder.name)
        try:
            if named and folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid() \
                    and not _alive(int(named[1])):
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # gone meanwhile, or not ours to read
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except PermissionError:  # another user's process: alive
        return True
    except (ProcessLookupError, OverflowError):  # gone, or a number no process can have
        return False
    return True


def remove_new_entries_at_exit(folder: Path) -> None:
    """For a cache folder given from outside (``GRADIO_TEMP_DIR`` set by the caller): at exit, delete
    what this process added to it (visitors' uploads included), and keep what was there before."""
    before = set(folder.iterdir()) if folder.is_dir() else set()

    def remove() -> None:
        for entry in folder.iterdir() if folder.is_dir() else ():
            if entry in before:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    atexit.register(remove)
