"""Getting the code of hugified files into the page cache as 2 MiB folios, and
measuring how much of it is there: the engine of ``hugify prefetch`` and
``hugify status`` (method: docs/runtime.md).

A hugified file is recognised from its program headers: an executable PT_LOAD whose
file offset and address agree modulo the huge-page size and that spans at least one
whole huge-page window. For each window, the page cache is asked how much of it is
cached (``cachestat(2)``, ``mincore(2)`` on kernels without it); the window is mapped
at a 2 MiB-aligned address through a mapping that carries ``MADV_HUGEPAGE`` and
faulted, which reads an uncached window as one 2 MiB folio; ``/proc/self/smaps``
(``FilePmdMapped``) of that mapping then tells whether the window is one folio.
Windows held in small folios are evicted (``POSIX_FADV_DONTNEED``) when no process
maps them, and read again.

Only the standard library and ``ctypes`` (imported lazily: the CLI must start fast).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hugify.manifest import Entry

THP = Path("/sys/kernel/mm/transparent_hugepage")
#: Where the kernel-awareness verdict is recorded (tmpfs on most systems).
RUNTIME_DIR = Path("/run/hugify")
VERDICT_FILE = "kernel-exec-pmd"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

PROT_READ, PROT_EXEC = 0x1, 0x4
MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x02, 0x10, 0x20
MADV_RANDOM, MADV_DONTNEED, MADV_HUGEPAGE = 1, 4, 14
POSIX_FADV_DONTNEED = 4
NR_CACHESTAT = 451  # the same on every architecture
PR_GET_THP_DISABLE = 42
#: PAGEMAP_SCAN page categories (linux/fs.h).
PAGE_IS_PRESENT, PAGE_IS_HUGE = 1 << 3, 1 << 6
#: Most windows mapped at once; larger runs go in batches.
BATCH_WINDOWS = 2048

#: Filesystems whose pages cannot be evicted and read again.
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "shmem", "hugetlbfs"}

# Window states.
HUGE = "huge"  # was a 2 MiB folio already
LOADED = "loaded"  # was not cached; read in as a 2 MiB folio
REPAIRED = "repaired"  # was in small folios; evicted and read in again
KERNEL = "kernel"  # not cached; the kernel reads it as a PMD folio on first exec
BUSY = "busy"  # small folios that processes map: cannot be evicted now
FAILED = "failed"  # could not be made a 2 MiB folio this time
UNSUPPORTED = "unsupported"  # the filesystem cannot hold it in 2 MiB folios
COLD = "cold"  # (status only) not cached
SMALL = "small"  # (status only) cached in small folios
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


def _record(directory: Path) -> list[str] | None:
    """The fields of this boot's record in DIR/kernel-exec-pmd, or None."""
    text = _read(directory / VERDICT_FILE)
    bid = boot_id()
    fields = (text or "").split()
    if not bid or len(fields) < 2 or fields[0] != bid:
        return None
    return fields


def read_verdict(directory: Path) -> bool | None:
    """The recorded answer to "does the kernel read executable mappings as PMD folios
    by itself?" for this boot, or None if nobody found out yet."""
    fields = _record(directory)
    if not fields or fields[1] not in ("0", "1"):
        return None
    return fields[1] == "1"


def write_record(directory: Path, aware: bool | None, thp: str | None) -> bool:
    """Records, for this boot, the kernel verdict and the THP mode, for later runs and
    for the C runtime (the audit library reads this instead of sysfs):
    "BOOT-ID 0|1|- MODE". Rewritten only when it changes; False if not writable."""
    bid = boot_id()
    if not bid:
        return False
    text = f"{bid} {'-' if aware is None else int(aware)} {thp or 'none'}\n"
    if _read(directory / VERDICT_FILE) == text.strip():
        return True
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{VERDICT_FILE}.{os.getpid()}"
        tmp.write_text(text)
        tmp.replace(directory / VERDICT_FILE)
        return True
    except OSError:
        return False


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
        }


# --- kernel interfaces through ctypes -------------------------------------------------


class Kernel:
    """mmap/madvise/mincore/cachestat/prctl, which the os module does not offer."""

    def __init__(self) -> None:
        import ctypes  # lazily: ~5 ms that the other commands do not need

        self.ct = ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        self._mmap = libc.mmap
        self._mmap.restype = ctypes.c_void_p
        self._mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        self._munmap = libc.munmap
        self._munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._madvise = libc.madvise
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._mincore = libc.mincore
        self._mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._prctl = libc.prctl
        self._ioctl = libc.ioctl
        self._cs_range = ctypes.c_uint64 * 2
        self._cs = ctypes.c_uint64 * 5
        self.page = os.sysconf("SC_PAGE_SIZE")
        # HUGIFY_FORCE_MINCORE=1 takes the path of kernels without cachestat (Linux < 6.5).
        self.has_cachestat: bool | None = False if os.environ.get("HUGIFY_FORCE_MINCORE") == "1" else None

    def _error(self, what: str) -> OSError:
        e = self.ct.get_errno()
        return OSError(e, f"{what}: {os.strerror(e)}")

    def mmap(self, addr: int | None, length: int, prot: int, flags: int, *, fd: int = -1, offset: int = 0) -> int:
        r = self._mmap(addr, length, prot, flags, fd, offset)
        if r is None or r == self.ct.c_void_p(-1).value:
            raise self._error("mmap")
        return int(r)

    def munmap(self, addr: int, length: int) -> None:
        self._munmap(addr, length)

    def madvise(self, addr: int, length: int, advice: int) -> bool:
        return int(self._madvise(addr, length, advice)) == 0

    def touch(self, addr: int) -> None:
        self.ct.c_ubyte.from_address(addr).value  # noqa: B018 - the read is the point

    def resident(self, addr: int, length: int) -> int:
        """Pages of a file mapping that are in the page cache (mapped or not); -1 if
        mincore fails."""
        vec = self.ct.create_string_buffer(length // self.page)
        if self._mincore(addr, length, vec) != 0:
            return -1
        return sum(b & 1 for b in vec.raw)

    def cachestat(self, fd: int, offset: int, length: int) -> tuple[int, int] | None:
        """(cached pages, dirty + writeback pages) of a file range; None without cachestat."""
        if self.has_cachestat is False:
            return None
        rng, cs = self._cs_range(offset, length), self._cs()
        ct = self.ct
        r = self._syscall(ct.c_long(NR_CACHESTAT), ct.c_int(fd), ct.byref(rng), ct.byref(cs), ct.c_uint(0))
        if r != 0:
            if ct.get_errno() in (38, 1):  # ENOSYS, EPERM (a seccomp filter that does not know it)
                self.has_cachestat = False
            return None
        self.has_cachestat = True
        return int(cs[0]), int(cs[1]) + int(cs[2])

    def thp_disabled(self) -> bool:
        return int(self._prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0)) == 1

    def probe_cachestat(self) -> bool:
        if self.has_cachestat is None:
            try:
                fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False
            try:
                if self.cachestat(fd, 0, 4096) is None:
                    self.has_cachestat = False
            finally:
                os.close(fd)
        return bool(self.has_cachestat)

    def page_regions(self, fd: int, start: int, end: int, anyof: int, report: int) -> list[tuple[int, int, int]]:
        """PAGEMAP_SCAN (Linux 6.7) over [start, end) of the process whose
        /proc/PID/pagemap `fd` is: the (start, end, categories & `report`) runs of pages
        having any category of `anyof` (PAGE_IS_PRESENT, PAGE_IS_HUGE, ...)."""
        ct = self.ct
        arg = (ct.c_uint64 * 12)()
        regions = (ct.c_uint64 * (3 * 64))()
        request = (3 << 30) | (12 * 8 << 16) | (ord("f") << 8) | 16  # _IOWR('f', 16, 96 bytes)
        out: list[tuple[int, int, int]] = []
        while start < end:
            arg[0], arg[2], arg[3] = 12 * 8, start, end  # size, start, end
            arg[5], arg[6] = ct.addressof(regions), 64  # vec, vec_len
            arg[10], arg[11] = anyof, report  # category_anyof_mask, return_mask
            n = int(self._ioctl(fd, ct.c_ulong(request), ct.byref(arg)))
            if n < 0:
                raise self._error("PAGEMAP_SCAN")
            out += [(int(regions[3 * i]), int(regions[3 * i + 1]), int(regions[3 * i + 2])) for i in range(n)]
            start = int(arg[4])  # walk_end: where a full vector stopped the walk
        return out

    def pagemap_scan(self) -> bool:
        """Whether PAGEMAP_SCAN (Linux 6.7) works: hugify-run and the audit library
        verify and repair windows with it."""
        try:
            fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            page = self.mmap(None, self.page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS)
            try:
                self.page_regions(fd, page, page + self.page, PAGE_IS_HUGE, PAGE_IS_HUGE)
            finally:
                self.munmap(page, self.page)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def system_info(kernel: Kernel, rdir: Path) -> System:
    enabled = _bracketed(_read(THP / "enabled")) if THP.is_dir() else None
    pmd = _read(THP / "hpage_pmd_size")
    return System(
        kernel=os.uname().release,
        thp_enabled=enabled,
        thp_defrag=_bracketed(_read(THP / "defrag")),
        pmd_size=int(pmd) if pmd and pmd.isdigit() else 2 << 20,
        page_size=kernel.page,
        process_thp_disabled=kernel.thp_disabled(),
        cachestat=kernel.probe_cachestat(),
        exec_pmd_readahead=read_verdict(rdir),
    )


# --- ELF ------------------------------------------------------------------------------

PT_LOAD, PT_NOTE, PF_X = 1, 4, 1
NT_GNU_BUILD_ID = 3
_MACHINES = {"x86_64": 62, "aarch64": 183}


class NotHugified(Exception):
    """The file is not (or no longer) a hugified ELF file; the message says why."""


@dataclass(frozen=True)
class Windows:
    """The whole huge-page windows of a file's executable segments."""

    offsets: tuple[int, ...]  # file offsets, each a multiple of the huge-page size
    code_size: int  # bytes of the executable segments in the file
    build_id: str  # hex, or "-"


def read_windows(fd: int, hp: int) -> Windows:
    head = os.pread(fd, 4096, 0)
    if len(head) < 64 or head[:4] != b"\x7fELF":
        raise NotHugified("not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise NotHugified("not a 64-bit little-endian ELF file")
    machine = struct.unpack_from("<H", head, 18)[0]
    if machine != _MACHINES.get(os.uname().machine, machine):
        raise NotHugified(f"ELF machine {machine} is not this system's")
    (phoff,) = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    if phentsize != 56 or not 0 < phnum <= 512:
        raise NotHugified("malformed program headers")
    ph = head[phoff : phoff + 56 * phnum] if phoff + 56 * phnum <= len(head) else b""
    if len(ph) != 56 * phnum:
        ph = os.pread(fd, 56 * phnum, phoff)
        if len(ph) != 56 * phnum:
            raise NotHugified("truncated program headers")
    offsets: list[int] = []
    code = 0
    build_id = "-"
    notes: list[tuple[int, int]] = []
    small_align = 0
    for i in range(phnum):
        p_type, p_flags, off, vaddr, _, filesz, _, align = struct.unpack_from("<IIQQQQQQ", ph, 56 * i)
        if p_type == PT_NOTE:
            notes.append((off, filesz))
        if p_type != PT_LOAD or not p_flags & PF_X or filesz == 0:
            continue
        code += filesz
        if align < hp:  # the loader would not place it at a 2 MiB-aligned address
            small_align = small_align or align
            continue
        if (vaddr - off) % hp:
            continue
        start, end = -(-off // hp) * hp, (off + filesz) // hp * hp
        offsets += range(start, end, hp)
    for off, size in notes:
        data = os.pread(fd, min(size, 4096), off)
        pos = 0
        while pos + 12 <= len(data):
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name_end = pos + 12 + (namesz + 3) // 4 * 4
            if ntype == NT_GNU_BUILD_ID and data[pos + 12 : pos + 12 + namesz] == b"GNU\0":
                build_id = data[name_end : name_end + descsz].hex()
            pos = name_end + (descsz + 3) // 4 * 4
    if code == 0:
        raise NotHugified("no executable segment")
    if not offsets and small_align:
        raise NotHugified(f"not hugified: its executable segment is aligned to {small_align:#x}, not {hp >> 20} MiB")
    if not offsets:
        raise NotHugified(f"not hugified: its code spans no whole {hp >> 20} MiB window at a matching offset")
    return Windows(tuple(offsets), code, build_id)


# --- targets --------------------------------------------------------------------------


@dataclass
class Window:
    offset: int
    state: str = ""
    reason: str = ""
    cached: int = -1  # pages in the page cache before, -1 unknown
    address: int = 0  # where this run maps it
    pids: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offset": self.offset, "state": self.state}
        if self.reason:
            out["reason"] = self.reason
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
    reservation: tuple[int, int] = (0, 0)

    hp: int = 2 << 20

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
        return out


def _filesystems() -> dict[int, str]:
    """st_dev -> filesystem type, from /proc/self/mountinfo."""
    out: dict[int, str] = {}
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 2 and right:
            major, _, minor = fields[2].partition(":")
            with contextlib.suppress(ValueError):
                out[os.makedev(int(major), int(minor))] = right.split()[0]
    return out


def open_targets(targets: list[Target], hp: int) -> list[Target]:
    """Opens and reads each target; returns the ones to work on (one per inode).
    Failures are recorded on the target, never raised."""
    fss = _filesystems()
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
            t.error = ("io-error", f"{e.strerror}{where}")
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotHugified("not a regular file")
            key = (st.st_dev, st.st_ino)
            if key in by_inode:  # a hardlink: the inode is prefetched once
                first = by_inode[key]
                first.names.append(t.path)
                t.error = ("hardlink", f"same file as {first.path}")
                os.close(fd)
                continue
            # No readahead for the header reads: it would cache code pages as small folios.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            w = read_windows(fd, hp)
            if w.offsets[-1] + hp > st.st_size:
                raise NotHugified("truncated: its code ends beyond the end of the file")
        except NotHugified as e:
            os.close(fd)
            t.error = ("not-hugified", f"{e}{where}")
            continue
        except OSError as e:
            os.close(fd)
            t.error = ("io-error", f"{e.strerror}{where}")
            continue
        t.fd, t.key = fd, key
        t.windows = [Window(o) for o in w.offsets]
        t.code_size, t.build_id = w.code_size, w.build_id
        t.fs = fss.get(st.st_dev, "?")
        if t.entry and t.entry.build_id not in ("-", w.build_id):
            t.notes.append(f"build-id {w.build_id} differs from the manifest's {t.entry.build_id}")
        if t.entry and (t.entry.offset, t.entry.size) != (w.offsets[0], len(w.offsets) * hp):
            t.notes.append("executable segment differs from the manifest")
        by_inode[key] = t
        out.append(t)
    return out


def close_targets(targets: Iterable[Target]) -> None:
    for t in targets:
        if t.fd >= 0:
            os.close(t.fd)
            t.fd = -1


# --- mapping windows ------------------------------------------------------------------


class Mapper:
    """Maps windows at 2 MiB-aligned addresses, each as a VMA of its own (so that
    smaps reports each separately), and reads their FilePmdMapped."""

    def __init__(self, kernel: Kernel, hp: int) -> None:
        self.k, self.hp = kernel, hp
        self.reservations: list[tuple[int, int]] = []

    def map_target(self, t: Target, windows: list[Window], advise: bool, prot: int = PROT_READ) -> None:
        """Maps the given windows of t. With `advise`, MADV_HUGEPAGE (a fault reads a
        whole PMD folio) and MADV_RANDOM (just that one)."""
        hp = self.hp
        span = (2 * len(windows) + 1) * hp
        res = self.k.mmap(None, span, 0, MAP_PRIVATE | MAP_ANONYMOUS)
        self.reservations.append((res, span))
        base = -(-res // hp) * hp
        for i, w in enumerate(windows):
            addr = base + 2 * i * hp
            self.k.mmap(addr, hp, prot, MAP_PRIVATE | MAP_FIXED, fd=t.fd, offset=w.offset)
            if advise:
                self.k.madvise(addr, hp, MADV_HUGEPAGE)
                self.k.madvise(addr, hp, MADV_RANDOM)
            w.address = addr

    def release(self) -> None:
        for addr, span in self.reservations:
            self.k.munmap(addr, span)
        self.reservations.clear()

    def pmd_mapped(self) -> dict[int, int]:
        """VMA start -> FilePmdMapped bytes, from /proc/self/smaps."""
        out: dict[int, int] = {}
        start = -1
        with open("/proc/self/smaps") as f:
            for line in f:
                c = line[0]
                if c in "0123456789abcdef" and "-" in line[:17]:
                    start = int(line[: line.index("-")], 16)
                elif c == "F" and line.startswith("FilePmdMapped:"):
                    out[start] = int(line.split()[1]) * 1024
        return out


def _buddy_has_pmd_blocks(order: int) -> bool:
    """Whether any zone has a free block of at least `order` pages (a 2 MiB folio
    can be allocated without compaction)."""
    for line in (_read("/proc/buddyinfo") or "").splitlines():
        counts = line.split()[4:]
        if any(int(c) for c in counts[order:]):
            return True
    return False


def _mappers_of(keys: set[tuple[int, int]]) -> dict[tuple[int, int], list[tuple[int, int, str]]]:
    """(dev, inode) -> [(file offset start, end, "pid N (comm)")] for the files in
    `keys` mapped by other processes (those /proc lets us see)."""
    out: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    me = os.getpid()
    inodes = {ino for _, ino in keys}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
            comm = _read(f"/proc/{pid}/comm") or "?"
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
    return out


@dataclass
class Run:
    """One prefetch or measurement over a list of targets."""

    kernel: Kernel
    system: System
    rdir: Path
    hp: int
    probed: bool = False
    #: Filesystem type -> why files on it cannot be prefetched (said once).
    unable_fs: dict[str, str] = field(default_factory=dict)

    def _fill_cached(self, t: Target, ws: list[Window]) -> None:
        """Pages of each window in the page cache: cachestat, or mincore on the
        (not yet faulted) mapping of the window."""
        for w in ws:
            cs = self.kernel.cachestat(t.fd, w.offset, self.hp)
            w.cached = cs[0] if cs else self.kernel.resident(w.address, self.hp) if w.address else -1

    def _memory_fs(self, t: Target) -> str:
        return self.unable_fs.setdefault(
            t.fs,
            f"the {t.fs} filesystem keeps pages only in memory, so they cannot be read in again as 2 MiB "
            "folios (its huge pages follow its huge= mount option)",
        )

    # -- kernel awareness ------------------------------------------------------------

    def record(self) -> None:
        write_record(self.rdir, self.system.exec_pmd_readahead, self.system.thp_enabled)

    def probe_kernel(self, t: Target, w: Window, cold: list[Window]) -> bool | None:
        """Maps an uncached window the way the ELF loader maps code (PROT_EXEC, no
        madvise), faults it, and checks whether the kernel made it one PMD by itself.
        On a "no", the small folios this read are evicted again."""
        m = Mapper(self.kernel, self.hp)
        try:
            probe = Window(w.offset)
            m.map_target(t, [probe], advise=False, prot=PROT_READ | PROT_EXEC)
            self.kernel.touch(probe.address)
            aware = m.pmd_mapped().get(probe.address, 0) >= self.hp
        except OSError:
            return None  # e.g. a noexec mount: no verdict
        finally:
            m.release()
        if not aware:
            for c in cold:  # the fault's readaround may have reached the other windows
                os.posix_fadvise(t.fd, c.offset, self.hp, POSIX_FADV_DONTNEED)
        self.system.exec_pmd_readahead = aware
        self.record()
        return aware

    # -- prefetch ------------------------------------------------------------------------

    def prefetch(self, targets: list[Target]) -> None:
        batch: list[Target] = []
        n = 0
        for t in targets:
            batch.append(t)
            n += len(t.windows)
            if n >= BATCH_WINDOWS:
                self._prefetch_batch(batch)
                batch, n = [], 0
        if batch:
            self._prefetch_batch(batch)

    def _prefetch_batch(self, targets: list[Target]) -> None:
        k, hp = self.kernel, self.hp
        started = time.perf_counter()
        m = Mapper(k, hp)
        try:
            touched: list[Window] = []
            owner: dict[int, Target] = {}
            for t in targets:
                if t.fs in self.unable_fs and t.fs not in MEMORY_FILESYSTEMS:
                    for w in t.windows:
                        w.state, w.reason = UNSUPPORTED, self.unable_fs[t.fs]
                    continue
                try:
                    m.map_target(t, t.windows, advise=True)
                except OSError as e:
                    for w in t.windows:
                        w.state, w.reason = FAILED, f"cannot map it: {e.strerror}"
                    continue
                self._fill_cached(t, t.windows)
                cold = [w for w in t.windows if w.cached == 0]
                if cold and self.system.exec_pmd_readahead is None and not self.probed:
                    self.probed = True
                    self.probe_kernel(t, cold[0], cold)
                for w in t.windows:
                    if w.cached == 0 and self.system.exec_pmd_readahead:
                        w.state = KERNEL  # left to the kernel's own exec readahead
                        continue
                    k.touch(w.address)  # reads an uncached window as one 2 MiB folio
                    touched.append(w)
                    owner[id(w)] = t
            pmd = m.pmd_mapped()
            small: list[tuple[Target, Window]] = []
            for w in touched:
                t = owner[id(w)]
                if pmd.get(w.address, 0) >= hp:
                    w.state = LOADED if w.cached == 0 else HUGE
                elif t.fs in MEMORY_FILESYSTEMS:
                    w.state, w.reason = UNSUPPORTED, self._memory_fs(t)
                else:
                    small.append((t, w))
            if small:
                self._repair(small, m)
        finally:
            m.release()
        share = (time.perf_counter() - started) / len(targets)
        for t in targets:
            t.elapsed = share  # its share of the batch (one smaps read serves all)

    def _repair(self, small: list[tuple[Target, Window]], m: Mapper) -> None:
        k, hp = self.kernel, self.hp
        mappers = _mappers_of({t.key for t, _ in small})
        retry: list[tuple[Target, Window]] = []
        for t, w in small:
            users = sorted({who for lo, hi, who in mappers.get(t.key, []) if lo < w.offset + hp and hi > w.offset})
            if users:
                w.state, w.pids = BUSY, users[:8]
                w.reason = "small folios mapped by running processes: " + ", ".join(users[:3])
                continue
            k.madvise(w.address, hp, MADV_DONTNEED)  # our own page-table entries
            cs = k.cachestat(t.fd, w.offset, hp)
            if cs and cs[1]:
                # Just written (a package upgrade): dirty pages are not evicted.
                with contextlib.suppress(OSError):
                    os.fdatasync(t.fd)
            os.posix_fadvise(t.fd, w.offset, hp, POSIX_FADV_DONTNEED)
            left = self._cached_after_evict(t, w)
            if left:
                w.state = BUSY
                w.reason = f"{left} small pages could not be evicted (mapped, dirty or locked)"
                continue
            k.touch(w.address)
            retry.append((t, w))
        if not retry:
            return
        pmd = m.pmd_mapped()
        order = (hp // k.page).bit_length() - 1
        for t, w in retry:
            if pmd.get(w.address, 0) >= hp:
                w.state = LOADED if w.cached == 0 else REPAIRED
            elif not _buddy_has_pmd_blocks(order):
                w.state = FAILED
                w.reason = "no free 2 MiB block of memory (fragmented); try again later"
            else:
                w.state = UNSUPPORTED
                w.reason = self.unable_fs.setdefault(
                    t.fs, f"the {t.fs} filesystem gives no large folios on this kernel (read in again as small folios)"
                )

    def _cached_after_evict(self, t: Target, w: Window) -> int:
        cs = self.kernel.cachestat(t.fd, w.offset, self.hp)
        left = cs[0] if cs is not None else self.kernel.resident(w.address, self.hp)
        return left if left >= 0 else self.hp // self.kernel.page  # unknown: assume nothing left the cache

    # -- measure (status) ------------------------------------------------------------------

    def measure(self, targets: list[Target]) -> None:
        """Current huge-page coverage, reading nothing into the page cache: only
        windows that are entirely cached are faulted, through mappings without madvise."""
        k, hp = self.kernel, self.hp
        full = hp // k.page
        m = Mapper(k, hp)
        try:
            todo: list[Window] = []
            for t in targets:
                try:
                    if k.has_cachestat is False:
                        m.map_target(t, t.windows, advise=False)  # mincore needs a mapping
                    self._fill_cached(t, t.windows)
                    ws = [w for w in t.windows if w.cached == full]
                    for w in t.windows:
                        w.state = COLD if w.cached == 0 else SMALL
                    if ws and k.has_cachestat is not False:
                        m.map_target(t, ws, advise=False)
                except OSError as e:
                    t.error = ("io-error", f"cannot map it: {e.strerror}")
                    continue
                for w in ws:
                    k.touch(w.address)
                todo += ws
            pmd = m.pmd_mapped()
            for w in todo:
                if pmd.get(w.address, 0) >= hp:
                    w.state = HUGE
        finally:
            m.release()


# --- entry points ---------------------------------------------------------------------


@contextlib.contextmanager
def session(rdir_arg: str | None = None) -> Iterator[Run]:
    kernel = Kernel()
    rdir = runtime_dir(rdir_arg)
    system = system_info(kernel, rdir)
    yield Run(kernel, system, rdir, system.pmd_size)


def manifest_files(directory: Path | None = None) -> list[Path]:
    """The manifests installed in `directory` (default: $HUGIFY_MANIFEST_DIR, else the
    system's manifest directory)."""
    from hugify import manifest

    env = os.environ.get("HUGIFY_MANIFEST_DIR")
    d = directory or (Path(env) if env else manifest.MANIFEST_DIR)
    return sorted(d.glob("*.list")) if d.is_dir() else []


def targets_from_manifests(paths: Iterable[Path]) -> tuple[list[Target], list[str]]:
    """A target for each line of each manifest; plus the manifests that could not be read."""
    from hugify import manifest

    problems: list[str] = []
    out: list[Target] = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            problems.append(f"{p}: {e.strerror}")
            continue
        except UnicodeDecodeError:
            problems.append(f"{p}: not UTF-8 text")
            continue
        out += [Target(e.path, e, str(p)) for e in manifest.parse(text, str(p))]
    return out, problems


def say(msg: str) -> None:
    print(f"hugify: {msg}", file=sys.stderr)
