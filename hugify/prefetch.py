"""``hugify prefetch`` and ``hugify status``: which files and windows to work on, and
what to say about them (method: docs/runtime-reference.md).

Which windows a file has is the core's answer (``_core.probe``); what happens to each
window is decided by the runtime's state machine, hp_core's ``hp_settle``, called
through ``ctypes`` in ``libhugify-engine.so`` (runtime/engine.c): the same code as
hugify-run and the audit library. This module keeps the bookkeeping around it
(manifests, hardlinks, filesystem names, the processes that map busy windows, the
kernel verdict record) and turns the engine's states and reasons into reports.
``ctypes`` is imported lazily: the CLI must start fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugify import reasons

if TYPE_CHECKING:
    from hugify.manifest import Entry
    from hugify.shared import Outcome

THP = Path("/sys/kernel/mm/transparent_hugepage")
#: The runtime directory, where this boot's records are kept (tmpfs on most systems).
#: Every record is read, written and removed through the engine, which honours only
#: root's records in a directory of root's and lets only root write (runtime/hp_verdict.h).
RUNTIME_DIR = Path("/run/hugify")
VERDICT_FILE = "kernel-exec-pmd"
#: What gives no large folios, this boot (hp_core.h HP_NO_LARGE_FOLIOS_PREFIX), written by
#: the engine: "no-large-folios-MAJOR:MINOR" (a filesystem) holding "BOOT-ID FS-MAGIC",
#: "no-large-folios-MAJOR:MINOR-INODE" (a file) holding "BOOT-ID FS-MAGIC CTIME SIZE".
NO_LARGE_FOLIOS_PREFIX = "no-large-folios-"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

#: The engine, next to the package: runtime/ in the source tree, /usr/lib/hugify installed.
ENGINE_LIB = "libhugify-engine.so"

# Window states, by the engine's names (runtime/hp_core.h; docs/runtime-reference.md "Window states").
HUGE = "huge"
LOADED = "loaded"
REPAIRED = "repaired"
KERNEL = "kernel"
BUSY = "busy"
FAILED = "failed"
UNSUPPORTED = "unsupported"
COLD = "cold"
SMALL = "small"
UNVERIFIED = "unverified"
GOOD_STATES = {HUGE, LOADED, REPAIRED}


# --- system ---------------------------------------------------------------------------


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _bracketed(text: str | None) -> str | None:
    m = re.search(r"\[(\w[\w+]*)\]", text or "")
    return m.group(1) if m else None


def boot_id() -> str | None:
    return _read(BOOT_ID)


def runtime_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("HUGIFY_RUNTIME_DIR") or RUNTIME_DIR)


def _record(engine: Engine) -> list[str] | None:
    """The fields of this boot's kernel-verdict record, or None."""
    text = engine.record_read(VERDICT_FILE)
    bid = boot_id()
    fields = (text or "").split()
    if not bid or len(fields) < 2 or fields[0] != bid:
        return None
    return fields


def first_run_this_boot(engine: Engine) -> bool:
    """Whether no prefetch has run yet this boot (every root run records the boot it ran in)."""
    return _record(engine) is None


def read_verdict(engine: Engine) -> bool | None:
    """The recorded answer to "does the kernel read executable mappings as PMD folios
    by itself?" for this boot, or None if nobody found out yet."""
    fields = _record(engine)
    if not fields or fields[1] not in ("0", "1"):
        return None
    return fields[1] == "1"


def write_record(engine: Engine, aware: bool | None, thp: str | None) -> bool:
    """Records, for this boot, the kernel verdict and the THP mode, for later runs and
    for the C runtime (the audit library reads this instead of sysfs):
    "BOOT-ID 0|1|- MODE". Rewritten only when it changes; False if this process writes
    no records (not root, or no runtime directory of root's)."""
    bid = boot_id()
    if not bid:
        return False
    text = f"{bid} {'-' if aware is None else int(aware)} {thp or 'none'}\n"
    if engine.record_read(VERDICT_FILE) == text:
        return True
    return engine.record_write(VERDICT_FILE, text)


#: The programs of the policy's [runtime] anonymous, for the audit library (hp_anon.h).
ANONYMOUS_FILE = "anonymous"


def write_anonymous_record(engine: Engine, programs: Iterable[str]) -> bool:
    """Records the programs whose code the audit library copies into anonymous huge
    pages, one real path a line (the audit library compares /proc/self/exe); without
    programs the record is removed. Rewritten only when it changes; False if this
    process writes no records."""
    paths = sorted({os.path.realpath(p) for p in programs})
    if not paths:
        return engine.record_read(ANONYMOUS_FILE) is None or engine.record_drop(ANONYMOUS_FILE)
    text = "# hugify prefetch, from the policy's [runtime] anonymous\n" + "".join(f"{p}\n" for p in paths)
    if engine.record_read(ANONYMOUS_FILE) == text:
        return True
    return engine.record_write(ANONYMOUS_FILE, text)


def verdict_records(directory: Path) -> list[str]:
    """The names of this boot's verdicts in the runtime directory, whoever wrote them:
    the kernel's and those of what gives no large folios (not the policy's record)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if n == VERDICT_FILE or n.startswith(NO_LARGE_FOLIOS_PREFIX))


def clear_records(engine: Engine, directory: Path) -> list[str]:
    """Removes the verdicts of this boot (hugify prefetch --clear-records): the next
    runs find them out again. The names it could not remove (not root)."""
    return [n for n in verdict_records(directory) if not engine.record_drop(n)]


def kernel_config(option: str) -> bool | None:
    """A boolean kernel configuration option, from /proc/config.gz or /boot; None if
    neither can be read."""
    text = None
    try:
        import gzip  # only status needs it

        with gzip.open("/proc/config.gz", "rt") as f:
            text = f.read()
    except OSError:
        text = _read(f"/boot/config-{os.uname().release}")
    if text is None:
        return None
    return re.search(rf"^{option}=[ym]$", text, re.M) is not None


def _kernel_version(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def large_folios_since(engine: Engine, fstype: str) -> int:
    """Since which Linux version (major * 1000 + minor) files on `fstype` get large
    folios, from the runtime's table (hp_large_folios_since); 0 in no kernel hugify
    knows, -1 where hugify does not know the filesystem."""
    magic = next((m for m, name in FS_MAGIC.items() if name == fstype), None)
    return -1 if magic is None else engine.large_folios_since(magic)


def gives_large_folios(engine: Engine, fstype: str, release: str | None = None) -> bool | None:
    """Whether files on `fstype` get large folios on this kernel (or `release`); None
    where hugify does not know the filesystem."""
    since = large_folios_since(engine, fstype)
    if since < 0:
        return None
    return since > 0 and _kernel_version(release or os.uname().release) >= divmod(since, 1000)


def large_folios_remedy(engine: Engine, fstype: str, release: str | None = None) -> str:
    """Which kernel would give files on `fstype` large folios, in a few words (from the
    runtime's table, hp_large_folios_since)."""
    since = large_folios_since(engine, fstype)
    if since < 0:
        return f"whether a newer kernel gives {fstype} large folios is not known to hugify"
    if since == 0:
        return f"no kernel Debian ships gives {fstype} large folios yet (up to Linux 7.3)"
    major, minor = divmod(since, 1000)
    if _kernel_version(release or os.uname().release) >= (major, minor):
        return f"{fstype} has large folios from Linux {major}.{minor}, yet this kernel gave none"
    hint = " (on Debian 13: the kernel of trixie-backports)" if (major, minor) >= (6, 13) else ""
    return f"{fstype} has them from Linux {major}.{minor}{hint}"


#: statfs f_type -> filesystem name, for the engine's records (linux/magic.h).
FS_MAGIC = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0xE0F5E1E2: "erofs",
    0x2FC12FC1: "zfs",
    0xCA451A4E: "bcachefs",
    0x794C7630: "overlay",
    0x6969: "nfs",
}


@dataclass(frozen=True)
class Filesystem:
    """A mounted filesystem, from /proc/self/mountinfo."""

    device: str  # "MAJOR:MINOR" as mountinfo says (btrfs files have st_dev of their subvolume)
    fstype: str
    mountpoint: str
    #: The filesystem's own options (mountinfo's super options: ext4's data=journal,
    #: tmpfs's huge=), as a tuple of "key" or "key=value".
    options: tuple[str, ...] = ()


def mounts() -> list[Filesystem]:
    """The mounts of this process's namespace, in mountinfo's order."""
    out = []
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) > 4 and tail:
            options = tuple(tail[2].split(",")) if len(tail) > 2 else ()
            out.append(Filesystem(fields[2], tail[0], fields[4].replace("\\040", " "), options))
    return out


def filesystem_of(path: str, mounted: list[Filesystem]) -> Filesystem | None:
    """The filesystem holding `path`: the last mount on the longest prefix of its real
    path (st_dev does not name it for btrfs, whose subvolumes have devices of their own)."""
    real = os.path.realpath(path)
    best: Filesystem | None = None
    for fs in mounted:
        mp = fs.mountpoint.rstrip("/") or ""
        if (real == mp or real.startswith(mp + "/")) and (best is None or len(mp) >= len(best.mountpoint.rstrip("/"))):
            best = fs
    return best


@dataclass(frozen=True)
class NoLargeFolios:
    """A filesystem (or one file of it: `inode`) that the runtime found, this boot, to
    give no large folios, by a record that is honoured."""

    device: str  # st_dev of the files it was found on, "MAJOR:MINOR"
    fstype: str
    mountpoint: str | None
    inode: int | None = None


def without_large_folios(engine: Engine, directory: Path) -> list[NoLargeFolios]:
    """The engine's records of this boot in the runtime directory (only those it honours)."""
    bid = boot_id()
    by_device = {fs.device: fs for fs in mounts()}
    out = []
    for name in verdict_records(directory):
        fields = (engine.record_read(name) or "").split() if name.startswith(NO_LARGE_FOLIOS_PREFIX) else []
        if not bid or len(fields) not in (2, 4) or fields[0] != bid:
            continue
        device, _, inode = name[len(NO_LARGE_FOLIOS_PREFIX) :].partition("-")
        with contextlib.suppress(ValueError):
            fstype = FS_MAGIC.get(int(fields[1], 16), f"type {fields[1]}")
            mount = by_device.get(device)
            where = mount.mountpoint if mount else None
            out.append(NoLargeFolios(device, fstype, where, int(inode) if inode else None))
    return out


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
                f"transparent huge pages are disabled by the administrator ({THP}/enabled is 'never'); not prefetching"
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


# --- the engine ---------------------------------------------------------------------


def runtime_candidates(name: str) -> tuple[Path, Path]:
    """Where a file of the C runtime is: runtime/ of the source tree, or the directory
    above the installed package (/usr/lib/hugify/python/hugify -> /usr/lib/hugify)."""
    here = Path(__file__).resolve().parent.parent
    return here / "runtime" / name, here.parent / name


def runtime_file(name: str) -> Path | None:
    """The C runtime's file `name` (libhugify-engine.so, libhugify-audit.so, …), if
    this installation has it."""
    return next((p for p in runtime_candidates(name) if p.is_file()), None)


def _engine_path() -> Path:
    found = runtime_file(ENGINE_LIB)
    if found is None:
        raise OSError(engine_missing())
    return found


def engine_missing(name: str = ENGINE_LIB) -> str | None:
    """Why `prefetch` and `status` (or another command, for the runtime's file
    `name`) cannot run in this installation (a `pip install` of the package carries
    no C runtime), in one line ending in its reason id; None if the file is there."""
    if runtime_file(name):
        return None
    where = runtime_candidates(name)
    return (
        f"{name} is not installed (looked for {where[0]} and {where[1]}): this command needs the C runtime "
        "that `make install` or the distribution's package installs (no-engine)"
    )


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


class Engine:
    """hp_core's window state machine, in libhugify-engine.so (runtime/engine.c)."""

    CACHESTAT, PAGEMAP_SCAN, THP_DISABLED = 1, 2, 4
    #: PAGEMAP_SCAN page categories (linux/fs.h), for page_regions.
    PAGE_IS_PRESENT, PAGE_IS_HUGE = 1 << 3, 1 << 6

    def __init__(self, hp: int, rdir: Path | None = None) -> None:
        import ctypes  # lazily: ~5 ms that the other commands do not need

        class Report(ctypes.Structure):  # struct hp_window
            _fields_ = [("state", ctypes.c_uint8), ("why", ctypes.c_uint8), ("pages", ctypes.c_uint32)]

        self.ct, self.report = ctypes, Report
        lib = ctypes.CDLL(str(_engine_path()))
        lib.hp_engine_init.restype = ctypes.c_uint
        lib.hp_engine_init.argtypes = [ctypes.c_uint64, ctypes.c_uint]
        lib.hp_engine_run.restype = ctypes.c_int
        lib.hp_engine_run.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(Report),
        ]
        lib.hp_engine_page_regions.restype = ctypes.c_long
        lib.hp_engine_page_regions.argtypes = [
            ctypes.c_int,
            *[ctypes.c_uint64] * 4,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_uint64),
        ]
        for f in (lib.hp_engine_state_name, lib.hp_engine_why_name):
            f.restype, f.argtypes = ctypes.c_char_p, [ctypes.c_uint]
        lib.hp_engine_set_runtime_dir.restype = ctypes.c_int
        lib.hp_engine_set_runtime_dir.argtypes = [ctypes.c_char_p]
        lib.hp_engine_set_budget.restype = None
        lib.hp_engine_set_budget.argtypes = [ctypes.c_int64]
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        lib.hp_engine_file_id.restype = ctypes.c_int
        lib.hp_engine_file_id.argtypes = [ctypes.c_int, u32p, u32p, u64p]
        lib.hp_engine_pmd_windows.restype = ctypes.c_int
        lib.hp_engine_pmd_windows.argtypes = [
            ctypes.c_int,
            u64p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int8),
        ]
        lib.hp_engine_large_folios_since.restype = ctypes.c_int
        lib.hp_engine_large_folios_since.argtypes = [ctypes.c_long]
        lib.hp_engine_record_read.restype = ctypes.c_long
        lib.hp_engine_record_read.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.hp_engine_record_write.restype = ctypes.c_int
        lib.hp_engine_record_write.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.hp_engine_record_drop.restype = ctypes.c_int
        lib.hp_engine_record_drop.argtypes = [ctypes.c_char_p]
        lib.hp_engine_may_record.restype = ctypes.c_int
        lib.hp_engine_may_record.argtypes = []
        # Where the engine reads and writes the per-boot filesystem records.
        lib.hp_engine_set_runtime_dir(os.fsencode(rdir) if rdir else b"")
        self.lib = lib
        self._names: dict[tuple[int, int], tuple[str, str]] = {}
        # HUGIFY_FORCE_MINCORE=1 / HUGIFY_FORCE_SMAPS=1 take the paths of kernels without
        # cachestat (Linux < 6.5) / PAGEMAP_SCAN (< 6.7), for the tests.
        force = self.CACHESTAT * _env_flag("HUGIFY_FORCE_MINCORE") | self.PAGEMAP_SCAN * _env_flag("HUGIFY_FORCE_SMAPS")
        self.features = int(lib.hp_engine_init(hp, force))

    def has(self, feature: int) -> bool:
        return bool(self.features & feature)

    def set_budget(self, size: int) -> None:
        """Bounds the bytes the following runs read in, together (windows past it stay
        cold or small, reason "budget")."""
        self.lib.hp_engine_set_budget(size)

    def large_folios_since(self, magic: int) -> int:
        """Since which Linux version (major * 1000 + minor) a filesystem type gives
        large folios; 0 in no kernel hugify knows; -1 no opinion (hp_verdict.h)."""
        return int(self.lib.hp_engine_large_folios_since(magic))

    def record_read(self, name: str) -> str | None:
        """A record of the runtime directory, if it is honoured (root's, in a directory of
        root's that nobody else may write, no symlink); None otherwise."""
        buf = self.ct.create_string_buffer(4096)
        n = self.lib.hp_engine_record_read(name.encode(), buf, len(buf))
        return None if n < 0 else buf.raw[:n].decode(errors="replace")

    def record_write(self, name: str, text: str) -> bool:
        """Replaces a record whole (a fresh file renamed over it, no symlink followed);
        False if this process writes no records (not root, or no directory of root's)."""
        data = text.encode()
        return int(self.lib.hp_engine_record_write(name.encode(), data, len(data))) == 0

    def record_drop(self, name: str) -> bool:
        """Removes a record; True if it is gone."""
        return int(self.lib.hp_engine_record_drop(name.encode())) == 0

    def may_record(self) -> bool:
        return bool(self.lib.hp_engine_may_record())

    def _name(self, state: int, why: int) -> tuple[str, str]:
        key = (state, why)
        if key not in self._names:
            self._names[key] = (
                self.lib.hp_engine_state_name(state).decode(),
                self.lib.hp_engine_why_name(why).decode(),
            )
        return self._names[key]

    def run(
        self, fd: int, offsets: list[int], measure: bool, aware: bool | None
    ) -> tuple[list[tuple[str, str, int]], bool | None]:
        """(state, reason id, pages left) of each window, and the kernel verdict (probed
        on the first cold window when `aware` is None). OSError if they cannot be mapped."""
        ct, n = self.ct, len(offsets)
        offs = (ct.c_uint64 * n)(*offsets)
        out = (self.report * n)()
        verdict = ct.c_int(-1 if aware is None else int(aware))
        rc = self.lib.hp_engine_run(fd, offs, n, int(measure), ct.byref(verdict), out)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))
        return [(*self._name(r.state, r.why), r.pages) for r in out], None if verdict.value < 0 else verdict.value == 1

    def file_id(self, fd: int) -> tuple[int, int, int] | None:
        """(major, minor, inode) of the open file as /proc/self/maps names a mapping of it
        (what the audit library sees; fstat's device differs on btrfs), or None."""
        ct = self.ct
        major, minor, inode = ct.c_uint32(), ct.c_uint32(), ct.c_uint64()
        if self.lib.hp_engine_file_id(fd, ct.byref(major), ct.byref(minor), ct.byref(inode)) != 0:
            return None
        return major.value, minor.value, inode.value

    def pmd_windows(self, fd: int, offsets: list[int], measure: bool = False) -> list[bool | None]:
        """Whether each window of the open tmpfs file is mapped by one PMD when mapped as
        the audit library maps a shared copy (None: the kernel does not say); `measure`:
        windows not wholly in memory (swapped out) are not faulted in, and are not huge.
        OSError if a window cannot be mapped."""
        ct, n = self.ct, len(offsets)
        out = (ct.c_int8 * n)()
        rc = self.lib.hp_engine_pmd_windows(fd, (ct.c_uint64 * n)(*offsets), n, int(measure), out)
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))
        return [None if v < 0 else v == 1 for v in out]

    def page_regions(
        self, pagemap_fd: int, start: int, end: int, anyof: int, report: int
    ) -> list[tuple[int, int, int]]:
        """PAGEMAP_SCAN (Linux 6.7) over [start, end) of an open /proc/PID/pagemap, of
        this process or another: the (start, end, categories & `report`) runs of pages
        having any category of `anyof`. OSError if the kernel refuses."""
        ct, vec_len = self.ct, 64
        regions = (ct.c_uint64 * (3 * vec_len))()
        walk_end = ct.c_uint64()
        out: list[tuple[int, int, int]] = []
        while start < end:
            n = self.lib.hp_engine_page_regions(pagemap_fd, start, end, anyof, report, regions, vec_len, walk_end)
            if n < 0:
                raise OSError(-n, f"PAGEMAP_SCAN: {os.strerror(-n)}")
            out += [(regions[3 * i], regions[3 * i + 1], regions[3 * i + 2]) for i in range(n)]
            start = walk_end.value  # a full vector stops the walk early
        return out


def pmd_size() -> int:
    """The size of a PMD huge page on this system (the core's default where the kernel
    does not say)."""
    pmd = _read(THP / "hpage_pmd_size")
    return int(pmd) if pmd and pmd.isdigit() else default_huge_page()


def default_huge_page() -> int:
    """The core's default huge-page size (its architecture table), imported lazily: the
    extension is only loaded where a file is read."""
    from hugify import _core

    return _core.DEFAULT_HUGE_PAGE


def system_info(engine: Engine, hp: int, rdir: Path) -> System:
    enabled = _bracketed(_read(THP / "enabled")) if THP.is_dir() else None
    return System(
        kernel=os.uname().release,
        thp_enabled=enabled,
        thp_defrag=_bracketed(_read(THP / "defrag")),
        pmd_size=hp,
        page_size=os.sysconf("SC_PAGE_SIZE"),
        process_thp_disabled=engine.has(Engine.THP_DISABLED),
        cachestat=engine.has(Engine.CACHESTAT),
        exec_pmd_readahead=read_verdict(engine),
        shmem_enabled=_bracketed(_read(THP / "shmem_enabled")),
    )


# --- ELF ------------------------------------------------------------------------------


class NotHugified(Exception):
    """The file is not (or no longer) a hugified ELF file; the message says why."""


@dataclass(frozen=True)
class Windows:
    """The whole huge-page windows of a file's executable segments (the core's probe)."""

    offsets: tuple[int, ...]  # file offsets, each a multiple of the huge-page size
    code_size: int  # bytes of the executable segments in the file
    entry: Entry  # the manifest entry the file itself gives (build-id, span)


def read_windows(fd: int, hp: int, path: str) -> Windows:
    """The windows of the open file `fd`, whose name is `path`, as the core sees them
    (core/src/windows.rs)."""
    from hugify import _core, manifest
    from hugify.policy import canonical_arch

    p = _core.probe(f"/proc/self/fd/{fd}", hp)
    if p is None:
        raise NotHugified("not an ELF file")
    if p["problem"]:
        raise NotHugified(f"{p['problem']['detail']} ({p['problem']['reason']})")
    host = canonical_arch(os.uname().machine)
    if p["arch"] != host:
        raise NotHugified(f"built for {p['arch'] or 'an unknown architecture'}, not this system's {host}")
    x = p["exec_load"]
    if x is None:
        raise NotHugified("no executable segment")
    if not p["windows"] or p["manifest_span"] is None:
        if p["kind"] != "executable" and x["align"] < hp:
            raise NotHugified(f"not hugified: its executable segment is aligned to {x['align']:#x}, not {hp >> 20} MiB")
        raise NotHugified(f"not hugified: its code spans no whole {hp >> 20} MiB window at a matching offset")
    offsets = tuple(r["offset"] + k * hp for r in p["windows"] for k in range(r["len"] // hp))
    entry = manifest.Entry.of(path, p)
    assert entry is not None  # it has windows
    return Windows(offsets, p["code_size"], entry)


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

    hp: int = field(default_factory=default_huge_page)

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
    mounted = mounts()
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
            w = read_windows(fd, hp, t.path)
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
        fs = filesystem_of(t.path, mounted)
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
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in ignore:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
            comm = _read(f"/proc/{pid}/comm") or "?"
        except PermissionError:
            unseen += 1
            continue
        except OSError:
            continue
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or int(fields[4]) not in inodes:
                continue
            major, minor = (int(x, 16) for x in fields[3].split(":"))
            key = (os.makedev(major, minor), int(fields[4]))
            if key in keys:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                off = int(fields[2], 16)
                out.setdefault(key, []).append((off, off + hi - lo, f"pid {pid} ({comm})"))
    return out, unseen


@dataclass
class Run:
    """One prefetch or measurement over a list of targets."""

    engine: Engine
    system: System
    rdir: Path
    hp: int
    #: Filesystem type -> why files on it cannot be prefetched (said once).
    unable_fs: dict[str, str] = field(default_factory=dict)

    def record(self) -> None:
        write_record(self.engine, self.system.exec_pmd_readahead, self.system.thp_enabled)

    def _settle(self, t: Target, measure: bool) -> None:
        """Runs the engine over t's windows; the states and reason ids go to t.windows."""
        before = self.system.exec_pmd_readahead
        got, aware = self.engine.run(t.fd, [w.offset for w in t.windows], measure, before)
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
                f"or evicted for it this boot; {large_folios_remedy(self.engine, t.fs, self.system.kernel)}",
            )
        if why == "kernel-version":
            return self.unable_fs.setdefault(
                t.fs,
                f"by its version, Linux {self.system.kernel} gives the {t.fs} filesystem no large folios (taken "
                "without a record, as this process keeps none), so nothing is read or evicted for it; "
                f"{large_folios_remedy(self.engine, t.fs, self.system.kernel)}",
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
                got, aware = self.engine.run(t.fd, [w.offset], False, None)
            except OSError:
                continue
            ((state, why, pages),) = got
            if state not in GOOD_STATES:  # settled again once (a race with another reader)
                with contextlib.suppress(OSError):
                    ((state, why, pages),), _ = self.engine.run(t.fd, [w.offset], False, aware)
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
def session(rdir_arg: str | None = None) -> Iterator[Run]:
    rdir = runtime_dir(rdir_arg)
    hp = pmd_size()
    engine = Engine(hp, rdir)
    yield Run(engine, system_info(engine, hp, rdir), rdir, hp)


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
