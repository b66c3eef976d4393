"""``hugify manifest record|forget``: keep the discovered list (docs/manifest.md) of
hugified files that packages installed without a manifest; rpm's file triggers of
the hugify package run it with the installed or erased paths."""

from __future__ import annotations

import argparse
import sys

from hugify import reasons
from hugify.commands.common import epilog
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify import discovered, manifest

    if args.from_stdin == bool(args.paths):
        print("hugify manifest: give --from-stdin, or PATH arguments", file=sys.stderr)
        return Exit.USAGE
    paths = sys.stdin.read().splitlines() if args.from_stdin else args.paths
    listing = manifest.discovered_list()
    act = discovered.record if args.manifest_command == "record" else discovered.forget
    try:
        changed = act(paths, listing)
    except OSError as e:
        print(f"hugify: {listing}: {reasons.io_detail(e, with_file=False)}", file=sys.stderr)
        return Exit.IO
    if not args.quiet:
        done = "recorded in" if args.manifest_command == "record" else "forgotten from"
        for entry in changed:
            print(f"hugify: {entry.path}: {done} {listing}")
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "manifest",
        help="record or forget installed hugified files in the discovered list (rpm file triggers)",
        description="Keeps $HUGIFY_STATE_DIR/discovered.list (default /var/lib/hugify/discovered.list), "
        "read by `hugify prefetch --all` and `hugify status` after the manifests of "
        "/usr/lib/hugify/manifest.d. A file is hugified when its executable segment spans a whole window "
        "of this system's PMD huge page, with its file offset congruent to its address, at an address "
        "the loader aligns to that size (an ET_EXEC at its fixed address; a PIE or library with "
        "p_align of at least that size).",
        epilog=epilog(
            (
                ("rpm -ql foo | hugify manifest record --from-stdin", "what the rpm file trigger does"),
                ("hugify manifest forget /usr/bin/foo", "drop a path whose package is being erased"),
            ),
            "0; 2 usage; 5 the list cannot be written.",
        ),
    )
    cmds = p.add_subparsers(dest="manifest_command", required=True, metavar="ACTION")
    for name, text in (
        ("record", "look at the given installed paths: list the hugified ones, drop the others"),
        ("forget", "drop the given paths from the list (their package is being erased)"),
    ):
        example = (f"rpm -ql foo | hugify manifest {name} --from-stdin", text)
        c = cmds.add_parser(
            name,
            help=text,
            description=text[0].upper() + text[1:] + ".",
            epilog=epilog((example,), "0; 2 usage; 5 the list cannot be written."),
        )
        c.add_argument("paths", nargs="*", metavar="PATH")
        c.add_argument("--from-stdin", action="store_true", help="read the paths from standard input, one a line")
        c.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
        c.set_defaults(func=run)
