"""The anonymous copies the audit library made of hugified code (docs/runtime-reference.md,
"Anonymous copies"), found in /proc/PID/maps: for `hugify status`.

A copy is an anonymous executable VMA of whole 2 MiB windows at a 2 MiB-aligned address,
recognised by its place: inside the mapping of a file, which continues on one side of it
at the file offsets that match. (Earlier runtimes named their copies
``[anon:hugify:PATH]`` where the kernel names anonymous VMAs, CONFIG_ANON_VMA_NAME;
the runtime names none now, since perf takes a named one for a file: those are still
recognised by the name.)
The memory it holds is the VMA's AnonHugePages (and Rss) in /proc/PID/smaps; its share
of it is the VMA's Pss: a copy a forked process shares with its parent (copy-on-write,
never written) counts half in each, so the shares of all processes add up to what is
held once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hugify import kernel
from hugify.kernel import Vma

NAME_PREFIX = "[anon:hugify:"


@dataclass
class Copy:
    """The anonymous copies of one file's windows in one process."""

    pid: int
    command: str
    path: str
    size: int = 0
    anon_huge: int = 0
    rss: int = 0
    pss: int = 0  # the proportional share: the pages divided among the processes mapping them

    def windows(self, hp: int) -> int:
        return self.size // hp

    def as_json(self, hp: int) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "command": self.command,
            "path": self.path,
            "windows": self.windows(hp),
            "bytes": self.size,
            "anon_huge_bytes": self.anon_huge,
            "rss_bytes": self.rss,
            "pss_bytes": self.pss,
        }


def copy_ranges(maps: list[Vma], hp: int) -> dict[tuple[int, int], str]:
    """The anonymous copies in one process's mappings: (start, end) -> the file's path.

    An unnamed run of anonymous executable whole windows is a copy when a mapping of a
    file adjoins it with offsets that continue through it: the rest of that file's
    mapping, with the run at 2 MiB-aligned file offsets (where the windows of a
    hugified file are)."""

    def candidate(i: int) -> bool:
        v = maps[i]
        anon = v.inode == 0 and (v.name == "" or v.name.startswith(NAME_PREFIX))
        return anon and v.executable and v.start % hp == 0 and (v.end - v.start) % hp == 0

    out: dict[tuple[int, int], str] = {}
    i = 0
    while i < len(maps):
        if not candidate(i):
            i += 1
            continue
        j = i
        while j + 1 < len(maps) and candidate(j + 1) and maps[j + 1].start == maps[j].end:
            j += 1
        lo, hi = maps[i].start, maps[j].end
        path = ""
        if i > 0 and maps[i - 1].end == lo and maps[i - 1].name.startswith("/"):
            before = maps[i - 1]
            if (before.offset + lo - before.start) % hp == 0:
                path = before.name
        if not path and j + 1 < len(maps) and maps[j + 1].start == hi and maps[j + 1].name.startswith("/"):
            after = maps[j + 1]
            if after.offset >= hi - lo and (after.offset - (hi - lo)) % hp == 0:
                path = after.name
        for v in maps[i : j + 1]:
            if v.name.startswith(NAME_PREFIX):
                out[(v.start, v.end)] = v.name[len(NAME_PREFIX) : -1]
            elif path:
                out[(v.start, v.end)] = path
        i = j + 1
    return out


def _sizes(pid: int, ranges: dict[tuple[int, int], str]) -> dict[tuple[int, int], dict[str, int]]:
    """The smaps sizes in bytes of the given VMAs of a process (none if it is gone)."""
    try:
        return {(v.start, v.end): sizes for v, sizes in kernel.smaps(pid, lambda v: (v.start, v.end) in ranges)}
    except OSError:
        return {}


def running_copies(hp: int, pids: Iterable[int] | None = None) -> list[Copy]:
    """The anonymous copies of every process (or of `pids`), per process and file."""
    found: list[Copy] = []
    for pid in kernel.pids() if pids is None else sorted(pids):
        try:
            ranges = copy_ranges(kernel.maps(pid), hp)
        except OSError:
            continue
        if not ranges:
            continue
        sizes = _sizes(pid, ranges)
        command = kernel.comm(pid) or "?"
        per_file: dict[str, Copy] = {}
        for (lo, hi), path in ranges.items():
            c = per_file.setdefault(path, Copy(pid, command, path))
            vma = sizes.get((lo, hi), {})
            huge, rss, pss = vma.get("AnonHugePages", 0), vma.get("Rss", 0), vma.get("Pss", 0)
            c.size += hi - lo
            c.anon_huge += huge
            c.rss += rss
            c.pss += pss
        found.extend(per_file.values())
    return found
