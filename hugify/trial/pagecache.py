"""The files under test in the page cache before each run, as bench/README.md
("The page cache, the order of the runs, the interval") describes: every file a side uses is cached, so
that no timed run reads from disk, and the two sides differ only in what hugify
changes.

* At the start the originals and the copies are written back (fdatasync: a program
  just built, a copy just made, has dirty pages) and evicted (POSIX_FADV_DONTNEED),
  so that the kernel's own faults bring them in as it does on a running system: small
  folios (then the copies' windows are loaded as 2 MiB folios, below). A file just
  written is cached in whatever folios the write made, large ones on a filesystem
  with large folios; the rest of a copy (its data) must start where its original
  does. (bench/speedup.py evicted both sides' files; hugify try first evicted only
  the originals.) (Read with read(2), a
  file on a filesystem with large folios gets them, and an original whose code starts
  at a 2 MiB-aligned offset would then be PMD-mapped by accident; bench/README.md
  shows it for libLLVM.) An original that another process maps is left as it is
  (it is not evicted: that process's page cache is not touched), and the report says
  so. A user other than root cannot see other users' processes, so evicts only the
  originals it owns: a system file (the system's libc, a distribution's libLLVM) is
  then left as it is cached, and the report gives what the originals' runs got of it
  on huge pages, if anything.
* Before every run, untimed: the originals are read ahead (POSIX_FADV_WILLNEED: a
  no-op for what is cached); the copies' windows are loaded as 2 MiB folios by the
  runtime's engine, as hugify prefetch does (a no-op for windows in place; windows
  another process's cache drop took away are loaded again and counted), then read
  ahead like the originals.

* With the shared way (hugify.trial.sharedway), each prefetch of the copies is
  followed, as in `hugify prefetch` run by root, by keeping or making root's shared
  copies of those whose windows the filesystem cannot give 2 MiB folios
  (hugify.shared.settle, in the comparison's own runtime directory): a copy split or
  dropped since the last run is made again before the next one.

Only files under test are touched: the originals of the hugified objects and the
copies in the cache.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hugify import prefetch as pf
from hugify import shared
from hugify.engine import LOADED, REPAIRED
from hugify.trial.cache import Usable


def advise(paths: Iterable[str | Path], advice: int) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if advice == os.POSIX_FADV_DONTNEED:
                    os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, advice)
            finally:
                os.close(fd)


def cache_drops() -> int:
    """How often anyone wrote to /proc/sys/vm/drop_caches since boot."""
    with contextlib.suppress(OSError), open("/proc/vmstat") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("drop_pagecache ")), 0)
    return 0


@dataclass
class Prepared:
    """What the start found."""

    evicted: list[str] = field(default_factory=list)  # originals evicted at the start
    kept: dict[str, str] = field(default_factory=dict)  # original -> why it was not evicted
    unseen: int = 0  # processes whose mappings could not be read
    windows: dict[str, pf.Target] = field(default_factory=dict)  # copy -> its first prefetch


class PageCache:
    def __init__(self, prefetcher: pf.Prefetcher, objects: Sequence[Usable], shared_budget: int | None = None) -> None:
        self.prefetcher = prefetcher
        self.objects = objects
        self.originals = [o.original for o in objects]
        self.copies = [o.file for o in objects]
        self.loaded_again = 0  # windows prefetched again before a run
        #: Root's shared copies are kept within this many bytes (None: none are made).
        self.shared_budget = shared_budget
        #: What the last prefetch found of the shared copies.
        self.shared = shared.Report()

    def start(self, skip: Iterable[int]) -> Prepared:
        """Evicts the copies and the originals nobody else maps, and prefetches the
        copies' windows."""
        found = Prepared()
        keys = {}
        me = os.geteuid()
        for p in self.originals:
            with contextlib.suppress(OSError):
                st = os.stat(p)
                keys[(st.st_dev, st.st_ino)] = p
                if me not in (0, st.st_uid):
                    found.kept[p] = "owned by another user: who else maps it cannot be seen by this user"
        mapped, found.unseen = pf.mappers_of(set(keys), skip)
        for key, who in mapped.items():
            found.kept.setdefault(keys[key], f"mapped by {', '.join(sorted({w for *_, w in who})[:3])}")
        found.evicted = [p for p in self.originals if p not in found.kept]
        advise([*found.evicted, *self.copies], os.POSIX_FADV_DONTNEED)
        found.windows = {t.path: t for t in self._prefetch()}
        return found

    def _prefetch(self) -> list[pf.Target]:
        targets = [pf.Target(str(c)) for c in self.copies]
        work = pf.open_targets(targets, self.prefetcher.hp)
        try:
            self.prefetcher.prefetch(work)
            if self.shared_budget is not None:
                # Each copy stands for its original: a shared copy shows every user
                # what the command loads, so only an original every user may read gets
                # one, and only while it is the file whose bytes were copied.
                p = self.prefetcher
                stands_for = {str(o.file): shared.StandsFor(o.original, o.source) for o in self.objects}
                self.shared = shared.settle(
                    p.rdir, p.engine, work, self.shared_budget, complete=True, stands_for=stands_for
                )
        finally:
            pf.close_targets(work)
        return targets

    def original_of(self) -> dict[str, str]:
        """The path of each copy -> the path of the original it stands for."""
        return {str(c): o for c, o in zip(self.copies, self.originals, strict=True)}

    def shared_copies(self) -> dict[tuple[int, int], str]:
        """The shared copies the last prefetch kept or made: (device, inode) -> the path
        of the file they are copies of."""
        out = {}
        for path, o in self.shared.outcomes.items():
            with contextlib.suppress(OSError):
                if o.state != "none":
                    st = os.stat(o.copy)
                    out[(st.st_dev, st.st_ino)] = path
        return out

    def before(self, hugified: bool) -> None:
        """The page cache for a run of one side."""
        if hugified:
            for t in self._prefetch():
                self.loaded_again += t.count(LOADED, REPAIRED)
            advise(self.copies, os.POSIX_FADV_WILLNEED)
        else:
            advise(self.originals, os.POSIX_FADV_WILLNEED)
