"""``hugify explain [ID…]``: what each reason id hugify prints means, and its exit status."""

from __future__ import annotations

import argparse
import sys

from hugify import reasons
from hugify.commands.common import epilog
from hugify.docs import doc
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    table = reasons.table()
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
    p = sub.add_parser(
        "explain",
        help="describe refusal reasons (all, or the IDs given)",
        description="Says what each reason id that hugify prints means, its kind and its exit status "
        f"({doc('exit-status.md')}).",
        epilog=epilog(
            (
                ("hugify explain", "every reason id"),
                ("hugify explain no-whole-window wrong-file-type", "just these"),
            ),
            "0; 2 an ID hugify does not know.",
        ),
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="reason ids, as hugify prints them in parentheses")
    p.set_defaults(func=run)
