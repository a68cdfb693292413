"""Why vLLM could not start, in one line.

vLLM (v1) builds its model in an engine-core *process*; when that fails, the exception in g4v's
process only says "Engine core initialization failed. See root cause above.": the cause (a weight
file it could not map, a LoRA rank it cannot hold, memory) is in the traceback the core printed
to its standard output (vLLM's log handler writes there) and error, which it inherits from this
process. :class:`OutputTail` passes file descriptors 1 and 2 through pipes while vLLM starts,
keeping the last lines, and :func:`start_error` reads the cause from them.
"""

import os
import re
import sys
import threading
from collections import deque

from g4v.errors import G4VError, first_line

#: The last line of a Python traceback: ``SomeError: message`` (after vLLM's ``(EngineCore pid=N)``
#: prefix and log header, when there is one).
_EXCEPTION = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (.+)$")
#: Lines kept (the traceback's end is what is read).
_KEPT_LINES = 400
_MAX_CAUSE = 300
#: Bytes kept of each line (vLLM's "no parameter named ..." line lists every parameter after it).
_LINE_BYTES = 4096


class OutputTail:
    """Standard output and error (``fds``) through pipes from now until :meth:`restore`."""

    def __init__(self, fds=(1, 2)):
        self._tails = [_FdTail(fd) for fd in fds]

    def restore(self) -> "OutputTail":
        for tail in self._tails:
            tail.restore()
        return self

    def lines(self, wait: float = 0.0) -> list[str]:
        return [line for tail in self._tails for line in tail.lines(wait)]


class _FdTail:
    """File descriptor ``fd`` through a pipe from now until :meth:`restore`: a thread passes every
    byte on to where it went before (nothing is hidden) and keeps the last lines. Processes
    started in between (vLLM's engine core) keep writing to the pipe after :meth:`restore`; the
    thread passes their output on until the last of them exits, then ends."""

    def __init__(self, fd: int):
        sys.stdout.flush()
        sys.stderr.flush()
        self._fd = fd
        self._out = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._lines: deque[str] = deque(maxlen=_KEPT_LINES)
        self._restored = False
        self._thread = threading.Thread(target=self._pump, args=(read_end,), daemon=True, name=f"g4v-fd{fd}-tail")
        self._thread.start()

    def _pump(self, read_end: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_end, 65536):
                try:
                    os.write(self._out, chunk)
                except OSError:  # this process's stderr went away: keep the lines all the same
                    pass
                pending += chunk
                *done, pending = pending.split(b"\n")
                self._lines.extend(line[:_LINE_BYTES].decode(errors="replace") for line in done)
                pending = pending[:_LINE_BYTES]  # a long line keeps its start (the exception's name)
        finally:
            os.close(read_end)
            os.close(self._out)

    def restore(self) -> None:
        """Give the fd back to this process (safe to call twice)."""
        if not self._restored:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self._out, self._fd)
            self._restored = True

    def lines(self, wait: float = 0.0) -> list[str]:
        """The lines kept so far; ``wait`` seconds at most for the writers to exit first (a failed
        engine core is exiting when its start is reported)."""
        self._thread.join(wait)
        return list(self._lines)


def root_cause(lines: list[str]) -> str | None:
    """The last ``SomeError: message`` line of a traceback in ``lines`` (its exception, in one
    line), or None when there is none."""
    for line in reversed(lines):
        match = _EXCEPTION.search(line.strip())
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"[:_MAX_CAUSE]
    return None


def start_error(err: BaseException, lines: list[str]) -> G4VError:
    """The one line for a failed start: the engine core's own exception when it printed one,
    else the exception raised here."""
    cause = root_cause(lines) if "root cause" in str(err) else None
    return G4VError(f"vLLM could not start: {cause or first_line(err)}")
