"""Where LoRA adapters may come from: the adapter folders, and the names and paths that resolve inside them.

An adapter is a folder a user points us at (``adapter_config.json`` plus
``adapter_model.safetensors``), so the CLI, the app and the engines all find it the same way, here:

* **Only configured folders.** Adapters are looked up in the adapter folders (``--adapters-dir``,
  else ``$G4V_ADAPTERS_DIR``, else ``assets/adapters``), nested ones by the name they are listed
  under (``team/my-lora``). A typed path is resolved (symlinks, ``..``) and refused unless it lies
  inside one of them, and so must every file in the adapter's folder: a link from inside to a file
  elsewhere would let a text box read arbitrary files just as a path would.
* **Which base it was made for.** PEFT writes the base model's name or path into the config; the
  LoRA tab uses it to offer first the adapters made for the model being served.

What the adapter's files hold is checked by :mod:`g4v.lora.checks` before any engine sees them.
"""

import json
import os
from pathlib import Path

from g4v.errors import G4VError, quoted
from g4v.paths import ASSETS_DIR, REPO_ROOT

ADAPTERS_ENV = "G4V_ADAPTERS_DIR"
DEFAULT_ADAPTERS_DIR = ASSETS_DIR / "adapters"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: Longest file name and path Linux takes (NAME_MAX, PATH_MAX, in bytes): longer typed names are
#: refused by us in words, rather than by the file system with an OSError that shows the full path.
MAX_NAME_LENGTH = 255
MAX_PATH_LENGTH = 4096


def adapter_dirs(configured: str | Path | list | None = None) -> list[Path]:
    """The adapter folders: ``configured`` (a folder, a list, or ``os.pathsep``-joined folders),
    else ``$G4V_ADAPTERS_DIR``, else ``assets/adapters``."""
    if configured is None or configured == "" or configured == []:
        configured = os.environ.get(ADAPTERS_ENV) or str(DEFAULT_ADAPTERS_DIR)
    if isinstance(configured, (str, Path)):
        configured = [part for part in str(configured).split(os.pathsep) if part]
    return [Path(folder).expanduser() for folder in configured]


def list_adapters(dirs: list[Path] | None = None) -> list[str]:
    """Names of the adapter folders (those holding an ``adapter_config.json``), sorted, unchecked."""
    names = set()
    for root in dirs if dirs is not None else adapter_dirs():
        if not root.is_dir():
            continue
        for config in root.rglob(CONFIG_FILE):
            if _inside(config.parent.resolve(), [root.resolve()]):
                names.add(config.parent.relative_to(root).as_posix())
    return sorted(names)


def resolve_adapter(choice: str, dirs: list[Path] | None = None) -> tuple[str, Path]:
    """Turn a typed adapter name or path into ``(name, resolved folder)``.

    A relative name is looked up in the adapter folders in order (``team/my-lora`` included), then
    as a path from the current folder; an absolute one is a path. Either way the resolved folder,
    and every file in it, must lie inside an adapter folder.
    """
    dirs = dirs if dirs is not None else adapter_dirs()
    roots = [root.resolve() for root in dirs]
    choice = (choice or "").strip()
    _check_typed_name(choice)
    real = _resolved(_find_adapter(choice, roots, dirs), choice)
    root = _inside(real, roots)
    if not real.is_dir():
        raise G4VError(f"adapter folder not found: {quoted(choice, 80)}")
    name = real.relative_to(root).as_posix()
    _check_links_stay_inside(real, roots, name)
    return name, real


def _check_typed_name(choice: str) -> None:
    """Refuse, in words, what the file system would refuse with an OSError naming the full path."""
    if not choice:
        raise G4VError("no adapter given")
    try:
        encoded = choice.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8, or broken text
        raise G4VError("adapter name is not valid UTF-8 text") from None
    for part in Path(choice).parts:
        size = len(part.encode("utf-8"))
        if size > MAX_NAME_LENGTH:
            length = f"{len(part)} characters" if size == len(part) else f"{size} bytes in UTF-8"
            raise G4VError(f"adapter name is too long ({length}; the limit is {MAX_NAME_LENGTH})")
    if len(encoded) > MAX_PATH_LENGTH:
        raise G4VError(f"adapter path is too long ({len(choice)} characters; the limit is {MAX_PATH_LENGTH})")


def _find_adapter(choice: str, roots: list[Path], dirs: list[Path]) -> Path:
    """The existing path ``choice`` names inside an adapter folder: under an adapter folder first
    (what :func:`list_adapters` shows), else a path as typed. Containment is decided on each
    resolved path before asking whether anything is there: a path that leads outside every adapter
    folder gets one answer, whether or not the server has such a file (``../../etc/passwd`` and
    ``../../etc/no-such-file`` alike), so no answer tells which server paths exist."""
    typed = Path(choice).expanduser()
    candidates = [typed] if typed.is_absolute() else [*(root / typed for root in roots), typed]
    inside = [candidate for candidate in candidates if _inside(_resolved(candidate, choice), roots) is not None]
    found = next((candidate for candidate in inside if _exists(candidate)), None)
    if found is not None:
        return found
    if not inside:
        folders = ", ".join(folder_label(d) for d in dirs)
        raise G4VError(
            f"adapter path {quoted(choice, 80)} is outside the adapter folders ({folders}); "
            f"copy it there or name its folder with --adapters-dir or ${ADAPTERS_ENV}"
        )
    available = ", ".join(list_adapters(dirs)) or "none"
    raise G4VError(f"unknown adapter {quoted(choice, 80)} (available: {available})")


def _check_links_stay_inside(folder: Path, roots: list[Path], name: str) -> None:
    """Every entry of the adapter folder must resolve inside the adapter folders: PEFT and vLLM
    open files in it by name (config, weights, and others they look for), following links."""
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() and _inside(_resolved(entry, name), roots) is None:
            raise G4VError(
                f"adapter {name}: {entry.name} links outside the adapter folders; "
                "copy the file into the adapter's folder instead of linking to it"
            )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a name longer than this file system allows
        return False


def _resolved(path: Path, shown_as: str) -> Path:
    """``path`` with links and ``..`` followed; a link loop or unreadable entry is a G4VError."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python 3.11)
        reason = getattr(err, "strerror", None) or "a symlink loop"
        raise G4VError(f"adapter {quoted(shown_as, 80)} cannot be opened ({reason})") from None


def _inside(path: Path, roots: list[Path]) -> Path | None:
    """The root that strictly contains ``path`` (both already resolved), if any."""
    return next((root for root in roots if path != root and path.is_relative_to(root)), None)


# ── which base an adapter was made for ──────────────────────────────────────────────────────


def adapter_base(choice: str, dirs: list[Path] | None = None) -> str | None:
    """The base model an adapter names (PEFT's ``base_model_name_or_path``), as written; None when
    it names none or its config cannot be read (it is then refused when used, with the reason)."""
    try:
        name, path = resolve_adapter(choice, dirs)
        base = read_adapter_config(path, name).get("base_model_name_or_path")
    except G4VError:
        return None
    return base if isinstance(base, str) and base.strip() else None


def read_adapter_config(path: Path, name: str) -> dict:
    """The adapter's ``adapter_config.json`` as written; a G4VError naming what is wrong with it."""
    config_path = Path(path) / CONFIG_FILE
    if not config_path.is_file():
        raise G4VError(f"adapter {name}: {CONFIG_FILE} is missing")
    try:
        config = json.loads(config_path.read_text())
    except UnicodeDecodeError:
        raise G4VError(f"adapter {name}: {CONFIG_FILE} is not valid JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as err:
        raise G4VError(f"adapter {name}: {CONFIG_FILE} is not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(config, dict):
        raise G4VError(f"adapter {name}: {CONFIG_FILE} is not a JSON object")
    return config


def same_base(base: str | None, model: str) -> bool:
    """Whether an adapter's ``base`` is ``model``: the same folder (links followed), or the same hub id.

    PEFT writes the path the adapter was trained from; the bundled adapters write it relative to
    the repository, so a relative base is read from :data:`~g4v.paths.REPO_ROOT`. ``model`` is what
    the user typed (``--model``): relative to the current folder, else to the repository.
    """
    if not base:
        return False
    wanted = _local_folder(base, [REPO_ROOT])
    served = _local_folder(model, [Path.cwd(), REPO_ROOT])
    if wanted is None or served is None:
        return wanted is None and served is None and base.strip() == model.strip()
    return wanted == served


def local_base_folder(base: str) -> Path | None:
    """The resolved folder an adapter's recorded base names (relative: to the repository, as
    :func:`same_base` reads it); None for a hub id."""
    return _local_folder(base, [REPO_ROOT])


def _local_folder(text: str, bases: list[Path]) -> Path | None:
    """The resolved folder ``text`` names (absolute, or under one of ``bases``); None for a hub id."""
    try:
        path = Path(text).expanduser()
        for candidate in [path] if path.is_absolute() else [base / path for base in bases]:
            if candidate.is_dir():
                return candidate.resolve()
    except (OSError, RuntimeError, ValueError):  # names no file system takes: not a local folder
        pass
    return None


def folder_label(folder: Path) -> str:
    """How an adapter folder is named to users: relative to the project (``assets/adapters``), else
    by its own name only, so that a web page never shows where the server keeps its files."""
    resolved = Path(folder).expanduser().resolve()
    return resolved.relative_to(REPO_ROOT).as_posix() if resolved.is_relative_to(REPO_ROOT) else resolved.name
