"""``hugify sign ROOT --report REPORT``: the package's signed statement of what hugify
changed, made after the last tool that rewrites files (docs/signing.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hugify import reasons
from hugify.commands.common import add_policy_option, add_recorded_policy_option, build_root, epilog, usable_policy
from hugify.docs import doc
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify import policy, signing

    root = build_root(args.root)
    if isinstance(root, Exit):
        return root
    pol = usable_policy(args.policy, args.package, recorded=args.recorded_policy)
    if pol is None:
        return Exit.INVALID
    try:
        report = signing.read_report(Path(args.report))
    except OSError as e:
        print(
            f"hugify: cannot read the hugify tree report {args.report}: {reasons.io_detail(e, with_file=False)}",
            file=sys.stderr,
        )
        return Exit.IO
    except signing.ReportError as e:
        print(f"hugify: {e}", file=sys.stderr)
        return Exit.INVALID
    name = args.package or report.get("package")
    if not isinstance(name, str) or not policy.is_package_name(name):
        print("hugify: the statement needs a package name: pass --package", file=sys.stderr)
        return Exit.USAGE
    if args.name is not None and not signing.is_statement_stem(args.name):
        print(f"hugify: --name {args.name!r} is not a file name (a package name, or NAME:ARCH)", file=sys.stderr)
        return Exit.USAGE
    req = signing.SignRequest(
        root=root,
        report=report,
        name=name,
        mode=pol.signing("mode"),
        mode_where=pol.where("signing", "mode"),
        key=pol.signing("key"),
        key_where=pol.where("signing", "key"),
        tlog_upload=pol.signing("tlog_upload"),
        install=not args.no_install,
        output=Path(args.output) if args.output else None,
        file_list=Path(args.file_list) if args.file_list else None,
        stem=args.name,
    )
    try:
        ok = signing.sign(req, lambda line: print(line, flush=True))
    except signing.ReportError as e:
        print(f"hugify: {args.report}: {e}", file=sys.stderr)
        return Exit.INVALID
    except OSError as e:  # an unsafe file's refusal too
        return reasons.say_error(e)
    return Exit.OK if ok else Exit.FAILED


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sign",
        help="write the package's signed statement of what hugify changed",
        description="After the last tool that rewrites files (rpm: after %__os_install_post; Debian: "
        "after dh_strip), hashes the files `hugify tree` transformed as they are now and writes an in-toto "
        f"statement ({doc('predicate-v1.md')}) to ROOT/usr/share/hugify/attestations/NAME.intoto.json, signed "
        "with cosign into NAME.bundle as the policy's [signing] section says (signing.key or "
        "$HUGIFY_SIGNING_KEY; cosign from $HUGIFY_COSIGN or PATH; COSIGN_PASSWORD for key files). "
        "dh_hugify_sign and rpm's signing step run it in package builds.",
        epilog=epilog(
            (
                (
                    "hugify sign debian/foo --report debian/.debhelper/generated/foo/hugify-report.json",
                    "the statement of what dh_hugify changed in the package foo (what dh_hugify_sign does)",
                ),
            ),
            '0; 1 signing failed and signing.mode is "required" (nothing written); 2 usage; 3 an unusable policy '
            "or report, or ROOT is not a directory; 5 I/O error (--output's directory must exist); 6 the "
            "attestation directory in ROOT is reached through a symlink (nothing is written outside ROOT).",
        ),
    )
    p.add_argument("root", metavar="ROOT", help="the build root (rpm: $RPM_BUILD_ROOT; Debian: debian/PKG)")
    p.add_argument("--report", required=True, metavar="REPORT.json", help="the report `hugify tree --report` wrote")
    p.add_argument(
        "--package",
        metavar="NAME",
        help="the package: policy [packages.NAME], and NAME.intoto.json (default: the report's package)",
    )
    p.add_argument(
        "--name",
        metavar="STEM",
        help="install the statement as STEM.intoto.json (default: the package's name; dh_hugify_sign gives "
        "NAME:ARCH for Multi-Arch: same packages, so that two architectures install side by side)",
    )
    add_policy_option(p)
    add_recorded_policy_option(p)
    p.add_argument("--no-install", action="store_true", help="write nothing into ROOT (only --output)")
    p.add_argument(
        "--output",
        metavar="PREFIX",
        help="also write PREFIX.intoto.json and PREFIX.bundle, for publication beside the packages",
    )
    p.add_argument(
        "--file-list",
        metavar="OUT",
        help="write the installed paths of the files written into ROOT here, one a line (rpm: %%files -f)",
    )
    p.set_defaults(func=run)
