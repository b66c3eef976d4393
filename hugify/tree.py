"""``hugify tree``: the buildroot walker that the rpm and debhelper steps call.

It selects ELF executables and shared objects by their header (never by name or
mode bits), applies the policy, transforms each inode once, in parallel and in
place, and keeps what the build put there: owner, mode (setuid/setgid too),
extended attributes (``security.capability`` too), timestamps (clamped to
``SOURCE_DATE_EPOCH`` when set), and hardlinks (every name is re-linked to the new
inode). Symlinks are never followed or touched, nor is anything under
``/usr/lib/debug``. A file that fails is logged and left byte-identical; it never
stops the others. The policy's ``on_error`` decides the exit status.

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

import contextlib
import hashlib
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

from hugify import _core, manifest, reasons, render
from hugify.exitcodes import Exit
from hugify.files import source_date_epoch, temporary_name, write_text_atomic
from hugify.policy import Policy, canonical_arch
from hugify.rewrite import Settings, rewrite
from hugify.sizes import human

if TYPE_CHECKING:
    from hugify.rewrite import Rewritten

#: Installed trees that are never walked: separate debug files describe code, they
#: are not code, and debug tools rely on their layout matching the file they describe.
PRUNED = ("/usr/lib/debug",)


def probe(path: Path) -> _core.Probe | None:
    """The core's header facts of an ELF executable or shared object; None for any
    other file. A file that has the ELF magic but is too damaged to tell its type,
    or that cannot be read, is a candidate too (its problem set), so that it is
    reported rather than silently passed over; so is one whose probe hit a bug in the
    core (a caught panic, reason `internal`): one file's bug must not stop the walk."""
    try:
        return _core.probe(path, _core.DEFAULT_HUGE_PAGE)
    except OSError as e:
        problem: _core.Refusal = {"reason": "io-error", "kind": "io", "detail": reasons.io_detail(e)}
    except _core.HugifyError as e:
        problem = {"reason": e.reason, "kind": e.kind, "detail": e.detail}
    return {
        "arch": None,
        "is64": False,
        "kind": None,
        "has_symtab": None,
        "build_id": None,
        "exec_load": None,
        "code_size": 0,
        "huge_page": _core.DEFAULT_HUGE_PAGE,
        "windows": [],
        "glibc_thp": {"advised": 0, "header": 0, "read_ahead_limit": None},
        "huge_bytes": 0,
        "state": "none",
        "manifest_span": None,
        "problem": problem,
    }


# --- walking -----------------------------------------------------------------------


class Candidate(NamedTuple):
    """One inode to consider, with all its names in the tree (in walk order)."""

    paths: list[str]
    files: list[Path]
    probe: _core.Probe
    st: os.stat_result


def installed_path(root: Path, file: Path) -> str:
    return "/" + file.relative_to(root).as_posix()


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Regular files under root, in a stable order; symlinks and pruned trees skipped."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if installed_path(root, here / d) not in PRUNED)
        for name in sorted(filenames):
            p = here / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield p, st


def candidates(root: Path) -> list[Candidate]:
    """The ELF executables and shared objects under root, one per inode."""
    by_inode: dict[tuple[int, int], Candidate] = {}
    for p, st in walk(root):
        key = (st.st_dev, st.st_ino)
        if key in by_inode:
            by_inode[key].paths.append(installed_path(root, p))
            by_inode[key].files.append(p)
            continue
        found = probe(p)
        if found is not None:
            by_inode[key] = Candidate([installed_path(root, p)], [p], found, st)
    return sorted(by_inode.values(), key=lambda c: c.paths[0])


# --- outcomes ----------------------------------------------------------------------


STATUSES = ("transformed", "as-is", "skipped", "failed")


class FileReport(TypedDict):
    """One inode's entry in the tree report (docs/…: `--report`)."""

    path: str  # its first name
    paths: list[str]
    status: str  # transformed | as-is | skipped | failed
    reason: str | None
    detail: str
    # When the file goes into the manifest:
    build_id: NotRequired[str]
    exec_offset: NotRequired[int]
    exec_size: NotRequired[int]
    huge_page: NotRequired[int]
    # When it was transformed:
    mode: NotRequired[str]
    dv: NotRequired[int]
    df: NotRequired[int]
    growth: NotRequired[int]
    code_bytes: NotRequired[int]
    covered_code: NotRequired[int]
    coverage: NotRequired[float]
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

    hugify_tree_report: int  # the format's version: 1
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
    #: (build-id, exec offset, exec size, huge page) when the file goes into the manifest.
    entry: tuple[str, int, int, int] | None = None
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
            out["build_id"], out["exec_offset"], out["exec_size"], out["huge_page"] = self.entry
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


def _clamped(ns: int, epoch: int | None) -> int:
    return ns if epoch is None else min(ns, epoch * 1_000_000_000)


def _entry(p: _core.Probe | None, threshold: int) -> tuple[str, int, int, int] | None:
    """The manifest fields of a probed file, if its code has whole huge-page windows
    (core/src/windows.rs) and its executable segment is over the threshold."""
    if not p or not p["manifest_span"] or not p["exec_load"] or p["exec_load"]["memsz"] < threshold:
        return None
    return (p["build_id"] or "-", *p["manifest_span"], p["huge_page"])


def _as_is(job: Job, skip: tuple[str, str] | None) -> Outcome:
    """Lists a file whose code already lies on whole huge-page windows (an ET_EXEC
    with congruent offsets, a file already aligned) in the manifest without a
    rewrite; otherwise skips it."""
    c, s = job.candidate, job.settings
    try:
        # Unchanged since the walk probed it: probe again only for another page size.
        known = c.probe if c.probe["huge_page"] == s.huge_page else _core.probe(c.files[0], s.huge_page)
        entry = _entry(known, s.threshold)
    except (_core.HugifyError, OSError):
        entry = None
    if entry:
        reason = skip[0] if skip else None
        detail = f"{human(entry[2])} of its code on whole huge-page windows as it is"
        return Outcome(c.paths, "as-is", reason, detail, entry=entry)
    if skip:
        return Outcome(c.paths, "skipped", *skip)
    return Outcome(c.paths, "skipped", "not-aligned", "no whole huge-page window at an offset congruent to its address")


def _relink(c: Candidate, epoch: int | None) -> None:
    """After the first name got a new inode: clamp its times, point the other names at it."""
    first = c.files[0]
    if epoch is not None and c.st.st_mtime_ns > epoch * 1_000_000_000:
        os.utime(first, ns=(_clamped(c.st.st_atime_ns, epoch), _clamped(c.st.st_mtime_ns, epoch)))
    for other in c.files[1:]:
        tmp = temporary_name(other)
        os.link(first, tmp)
        try:
            os.replace(tmp, other)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def process(job: Job) -> Outcome:
    """Transforms one inode in place (or lists it). Never raises."""
    c, s = job.candidate, job.settings
    try:
        if job.manifest_only:
            return _as_is(job, None)
        if job.refuse_stripped and c.probe["has_symtab"] is False:
            why = "no symbol table, so references to the ELF header cannot be ruled out by name"
            return _as_is(job, ("stripped", f"{why} (refuse_stripped = true, {job.refuse_stripped})"))
        try:
            with c.files[0].open("rb") as f:
                before = hashlib.file_digest(f, "sha256").hexdigest()
            report = rewrite(c.files[0], None, s, keep_times=True, drop_signatures=job.drop_signatures)
        except _core.HugifyError as e:
            if e.kind == "refused":
                return _as_is(job, (e.reason, e.detail))
            return Outcome(c.paths, "failed", e.reason, e.detail)
        except OSError as e:
            return Outcome(c.paths, "failed", "io-error", reasons.io_detail(e))
        entry = _entry(_core.probe(c.files[0], s.huge_page), 0)  # the file written, not the plan
        try:
            _relink(c, job.epoch)
        except OSError as e:
            detail = f"transformed {c.paths[0]}, but re-linking its other names failed: {reasons.io_detail(e)}"
            return Outcome(c.paths, "failed", "io-error", detail, report, entry, before)
        return Outcome(c.paths, "transformed", report=report, entry=entry, sha256_before=before)
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


def _decide(c: Candidate, opts: Options) -> Settings | Outcome:
    """What to do with a candidate: the settings to transform it with, or why not."""
    pol = opts.policy
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
        return Settings(threshold=pol.threshold, mode=pol.mode)
    if arch is None:
        return Outcome(c.paths, "skipped", "unsupported-arch", "an architecture hugify has no name for")
    build = canonical_arch(opts.arch) if opts.arch else None
    if opts.arch and build != arch:
        return Outcome(c.paths, "skipped", "foreign-arch", f"{arch} file in a {opts.arch} package")
    hp = pol.huge_page(arch)
    if hp is None:
        return Outcome(c.paths, "skipped", "unsupported-arch", f"the policy has no huge_page_size for {arch}")
    return Settings(hp, pol.threshold, pol.mode)


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
    jobs: list[Job | Outcome] = []
    for c in found:
        decision = _decide(c, opts)
        if isinstance(decision, Outcome):
            jobs.append(decision)
        else:
            jobs.append(Job(c, decision, opts.manifest_only, stripped_rule, epoch, drop))
    dirs = {f.parent: f.parent.stat() for c in found for f in c.files}
    progress = _Progress(sum(isinstance(j, Job) for j in jobs), opts.progress)

    def log(o: Outcome) -> None:
        if not opts.manifest_only:
            progress.print(out, log_line(o, pol.on_error))

    outcomes = execute(jobs, opts.jobs, log, lambda o: progress.tick(o.paths[0]))
    progress.clear()
    # Replacing (or trying to replace) a file changes its directory's times: put them back.
    for directory, st in sorted(dirs.items()):
        with contextlib.suppress(OSError):
            if directory.stat().st_mtime_ns != st.st_mtime_ns:
                os.utime(directory, ns=(_clamped(st.st_atime_ns, epoch), _clamped(st.st_mtime_ns, epoch)))
    return outcomes


def run(opts: Options) -> Exit:
    """Walks, transforms, writes the manifest and the report, logs; the exit status."""
    pol, epoch, out = opts.policy, source_date_epoch(), opts.out or sys.stdout
    outcomes: list[Outcome] = []
    if pol.enabled:
        outcomes = _walk_and_transform(opts, out, epoch)
    else:
        print(f"hugify: disabled by the policy (enabled = false, {pol.where('enabled')}); nothing changed", file=out)
    entries = [
        manifest.Entry(p, *o.entry)
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
            write_text_atomic(opts.manifest, manifest.render(entries), epoch)
        if opts.report:
            write_text_atomic(opts.report, _report_json(opts, outcomes, code), epoch)
    except OSError as e:
        print(f"hugify: error: cannot write {reasons.io_detail(e)}", file=sys.stderr)
        return Exit.IO
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
        "hugify_tree_report": 1,
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
