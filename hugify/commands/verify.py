"""``hugify verify [PATH… | --all]``: is each hugified file exactly what the signed
statement of its package says (docs/signing.md)?"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from hugify import reasons
from hugify.commands.common import add_json_option, add_policy_option, epilog, print_json, usable_policy
from hugify.exitcodes import Exit


def _installed_path(arg: str, root: Path) -> str:
    """An argument as an installed path: a file inside ROOT (by its name on this
    system) or a path as installed ("/usr/bin/foo"). On the running system,
    symbolic links are resolved (/lib -> /usr/lib, libfoo.so -> libfoo.so.1)."""
    if root == Path("/"):
        return os.path.realpath(arg)
    full = Path(os.path.abspath(arg))
    real_root = Path(os.path.abspath(root))
    if real_root != Path("/") and full.is_relative_to(real_root):
        return "/" + full.relative_to(real_root).as_posix()
    return os.path.normpath("/" + arg.lstrip("/"))


def _listed_hugified(root: Path) -> set[str]:
    """The installed paths the manifests in ROOT list (docs/manifest.md): the
    packages' and, on the running system, the rpm file triggers' discovered list.
    What `verify --all` reports as "no statement" when no statement names them."""
    from hugify import manifest

    listings = sorted((root / manifest.MANIFEST_DIR.relative_to("/")).glob("*.list"))
    discovered = manifest.discovered_list() if root == Path("/") else root / "var/lib/hugify" / manifest.DISCOVERED
    out: set[str] = set()
    for f in [*listings, discovered]:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # hugify status says which manifest cannot be read
        out |= {e.path for e in manifest.parse(text, str(f)) if (root / e.path.lstrip("/")).exists()}
    return out


def _public_keys(args: argparse.Namespace, signing_key: str, public_key: str | tuple[str, ...]) -> list[str]:
    if args.key:
        return list(args.key)
    if public_key:
        return [public_key] if isinstance(public_key, str) else list(public_key)
    # A KMS or token key reference stands for its public half too; a key file does not.
    return [signing_key] if signing_key and not signing_key.startswith("/") else []


def run(args: argparse.Namespace) -> int:
    from hugify import signing

    if bool(args.paths) == args.all:
        print("hugify: verify: name the files to check, or --all", file=sys.stderr)
        return Exit.USAGE
    root = Path(args.root)
    pol = usable_policy(args.policy, for_build=False)
    if pol is None:
        return Exit.INVALID
    installed = None
    if args.paths:
        installed = [_installed_path(p, root) for p in args.paths]
        absent = [p for p in installed if not (root / p.lstrip("/")).exists()]
        if absent:
            reasons.printed(["io-error"])
            for p in absent:
                print(f"hugify: {p}: no such file (io-error)", file=sys.stderr)
            return Exit.IO
    directory = Path(args.attestations) if args.attestations else root / signing.ATTESTATION_DIR.lstrip("/")
    keys = _public_keys(args, pol.signing("key"), pol.signing("public_key"))
    # Signatures made after the build: a package of them installs them, or they are given.
    detached = [root / signing.SIGNATURE_DIR.lstrip("/"), *(Path(d) for d in args.bundles or [])]
    try:
        attestations = signing.load_attestations(directory, signing.BundleIndex(detached))
        with tempfile.TemporaryDirectory(prefix="hugify-verify-") as tmp:
            check = signing.Verifier(keys, pol.signing("tlog_upload"), Path(tmp))
            if args.all:  # every statement's files, and the hugified files no statement names
                subjects = {p for a in attestations for p in a.subjects}
                installed = sorted(subjects | _listed_hugified(root))
            results = signing.verify(root, installed, attestations, check)
    except signing.SigningError as e:
        print(f"hugify: verify: {e}", file=sys.stderr)
        return Exit.USAGE
    except OSError as e:
        print(f"hugify: verify: {reasons.io_detail(e)}", file=sys.stderr)
        return Exit.IO
    status = signing.exit_status(results)
    if args.json:
        counts = {v.id: sum(r.verdict is v for r in results) for v in signing.Verdict}
        doc = {"files": [r.as_json() for r in results], "summary": counts, "exit_status": status}
        print_json(doc)
    else:
        for r in results:
            print(r.line())
        counts_text = ", ".join(f"{n} {v.text}" for v in signing.Verdict if (n := sum(r.verdict is v for r in results)))
        nothing = "no hugified files (no statement lists any, and no manifest)"
        print(f"hugify: verify: {counts_text or nothing}")
    return status


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="check installed hugified files against their package's signed statement",
        description="For each file: find the statement that lists it (ROOT/usr/share/hugify/attestations/"
        "*.intoto.json), check the signature of its bundle with cosign against the distribution's public key "
        "(the bundle beside it, signed in the build; else one signed after the build, `hugify sign-packages`, "
        "that signs exactly this statement: in ROOT/usr/share/hugify/signatures or a --bundles directory), "
        "check that the statement is what was signed, and compare the file's sha256 with the "
        "signed one. Verdicts and exit statuses: verified 0, no statement 10, unsigned 11, modified since "
        "signing 12, bad signature 13 (a run exits with the highest). With --all, also every hugified file "
        "the manifests in ROOT list (no statement: 10); files a statement lists but not installed (a "
        "subpackage) are reported as such and do not change the status.",
        epilog=epilog(
            (
                ("hugify verify /usr/bin/foo", "is this file what its package's signed statement says?"),
                ("hugify verify --all --bundles /srv/signatures", "every hugified file, with bundles signed later"),
            ),
            "0 verified; 2 usage or no public key; 3 unusable policy; 5 I/O error (a file given is missing); "
            "10 no statement; 11 unsigned; 12 modified since signing; 13 bad signature.",
        ),
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="installed files (or files inside --root)")
    p.add_argument(
        "--all", action="store_true", help="every file of every statement, and every hugified file the manifests list"
    )
    p.add_argument("--root", default="/", metavar="DIR", help="the system (or extracted packages) to check")
    p.add_argument(
        "--attestations", metavar="DIR", help="where the statements are (default: ROOT/usr/share/hugify/attestations)"
    )
    p.add_argument(
        "--bundles",
        action="append",
        metavar="DIR",
        help="also look here for bundles signed after the build (`hugify sign-packages` output); repeatable",
    )
    p.add_argument(
        "--key",
        action="append",
        metavar="PUB",
        help="a trusted public key (file or KMS URI); repeatable; default: the policy's signing.public_key",
    )
    add_policy_option(p)
    add_json_option(p)
    p.set_defaults(func=run)
