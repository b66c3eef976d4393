"""``hugify transform FILE -o OUT | --in-place``."""

from __future__ import annotations

import argparse
import sys

from hugify import _core
from hugify.commands.common import add_json_option, add_plan_options, epilog, failure, print_json, say_failure, settings
from hugify.exitcodes import Exit
from hugify.rewrite import rewrite


def run(args: argparse.Namespace) -> Exit:

    from hugify import render

    src = args.file
    dst = None if args.in_place else args.output
    try:
        # In place, the file replaced may be a live system's: a crash must leave the
        # old file or the new one, never an empty one (fsync before and after rename).
        r = rewrite(src, dst, settings(args), drop_signatures=args.drop_stale_signatures, durable=args.in_place)
    except (_core.HugifyError, OSError) as e:
        code, info = failure(e, args.file)
        if args.json:
            print_json({"path": args.file, "error": info})
        else:
            say_failure(args.file, info)
        return code
    out = str(dst or src)
    _say_if_stripped(src, out)
    if args.json:
        print_json({"path": args.file, "output": out, **r})
    else:
        print(render.transform_line(out, r))
    return Exit.OK


def _say_if_stripped(src: str, out: str) -> None:
    """transform applies no policy; where the policy's refuse_stripped would have kept
    a build from rewriting this file (no symbol table), it says so, once."""
    try:
        p = _core.probe(out)
    except (_core.HugifyError, OSError):
        return
    if p is not None and p["has_symtab"] is False:
        print(
            f"hugify: note: {src} has no symbol table; transform applies no policy, so refuse_stripped "
            "(which hugify tree, dh_hugify and brp-hugify apply) did not skip it: references to the ELF header "
            "were ruled out by the byte probe only, not by name",
            file=sys.stderr,
        )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "transform",
        help="rewrite one file atomically; on failure the original is untouched",
        description="Rewrites FILE so that its code lies on whole huge-page windows, into OUT or in place, "
        "and says in one line what it did or why not (a reason id, `hugify explain`). The result is checked "
        "before it is renamed into place; on any failure the original is byte-identical and nothing is left "
        "beside it. Applies no policy: the plan options below are all it reads.",
        epilog=epilog(
            (
                ("hugify transform /usr/bin/gdb -o gdb.huge", "a rewritten copy; /usr/bin/gdb stays as it is"),
                ("hugify transform --in-place --threshold 0 ./prog", "rewrite ./prog itself, however small its code"),
            ),
            "0 transformed; 2 usage; 3 invalid input (a malformed file, a directory or device); 4 refused (the "
            "reason id says why); 5 I/O error (reading FILE or writing OUT); 6 unsafe file (a symlink where it "
            "would replace a file, a file swapped meanwhile, a device at OUT); 70 internal error.",
        ),
    )
    p.add_argument("file", metavar="FILE", help="the ELF program or library to rewrite")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="OUT", help="write the result to OUT")
    out.add_argument("--in-place", action="store_true", help="replace FILE, keeping owner, mode and xattrs")
    p.add_argument(
        "--drop-stale-signatures",
        action="store_true",
        help="rewrite a file signed with security.ima/security.evm and drop those attributes "
        "(default: refuse it, reason signed-file)",
    )
    add_json_option(p)
    add_plan_options(p)
    p.set_defaults(func=run)
