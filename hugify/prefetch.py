"""``hugify prefetch`` and ``hugify status``: the files and windows to work on, and what
to say about them (method: docs/runtime-reference.md).

This module owns the targets (the files named by manifests or on the command line,
opened once per inode), their windows and what became of each, and the Prefetcher that
settles them in one session: the engine (hugify.engine) decides each window, the core
says which windows a file has (hugify.hugified), the kernel's facts are hugify.kernel's
and this boot's records hugify.rundir's; here they become reports, with the processes
that map busy windows named.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugify import kernel, reasons, rundir
from hugify.engine import BUSY, FAILED, GOOD_STATES, LOADED, REPAIRED, Engine
from hugify.hugified import NotHugified, read_hugified

if TYPE_CHECKING:
    from hugify.manifest import Entry
    from hugify.shared import Outcome


@dataclass
class System:
    """The settings that decide whether file pages can be 2 MiB folios."""

    kernel: str
    thp_enabled: str | None  # always / madvise / never; None: no THP in this kernel
    thp_defrag: str | None
    pmd_size: int
    page_size: int
    process_thp_disabled: bool  # prctl(PR_SET_THP_DISABLE) in force for this process
    cachestat: bool
    exec_pmd_readahead: bool | None  # the recorded verdict; None: not found out this boot
    #: transparent_hugepage/shmem_enabled (deny: no shared-memory huge pages even where a
    #: tmpfs asks with huge=, which root's shared copies need); None: not in this kernel.
    shmem_enabled: str | None = None

    def problem(self, huge_page: int | None = None) -> str | None:
        """Why nothing can be done on this system, or None."""
        if self.thp_enabled is None:
            return "this kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE is off)"
        if self.thp_enabled == "never":
            return (
                "transparent huge pages are disabled by the administrator "
                f"({kernel.THP}/enabled is 'never'); not prefetching"
            )
        if self.process_thp_disabled:
            return (
                "transparent huge pages are disabled for this process "
                "(prctl PR_SET_THP_DISABLE, inherited from a parent)"
            )
        if huge_page is not None and huge_page != self.pmd_size:
            return f"this system's PMD huge page is {self.pmd_size:#x} bytes, files are aligned to {huge_page:#x}"
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "thp_enabled": self.thp_enabled,
            "thp_defrag": self.thp_defrag,
            "pmd_size": self.pmd_size,
            "page_size": self.page_size,
            "process_thp_disabled": self.process_thp_disabled,
            "cachestat": self.cachestat,
            "exec_pmd_readahead": self.exec_pmd_readahead,
            "shmem_enabled": self.shmem_enabled,
        }


def system_info(engine: Engine, hp: int, rdir: Path) -> System:
    return System(
        kernel=os.uname().release,
        thp_enabled=kernel.thp_setting("enabled"),
        thp_defrag=kernel.thp_setting("defrag"),
        pmd_size=hp,
        page_size=os.sysconf("SC_PAGE_SIZE"),
        process_thp_disabled=engine.has(Engine.THP_DISABLED),
        cachestat=engine.has(Engine.CACHESTAT),
        exec_pmd_readahead=rundir.read_verdict(engine),
        shmem_enabled=kernel.thp_setting("shmem_enabled"),
    )


# --- targets --------------------------------------------------------------------------


@dataclass
class Window:
    offset: int
    state: str = ""
    reason: str = ""  # the engine's reason id (one of the core's table), or ""
    detail: str = ""  # the reason said for this file and system
    pids: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offset": self.offset, "state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.detail:
            out["detail"] = self.detail
        if self.pids:
            out["mapped_by"] = self.pids
        return out


@dataclass
class Target:
    """One file to prefetch or measure, and what happened to it."""

    path: str
    entry: Entry | None = None
    origin: str = ""  # the manifest that listed it
    names: list[str] = field(default_factory=list)  # hardlinked names of the same inode
    windows: list[Window] = field(default_factory=list)
    code_size: int = 0
    build_id: str = "-"
    fs: str = ""
    error: tuple[str, str] | None = None  # (reason, one-line detail)
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    fd: int = -1
    key: tuple[int, int] = (0, 0)
    #: Root's shared copy of the file, where its windows are unsupported (hugify/shared.py).
    shared: Outcome | None = None

    hp: int = field(default_factory=kernel.default_huge_page)

    @property
    def huge_bytes(self) -> int:
        return sum(1 for w in self.windows if w.state in GOOD_STATES) * self.hp

    def count(self, *states: str) -> int:
        return sum(1 for w in self.windows if w.state in states)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.names and self.names != [self.path]:
            out["names"] = self.names
        if self.origin:
            out["manifest"] = self.origin
        if self.error:
            out["error"] = {"reason": self.error[0], "detail": self.error[1]}
            return out
        out |= {
            "code_size": self.code_size,
            "huge_bytes": self.huge_bytes,
            "coverage": round(self.huge_bytes / self.code_size, 4) if self.code_size else 0.0,
            "build_id": self.build_id,
            "filesystem": self.fs,
            "windows": [w.as_json() for w in self.windows],
            "elapsed_ms": round(self.elapsed * 1e3, 3),
        }
        if self.notes:
            out["notes"] = self.notes
        if self.shared:
            out["shared_copy"] = self.shared.as_json()
        return out


def open_targets(targets: list[Target], hp: int) -> list[Target]:
    """Opens and reads each target; returns the ones to work on (one per inode).
    Failures are recorded on the target, never raised."""
    mounted = kernel.mounts()
    by_inode: dict[tuple[int, int], Target] = {}
    out = []
    for t in targets:
        t.hp = hp
        t.names = [t.path]
        where = f" (listed in {t.origin})" if t.origin else ""
        try:
            fd = os.open(t.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            t.error = ("missing", f"not found{where}")
            continue
        except OSError as e:
            t.error = ("io-error", f"{reasons.io_detail(e, with_file=False)}{where}")
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                from hugify.files import describe

                os.close(fd)
                t.error = ("wrong-file-type", f"{describe(st.st_mode)}, not a regular file{where}")
                continue
            key = (st.st_dev, st.st_ino)
            if key in by_inode:  # a hardlink: the inode is prefetched once
                first = by_inode[key]
                first.names.append(t.path)
                t.error = ("hardlink", f"same file as {first.path}")
                os.close(fd)
                continue
            # No readahead for the header reads: it would cache code pages as small folios.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            w = read_hugified(fd, hp, t.path)
            if w.offsets[-1] + hp > st.st_size:
                raise NotHugified("truncated: its code ends beyond the end of the file")
        except NotHugified as e:
            os.close(fd)
            t.error = ("not-hugified", f"{e}{where}")
            continue
        except OSError as e:
            os.close(fd)
            t.error = ("io-error", f"{reasons.io_detail(e, with_file=False)}{where}")
            continue
        t.fd, t.key = fd, key
        t.windows = [Window(o) for o in w.offsets]
        t.code_size, t.build_id = w.code_size, w.entry.build_id
        fs = kernel.mount_holding(t.path, mounted)
        t.fs = fs.fstype if fs else "?"
        if t.entry and t.entry.build_id not in ("-", w.entry.build_id):
            t.notes.append(f"build-id {w.entry.build_id} differs from the manifest's {t.entry.build_id}")
        if t.entry and (t.entry.offset, t.entry.size) != (w.entry.offset, w.entry.size):
            t.notes.append("executable segment differs from the manifest")
        by_inode[key] = t
        out.append(t)
    return out


def close_targets(targets: Iterable[Target]) -> None:
    for t in targets:
        if t.fd >= 0:
            os.close(t.fd)
            t.fd = -1


# --- settling windows -----------------------------------------------------------------


def mappers_of(
    keys: set[tuple[int, int]], skip: Iterable[int] = ()
) -> tuple[dict[tuple[int, int], list[tuple[int, int, str]]], int]:
    """(dev, inode) -> [(file offset start, end, "pid N (comm)")] for the files in
    `keys` mapped by other processes than this one and those in `skip`; and how many
    processes /proc would not show (other users', to a user other than root)."""
    out: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    unseen = 0
    ignore = {os.getpid(), *skip}
    inodes = {ino for _, ino in keys}
    for pid in kernel.pids():
        if pid in ignore:
            continue
        try:
            vmas = kernel.maps(pid)
        except PermissionError:
            unseen += 1
            continue
        except OSError:
            continue
        comm = kernel.comm(pid) or "?"
        for v in vmas:
            if v.inode in inodes and (v.dev, v.inode) in keys:
                end = v.offset + v.end - v.start
                out.setdefault((v.dev, v.inode), []).append((v.offset, end, f"pid {pid} ({comm})"))
    return out, unseen


@dataclass
class Prefetcher:
    """The engine as this process drives it, in one session: prefetches or measures
    lists of targets, and finds out the kernel verdict where it can."""

    engine: Engine
    system: System
    rdir: Path
    hp: int
    #: Filesystem type -> why files on it cannot be prefetched (said once).
    unable_fs: dict[str, str] = field(default_factory=dict)

    def record(self) -> None:
        rundir.write_record(self.engine, self.system.exec_pmd_readahead, self.system.thp_enabled)

    def _settle(self, t: Target, measure: bool) -> None:
        """Runs the engine over t's windows; the states and reason ids go to t.windows."""
        before = self.system.exec_pmd_readahead
        got, aware = self.engine.settle(t.fd, [w.offset for w in t.windows], measure, before)
        if aware is not None and aware != before:  # probed on a cold window of t (or contradicted)
            self.system.exec_pmd_readahead = aware
            self.record()
        reasons.printed(why for _, why, _ in got)
        for w, (state, why, pages) in zip(t.windows, got, strict=True):
            w.state, w.reason = state, why
            w.detail = self._explain(t, why, pages) if why else ""

    def _explain(self, t: Target, why: str, pages: int) -> str:
        """The engine's reason id, said for this file (the table's summary where there
        is nothing more particular to say)."""
        if why == "not-evicted":
            return f"{pages} small pages could not be evicted (mapped, dirty or locked)"
        if why == "memory-fs":
            return self.unable_fs.setdefault(
                t.fs,
                f"the {t.fs} filesystem keeps pages only in memory, so they cannot be read in again as 2 MiB "
                "folios (its huge pages follow its huge= mount option)",
            )
        if why == "no-large-folios":
            return self.unable_fs.setdefault(
                t.fs,
                f"the {t.fs} filesystem gives no large folios on Linux {self.system.kernel}, so nothing is read "
                f"or evicted for it this boot; {kernel.large_folios_remedy(self.engine, t.fs, self.system.kernel)}",
            )
        if why == "kernel-version":
            return self.unable_fs.setdefault(
                t.fs,
                f"by its version, Linux {self.system.kernel} gives the {t.fs} filesystem no large folios (taken "
                "without a record, as this process keeps none), so nothing is read or evicted for it; "
                f"{kernel.large_folios_remedy(self.engine, t.fs, self.system.kernel)}",
            )
        if why == "file-no-large-folios":
            return "read in again as small folios with nothing in the way: this file gets no large folios"
        if why == "fragmented":
            return "no free 2 MiB block of memory the page cache could take (fragmented, or low); try again later"
        if why == "read-meanwhile":
            return (
                "read in again as small folios, but not wholly by this process (another read pages of it in "
                "meanwhile): nothing concluded; the timer retries"
            )
        if why == "not-owner":
            return (
                "small folios this user does not evict (the kernel tells only root, the file's owner or a writer "
                "what is cached); the boot service and its timer repair them"
            )
        if why == "madvise-refused":
            return "MADV_HUGEPAGE is refused to this process (a seccomp filter?): nothing read or evicted"
        if why == "cgroup-limit":
            return "read in small while this process's memory cgroup was near its limit; try from outside it"
        return reasons.table()[why][1]

    def prefetch(self, targets: list[Target]) -> None:
        for t in targets:
            started = time.perf_counter()
            try:
                self._settle(t, measure=False)
            except OSError as e:
                why = f"cannot map it: {reasons.io_detail(e, with_file=False)}"
                for w in t.windows:
                    w.state, w.reason, w.detail = FAILED, "io-error", why
            t.elapsed = time.perf_counter() - started
        self._name_mappers([t for t in targets if t.count(BUSY)])

    def _name_mappers(self, busy: list[Target]) -> None:
        """Busy windows that running processes map: which ones (the likely reason)."""
        if not busy:
            return
        mappers, _ = mappers_of({t.key for t in busy})
        for t in busy:
            for w in t.windows:
                if w.state != BUSY:
                    continue
                users = sorted(
                    {who for lo, hi, who in mappers.get(t.key, []) if lo < w.offset + self.hp and hi > w.offset}
                )
                if users:
                    w.pids = users[:8]
                    w.detail = "small folios mapped by running processes: " + ", ".join(users[:3])

    def probe_kernel(self, targets: list[Target]) -> None:
        """Finds out whether the kernel reads exec mappings as PMD folios by itself where
        this run met no cold window to probe it on (every window was cached, in small
        folios or huge: the engine probes only a cold one): one window this run made
        huge and no process maps is evicted and settled again, which probes it, at the
        cost of reading it once more; once a boot, by root, whose record keeps it."""
        if self.system.exec_pmd_readahead is not None or not self.engine.may_record():
            return
        made = [(t, w) for t in targets for w in t.windows if w.state in (LOADED, REPAIRED)]
        mapped, _ = mappers_of({t.key for t, _ in made}) if made else ({}, 0)
        for t, w in made:
            if any(lo < w.offset + self.hp and hi > w.offset for lo, hi, _ in mapped.get(t.key, [])):
                continue
            os.posix_fadvise(t.fd, w.offset, self.hp, os.POSIX_FADV_DONTNEED)
            try:
                got, aware = self.engine.settle(t.fd, [w.offset], False, None)
            except OSError:
                continue
            ((state, why, pages),) = got
            if state not in GOOD_STATES:  # settled again once (a race with another reader)
                with contextlib.suppress(OSError):
                    ((state, why, pages),), _ = self.engine.settle(t.fd, [w.offset], False, aware)
            if state not in GOOD_STATES:  # else it stays what this run made it (repaired, loaded)
                w.state, w.reason = state, why
                w.detail = self._explain(t, why, pages) if why else ""
            if aware is not None:
                self.system.exec_pmd_readahead = aware
                self.record()
                return

    def measure(self, targets: list[Target]) -> None:
        """Current huge-page coverage, reading nothing into the page cache (the engine
        faults only windows that are entirely cached, through mappings without madvise)."""
        for t in targets:
            try:
                self._settle(t, measure=True)
            except OSError as e:
                t.error = ("io-error", f"cannot map it: {reasons.io_detail(e, with_file=False)}")


# --- entry points ---------------------------------------------------------------------


@contextlib.contextmanager
def session(rdir_arg: str | None = None) -> Iterator[Prefetcher]:
    rdir = rundir.runtime_dir(rdir_arg)
    hp = kernel.pmd_size()
    engine = Engine(hp, rdir)
    yield Prefetcher(engine, system_info(engine, hp, rdir), rdir, hp)


def manifest_files(directory: Path | None = None) -> list[Path]:
    """The manifests installed in `directory` (default: $HUGIFY_MANIFEST_DIR, else the
    system's manifest directory), then the list of hugified files the rpm file
    trigger discovered (docs/manifest.md), when there is one."""
    from hugify import manifest

    env = os.environ.get("HUGIFY_MANIFEST_DIR")
    d = directory or (Path(env) if env else manifest.MANIFEST_DIR)
    discovered = manifest.discovered_list()
    return (sorted(d.glob("*.list")) if d.is_dir() else []) + ([discovered] if discovered.is_file() else [])


def targets_from_manifests(paths: Iterable[Path]) -> tuple[list[Target], list[str]]:
    """A target for each path listed in the manifests (the first listing wins);
    plus the manifests that could not be read."""
    from hugify import manifest

    problems: list[str] = []
    out: list[Target] = []
    seen: set[str] = set()
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            problems.append(f"{p}: {reasons.io_detail(e, with_file=False)}")
            continue
        except UnicodeDecodeError:
            problems.append(f"{p}: not UTF-8 text")
            continue
        for entry in manifest.parse(text, str(p)):
            if entry.path not in seen:
                seen.add(entry.path)
                out.append(Target(entry.path, entry, str(p)))
    return out, problems


def say(msg: str) -> None:
    print(f"hugify: {msg}", file=sys.stderr)
