"""Each visitor's files apart: one set of bounded stores per Gradio session, bounded in total.

Gradio serves any file under its cache folder to whoever names its path, so what one visitor
uploads, opens or exports must not lie where another can find it, nor be pushed out by another's
work. Every session (``gr.Request.session_hash``; a request without one is a session of its own)
gets its own folder with a random name, and in it one :class:`~g4v.model.exports.ExportStore`
per kind of file (Deepstack and Attribution exports, uploaded datasets, run folders, export zips
and opened samples), each keeping its own newest few. A session's folder goes when its page is
closed (``demo.unload``), after :data:`IDLE_SECONDS` without a request, or, oldest first, when
more than ``max_sessions`` sessions or ``max_session_bytes`` bytes (:mod:`g4v.settings.limits`) are kept; never while one of its
requests runs (:meth:`SessionStores.using`).
"""

import secrets
import shutil
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

from g4v.model.exports import ExportStore, unguessable_name
from g4v.settings.limits import limits

#: Seconds a session's files outlive its last request (Gradio's cache age, see webapp.layout); how
#: many sessions are kept, and how many bytes of them, are limits (the least recently used goes first).
IDLE_SECONDS = 3600
#: Seconds between two measurements of the bytes kept (a walk over every session's files).
MEASURE_SECONDS = 5.0
#: Random bytes of the key given to a request that came without a session.
NAME_TOKEN = 16


class Session:
    """One visitor's stores (``stores[kind]``) in one folder of their own."""

    def __init__(self, parent: Path, keeps: dict[str, int]):
        self.root = parent / unguessable_name("g4v-session")
        self.root.mkdir(mode=0o700)
        self.stores = {kind: ExportStore(self.root, keep=keep, prefix=kind) for kind, keep in keeps.items()}
        self.used = time.monotonic()
        self.busy = 0  # requests of this session running now
        self.ending = False  # its page was closed while a request ran: removed when that ends
        self.notes: dict = {}  # what the tabs remember for this visitor between events
        self._remove_root = weakref.finalize(self, shutil.rmtree, str(self.root), ignore_errors=True)  # at exit too

    def in_use(self) -> bool:
        return self.busy > 0 or any(store.leased() for store in self.stores.values())

    def size(self) -> int:
        return sum(store.size() for store in self.stores.values())

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self._remove_root()


class SessionStores:
    """The sessions' stores under ``parent``; ``keeps`` gives each kind of store its bound."""

    def __init__(self, parent, keeps: dict[str, int], max_sessions: int | None = None,
                 max_bytes: int | None = None, idle_seconds: float = IDLE_SECONDS):
        self.parent, self.keeps = Path(parent), dict(keeps)
        self.max_sessions = limits().max_sessions if max_sessions is None else max_sessions
        self.max_bytes = limits().max_session_bytes if max_bytes is None else max_bytes
        self.idle_seconds = idle_seconds
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._measured = 0.0

    @contextmanager
    def using(self, key: str | None):
        """The session ``key`` (a new one when None), kept from removal while the block runs."""
        key = key or secrets.token_hex(NAME_TOKEN)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                session = self._sessions[key] = Session(self.parent, self.keeps)
            session.busy += 1
            session.used = time.monotonic()
            self._prune(keep=session)
        try:
            yield session
        finally:
            with self._lock:
                session.busy -= 1
                session.used = time.monotonic()
                if session.ending and not session.in_use():
                    self._remove(key)

    def end(self, key: str | None) -> None:
        """The session's page was closed: remove its files (once its running requests end)."""
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return
            if session.in_use():
                session.ending = True
            else:
                self._remove(key)

    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _remove(self, key: str) -> None:
        self._sessions.pop(key).close()

    def _prune(self, keep: Session) -> None:
        """Remove idle sessions, then the least recently used beyond the bounds (the lock is held).
        Sessions with a request running, and ``keep`` (the one asking), stay."""
        now = time.monotonic()
        removable = sorted((s.used, k) for k, s in self._sessions.items() if s is not keep and not s.in_use())
        for used, key in removable:
            if now - used > self.idle_seconds:
                self._remove(key)
        removable = [(used, key) for used, key in removable if key in self._sessions]
        while removable and len(self._sessions) > self.max_sessions:
            self._remove(removable.pop(0)[1])
        if removable and now - self._measured > MEASURE_SECONDS:
            self._measured = now
            total = sum(s.size() for s in self._sessions.values())
            while removable and total > self.max_bytes:
                key = removable.pop(0)[1]
                total -= self._sessions[key].size()
                self._remove(key)

    def close(self) -> None:
        with self._lock:
            for key in list(self._sessions):
                self._remove(key)


def session_key(request) -> str | None:
    """The Gradio session of a request (None: the request is a session of its own)."""
    return getattr(request, "session_hash", None) or None
