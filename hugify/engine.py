"""The engine: hp_core's window state machine (``hp_settle``) and the runtime's records,
in ``libhugify-engine.so`` (runtime/engine.c), bound through ``ctypes``: the same code
as hugify-run and the audit library. This module owns that binding (the argument types,
the window states by the engine's names) and where the C runtime's files are (runtime/
of the source tree, /usr/lib/hugify installed). ``ctypes`` is imported when an Engine
is made: the CLI must start fast.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def runtime_candidates(name: str) -> tuple[Path, Path]:
    """Where a file of the C runtime is: runtime/ of the source tree, or the directory
    above the installed package (/usr/lib/hugify/python/hugify -> /usr/lib/hugify)."""
    here = Path(__file__).resolve().parent.parent
    return here / "runtime" / name, here.parent / name


def runtime_file(name: str) -> Path | None:
    """The C runtime's file `name` (libhugify-engine.so, libhugify-audit.so, …), if
    this installation has it."""
    return next((p for p in runtime_candidates(name) if p.is_file()), None)


def engine_path() -> Path:
    """The engine's library; OSError (saying so) where this installation has none."""
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
        lib = ctypes.CDLL(str(engine_path()))
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
        """Bounds the bytes the following settles read in, together (windows past it stay
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

    def settle(
        self, fd: int, offsets: list[int], measure: bool, aware: bool | None
    ) -> tuple[list[tuple[str, str, int]], bool | None]:
        """Settles the windows of the open file (hp_settle; `measure`: only measures
        them, reading nothing in): (state, reason id, pages left) of each window, and the
        kernel verdict (probed on the first cold window when `aware` is None). OSError if
        they cannot be mapped."""
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
