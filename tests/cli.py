"""Run ``python -m g4v ...`` inside the test process: ``run_cli("chat", "hi")``.

A new interpreter per check costs seconds (torch, transformers and the command modules import
again); ``g4v.cli.main`` is what ``python -m g4v`` calls, so calling it here tests the same
contract: the exit status, stdout, and stderr. Bad flags raise ``SystemExit(2)`` after argparse
writes its line; that becomes the status. Any other exception is not caught: where a process would
print a traceback, the test fails with it.

What a new process would show on stderr is captured here too: warnings (with Python's default
filters, as a fresh interpreter has them, not pytest's recorder) and library log lines (transformers'
handler holds the stderr of import time, so it is pointed at the captured one). What the CLI
changes in the process (working directory, environment, torch threads, library verbosity) is put
back afterwards, so one test's run does not leak into the next.
"""

import contextlib
import io
import logging
import os
import sys
import warnings
from dataclasses import dataclass

from g4v.paths import REPO_ROOT


@dataclass
class Result:
    """The fields of ``subprocess.CompletedProcess`` that the tests read."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args) -> Result:
    from g4v.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process_state_kept())
        stack.enter_context(contextlib.chdir(REPO_ROOT))
        stack.enter_context(_log_handlers_write_to(err))  # before stdout is swapped: it tells them apart
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(_warnings_shown_as_a_new_process_would())
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as exit_:
            code = exit_.code
            if isinstance(code, str):  # SystemExit("text"): Python prints it and exits with 1
                print(code, file=sys.stderr)
                code = 1
    return Result(0 if code is None else code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _process_state_kept():
    import torch
    import transformers

    environment, threads = dict(os.environ), torch.get_num_threads()
    verbosity = transformers.logging.get_verbosity()
    try:
        yield
    finally:
        for name in set(os.environ) - set(environment):
            del os.environ[name]
        os.environ.update(environment)
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)


@contextlib.contextmanager
def _log_handlers_write_to(stream):
    """Every plain logging handler (in a new process they write to stderr) writes to ``stream``."""
    loggers = [logging.getLogger(), *(logger for logger in logging.root.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    moved = [(handler, handler.stream) for logger in loggers for handler in logger.handlers
             if type(handler) is logging.StreamHandler and handler.stream not in (sys.__stdout__, sys.stdout)]
    for handler, _ in moved:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, old in moved:
            handler.setStream(old)


@contextlib.contextmanager
def _warnings_shown_as_a_new_process_would():
    with warnings.catch_warnings():
        warnings.resetwarnings()  # Python's defaults (Lib/warnings.py), not pytest's filters
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.showwarning = _show_on_stderr
        yield


def _show_on_stderr(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
