"""``make run`` serves from requirements.txt alone, ``make test`` still installs the test tools
(a new user's ``make run`` from a fresh clone once took 162 s, most of it installing pytest,
Playwright and SciPy). Read with ``make -n`` on a copy of the Makefile, and on the app's imports."""

import ast
import re
import shutil
import subprocess

import pytest

from g4v.paths import REPO_ROOT

#: What requirements-dev.txt adds for the tests, as their import names.
TEST_ONLY = ("pytest", "xdist", "gradio_client", "playwright", "scipy")


def planned(target: str, folder) -> str:
    """The commands ``make -n TARGET`` would run in a fresh clone (no environment built yet)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in ("Makefile", "requirements.txt", "requirements-dev.txt"):
        shutil.copy(REPO_ROOT / name, folder / name)
    done = subprocess.run(["make", "-n", target], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def installed(commands: str) -> list[str]:
    return re.findall(r"pip install .*?-r (\S+)", commands)


def test_make_run_installs_the_app_requirements_only(tmp_path):
    run = planned("run", tmp_path)
    assert installed(run) == ["requirements.txt"] and "app.py" in run


def test_make_test_still_installs_the_test_tools(tmp_path):
    assert installed(planned("test-fast", tmp_path)) == ["requirements-dev.txt"]
    dev = (REPO_ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev  # the tests' environment serves the app too


def test_the_app_imports_none_of_the_test_tools():
    """What ``make run`` leaves out is never imported by the app (functions' own imports included)."""
    offenders = []
    for root in ("g4v", "webapp", "viz"):
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                offenders += [f"{path.relative_to(REPO_ROOT)}: {name}" for name in names
                              if name.split(".")[0] in TEST_ONLY]
    assert offenders == []
