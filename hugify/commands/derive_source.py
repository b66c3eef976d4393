"""``hugify derive-source PKG.dsc -o DIR``: the +hugifyN source that builds a Debian
source package with hugify on, the recorded way (hugify/derive.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hugify.commands.common import epilog
from hugify.docs import doc
from hugify.exitcodes import Exit


def run(args: argparse.Namespace) -> Exit:
    from hugify import derive, reasons

    maintainer = args.maintainer or derive.maintainer_from_env(dict(os.environ))
    if maintainer is None:
        print(
            "hugify: derive-source: who signs the changelog entry? --maintainer 'Full Name <address>', "
            "or DEBFULLNAME and DEBEMAIL as for dch",
            file=sys.stderr,
        )
        return Exit.USAGE
    wrong = [
        f"{text!r} is not {what}"
        for text, pattern, what in (
            (maintainer, derive.MAINTAINER, "'Full Name <address>'"),
            (args.suffix, derive.SUFFIX, "a version suffix (letters, digits, '.', '+', '~')"),
            (args.distribution or "unstable", derive.DISTRIBUTION, "a distribution name"),
        )
        if not pattern.fullmatch(text)
    ]
    if wrong:
        print(f"hugify: derive-source: {'; '.join(wrong)}", file=sys.stderr)
        return Exit.USAGE
    opts = derive.Options(
        dsc=Path(args.dsc),
        outdir=Path(args.output),
        maintainer=maintainer,
        suffix=args.suffix,
        distribution=args.distribution,
    )
    try:
        made = derive.derive(opts)
    except (reasons.ReasonError, OSError) as e:
        return reasons.report(e)
    print(f"hugify: derive-source: {made.source} {made.version}, Build-Depends: {derive.SEQUENCE}: {made.dsc}")
    return Exit.OK


#: hugify.derive.DEFAULT_SUFFIX, which `--help` names without importing it.
DEFAULT_SUFFIX = "+hugify1"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "derive-source",
        help="make the +hugifyN source that builds a Debian source package with hugify on",
        description="Unpacks the source (dpkg-source -x, which checks every file the .dsc lists), adds "
        "dh-sequence-hugify to its Build-Depends (the switch the .buildinfo of every build records, with "
        "hugify and the distribution's policy package: "
        f"{doc('packaging-debian.md')}, 'Turning it on, recorded') "
        "and a changelog entry VERSION+hugify1 saying so, and builds the new source (dpkg-source -b) into "
        "DIR, which must exist: its .dsc, the new debian tarball or diff, and the upstream tarballs it "
        "shares with the original. Nothing else of the package changes. Same input and options give the "
        "same bytes: the entry is dated SOURCE_DATE_EPOCH, else one second after the last entry, never by "
        "the clock. The new .dsc is unsigned (debsign it, or let the build service sign the upload). "
        "Refused, with nothing written: what is not a .dsc, a source format other than 1.0, 3.0 (quilt) "
        "and 3.0 (native), a listed file missing or damaged, a source that turns hugify on already, "
        "rules that run no dh sequence.",
        epilog=epilog(
            (
                (
                    "hugify derive-source hello_2.10-3.dsc -o derived/ --maintainer 'A B <ab@example.org>'",
                    "derived/hello_2.10-3+hugify1.dsc, for upload to a derivative's build service",
                ),
                (
                    "hugify derive-source --distribution trixie-hugify --suffix +hugify2 git_2.47.3-0+deb13u1.dsc -o .",
                    "git 1:2.47.3-0+deb13u1+hugify2, its changelog entry for trixie-hugify",
                ),
            ),
            "0; 2 usage (no --maintainer and no DEBEMAIL); 3 not a .dsc, a file it lists missing or damaged, "
            "a suffix that does not sort higher; 4 an unsupported source format, hugify on already, "
            "debian/rules runs no dh sequence; 5 I/O error (DIR missing), dpkg-source failed or missing; "
            "6 a directory, FIFO or device at an output's name.",
        ),
    )
    p.add_argument("dsc", metavar="PKG.dsc", help="the source package (the files it lists beside it)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="where the derived source goes (must exist)")
    p.add_argument(
        "--suffix",
        default=DEFAULT_SUFFIX,
        metavar="TEXT",
        help=f"appended to the version; it must sort above it (default: {DEFAULT_SUFFIX})",
    )
    p.add_argument(
        "--maintainer",
        metavar="'NAME <ADDRESS>'",
        help="who signs the changelog entry (default: DEBFULLNAME and DEBEMAIL, as dch takes them)",
    )
    p.add_argument(
        "--distribution",
        metavar="NAME",
        help="the entry's distribution (default: the last entry's)",
    )
    p.set_defaults(func=run)
