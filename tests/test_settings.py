"""Settings written once and read at start: the limits (g4v.settings.limits) and the app's flags
(app.AppSettings), each from its dataclass's fields and their environment variables."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from g4v.errors import G4VError
from g4v.paths import REPO_ROOT
from g4v.settings import limits as limits_module
from g4v.settings.flags import env_names
from g4v.settings.limits import Limits, limits


def test_every_limit_has_its_own_variable_and_is_documented():
    names = [env_names(field) for field in dataclasses.fields(Limits)]
    assert all(len(given) == 1 and given[0].startswith("G4V_") for given in names)
    assert len({given[0] for given in names}) == len(names)
    documented = (REPO_ROOT / "docs" / "limits.md").read_text() + (REPO_ROOT / "docs" / "documents.md").read_text()
    assert [given[0] for given in names if f"`{given[0]}`" not in documented] == []


def test_limits_are_read_from_the_environment_given():
    assert Limits.from_environment({}) == Limits()
    read = Limits.from_environment({"G4V_MAX_PDF_PAGES": "7", "G4V_PDF_PAGE_SECONDS": "1.5",
                                    "G4V_MAX_UPLOAD_SIZE": "50mb", "UNRELATED": "x"})
    assert read == dataclasses.replace(Limits(), max_pdf_pages=7, pdf_page_seconds=1.5, max_upload_size="50mb")


@pytest.mark.parametrize("name, text", [("G4V_MAX_PDF_PAGES", "abc"), ("G4V_MAX_IMAGE_PIXELS", "٣"),
                                        ("G4V_PDF_PAGE_SECONDS", "inf")])
def test_a_bad_limit_is_one_line_that_names_its_variable(name, text):
    with pytest.raises(G4VError) as refused:
        Limits.from_environment({name: text})
    assert str(refused.value).startswith(f"{name} must be") and "\n" not in str(refused.value)


def test_limits_are_read_when_first_asked_not_at_import(monkeypatch):
    monkeypatch.setattr(limits_module, "_current", None)  # as in a fresh process, which has imported everything
    monkeypatch.setenv("G4V_MAX_SESSIONS", "3")
    assert limits().max_sessions == 3
    monkeypatch.setenv("G4V_MAX_SESSIONS", "4")  # read once: the process keeps what it started with
    assert limits() is limits() and limits().max_sessions == 3


#: (environment, flags) -> the app's settings, or the one line it stops with.
READ_APP_SETTINGS = """
import contextlib, io, json, os, sys
import app
for environment, flags in json.loads(sys.argv[1]):
    os.environ.update(environment)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = app.parse_args(flags)
        print(json.dumps([args.host, args.port, args.concurrency, args.data_dirs, args.eval_servers, args.backend]))
    except SystemExit:
        print(json.dumps(said.getvalue().strip().splitlines()[-1]))
    for name in environment:
        del os.environ[name]
"""

CASES = [
    ({}, [], ["127.0.0.1", 7860, 1, [], [], "auto"]),
    ({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "9000"}, [], ["0.0.0.0", 9000, 1, [], [], "auto"]),
    ({"G4V_HOST": "10.0.0.1", "GRADIO_SERVER_NAME": "0.0.0.0", "G4V_PORT": "8000", "GRADIO_SERVER_PORT": "9000"}, [],
     ["10.0.0.1", 8000, 1, [], [], "auto"]),
    ({"G4V_PORT": "8000", "G4V_CONCURRENCY": "3", "G4V_DATA_DIRS": "a::b", "G4V_EVAL_SERVERS": "http://x  http://y,model=m",
      "G4V_BACKEND": "hf"}, ["--port", "7", "--data-dir", "c", "--eval-server", "u"],
     ["127.0.0.1", 7, 3, ["a", "b", "c"], ["http://x", "http://y,model=m", "u"], "hf"]),
    ({"G4V_PORT": "abc"}, [], "-c: error: G4V_PORT must be a whole number written with the digits 0-9, got 'abc'"),
    ({"G4V_CONCURRENCY": "1.5"}, [], "-c: error: G4V_CONCURRENCY must be a whole number written with the digits 0-9, got '1.5'"),
    ({"G4V_BACKEND": "bogus"}, [], "-c: error: G4V_BACKEND must be one of auto, hf, vllm, openai, not 'bogus'"),
]


def test_the_app_reads_its_flags_defaults_from_the_environment_and_a_bad_value_is_one_line():
    """``app.parse_args`` in a process of its own (importing app.py sets Gradio's cache folder)."""
    own = ("G4V_", "GRADIO_SERVER_", "GRADIO_MCP_SERVER")
    environment = {name: value for name, value in os.environ.items() if not name.startswith(own)}
    read = subprocess.run([sys.executable, "-c", READ_APP_SETTINGS, json.dumps([case[:2] for case in CASES])],
                          cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert [json.loads(line) for line in read.stdout.splitlines()] == [expected for *_, expected in CASES], read.stderr
