"""``hugify repack PACKAGE… -o DIR``: rewrite the ELF files of built .deb and .rpm packages."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hugify.commands.common import add_policy_option, epilog
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify import repack

    if os.geteuid() != 0:  # fakeroot counts: it answers 0
        print("hugify: repack needs root or fakeroot, to keep the owners and modes of the files", file=sys.stderr)
        return Exit.USAGE
    opts = repack.Options(
        packages=[Path(p) for p in args.packages],
        outdir=Path(args.output),
        policy=args.policy,
        suffix=args.suffix,
        dry_run=args.dry_run,
        jobs=args.jobs or os.cpu_count() or 1,
    )
    return repack.run(opts)


def _suffix(text: str) -> str:
    if not text or any(c.isspace() or c in "/_-:" for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} cannot end a version (no spaces, '/', '_', '-' or ':')")
    return text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "repack",
        help="rewrite the ELF files of built .deb and .rpm packages into new packages",
        description="Unpacks each package, transforms its ELF files under the policy (stripped files "
        "allowed), adds the runtime manifest (and the signed statement when the policy signs), and "
        "rebuilds it with the same name, relationships, scripts, triggers, conffiles, modes and owners "
        "and a version suffix. A debug package (-dbgsym, -debuginfo) given with its package is repacked "
        "to match. Prints a summary. Run as root or under fakeroot. On failure nothing is written to DIR "
        "(DIR is made if missing, not its parents).",
        epilog=epilog(
            (
                (
                    "sudo hugify repack foo_1.2-3_amd64.deb foo-dbgsym_1.2-3_amd64.deb -o out/",
                    "out/foo_1.2-3+hugify1_amd64.deb and its -dbgsym, which install as upgrades",
                ),
                ("fakeroot hugify repack --dry-run foo-1.2-3.x86_64.rpm -o out/", "what it would change"),
            ),
            "0; 2 usage; 3 not a package, an unusable policy, or a --suffix that does not sort above the "
            "original version; 4 nothing to transform, a package built with hugify already, or an rpm header "
            "tag repack cannot carry (the reason id says which); 5 I/O or tool failure; 6 a symlink of the "
            "package would lead what hugify adds or rewrites out of it.",
        ),
    )
    p.add_argument("packages", nargs="+", metavar="PACKAGE", help=".deb or .rpm files")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="where the new packages go")
    p.add_argument(
        "--suffix",
        type=_suffix,
        metavar="TEXT",
        help="appended to the version; it must sort above the original (default: +hugify1 for Debian, "
        ".hugify1 to the rpm Release)",
    )
    add_policy_option(p)
    p.add_argument("--jobs", "-j", type=int, metavar="N", help="files transformed at once (default: CPUs)")
    p.add_argument("--dry-run", action="store_true", help="do everything in a scratch directory, print the summary")
    p.set_defaults(func=run)
