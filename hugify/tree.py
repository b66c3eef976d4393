"""``hugify tree``: the buildroot walker that the rpm and debhelper steps call.

It selects ELF executables and shared objects by their header (never by name or
mode bits), applies the policy, transforms each inode once, in parallel and in
place, and keeps what the build put there: owner, mode (setuid/setgid too),
extended attributes (``security.capability`` too), timestamps (clamped to
``SOURCE_DATE_EPOCH`` when set), and hardlinks (every name is re-linked to the new
inode). Symlinks are never followed or touched, nor is anything under
``/usr/lib/debug``. A file that fails is logged and left byte-identical; it never
stops the others. The policy's ``on_error`` decides the exit status.

The tree may be hostile (hugify runs as root in package builds whose files the
build, that is upstream's code, made): it is walked with directory descriptors,
each directory opened relative to its parent with O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK
(a symlink, a FIFO or a device node swapped in for one is never opened), and every
file is opened and replaced relative to its directory (hugify/files.py).
FIFOs, device nodes and sockets are never opened and are skipped with reason
not-regular; a file with hard links outside the tree is skipped (outside-links);
a file swapped while hugify works on it is left alone (changed-meanwhile).

A file whose code already lies on whole huge-page windows (a non-PIE executable
with congruent offsets, a file linked or transformed that way) needs no rewrite:
it is listed in the manifest as it is (status ``as-is``), so that the runtime
loads it as huge pages too.

Outputs: a brp-style log on stdout (one line per ELF file, in path order, then a
summary), the package manifest (docs/manifest.md) and a JSON report. Every reason
id they carry is in the core's one table (`hugify explain`). Files signed with
IMA/EVM attributes are refused (signed-file) unless the policy or
--drop-stale-signatures drops the signature; the summary counts both cases.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NotRequired, TextIO, TypedDict, cast

from hugify import _core, files, manifest, reasons, render, signing
from hugify.exitcodes import Exit
from hugify.files import source_date_epoch, write_text_atomic
from hugify.policy import Policy, canonical_arch
from hugify.rewrite import Settings, replace
from hugify.sizes import human

if TYPE_CHECKING:
    from hugify.rewrite import Rewritten

#: Installed trees that are never walked: separate debug files describe code, they
#: are not code, and debug tools rely on their layout matching the file they describe.
PRUNED = ("/usr/lib/debug",)


def _unprobed(problem: _core.Refusal | None) -> _core.Probe:
    """The facts of a file the core could not (or was not asked to) read."""
    return {
        "arch": None,
        "is64": False,
        "kind": None,
        "has_symtab": None,
        "build_id": None,
        "exec_load": None,
        "code_size": 0,
        "loads": [],
        "fixed": False,
        "problem": problem,
    }


def probe(directory: files.Directory, name: str) -> _core.Probe | None:
    """The core's header facts of the ELF executable or shared object `name` in
    `directory`, read through one descriptor opened without following a symlink;
    None for any other file. A file that has the ELF magic but is too damaged to
    tell its type, or that cannot be read, is a candidate too (its problem set), so
    that it is reported rather than silently passed over; so is one whose probe hit
    a bug in the core (a caught panic, reason `internal`): one file's bug must not
    stop the walk."""
    try:
        with files.open_source(directory, name, step="probed") as source:
            return _core.probe(source.fd)
    except files.UnsafeFile as e:
        problem: _core.Refusal = {"reason": e.reason, "kind": "unsafe", "detail": e.detail}
    except OSError as e:
        detail = f"{directory.join(name)}: {reasons.io_detail(e, with_file=False)}"
        problem = {"reason": "io-error", "kind": "io", "detail": detail}
    except _core.HugifyError as e:
        problem = {"reason": e.reason, "kind": e.kind, "detail": e.detail}
    return _unprobed(problem)


# --- walking -----------------------------------------------------------------------


class Candidate(NamedTuple):
    """One inode to consider, with all its names in the tree (in walk order)."""

    paths: list[str]
    files: list[Path]
    probe: _core.Probe
    st: os.stat_result
    #: (reason, detail) when it must be left alone whatever the policy says: not a
    #: regular file, or hard links outside the tree.
    refusal: tuple[str, str] | None = None


class Entry(NamedTuple):
    """A name in the tree that is neither a directory nor a symbolic link."""

    rel: str  # "/"-separated, relative to the root
    name: str
    directory: files.Directory  # valid during the walk only
    st: os.stat_result  # of the name itself (lstat)


def entries(root: Path) -> Iterator[Entry]:
    """Every file under root but directories and symbolic links, in a stable order:
    a directory's files by name, then its subdirectories by name, each walked whole.
    Walked with directory descriptors (`files.Directory.subdirectory`): a symbolic
    link is never followed, a directory swapped for a link, a FIFO or a device node is
    neither opened nor entered, pruned trees are skipped."""
    with files.Directory.open(root, follow=True) as top:
        yield from _entries_in(top, "")


def _entries_in(directory: files.Directory, prefix: str) -> Iterator[Entry]:
    """The entries of `directory` (whose path below the root is `prefix`) and below.
    The listing's file types only sort names into files and subdirectories; what a
    name is when it is used is looked at again (fstatat, or opening it as a directory
    without following it)."""
    with os.scandir(directory.fd) as listing:
        listed = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in listing)
    for name, _ in (n for n in listed if not n[1]):
        try:
            st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
        except OSError:
            continue
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            yield Entry(prefix + name, name, directory, st)
    for name, _ in (n for n in listed if n[1] and "/" + prefix + n[0] not in PRUNED):
        try:
            sub = directory.subdirectory(name)
        except OSError:  # gone, or no longer a directory: nothing to walk there
            continue
        with sub:
            yield from _entries_in(sub, prefix + name + "/")


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular files under root, in a stable order; symlinks and pruned trees skipped."""
    for e in entries(root):
        if stat.S_ISREG(e.st.st_mode):
            yield root / e.rel, e.st


def candidates(root: Path) -> list[Candidate]:
    """The ELF executables and shared objects under root, one per inode, and the
    FIFOs, device nodes and sockets (refused: not-regular). An ELF file with more
    hard links than names in the tree is refused (outside-links): replacing the
    names inside would part them from the others."""
    by_inode: dict[tuple[int, int], Candidate] = {}
    for e in entries(root):
        key, path = files.identity(e.st), "/" + e.rel
        if key in by_inode:
            by_inode[key].paths.append(path)
            by_inode[key].files.append(root / e.rel)
            continue
        if not stat.S_ISREG(e.st.st_mode):
            what = f"{files.describe(e.st.st_mode)}, not a regular file; hugify never opens one"
            by_inode[key] = Candidate([path], [root / e.rel], _unprobed(None), e.st, ("not-regular", what))
            continue
        found = probe(e.directory, e.name)
        if found is not None:
            by_inode[key] = Candidate([path], [root / e.rel], found, e.st)
    return sorted((_linked_outside(c) for c in by_inode.values()), key=lambda c: c.paths[0])


def _linked_outside(c: Candidate) -> Candidate:
    """The candidate, refused when its inode has more names than the tree holds."""
    outside = c.st.st_nlink - len(c.paths)
    if c.refusal is not None or outside <= 0:
        return c
    n = f"{outside} hard link{'s' if outside > 1 else ''}"
    return c._replace(refusal=("outside-links", f"{n} outside the tree; replacing it would part them from it"))


# --- outcomes ----------------------------------------------------------------------


STATUSES = ("transformed", "as-is", "skipped", "failed")


class FileReport(TypedDict):
    """One inode's entry in the tree report (`--report`; its manifest fields:
    docs/manifest.md)."""

    path: str  # its first name
    paths: list[str]
    status: str  # transformed | as-is | skipped | failed
    reason: str | None
    detail: str
    # When the file goes into the manifest, its entry there (the manifest span: from
    # the first whole huge-page window of its code to the end of the last):
    build_id: NotRequired[str]
    manifest_offset: NotRequired[int]
    manifest_size: NotRequired[int]
    huge_page: NotRequired[int]
    # When it was transformed:
    mode: NotRequired[str]
    dv: NotRequired[int]
    df: NotRequired[int]
    growth: NotRequired[int]
    code_bytes: NotRequired[int]
    covered_code: NotRequired[int]
    coverage: NotRequired[float]
    #: Bytes made executable that were not (policy exposure_limit), and where they lie.
    exposed_bytes: NotRequired[int]
    exposed_sections: NotRequired[dict[str, int]]
    #: The largest base page size it was transformed to run with (policy page_size),
    #: and the page its exposure was measured in.
    page_size: NotRequired[int]
    page: NotRequired[int]
    #: The program header table left e_phoff for a gap between sections (dwz and
    #: eu-strip zero it there): a distribution must be able to find such files.
    phdr_table_displaced: NotRequired[bool]
    build_id_before: NotRequired[str | None]
    build_id_after: NotRequired[str | None]
    sha256_before: NotRequired[str | None]
    dropped_signatures: NotRequired[list[str]]


Summary = TypedDict(
    "Summary",
    {
        "transformed": int,
        "as-is": int,
        "skipped": int,
        "failed": int,
        "signed_refused": int,
        "signatures_dropped": int,
        "on_error": str,
        "exit_status": int,
    },
)


class Report(TypedDict):
    """What `hugify tree --report` writes, and what repack and signing read back."""

    hugify_tree_report: int  # the format's version: manifest.TREE_REPORT_VERSION
    hugify_version: str
    package: str | None
    arch: str | None
    enabled: bool
    manifest_only: bool
    policy: dict[str, Any]
    policy_digest: str
    files: list[FileReport]
    summary: Summary


def read_report(path: Path) -> Report:
    """A report `hugify tree` wrote (this version's: written and read by one hugify)."""
    return cast(Report, json.loads(path.read_text(encoding="utf-8")))


class Outcome(NamedTuple):
    paths: list[str]
    status: str  # transformed | as-is | skipped | failed
    reason: str | None = None
    detail: str = ""
    report: Rewritten | None = None
    #: Its manifest entry (under its first name) when the file goes into the manifest.
    entry: manifest.Entry | None = None
    #: sha256 (hex) of the file before it was transformed, for the signed statement.
    sha256_before: str | None = None

    def as_json(self) -> FileReport:
        out: FileReport = {
            "path": self.paths[0],
            "paths": self.paths,
            "status": self.status,
            "reason": self.reason,
            "detail": self.detail,
        }
        if self.entry:
            e = self.entry
            out.update(
                {"build_id": e.build_id, "manifest_offset": e.offset, "manifest_size": e.size, "huge_page": e.huge_page}
            )
        if self.report:
            res = self.report["result"]
            code = self.report["code_bytes"]
            out.update(
                {
                    "mode": res["mode"],
                    "dv": res["dv"],
                    "df": res["df"],
                    "growth": res["growth"],
                    "code_bytes": code,
                    "covered_code": res["covered_code"],
                    "coverage": round(res["covered_code"] / code, 4) if code else 0.0,
                    "exposed_bytes": res["exposed_read_only"],
                    "exposed_sections": res["exposed_sections"],
                    "page_size": self.report["page_size"],
                    "page": self.report["page"],
                    "phdr_table_displaced": res["phdr_table_displaced"],
                    "huge_page": self.report["huge_page"],
                    "build_id_before": self.report["build_id"],
                    "build_id_after": res["build_id"],
                    "sha256_before": self.sha256_before,
                }
            )
            if self.report.get("dropped_signatures"):
                out["dropped_signatures"] = self.report["dropped_signatures"]
        return out


# --- the work on one inode -----------------------------------------------------------


class Job(NamedTuple):
    candidate: Candidate
    settings: Settings
    manifest_only: bool
    refuse_stripped: str | None  # where the policy says so, or None
    epoch: int | None  # SOURCE_DATE_EPOCH
    drop_signatures: bool = False
    #: The tree's root, open: every file is reached below it, never through a symlink.
    root: files.Directory | None = None
    #: fsync each replaced file and its directory (a live system's files).
    durable: bool = False


def _clamped(ns: int, epoch: int | None) -> int:
    return ns if epoch is None else min(ns, epoch * 1_000_000_000)


def _entry(path: str, p: _core.Probe | None, huge_page: int, threshold: int) -> manifest.Entry | None:
    """The manifest entry of a probed file, if its code has whole windows of
    `huge_page` (core/src/windows.rs) and its executable segment is over the threshold."""
    if not p or not p["exec_load"] or p["exec_load"]["memsz"] < threshold:
        return None
    return manifest.Entry.of(path, p, _core.windows(p, huge_page))


def _below(root: files.Directory, installed: str) -> tuple[files.Directory, str]:
    """The directory of an installed path, opened below the root without following
    a symlink, and the file's name in it."""
    head, name = files.split_relative(installed)
    return root.beneath(head), name


def _as_is(job: Job, skip: tuple[str, str] | None) -> Outcome:
    """Lists a file whose code already lies on whole huge-page windows (an ET_EXEC
    with congruent offsets, a file already aligned) in the manifest without a
    rewrite; otherwise skips it."""
    c, s = job.candidate, job.settings
    try:
        # Unchanged since the walk probed it: the windows at the policy's page size
        # come from the loads it read, not from reading the file again.
        known: _core.Windows | None = _core.windows(c.probe, s.huge_page)
        entry = _entry(c.paths[0], c.probe, s.huge_page, s.threshold)
    except (_core.HugifyError, OSError):
        known, entry = None, None
    if entry:
        reason = skip[0] if skip else None
        detail = f"{human(entry.size)} of its code on whole huge-page windows as it is"
        return Outcome(c.paths, "as-is", reason, detail, entry=entry)
    if skip:
        return Outcome(c.paths, "skipped", *skip)
    x = c.probe["exec_load"]
    if known and x and known["manifest_span"]:
        # Windows it has, but too little code for the threshold: say that, not "no window".
        code = human(x["memsz"])
        return Outcome(
            c.paths, "skipped", "below-threshold", f"its code ({code}) is under the threshold ({human(s.threshold)})"
        )
    return Outcome(c.paths, "skipped", "not-aligned", "no whole huge-page window at an offset congruent to its address")


def _times(st: os.stat_result, epoch: int | None) -> tuple[int, int]:
    """The times a replaced file keeps: its own, clamped to SOURCE_DATE_EPOCH when
    it is newer than that."""
    if epoch is not None and st.st_mtime_ns > epoch * 1_000_000_000:
        return _clamped(st.st_atime_ns, epoch), _clamped(st.st_mtime_ns, epoch)
    return st.st_atime_ns, st.st_mtime_ns


def _transform(job: Job, root: files.Directory) -> Outcome:
    """Replaces the inode's first name with the transformed file, then points its
    other names at the new inode."""
    c, s = job.candidate, job.settings
    d, name = _below(root, c.paths[0])
    with d:
        try:
            with files.open_source(d, name, expect=files.identity(c.st)) as source:
                before = signing.file_sha256(source.fd)
                report, new = replace(
                    source,
                    d,
                    name,
                    s,
                    in_place=True,
                    times=_times(c.st, job.epoch),
                    drop_signatures=job.drop_signatures,
                    durable=job.durable,
                )
        except files.UnsafeFile as e:
            return Outcome(c.paths, "failed", e.reason, e.detail)
        except _core.HugifyError as e:
            if e.kind == "refused":
                return _as_is(job, (e.reason, e.detail))
            return Outcome(c.paths, "failed", e.reason, e.detail)
        except OSError as e:
            return Outcome(c.paths, "failed", "io-error", reasons.io_detail(e))
        try:
            with files.open_source(d, name, expect=new) as written:  # the file written, not the plan
                entry = _entry(c.paths[0], _core.probe(written.fd), s.huge_page, 0)
            for other in c.paths[1:]:
                od, oname = _below(root, other)
                with od:
                    files.link_replace(d, name, new, od, oname, replacing=files.identity(c.st))
        except OSError as e:
            why = f"{e.detail} ({e.reason})" if isinstance(e, files.UnsafeFile) else reasons.io_detail(e)
            detail = f"transformed {c.paths[0]}, but re-linking its other names failed: {why}"
            reason = e.reason if isinstance(e, files.UnsafeFile) else "io-error"
            return Outcome(c.paths, "failed", reason, detail, report, None, before)
    return Outcome(c.paths, "transformed", report=report, entry=entry, sha256_before=before)


def process(job: Job) -> Outcome:
    """Transforms one inode in place (or lists it). Never raises."""
    c = job.candidate
    try:
        if job.manifest_only:
            return _as_is(job, None)
        if job.refuse_stripped and c.probe["has_symtab"] is False:
            why = "no symbol table, so references to the ELF header cannot be ruled out by name"
            return _as_is(job, ("stripped", f"{why} (refuse_stripped = true, {job.refuse_stripped})"))
        assert job.root is not None
        return _transform(job, job.root)
    except files.UnsafeFile as e:  # a directory on its way was swapped for a symlink
        return Outcome(c.paths, "failed", e.reason, e.detail)
    except OSError as e:
        return Outcome(c.paths, "failed", "io-error", reasons.io_detail(e))
    except Exception as e:  # a bug must not stop the other files
        return Outcome(c.paths, "failed", "internal", f"{type(e).__name__}: {e}")


# --- the whole run -----------------------------------------------------------------


class Options(NamedTuple):
    root: Path
    policy: Policy
    jobs: int = 1
    arch: str | None = None
    exclude_regexes: tuple[re.Pattern[str], ...] = ()
    manifest: Path | None = None
    report: Path | None = None
    manifest_only: bool = False
    out: TextIO | None = None  # the log; None: standard output
    progress: bool = False
    #: --drop-stale-signatures: over the policy's ima_signatures.
    drop_signatures: bool = False
    #: The root's candidates when the caller has walked it already (repack keeps
    #: their originals first); None: walk it here.
    found: list[Candidate] | None = None
    #: fsync each replaced file before and its directory after the rename (for a
    #: live system's files: `--allow-live-root` on the running root).
    durable: bool = False


def decide(c: Candidate, opts: Options) -> Settings | Outcome:
    """What to do with a candidate: the settings to transform it with, or why not."""
    pol = opts.policy
    if c.refusal:
        return Outcome(c.paths, "skipped", *c.refusal)
    for path in c.paths:
        why = pol.excluded_by(path)
        if why is None:
            why = next(
                (f"matches --exclude-regex {rx.pattern!r}" for rx in opts.exclude_regexes if rx.search(path)), None
            )
        if why:
            return Outcome(c.paths, "skipped", "excluded", f"{path} {why}" if path != c.paths[0] else why)
    arch = c.probe["arch"]
    if arch is None and c.probe["problem"]:
        # Too damaged to tell its architecture: the rewriter says what is wrong with it.
        return Settings(threshold=pol.threshold, mode=pol.mode, exposure_limit=pol.exposure_limit)
    if arch is None:
        return Outcome(c.paths, "skipped", "unsupported-arch", "an architecture hugify has no name for")
    build = canonical_arch(opts.arch) if opts.arch else None
    if opts.arch and build != arch:
        return Outcome(c.paths, "skipped", "foreign-arch", f"{arch} file in a {opts.arch} package")
    hp = pol.huge_page(arch)
    if hp is None:
        return Outcome(c.paths, "skipped", "unsupported-arch", f"the policy has no huge_page_size for {arch}")
    return Settings(hp, pol.threshold, pol.mode, pol.exposure_limit, pol.page_size(arch))


class _Progress:
    """A one-line status display on stderr, for terminals only."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.lock = threading.Lock()

    def tick(self, path: str) -> None:
        with self.lock:
            self.done += 1
            if self.enabled:
                sys.stderr.write(f"\r\x1b[Khugify: [{self.done}/{self.total}] {path}")
                sys.stderr.flush()

    def print(self, out: TextIO, line: str) -> None:
        with self.lock:
            if self.enabled:
                sys.stderr.write("\r\x1b[K")
                sys.stderr.flush()
            print(line, file=out, flush=True)

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def log_line(o: Outcome, on_error: str) -> str:
    path = o.paths[0]
    also = f" (also: {', '.join(o.paths[1:])})" if len(o.paths) > 1 else ""
    if o.status == "transformed":
        assert o.report is not None
        return f"hugify: {render.transform_line(path, o.report)}{also}"
    if o.status == "as-is":
        why = f" ({o.reason})" if o.reason else ""
        return f"hugify: {path}: as-is{why}: {o.detail}, listed in the manifest without a rewrite{also}"
    if o.status == "skipped":
        return f"hugify: {path}: skipped ({o.reason}): {o.detail}{also}"
    level = "error" if on_error == "fail" else "warning"
    return f"hugify: {level}: {path}: not transformed ({o.reason}): {o.detail}; the file is unchanged{also}"


def execute(
    jobs: list[Job | Outcome],
    workers: int,
    on_done: Callable[[Outcome], None],
    tick: Callable[[Outcome], None] = lambda o: None,
) -> list[Outcome]:
    """Runs the jobs in a thread pool (the core releases the GIL). `tick` sees each
    outcome as soon as it is ready (from a worker thread); `on_done` sees them in the
    order of `jobs`, each once it and all before it are done."""
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures: list[Future[Outcome] | Outcome] = []
        for j in jobs:
            if isinstance(j, Job):
                fut = pool.submit(process, j)
                fut.add_done_callback(lambda f: tick(f.result()))
                futures.append(fut)
            else:
                futures.append(j)
        for f in futures:
            o = f.result() if isinstance(f, Future) else f
            outcomes.append(o)
            on_done(o)
    return outcomes


def _walk_and_transform(opts: Options, out: TextIO, epoch: int | None) -> list[Outcome]:
    pol = opts.policy
    found = candidates(opts.root) if opts.found is None else opts.found
    stripped_rule = pol.where("refuse_stripped") if pol.refuse_stripped else None
    drop = opts.drop_signatures or pol.drop_signatures
    with files.Directory.open(opts.root, follow=True) as root:
        jobs: list[Job | Outcome] = []
        for c in found:
            decision = decide(c, opts)
            if isinstance(decision, Outcome):
                jobs.append(decision)
            else:
                jobs.append(Job(c, decision, opts.manifest_only, stripped_rule, epoch, drop, root, opts.durable))
        dirs = _directory_times(root, {files.split_relative(p)[0] for c in found for p in c.paths})
        progress = _Progress(sum(isinstance(j, Job) for j in jobs), opts.progress)

        def log(o: Outcome) -> None:
            if not opts.manifest_only:
                progress.print(out, log_line(o, pol.on_error))

        outcomes = execute(jobs, opts.jobs, log, lambda o: progress.tick(o.paths[0]))
        progress.clear()
        _restore_directory_times(root, dirs, epoch)
    return outcomes


def _directory_times(root: files.Directory, rels: set[str]) -> dict[str, os.stat_result]:
    """The status of each directory (below the root, none through a symlink)."""
    times = {}
    for rel in sorted(rels):
        try:
            with root.beneath(rel) as d:
                times[rel] = os.fstat(d.fd)
        except OSError:
            continue
    return times


def _restore_directory_times(root: files.Directory, before: dict[str, os.stat_result], epoch: int | None) -> None:
    """Replacing (or trying to replace) a file changes its directory's times: put
    them back, through each directory's descriptor."""
    for rel, st in before.items():
        try:
            with root.beneath(rel) as d:
                now = os.fstat(d.fd)
                if files.identity(now) == files.identity(st) and now.st_mtime_ns != st.st_mtime_ns:
                    os.utime(d.fd, ns=(_clamped(st.st_atime_ns, epoch), _clamped(st.st_mtime_ns, epoch)))
        except OSError:
            continue


def run(opts: Options) -> Exit:
    """Walks, transforms, writes the manifest and the report, logs; the exit status."""
    pol, epoch, out = opts.policy, source_date_epoch(), opts.out or sys.stdout
    outcomes: list[Outcome] = []
    if pol.enabled:
        outcomes = _walk_and_transform(opts, out, epoch)
    else:
        print(f"hugify: disabled by the policy (enabled = false, {pol.where('enabled')}); nothing changed", file=out)
    entries = [
        dataclasses.replace(o.entry, path=p)
        for o in outcomes
        if o.entry
        for p in o.paths
        if "\t" not in p and "\n" not in p  # not representable in a manifest
    ]
    reasons.printed(o.reason for o in outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    code = Exit.FAILED if failed and pol.on_error == "fail" else Exit.OK
    try:
        if opts.manifest:
            write_text_atomic(opts.manifest, manifest.render(entries), epoch, tree=opts.root)
        if opts.report:
            write_text_atomic(opts.report, _report_json(opts, outcomes, code), epoch, tree=opts.root)
    except OSError as e:  # an unsafe file's refusal too
        return reasons.say_error(e, "cannot write ")
    print(_summary(opts, outcomes, entries), file=out, flush=True)
    if failed:
        n = f"{len(failed)} file{'s' if len(failed) > 1 else ''}"
        where = pol.where("on_error")
        if code == Exit.FAILED:
            print(f'hugify: error: {n} could not be transformed and on_error = "fail" ({where})', file=out)
        else:
            print(
                f'hugify: warning: {n} could not be transformed; on_error = "warn" ({where}): the build goes on',
                file=out,
            )
    return code


def _summary(opts: Options, outcomes: list[Outcome], entries: list[manifest.Entry]) -> str:
    count = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    who = f"{opts.policy.package}: " if opts.policy.package else ""
    where = f"; manifest {opts.manifest} ({len(entries)} entries)" if opts.manifest else ""
    if opts.manifest_only:
        return f"hugify: {who}manifest only: {count['as-is']} aligned file(s) listed{where}"
    refused, dropped = _signed(outcomes)
    signed = ""
    if refused:
        signed += f"; {refused} signed with IMA/EVM attributes, left unchanged (signed-file)"
    if dropped:
        how = (
            "--drop-stale-signatures"
            if opts.drop_signatures
            else f'ima_signatures = "drop", {opts.policy.where("ima_signatures")}'
        )
        signed += f"; stale IMA/EVM signatures dropped from {dropped} ({how})"
    return (
        f"hugify: {who}{count['transformed']} transformed, {count['as-is']} as-is, "
        f"{count['skipped']} skipped, {count['failed']} failed{signed}{where}"
    )


def _signed(outcomes: list[Outcome]) -> tuple[int, int]:
    """Files refused for their IMA/EVM signature, and files whose signature was dropped."""
    refused = sum(o.reason == "signed-file" for o in outcomes)
    return refused, sum(bool(o.report and o.report.get("dropped_signatures")) for o in outcomes)


def _report_json(opts: Options, outcomes: list[Outcome], code: Exit) -> str:
    pol = opts.policy
    refused, dropped = _signed(outcomes)
    doc: Report = {
        "hugify_tree_report": manifest.TREE_REPORT_VERSION,
        "hugify_version": _core.VERSION,
        "package": pol.package,
        "arch": opts.arch,
        "enabled": pol.enabled,
        "manifest_only": opts.manifest_only,
        "policy": pol.as_json(),
        "policy_digest": pol.digest(),
        "files": [o.as_json() for o in outcomes],
        "summary": {
            "transformed": sum(o.status == "transformed" for o in outcomes),
            "as-is": sum(o.status == "as-is" for o in outcomes),
            "skipped": sum(o.status == "skipped" for o in outcomes),
            "failed": sum(o.status == "failed" for o in outcomes),
            "signed_refused": refused,
            "signatures_dropped": dropped,
            "on_error": pol.on_error,
            "exit_status": int(code),
        },
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
