"""Flags that several commands share, so they read and behave the same everywhere."""

import argparse
import tempfile
from pathlib import Path

from g4v.engines import BACKENDS


def output_folder(text: str) -> Path:
    """An ``--out`` folder as argparse reads it: one that can take the results, or one line naming
    the flag (``/proc/self``, a file, no permission) before any model loads, not a traceback once
    the work is done. The folder itself (or, while it does not exist, the nearest folder above it
    that does) is written to once, a file made and removed; nothing is made yet."""
    folder = Path(text).expanduser()
    if folder.exists() and not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file: name a folder")
    _check_writable(folder if folder.exists() else _nearest_existing(folder), text)
    return folder


def output_file(text: str) -> Path:
    """A file flag (``--png``, ``--plot``, ``--markdown``) as argparse reads it: its folder must
    exist and take a file (checked as :func:`output_folder` checks a folder), and it is no folder."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: name a file")
    _check_writable(path.parent, text)
    return path


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable(folder: Path, typed: str) -> None:
    try:
        if not folder.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".g4v-write-check-"):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot write to {typed!r} ({_reason(err)})") from None


def _reason(err: OSError) -> str:
    return (err.strerror or type(err).__name__).lower()


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="model folder or hub id (default: $G4V_MODEL, else the bundled checkpoint)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto")


def add_backend_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="inference backend")


def add_adapters_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapters-dir", default=None, metavar="DIR",
                        help="folder(s) adapters may be read from, os.pathsep-separated "
                             "(default: $G4V_ADAPTERS_DIR, else assets/adapters)")

