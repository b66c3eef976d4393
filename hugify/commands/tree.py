"""``hugify tree ROOT``: transform every eligible ELF file of a package build tree."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from hugify.commands.common import (
    add_policy_option,
    add_recorded_policy_option,
    build_root,
    epilog,
    failure,
    say_failure,
    usable_policy,
)
from hugify.docs import doc
from hugify.exitcodes import Exit


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of jobs")
    return n


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {e}") from e


def live_root(root: Path) -> bool:
    """Whether `root` is the running system's root directory (the same directory as
    /, whatever the path: a symlink or a bind mount of / too)."""
    here, top = root.stat(), os.stat("/")
    return (here.st_dev, here.st_ino) == (top.st_dev, top.st_ino)


def run(args: argparse.Namespace) -> Exit:
    from hugify import policy, tree
    from hugify.rewrite import hugify_error

    root = build_root(args.root)
    if isinstance(root, Exit):
        return root
    if not args.allow_live_root and live_root(root):
        detail = (
            "this is the running system's root, not a package build root; hint: give the build root "
            "(rpm: $RPM_BUILD_ROOT, Debian: debian/PKG), or --allow-live-root to rewrite this system's files in place"
        )
        code, info = failure(hugify_error("live-root", detail), args.root)
        say_failure(args.root, info)
        return code
    pol = usable_policy(args.policy, args.package, recorded=args.recorded_policy)
    if pol is None:
        return Exit.INVALID
    if args.arch is not None and policy.canonical_arch(args.arch) is None:
        print(f"hugify: note: unknown --arch {args.arch!r}: every ELF file counts as foreign", file=sys.stderr)
    opts = tree.Options(
        root=root,
        policy=pol,
        jobs=args.jobs or os.cpu_count() or 1,
        arch=args.arch,
        exclude_regexes=tuple(args.exclude_regex),
        manifest=Path(args.manifest) if args.manifest else None,
        report=Path(args.report) if args.report else None,
        manifest_only=args.manifest_only,
        progress=sys.stderr.isatty() and not args.no_progress,
        drop_signatures=args.drop_stale_signatures,
        # A live system's files must survive a crash in the middle: the old or the new.
        durable=args.allow_live_root and live_root(root),
    )
    return tree.run(opts)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tree",
        help="transform the eligible ELF files of a package build root in place",
        description="Selects ELF executables and shared objects by content, applies the policy, and "
        "transforms each inode once, in parallel, keeping owner, mode, xattrs, times and hardlinks. "
        "Logs one line per ELF file and a summary. Nothing below ROOT is reached through a symbolic link; "
        "FIFOs, device nodes and sockets are never opened ("
        f"{doc('security.md')}). brp-hugify and dh_hugify run it "
        "in package builds.",
        epilog=epilog(
            (
                (
                    "hugify tree debian/foo --package foo --manifest foo.list --report foo.json",
                    "what dh_hugify does for the package foo",
                ),
                ("hugify tree --manifest-only root/ --manifest m.list", "list the files already on whole windows"),
            ),
            '0, or 1 when files failed and the policy says on_error = "fail"; 2 usage; 3 an unusable policy, or '
            "ROOT is not a directory; 4 ROOT is the running system's root (live-root) and --allow-live-root is not "
            "given; 5 the manifest or report cannot be written (its directory must exist); 6 they would be "
            "written through a symlink in ROOT.",
        ),
    )
    p.add_argument("root", metavar="ROOT", help="the build root (rpm: $RPM_BUILD_ROOT; Debian: debian/PKG)")
    add_policy_option(p)
    add_recorded_policy_option(p)
    p.add_argument("--package", metavar="NAME", help="apply the policy's [packages.NAME] overrides")
    p.add_argument("--jobs", "-j", type=_jobs, metavar="N", help="files transformed at once (default: CPUs)")
    p.add_argument("--manifest", metavar="OUT", help=f"write the package manifest ({doc('manifest.md')}) here")
    p.add_argument("--report", metavar="OUT.json", help="write a JSON report of every ELF file here")
    p.add_argument(
        "--arch",
        metavar="ARCH",
        help="the package's architecture (rpm or Debian name); ELF files of other architectures are skipped",
    )
    p.add_argument(
        "--exclude-regex",
        type=_regex,
        action="append",
        default=[],
        metavar="REGEX",
        help="skip installed paths this regular expression matches (searched; repeatable)",
    )
    p.add_argument(
        "--manifest-only",
        action="store_true",
        help="transform nothing; list the files whose code is already huge-page aligned "
        "(to refresh build-ids after a later tool such as debugedit rewrote them)",
    )
    p.add_argument(
        "--drop-stale-signatures",
        action="store_true",
        help="rewrite files signed with security.ima/security.evm and drop those attributes "
        '(default: the policy\'s ima_signatures, "refuse": such files are skipped with reason signed-file)',
    )
    p.add_argument(
        "--allow-live-root",
        action="store_true",
        help="allow ROOT to be the running system's root (/): rewrite installed files in place",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display, even on a terminal")
    p.set_defaults(func=run)
