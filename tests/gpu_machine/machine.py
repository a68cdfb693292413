"""The lent GPU machine as the tests see it: what its image holds (``has.txt`` beside this file),
what the workbench needs beyond that and does not carry there, and the environment in which the
smoke run lacks those packages too (``sitecustomize.py`` beside this file). Read by
``tests/test_gpu_check.py`` and ``tests/test_requirements_resolve.py``."""

import os
import re
from pathlib import Path

from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]


def image() -> dict[str, str | None]:
    """``{package: version, or None where none was seen}`` of the machine's image (names canonical)."""
    packages = {}
    for line in (HERE / "has.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            packages[canonicalize_name(name)] = version or None
    return packages


def requirement_names(path: Path) -> set[str]:
    """The canonical package names a requirements file lists (options and comments left out)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(re.split(r"[=<>!~\[; ]", line)[0]) for line in lines if line and not line.startswith("-")}


def lacks() -> list[str]:
    """The app's requirements that the machine neither has nor is carried: gradio, captum, torchao."""
    carried = requirement_names(REPO_ROOT / "requirements-gpu-check.txt")
    return sorted(requirement_names(REPO_ROOT / "requirements.txt") - set(image()) - carried)


def environment() -> dict[str, str]:
    """This process's environment with :func:`lacks` made unimportable (``sitecustomize.py``)."""
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "G4V_UNIMPORTABLE": ",".join(lacks()), "PYTHONPATH": path}
