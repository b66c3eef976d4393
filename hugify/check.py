"""``hugify check``: is what a build hugified still hugified, after every tool that ran
after hugify? Verify-only: it reads a built tree (debian/PACKAGE, $RPM_BUILD_ROOT, an
unpacked root) or a set of built packages (.deb, .udeb, .rpm, .changes) and writes
nothing.

What the build hugified is what hugify recorded: the tree report of `hugify tree`
(given with --report, in a build), the runtime manifests under
/usr/lib/hugify/manifest.d and the statements under /usr/share/hugify/attestations
that the tree or the packages carry. For each file they name:

* its code is still on the whole huge-page windows recorded (layout-undone): a later
  tool (patchelf, dwz or eu-strip on a displaced program header table) may have
  rewritten its program headers;
* the manifest entry names the file that ships (manifest-stale): its build-id and
  span; a hugified file of the report is listed where the tree has a manifest;
* the statement names the bytes and build-id that ship (statement-stale);
* the bytes made executable that were not, as recorded, are within the policy's
  exposure_limit for the package (exposure-over-limit);
* a separate debug file of the build carries its build-id (debug-file-mismatch), when
  the build's debug files are given (--debug-root; in a set, its -dbgsym or
  -debuginfo packages);
* it is there at all (missing).

Every fact about an ELF file (its windows, its build-id) is the core's probe
(hugify._core.probe, and windows for a huge-page size); nothing about ELF is read here. A tree is read
as `hugify tree` reads one: below its root, never through a symbolic link (a path
that leads through one is refused as a whole, reason symlink).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hugify import _core, files, manifest, signing
from hugify.artefacts import Artefact
from hugify.policy import Policy
from hugify.sizes import human

#: Where the build's separate debug files are named by build-id (Debian; rpm links them).
BUILD_ID_DIR = "/usr/lib/debug/.build-id/"
_BUILD_ID_PATH = re.compile(r"\A/usr/lib/debug/\.build-id/([0-9a-f]{2})/([0-9a-f]+)\.debug\Z")
#: A report's files that hugify put on whole windows.
HUGIFIED = ("transformed", "as-is")


@dataclass(frozen=True, order=True)
class Regression:
    """One thing that is no longer as hugify left it: one line with its reason id."""

    where: str  # the package (file name) or tree
    path: str  # installed path
    reason: str
    detail: str

    def line(self, warn: bool = False) -> str:
        level = "warning: " if warn else ""
        return f"hugify: {level}{self.where}: {self.path}: {self.detail} ({self.reason})"


@dataclass
class Shipped:
    """A regular file that ships: its sha256 and the core's facts about it (None when
    it is not an ELF executable or shared object, or too damaged to read)."""

    sha256: str
    facts: _core.Probe | None
    problem: str = ""

    def at(self, huge_page: int) -> _core.Windows | None:
        """The core's facts at a huge-page size, from the one probe (no second read)."""
        return None if self.facts is None else _core.windows(self.facts, huge_page)


@dataclass
class Built:
    """What check reads of one tree, or of the packages of one statement (a Debian
    binary package; the packages of one source rpm)."""

    where: str
    #: For the policy's [packages.NAME]: the binary package (Debian), the source (rpm).
    package: str | None
    #: Installed path -> the file that ships there, None when absent; every path
    #: hugify's records name.
    shipped: dict[str, Shipped | None] = field(default_factory=dict)
    manifests: dict[str, list[manifest.Entry]] = field(default_factory=dict)
    statements: dict[str, Any] = field(default_factory=dict)
    report: list[dict[str, Any]] | None = None
    #: The build-ids the build's separate debug files carry; None: not given.
    debug_ids: set[str] | None = None


class BadInput(Exception):
    """The input is not something check can read (one line, its reason id)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


# --- what hugify recorded ---------------------------------------------------------------


def _statement(name: str, data: bytes) -> Any:
    try:
        doc = json.loads(data.decode("utf-8"))
        if doc["_type"] != signing.STATEMENT_TYPE or doc["predicateType"] != signing.PREDICATE_TYPE:
            raise ValueError("not hugify's statement type")
        return doc
    except (ValueError, KeyError, TypeError) as e:
        raise BadInput("statement-stale", f"{signing.ATTESTATION_DIR}/{name}: not a hugify statement ({e})") from None


def recorded_paths(b: Built) -> list[str]:
    """Every installed path hugify's records name, in a stable order."""
    paths: dict[str, None] = {}
    for f in b.report or []:
        if f.get("status") in HUGIFIED:
            paths.update(dict.fromkeys(f.get("paths", [])))
    for entries in b.manifests.values():
        paths.update(dict.fromkeys(e.path for e in entries))
    for doc in b.statements.values():
        paths.update(dict.fromkeys(str(s["name"]) for s in doc["subject"]))
    return sorted(paths)


# --- the checks ---------------------------------------------------------------------------


def _span_text(span: tuple[int, int] | None) -> str:
    return "no whole window" if span is None else f"{human(span[1])} of windows at offset {span[0]:#x}"


class _Checker:
    """The checks of one Built under one policy; regressions by (path, reason), the
    first found kept (a file whose layout is undone is named once)."""

    def __init__(self, b: Built, pol: Policy) -> None:
        self.b, self.pol = b, pol
        self.found: dict[tuple[str, str], Regression] = {}
        #: Hugified files that ship, with the core's facts about them now.
        self.hugified: dict[str, _core.Probe | None] = {}

    def flag(self, path: str, reason: str, detail: str) -> None:
        self.found.setdefault((path, reason), Regression(self.b.where, path, reason, detail))

    def shipped(self, path: str, record: str) -> Shipped | None:
        s = self.b.shipped.get(path)
        if s is None:
            self.flag(path, "missing", f"{record} names it, but it is not there")
        return s

    def layout(self, path: str, s: Shipped, huge_page: int, span: tuple[int, int], record: str) -> None:
        windows = s.at(huge_page)
        self.hugified[path] = s.facts
        now = windows["manifest_span"] if windows else None
        if now != span:
            why = f"not an ELF file the core can read ({s.problem})" if windows is None else _span_text(now)
            detail = f"{record} has {_span_text(span)}, the file has {why}: a tool after hugify rewrote it"
            self.flag(path, "layout-undone", detail)

    def exposure(self, path: str, exposed: int, record: str) -> None:
        if exposed > self.pol.exposure_limit:
            limit = f"{self.pol.exposure_limit} ({self.pol.where('exposure_limit')})"
            detail = f"{record} records {exposed} bytes made executable that were not; exposure_limit is {limit}"
            self.flag(path, "exposure-over-limit", detail)

    def report(self) -> None:
        for f in self.b.report or []:
            if f.get("status") not in HUGIFIED or "manifest_offset" not in f:
                continue
            span = (int(f["manifest_offset"]), int(f["manifest_size"]))
            for path in f["paths"]:
                if (s := self.shipped(path, "the tree report")) is not None:
                    self.layout(path, s, int(f["huge_page"]), span, "the tree report")
                self.exposure(path, int(f.get("exposed_bytes", 0)), "the tree report")

    def manifests(self) -> None:
        listed: set[str] = set()
        for name, entries in sorted(self.b.manifests.items()):
            record = f"manifest {name}"
            for e in entries:
                listed.add(e.path)
                if (s := self.shipped(e.path, record)) is None:
                    continue
                self.layout(e.path, s, e.huge_page, (e.offset, e.size), record)
                facts = self.hugified[e.path]
                if facts is not None and (facts["build_id"] or "-") != e.build_id:
                    detail = f"{record} names build-id {e.build_id}, the file has {facts['build_id']}"
                    self.flag(e.path, "manifest-stale", detail)
        if self.b.manifests:
            for path in sorted(set(self.hugified) - listed):
                detail = "hugify put it on whole windows, but no manifest of the package lists it"
                self.flag(path, "manifest-stale", detail)

    def statements(self) -> None:
        for name, doc in sorted(self.b.statements.items()):
            record = f"statement {name}"
            for subject in doc["subject"]:
                path, digest = str(subject["name"]), str(subject["digest"]["sha256"])
                if (s := self.shipped(path, record)) is not None and s.sha256 != digest:
                    self.flag(path, "statement-stale", f"{record} names sha256 {digest}, the file has {s.sha256}")
            for entry in doc["predicate"]["files"]:
                self.statement_entry(record, entry)

    def statement_entry(self, record: str, entry: dict[str, Any]) -> None:
        t = entry["transformed"]
        for path in entry["paths"]:
            self.exposure(path, int(t.get("exposed", {}).get("bytes", 0)), record)
            if (s := self.b.shipped.get(path)) is None:
                continue
            windows, facts = s.at(int(t["huge_page"])), s.facts
            self.hugified.setdefault(path, facts)
            if windows is None or windows["manifest_span"] is None:
                why = f"no whole {human(int(t['huge_page']))} window" if windows else "no ELF file the core reads"
                self.flag(path, "layout-undone", f"{record} says hugify transformed it; it has {why} now")
            shipped_id = entry.get("shipped", {}).get("build_id")
            if facts is not None and shipped_id and facts["build_id"] != shipped_id:
                detail = f"{record} names build-id {shipped_id}, the file has {facts['build_id']}"
                self.flag(path, "statement-stale", detail)

    def debug_files(self) -> None:
        if self.b.debug_ids is None:
            return
        for path, facts in sorted(self.hugified.items()):
            bid = facts["build_id"] if facts else None
            if bid and bid not in self.b.debug_ids:
                self.flag(path, "debug-file-mismatch", f"no debug file of the build carries its build-id {bid}")


def regressions(b: Built, pol: Policy) -> list[Regression]:
    """What no longer holds, one per file and reason, in path order. BadInput for a
    report or statement that lacks what hugify writes into one."""
    c = _Checker(b, pol)
    try:
        c.report()
        c.manifests()
        c.statements()
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput("not-a-package", f"{b.where}: a tree report or statement lacks {e}: not hugify's") from None
    c.debug_files()
    return sorted(c.found.values())


# --- a built tree ----------------------------------------------------------------------------


def _shipped_at(root: files.Directory, path: str) -> Shipped | None:
    """The file at an installed path below the root, None if absent. UnsafeFile when
    the path leads through a symbolic link or is not a regular file."""
    head, name = files.split_relative(path)
    try:
        with root.beneath(head) as d, files.open_source(d, name, step="checked") as source:
            digest = signing.file_sha256(source.fd)
            try:
                return Shipped(digest, _core.probe(source.fd))
            except _core.HugifyError as e:
                return Shipped(digest, None, f"{e.detail} ({e.reason})")
    except (FileNotFoundError, NotADirectoryError):
        return None


def _kept_files(root: files.Directory, directory: str, suffix: str) -> Iterator[tuple[str, bytes]]:
    """(name without suffix, content) of hugify's own files in a directory of the tree."""
    try:
        d = root.beneath(directory.strip("/"))
    except FileNotFoundError:
        return
    with d:
        for name in sorted(_listdir(d)):
            if name.endswith(suffix):
                with files.open_source(d, name, step="checked") as source:
                    yield name[: -len(suffix)], _read_all(source.fd)


def _listdir(d: files.Directory) -> list[str]:
    return os.listdir(d.fd)


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def debug_ids_of_tree(debug_root: Path) -> set[str]:
    """The build-ids of the separate debug files under DEBUG_ROOT/usr/lib/debug (regular
    files only: rpm's .build-id links are made later, from the same files), read by
    the core from their notes."""
    from hugify import tree

    ids: set[str] = set()
    top = debug_root / "usr/lib/debug"
    if not top.is_dir():
        return ids
    for e in tree.entries(top):
        if not e.name.endswith(".debug") or not stat.S_ISREG(e.st.st_mode):
            continue
        try:
            with files.open_source(e.directory, e.name, step="checked") as source:
                bid = _core.debug_file_build_id(source.fd)
        except _core.HugifyError:
            continue
        if bid:
            ids.add(bid)
    return ids


def read_tree(root: Path, report: Path | None, debug_root: Path | None, package: str | None) -> Built:
    """A built tree and hugify's records of it. BadInput, UnsafeFile, OSError."""
    b = Built(str(root), package)
    if report is not None:
        try:
            doc = json.loads(report.read_text(encoding="utf-8"))
            if doc.get("hugify_tree_report") != manifest.TREE_REPORT_VERSION:
                raise ValueError(f"not a report of format {manifest.TREE_REPORT_VERSION}")
            b.report = list(doc["files"])
            b.package = b.package or doc.get("package")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise BadInput("not-a-package", f"{report}: not a hugify tree report ({e})") from None
    with files.Directory.open(root, follow=True) as top:
        for name, data in _kept_files(top, str(manifest.MANIFEST_DIR), ".list"):
            b.manifests[f"{name}.list"] = manifest.parse(data.decode("utf-8", "replace"), name)
        for name, data in _kept_files(top, signing.ATTESTATION_DIR, signing.STATEMENT_SUFFIX):
            b.statements[name] = _statement(name, data)
        for path in recorded_paths(b):
            b.shipped[path] = _shipped_at(top, path)
    if debug_root is not None:
        b.debug_ids = debug_ids_of_tree(debug_root)
    return b


# --- built packages ---------------------------------------------------------------------------


def _probe_copy(copy: Path | None) -> tuple[_core.Probe | None, str]:
    if copy is None:
        return None, "not an ELF file"
    try:
        return _core.probe(copy), ""
    except _core.HugifyError as e:
        return None, f"{e.detail} ({e.reason})"


def debug_ids_of_packages(artefacts: Iterable[Artefact]) -> set[str] | None:
    """The build-ids whose debug file a package of the set installs under
    /usr/lib/debug/.build-id (a file in a -dbgsym, a link in a -debuginfo); None when
    no package of the set has one."""
    ids = {m[1] + m[2] for art in artefacts for p in [*art.files, *art.links] if (m := _BUILD_ID_PATH.match(p))}
    return ids or None


def read_packages(artefacts: list[Artefact]) -> list[Built]:
    """The set, one Built per statement's scope: a Debian binary package, or the
    packages of one source rpm; only those with hugify's records."""
    debug = debug_ids_of_packages(artefacts)
    groups: dict[tuple[str, str], list[Artefact]] = {}
    for art in artefacts:
        groups.setdefault((art.format, art.name if art.format == "deb" else art.built_from), []).append(art)
    out = []
    for (fmt, _), arts in sorted(groups.items()):
        b = Built(", ".join(a.path.name for a in arts), arts[0].name if fmt == "deb" else arts[0].source)
        b.debug_ids = debug
        members = {p: m for a in arts for p, m in a.files.items()}
        for a in arts:
            for name, data in a.kept(str(manifest.MANIFEST_DIR), ".list").items():
                b.manifests[f"{name}.list"] = manifest.parse(data.decode("utf-8", "replace"), name)
            for name, data in a.kept(signing.ATTESTATION_DIR, signing.STATEMENT_SUFFIX).items():
                b.statements[name] = _statement(name, data)
        if not b.manifests and not b.statements:
            continue
        for path in recorded_paths(b):
            m = members.get(path)
            if m is None:
                b.shipped[path] = None
                continue
            facts, problem = _probe_copy(m.copy)
            b.shipped[path] = Shipped(m.sha256, facts, problem)
        out.append(b)
    return out
