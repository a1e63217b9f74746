"""The ``pycoll`` command line: ``pycoll info``."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import pycoll
from pycoll import config


def cmd_info(args: argparse.Namespace) -> int:
    """Print the version, the transports and the settings with their values."""
    print(f"pycoll {pycoll.__version__}")
    print("\nsettings (environment variables):")
    for name, value, doc in config.describe():
        print(f"  {name:<24} {value}")
        print(f"  {'':<24} {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pycoll", description="pycoll collective engine")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="version, transports, algorithms and settings")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
