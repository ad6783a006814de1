"""The ``infer`` command: ``generate``, ``serve``, ``router``, ``bench``, ``kvsim``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = ("generate", "serve", "router", "bench", "kvsim")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone: its module is the only one
    imported (``infer serve`` then loads none of the engine: ``generate`` and ``kvsim`` do)."""
    parser = argparse.ArgumentParser(prog="infer", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"infer.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, TimeoutError) as exc:
        print(f"infer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
