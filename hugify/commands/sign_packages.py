"""``hugify sign-packages ARTEFACT…``: the statements of built packages signed after
the build, where it never ran (docs/signing.md, "The recommended setup: sign after the build")."""

from __future__ import annotations

import argparse
from pathlib import Path

from hugify.commands.common import add_policy_option, epilog, usable_policy
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify import postbuild, reasons
    from hugify.reasons import ReasonError

    pol = usable_policy(args.policy, for_build=False)
    if pol is None:
        return Exit.INVALID
    key, key_where = (args.key, "--key") if args.key else (pol.signing("key"), pol.where("signing", "key"))
    opts = postbuild.Options(
        inputs=[Path(p) for p in args.artefacts],
        outdir=Path(args.output) if args.output else None,
        key=key,
        key_where=key_where,
        tlog_upload=pol.signing("tlog_upload"),
        policy=pol,
    )
    try:
        written = postbuild.run(opts, lambda line: print(line, flush=True))
    except (ReasonError, OSError) as e:
        return reasons.report(e)
    print(f"hugify: sign-packages: {len(written) // 2} statement(s) signed")
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sign-packages",
        help="sign the statements of built packages, after the build and outside it",
        description="Reads each package (a .changes file stands for the packages it lists, checked against its "
        "checksums), checks the hugify statement it carries (ROOT/usr/share/hugify/attestations/NAME.intoto.json, "
        'built unsigned with signing.mode = "off") against the packages given: every file it lists is in them '
        "with that sha256 and hugified by its program headers, under the package's name and architecture. "
        "Then signs each statement with cosign and writes the bundle and a copy of the statement beside the "
        "package (or into -o DIR): PACKAGE_VERSION_ARCH.bundle, N-V-R.A.bundle. The packages are not changed. "
        "Nothing is written unless every statement passed.",
        epilog=epilog(
            (
                ("hugify sign-packages --key cosign.key foo_1.2-3_amd64.changes", "sign a Debian upload's statements"),
                (
                    "hugify sign-packages --key awskms:///alias/hugify RPMS/x86_64/*.rpm",
                    "an rpm build's, with a KMS key",
                ),
            ),
            "0; 2 usage; 3 a damaged package or .changes (not-a-package, bad-changes, changes-mismatch), a "
            "statement that does not describe the packages (statement-mismatch) or an unusable policy; 4 hugified "
            "files but no statement (statement-missing); 5 I/O error or signing failed (signing-failed).",
        ),
    )
    p.add_argument(
        "artefacts", nargs="+", metavar="ARTEFACT", help="a .changes file, .deb/.udeb or .rpm packages (all of a build)"
    )
    p.add_argument("-o", "--output", metavar="DIR", help="where the bundles go (default: beside each package)")
    p.add_argument(
        "--key",
        metavar="KEY",
        help="the signing key: a cosign key file (COSIGN_PASSWORD in the environment) or a KMS/PKCS#11 URI "
        "(default: the policy's signing.key, or $HUGIFY_SIGNING_KEY)",
    )
    add_policy_option(p)
    p.set_defaults(func=run)
