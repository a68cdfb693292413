"""One module per ``python -m g4v`` command: ``add_parser(subparsers)`` and ``run(args) -> int``."""
