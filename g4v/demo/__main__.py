"""``python -m g4v.demo build [--out DIR]``: regenerate the bundled checkpoint."""

import argparse
from pathlib import Path

from g4v.paths import BUNDLED_MODEL_DIR


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m g4v.demo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build the tiny random-weight checkpoint")
    build_cmd.add_argument("--out", type=Path, default=BUNDLED_MODEL_DIR, help="output folder")
    args = parser.parse_args(argv)

    if args.command == "build":
        from g4v.demo.build import build

        sha = build(args.out)
        print(f"wrote {args.out} (weights sha256 {sha})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
