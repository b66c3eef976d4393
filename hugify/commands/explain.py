"""``hugify explain [ID…]``: what each refusal reason means and its exit status."""

from __future__ import annotations

import argparse
import sys

from hugify import _core
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify.repack import REASONS

    table = {rid: (kind, summary) for rid, kind, summary in [*_core.reasons(), *REASONS]}
    code = Exit.OK
    for rid in args.ids or list(table):
        if rid not in table:
            print(f"hugify: no reason called {rid!r}; try `hugify explain` for the list", file=sys.stderr)
            code = Exit.USAGE
            continue
        kind, summary = table[rid]
        print(f"{rid} ({kind}, exit status {int(Exit.for_kind(kind))}): {summary}")
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="describe refusal reasons (all, or the IDs given)")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.set_defaults(func=run)
