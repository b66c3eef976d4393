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

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME_PREFIX = "[anon:hugify:"
_MAPS = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ (\d+)\s*(.*)$")


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def copy_ranges(maps: str, hp: int) -> dict[tuple[int, int], str]:
    """The anonymous copies in one process's maps: (start, end) -> the file's path.

    An unnamed run of anonymous executable whole windows is a copy when a mapping of a
    file adjoins it with offsets that continue through it: the rest of that file's
    mapping, with the run at 2 MiB-aligned file offsets (where the windows of a
    hugified file are)."""
    rows = []
    for line in maps.splitlines():
        m = _MAPS.match(line)
        if m:
            rows.append((int(m[1], 16), int(m[2], 16), m[3], int(m[4], 16), int(m[5]), m[6]))

    def candidate(i: int) -> bool:
        lo, hi, perms, _, inode, name = rows[i]
        anon = inode == 0 and (name == "" or name.startswith(NAME_PREFIX))
        return anon and "x" in perms and lo % hp == 0 and (hi - lo) % hp == 0

    out: dict[tuple[int, int], str] = {}
    i = 0
    while i < len(rows):
        if not candidate(i):
            i += 1
            continue
        j = i
        while j + 1 < len(rows) and candidate(j + 1) and rows[j + 1][0] == rows[j][1]:
            j += 1
        lo, hi = rows[i][0], rows[j][1]
        path = ""
        if i > 0 and rows[i - 1][1] == lo and rows[i - 1][5].startswith("/"):
            before = rows[i - 1]
            if (before[3] + lo - before[0]) % hp == 0:
                path = before[5]
        if not path and j + 1 < len(rows) and rows[j + 1][0] == hi and rows[j + 1][5].startswith("/"):
            after = rows[j + 1]
            if after[3] >= hi - lo and (after[3] - (hi - lo)) % hp == 0:
                path = after[5]
        for k in range(i, j + 1):
            name = rows[k][5]
            if name.startswith(NAME_PREFIX):
                out[(rows[k][0], rows[k][1])] = name[len(NAME_PREFIX) : -1]
            elif path:
                out[(rows[k][0], rows[k][1])] = path
        i = j + 1
    return out


#: The smaps fields read of each copy, in the order _smaps_sizes gives them.
_FIELDS = ("AnonHugePages:", "Rss:", "Pss:")


def _smaps_sizes(text: str, ranges: dict[tuple[int, int], str]) -> dict[tuple[int, int], tuple[int, ...]]:
    """(AnonHugePages, Rss, Pss) in bytes of the given VMAs."""
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    cur: tuple[int, int] | None = None
    for line in text.splitlines():
        m = _MAPS.match(line)
        if m:
            key = (int(m[1], 16), int(m[2], 16))
            cur = key if key in ranges else None
            continue
        name = line.split(maxsplit=1)[0] if cur and line else ""
        if cur and name in _FIELDS:
            sizes = list(out.get(cur, (0,) * len(_FIELDS)))
            sizes[_FIELDS.index(name)] = int(line.split()[1]) * 1024
            out[cur] = tuple(sizes)
    return out


def running_copies(hp: int, pids: Iterable[int] | None = None) -> list[Copy]:
    """The anonymous copies of every process (or of `pids`), per process and file."""
    found: list[Copy] = []
    proc = Path("/proc")
    every = (int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for d in (proc / str(pid) for pid in sorted(every if pids is None else pids)):
        maps = _read(d / "maps")
        ranges = copy_ranges(maps, hp) if maps else {}
        if not ranges:
            continue
        sizes = _smaps_sizes(_read(d / "smaps") or "", ranges)
        command = (_read(d / "comm") or "?").strip()
        per_file: dict[str, Copy] = {}
        for (lo, hi), path in ranges.items():
            c = per_file.setdefault(path, Copy(int(d.name), command, path))
            huge, rss, pss = sizes.get((lo, hi), (0, 0, 0))
            c.size += hi - lo
            c.anon_huge += huge
            c.rss += rss
            c.pss += pss
        found.extend(per_file.values())
    return found
