"""``hugify sign-packages``: hugify's statements signed after the build, outside it
(docs/signing.md, "The recommended setup: sign after the build").

The build ships each package's statement unsigned (``signing.mode = "off"``, the
default): it is a pure function of the build, so the package stays reproducible, and
no key enters the build, where every upstream build system and test suite could read
it. Afterwards, where the package's build never ran (a signing service), each
statement is read from the package that carries it and checked against the packages
it came with, read by hugify.artefacts: every file it lists is a regular file of the
carrying package (rpm: of a package built from the same source rpm, since one
statement covers the whole source package) with the listed SHA-256, hugified by its
program headers (the core's probe, at the huge-page size the statement names), and in
the package's manifest when the set ships one; it names the package and its
architecture. Then cosign signs the statement's exact bytes, and the bundle is written
beside the packages, which stay byte-identical: ``PACKAGE_VERSION_ARCH.bundle`` (rpm:
``N-V-R.A.bundle``), the statement's copy beside it. `hugify verify` finds it by the
statement it signs (hugify.signing.BundleIndex).

Nothing is written unless every statement of the set passed and was signed.
"""

from __future__ import annotations

import errno
import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hugify import _core, manifest, signing
from hugify.artefacts import Artefact, Member, changes_files, read_artefact
from hugify.files import source_date_epoch, write_text_atomic
from hugify.policy import Policy
from hugify.reasons import ReasonError


@dataclass
class Options:
    #: .changes files, .deb/.udeb and .rpm packages.
    inputs: list[Path]
    #: Where the bundles go; None: beside each package.
    outdir: Path | None
    key: str
    key_where: str
    tlog_upload: bool
    policy: Policy


@dataclass
class Checked:
    """A statement that describes the packages it came with, ready to be signed."""

    artefact: Artefact  # the package carrying it
    name: str  # its installed name, NAME of NAME.intoto.json
    text: str
    files: int
    subjects: set[str]
    #: (package file, installed path) of each file it covers.
    held: set[tuple[Path, str]]


def run(opts: Options, say: Callable[[str], None]) -> list[Path]:
    """Checks and signs every statement of the packages given; the files written.
    ReasonError for the first package or statement that fails, before anything is
    written; OSError."""
    if not opts.key:
        raise ReasonError(
            "signing-failed", "no signing key: pass --key, or set signing.key or $HUGIFY_SIGNING_KEY on this host"
        )
    with tempfile.TemporaryDirectory(prefix="hugify-sign-packages-") as spool:
        artefacts = [read_artefact(p, Path(spool)) for p in packages_of(opts.inputs)]
        checked = check(artefacts, opts.policy, say)
    prefixes = [(opts.outdir or c.artefact.path.parent) / c.artefact.stem for c in checked]
    twice = sorted({str(p) for p in prefixes if prefixes.count(p) > 1})
    if twice:
        raise ReasonError("not-a-package", f"two packages of one name would be signed into {', '.join(twice)}.*")
    if opts.outdir is not None and not opts.outdir.is_dir():
        # Before anything is signed (a transparency log keeps what is uploaded); as
        # for every output of hugify, the directory is the caller's to make.
        raise FileNotFoundError(errno.ENOENT, "no such directory for the bundles", str(opts.outdir))
    bundles = []
    for c in checked:
        try:
            bundles.append(signing.attest_text(c.text, opts.key, opts.tlog_upload))
        except signing.SigningError as e:
            raise ReasonError("signing-failed", f"{c.artefact.path}: statement {c.name}: {e}") from None
        tlog = "uploaded to the transparency log" if opts.tlog_upload else "no transparency log"
        say(
            f"hugify: {c.artefact.path.name}: statement {c.name} of {c.files} file(s), {len(c.subjects)} name(s), "
            f"checked against the packages: signed with {signing.redact(opts.key)} ({opts.key_where}; {tlog})"
        )
    written = []
    epoch = source_date_epoch()
    for c, bundle, prefix in zip(checked, bundles, prefixes, strict=True):
        for suffix, text in ((signing.STATEMENT_SUFFIX, c.text), (signing.BUNDLE_SUFFIX, bundle)):
            path = prefix.with_name(prefix.name + suffix)
            write_text_atomic(path, text, epoch)
            say(f"hugify: wrote {path}")
            written.append(path)
    return written


def packages_of(inputs: Iterable[Path]) -> list[Path]:
    """The packages named, a .changes file standing for the packages it lists (checked
    against its checksums); each once."""
    out: dict[Path, None] = {}
    for p in inputs:
        for pkg in changes_files(p) if p.name.endswith(".changes") else [p]:
            out.setdefault(pkg.resolve(), None)
    return list(out)


def check(artefacts: list[Artefact], pol: Policy, say: Callable[[str], None]) -> list[Checked]:
    """The statements of the set, each checked against the packages; ReasonError
    statement-mismatch for one that does not describe them, statement-missing when
    hugified files ship and no package carries a statement."""
    checked: list[Checked] = []
    for art in artefacts:
        statements = art.kept(signing.ATTESTATION_DIR, signing.STATEMENT_SUFFIX)
        if len(statements) > 1:
            raise _mismatch(art, f"it carries {len(statements)} statements ({', '.join(statements)}), not its own one")
        for name, data in statements.items():
            checked.append(_check(art, name, data, _siblings(art, artefacts), pol))
    covered = {held for c in checked for held in c.held}
    uncovered = {art.path: [p for p in _hugified(art, pol) if (art.path, p) not in covered] for art in artefacts}
    if not checked and any(uncovered.values()):
        where = "; ".join(f"{a.name}: {', '.join(ps)}" for a, ps in uncovered.items() if ps)
        raise ReasonError("statement-missing", f"hugified files ship, but no package given has a statement: {where}")
    for art in artefacts:
        for p in uncovered[art.path]:
            say(
                f"hugify: warning: {art.path.name}: {p} is hugified but in no statement: left as it was "
                "(as-is), or its build made no statement; nothing vouches for it"
            )
        if not art.kept(signing.ATTESTATION_DIR, signing.STATEMENT_SUFFIX) and not uncovered[art.path]:
            say(f"hugify: {art.path.name}: no statement, nothing hugified in it")
    return checked


def _siblings(art: Artefact, artefacts: list[Artefact]) -> list[Artefact]:
    """The packages a statement of `art` may describe: itself, and for an rpm those
    built from the same source rpm (one statement covers the source package)."""
    if art.format != "rpm":
        return [art]
    same = [a for a in artefacts if a.format == "rpm" and a.built_from == art.built_from and a is not art]
    return [art, *same]


def _mismatch(art: Artefact, detail: str) -> ReasonError:
    return ReasonError("statement-mismatch", f"{art.path}: {detail}")


def _check(art: Artefact, name: str, data: bytes, siblings: list[Artefact], pol: Policy) -> Checked:
    where = f"{signing.ATTESTATION_DIR}/{name}{signing.STATEMENT_SUFFIX}"
    try:
        text = data.decode("utf-8")
        doc = json.loads(text)
        if doc["_type"] != signing.STATEMENT_TYPE or doc["predicateType"] != signing.PREDICATE_TYPE:
            raise ValueError("not hugify's statement type")
        subjects = {str(s["name"]): str(s["digest"]["sha256"]) for s in doc["subject"]}
        pred: dict[str, Any] = doc["predicate"]
        package, arch = str(pred["package"]), pred.get("arch")
        huge_pages = {str(p): int(e["transformed"]["huge_page"]) for e in pred["files"] for p in e["paths"]}
    except (ValueError, KeyError, TypeError) as e:
        raise _mismatch(art, f"{where} is not a hugify statement ({e})") from None
    owner = art.name if art.format == "deb" else art.source
    if package != owner:
        raise _mismatch(art, f"{where} is the statement of {package}, not of {owner}")
    if name != package and not (art.multi_arch_same and name == f"{package}:{art.arch}"):
        raise _mismatch(art, f"{where} is not named after its package {package}")
    if not subjects:
        raise _mismatch(art, f"{where} lists no file")
    manifests = {e.path for a in siblings for listing in _manifests(a) for e in manifest.parse(listing)}
    has_manifest = any(_manifests(a) for a in siblings)
    held = set()
    for path, digest in sorted(subjects.items()):
        holder = next((a for a in siblings if path in a.files), None)
        if holder is None:
            raise _mismatch(art, f"{where} lists {path}, which no package given holds (give all of the build's)")
        member = holder.files[path]
        if member.sha256 != digest:
            raise _mismatch(art, f"{where} lists {path} with SHA-256 {digest}; {holder.path.name} has {member.sha256}")
        if arch is not None and _core.canonical_arch(holder.arch) != _core.canonical_arch(str(arch)):
            raise _mismatch(art, f"{where} is for {arch}; {path} is in {holder.path.name}, for {holder.arch}")
        if path not in huge_pages:
            raise _mismatch(art, f"{where} lists {path} as a subject but describes no such file")
        if not _windows(member, huge_pages[path]):
            raise _mismatch(art, f"{where} lists {path}, which is not hugified by its program headers")
        if has_manifest and path not in manifests:
            raise _mismatch(art, f"{where} lists {path}, which the packages' runtime manifest does not")
        held.add((holder.path, path))
    return Checked(art, name, text, len(pred["files"]), set(subjects), held)


def _manifests(art: Artefact) -> list[str]:
    return [d.decode("utf-8", "replace") for d in art.kept(str(manifest.MANIFEST_DIR), ".list").values()]


def _windows(member: Member, huge_page: int) -> bool:
    """Whether the core finds the file's code on whole huge-page windows (the
    manifest's rule, docs/manifest.md)."""
    if member.copy is None:
        return False
    try:
        found = _core.probe(member.copy)
    except (_core.HugifyError, OSError):
        return False
    return found is not None and _core.windows(found, huge_page)["manifest_span"] is not None


def _hugified(art: Artefact, pol: Policy) -> list[str]:
    """The package's hugified files: listed in its manifest, or hugified by their
    program headers at the policy's huge-page size for their architecture."""
    out = {e.path for text in _manifests(art) for e in manifest.parse(text) if e.path in art.files}
    for path, member in art.files.items():
        if member.copy is None or path in out:
            continue
        try:
            found = _core.probe(member.copy)
        except (_core.HugifyError, OSError):
            continue
        huge_page = pol.huge_page(found["arch"]) if found and found["arch"] else None
        # The policy's page size for its architecture, from the probe's loads.
        if found and huge_page and _core.windows(found, huge_page)["manifest_span"] is not None:
            out.add(path)
    return sorted(out)
