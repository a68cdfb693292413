"""Flags that several commands share, so they read and behave the same everywhere."""

import argparse

from g4v.engines import BACKENDS


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

