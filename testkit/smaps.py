"""The smaps oracle: what a process had mapped, read from /proc/PID/smaps text as the
kernel wrote it (never through hugify's own reader, hugify/procmaps or the runtime's),
so that a test checks hugify's reading of the mappings against the kernel's word.

One reader, vmas(): every mapping with its range, permissions, inode and name, and the
huge-page lines the tests look at (AnonHugePages, FilePmdMapped, ShmemPmdMapped, in
bytes). The test programs print their own smaps after a line `--- smaps`
(smaps_text, smaps_of); exec_mappings() sums a program's executable file mappings per
path.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

#: The head line of a mapping: start-end perms offset dev inode [name].
_HEAD = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")
#: The huge-page lines read, and the field each one fills.
_HUGE_FIELDS = {"AnonHugePages:": "anon_huge", "FilePmdMapped:": "file_pmd", "ShmemPmdMapped:": "shmem_pmd"}


@dataclass
class Vma:
    lo: int
    hi: int
    perms: str
    inode: int
    name: str
    anon_huge: int = 0
    file_pmd: int = 0
    shmem_pmd: int = 0
    #: Whether the kernel wrote a FilePmdMapped line for it (it has since Linux 4.8).
    has_file_pmd: bool = False


def vmas(smaps: str) -> list[Vma]:
    out: list[Vma] = []
    for line in smaps.splitlines():
        m = _HEAD.match(line)
        if m:
            out.append(Vma(int(m[1], 16), int(m[2], 16), m[3], int(m[4]), m[5]))
            continue
        field = _HUGE_FIELDS.get(line.split(maxsplit=1)[0]) if line and out else None
        if field:
            setattr(out[-1], field, int(line.split()[1]) * 1024)
            if field == "file_pmd":
                out[-1].has_file_pmd = True
    return out


def smaps_text(stdout: str) -> str:
    """The smaps a test program printed after its `--- smaps` line."""
    assert "--- smaps\n" in stdout, stdout[-2000:]
    return stdout.split("--- smaps\n", 1)[1]


def smaps_of(res: subprocess.CompletedProcess[str]) -> list[Vma]:
    return vmas(res.stdout.split("--- smaps\n", 1)[1])


@dataclass
class Mapping:
    size: int
    pmd: int


def exec_mappings(smaps: str) -> dict[str, Mapping]:
    """Executable file mappings: path -> their size and FilePmdMapped, summed."""
    out: dict[str, Mapping] = {}
    for v in vmas(smaps):
        if v.has_file_pmd and "x" in v.perms and v.name.startswith("/"):
            prev = out.get(v.name, Mapping(0, 0))
            out[v.name] = Mapping(prev.size + v.hi - v.lo, prev.pmd + v.file_pmd)
    return out
