"""``infer serve``: placeholder until its issue lands (replace this whole file)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="(not available yet)")
    parser.set_defaults(handler=lambda args: print("infer serve is not available yet") or 1)
