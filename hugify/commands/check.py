"""``hugify check TREE | PACKAGE…``: verify, after the last tool that rewrites ELF
files, that what hugify put on huge pages still is, and that its records (manifest,
statement, debug files) describe what ships (hugify/check.py)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hugify import reasons
from hugify.commands.common import add_policy_option, add_recorded_policy_option, epilog
from hugify.exitcodes import Exit

if TYPE_CHECKING:
    from hugify.check import Built


def _refuse(reason: str, detail: str) -> Exit:
    reasons.printed([reason])
    print(f"hugify: check: {detail} ({reason})", file=sys.stderr)
    return Exit.for_kind(reasons.table()[reason][0])


def _built(args: argparse.Namespace, spool: Path) -> list[Built]:
    """The packages (or the tree) to check, read."""
    from hugify import check
    from hugify.artefacts import read_artefact
    from hugify.postbuild import packages_of

    targets = [Path(t) for t in args.targets]
    if len(targets) == 1 and targets[0].is_dir():
        report = Path(args.report) if args.report else None
        debug = Path(args.debug_root) if args.debug_root else None
        return [check.read_tree(targets[0], report, debug, args.package)]
    return check.read_packages([read_artefact(p, spool) for p in packages_of(targets)])


def run(args: argparse.Namespace) -> Exit:
    from hugify import check, files, policy
    from hugify.reasons import ReasonError

    targets = [Path(t) for t in args.targets]
    try:
        for t in targets:  # a file given that is missing or unreadable is an I/O error, as in every command
            os.stat(t)
    except OSError as e:
        return reasons.report(e)
    dirs = [t for t in targets if t.is_dir()]
    if dirs and len(targets) > 1:
        print("hugify: check: give one built tree, or package files (.deb, .rpm, .changes)", file=sys.stderr)
        return Exit.USAGE
    if not dirs and (args.report or args.debug_root):
        print("hugify: check: --report and --debug-root go with a built tree", file=sys.stderr)
        return Exit.USAGE
    try:
        layers = policy.load(args.policy, recorded=args.recorded_policy)
    except policy.PolicyError as e:
        print(f"hugify: the policy is not usable:\n{e}", file=sys.stderr)
        return Exit.INVALID
    try:
        with tempfile.TemporaryDirectory(prefix="hugify-check-") as spool:
            built = _built(args, Path(spool))
            found: list[check.Regression] = []
            files_checked = 0
            for b in built:
                pol = policy.resolve(layers, b.package, for_build=False)
                found += check.regressions(b, pol)
                files_checked += sum(s is not None for s in b.shipped.values())
    except (check.BadInput, ReasonError) as e:
        return _refuse(e.reason, e.detail)
    except files.UnsafeFile as e:
        return _refuse(e.reason, str(e).removesuffix(f" ({e.reason})"))
    except OSError as e:  # a file given that is missing or unreadable: 5, as in every command
        return reasons.report(e)
    except policy.PolicyError as e:
        print(f"hugify: the policy is not usable:\n{e}", file=sys.stderr)
        return Exit.INVALID
    on_regression = args.on_regression or (
        policy.resolve(layers, built[0].package if len(built) == 1 else args.package, for_build=False).on_regression
    )
    warn = on_regression == "warn"
    reasons.printed(r.reason for r in found)
    for r in found:
        print(r.line(warn), flush=True)
    debug = "" if all(b.debug_ids is not None for b in built) and built else "; no debug files given"
    what = ", ".join(b.where for b in built) or "nothing hugify recorded"
    if found:
        verdict = "warning only (on_regression = warn)" if warn else "the check fails"
        print(f"hugify: check: {what}: {len(found)} regression(s) in {files_checked} file(s){debug}; {verdict}")
        return Exit.OK if warn else Exit.FAILED
    print(f"hugify: check: {what}: {files_checked} hugified file(s) as hugify left them{debug}")
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="verify, after the last tool that rewrites ELF files, that hugified files still are",
        description="Reads a built tree (debian/PACKAGE, $RPM_BUILD_ROOT, an unpacked root) or built packages "
        "(.deb, .udeb, .rpm, .changes) and writes nothing. For each file hugify's records name (the tree "
        "report given with --report, the runtime manifests and statements the tree or packages carry): its code "
        "is on the whole huge-page windows recorded (layout-undone), its manifest entry and statement name "
        "what ships (manifest-stale, statement-stale), the bytes made executable are within the policy's "
        "exposure_limit (exposure-over-limit), a debug file of the build carries its build-id "
        "(debug-file-mismatch; with --debug-root, or the -dbgsym/-debuginfo packages of the set), it exists "
        "(missing). One line per regression, with its reason id.",
        epilog=epilog(
            (
                (
                    "hugify check debian/libfoo1 --report debian/.debhelper/generated/libfoo1/hugify-report.json",
                    "a built tree, as dh_hugify_check runs it after dh_strip",
                ),
                ("hugify check ../foo_1.2-3_amd64.changes", "the packages of a build, before signing them"),
                ("hugify check --on-regression warn *.rpm", "an archive's QA: report, do not fail"),
            ),
            '0 no regression (also with regressions when on_regression is "warn"); 1 regressions; 2 usage; '
            "3 not a package, a truncated or damaged one, an unreadable report or policy; 5 I/O error (a file "
            "given is missing); 6 a path of the tree leads through a symbolic link.",
        ),
    )
    p.add_argument("targets", nargs="+", metavar="TREE|PACKAGE", help="one built tree, or package files")
    p.add_argument("--report", metavar="REPORT.json", help="the report `hugify tree --report` wrote for the tree")
    p.add_argument(
        "--debug-root",
        metavar="DIR",
        help="the tree holding the build's separate debug files under usr/lib/debug (Debian: "
        "debian/.debhelper/PACKAGE/dbgsym-root; rpm: $RPM_BUILD_ROOT): each hugified file's build-id must have one",
    )
    p.add_argument("--package", metavar="NAME", help="the policy's [packages.NAME] (default: the report's package)")
    add_policy_option(p)
    add_recorded_policy_option(p)
    p.add_argument(
        "--on-regression",
        choices=("fail", "warn"),
        help="fail (exit 1) or only warn about regressions (default: the policy's on_regression, fail)",
    )
    p.set_defaults(func=run)
