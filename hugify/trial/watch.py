"""What the command's processes map, read from /proc while each run lasts.

A watcher thread looks every SAMPLE_INTERVAL at every process below a side's process
(/proc/PID/task/TID/children). In the first run it collects every file mapped
executable (the objects the command runs, also those of static programs and of
processes the record library cannot see). In the timed runs it follows the objects
under test, recognised by inode (so the bind-mounted copy and its original are told
apart whatever path a process used): which of the two each process mapped,
FilePmdMapped and Rss of their code (the most in one process at one time), and, where
the kernel has PAGEMAP_SCAN (Linux 6.7), which of the copy's huge-page windows a
process had PMD-mapped or executed on small pages (a window a process had small and
later huge counts as huge: the audit library's probe faults a window in small pages
before it maps the window from a shared copy). With the runtime's anonymous copies
(hugify.anoncopies) the copies of an object's windows are its code, their
AnonHugePages its huge pages: the audit library copies the windows at the process's
start and unmaps them from the file, so the file's mapping shows the code only while
it copies (for libclang-cpp about half a second, which a loaded machine's watcher can
miss entirely); the most the copies held in one process is recorded too. Root's shared
copies (the shared way) count as the copy they were made of, their ShmemPmdMapped as
its huge pages.

A process that lives less than SAMPLE_INTERVAL may be missed; the counts say how many
samples saw anything.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field

from hugify import anoncopies, kernel
from hugify.engine import Engine
from hugify.kernel import Vma
from hugify.trial.sides import descendants

#: Seconds between two looks at the processes; until FIRST_LOOKS have found one,
#: FIRST_INTERVAL.
SAMPLE_INTERVAL = 0.025
FIRST_LOOKS, FIRST_INTERVAL = 3, 0.002


def of_inodes(pid: int, inodes: set[int]) -> list[tuple[Vma, dict[str, int]]]:
    """The mappings of the given inodes (0: anonymous memory) in a process, with their
    smaps sizes in bytes. OSError if the process is gone or unreadable."""
    return kernel.smaps(pid, lambda v: v.inode in inodes)


def executable_files(pid: int) -> list[Vma]:
    """The files a process maps executable (its program, its libraries)."""
    return [v for v in kernel.maps(pid) if v.executable and v.inode and v.path.startswith("/")]


def pid_inside(pid: int) -> int:
    """The pid a process has in its own PID namespace (a side's, where the record
    library writes its pid down), from the last field of NSpid; `pid` if unknown."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return pid


def _identity(pid: int) -> tuple[int, int, bytes]:
    """The program file and the arguments of a process: a child the side's process
    spawned is that process until it executes the command."""
    st = os.stat(f"/proc/{pid}/exe")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return st.st_dev, st.st_ino, f.read()


class Sampler(threading.Thread):
    """Looks at every process below `root` until stopped; subclasses say what to read."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stopping = threading.Event()
        self.samples = 0  # looks that found a process to read
        self.unreadable: dict[int, str] = {}  # pid -> its command, for processes /proc would not show
        self.spawner = _identity(root)

    def run(self) -> None:
        while True:
            found = False
            for pid in descendants(self.root):
                try:
                    if _identity(pid) == self.spawner:
                        continue  # spawned, not yet executing the command
                    self.look(pid)
                    found = True
                except PermissionError:
                    if (name := kernel.comm(pid)) is not None:
                        self.unreadable[pid] = name
                except OSError:
                    continue  # gone meanwhile
            self.samples += found
            # the first looks come sooner: a short run may end before the second one
            if self.stopping.wait(SAMPLE_INTERVAL if self.samples >= FIRST_LOOKS else FIRST_INTERVAL):
                return

    def look(self, pid: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        self.stopping.set()
        self.join()


class FileSampler(Sampler):
    """The first run's: every file mapped executable, by path and inode."""

    def __init__(self, root: int) -> None:
        super().__init__(root)
        self.files: dict[str, tuple[int, int]] = {}  # path -> (dev, inode)
        self.processes: set[int] = set()  # by their pids in the side's PID namespace

    def look(self, pid: int) -> None:
        for v in executable_files(pid):
            self.files.setdefault(v.path, (v.dev, v.inode))
        self.processes.add(pid_inside(pid))


@dataclass(frozen=True)
class Watched:
    """An object under test: its original and its copy, by (dev, inode), and the
    copy's huge-page windows (file offsets)."""

    name: str
    original: tuple[int, int]
    copy: tuple[int, int]
    windows: tuple[int, ...]


@dataclass
class Seen:
    """What the processes of one side mapped of one object."""

    mapped: set[str] = field(default_factory=set)  # "original", "copy"
    #: most huge pages of its code in one process at one time (FilePmdMapped,
    #: ShmemPmdMapped, or its anonymous copies' AnonHugePages)
    pmd: int = 0
    rss: int = 0  # most resident code in one process at one time
    huge: set[int] = field(default_factory=set)  # windows seen PMD-mapped
    small: set[int] = field(default_factory=set)  # windows seen executed on small pages
    small_in: dict[int, str] = field(default_factory=dict)  # window -> a process that had it small

    def add(self, other: Seen) -> None:
        self.mapped |= other.mapped
        self.pmd, self.rss = max(self.pmd, other.pmd), max(self.rss, other.rss)
        self.huge |= other.huge
        self.small |= other.small
        for w, who in other.small_in.items():
            self.small_in.setdefault(w, who)


class RunSampler(Sampler):
    """A timed run's: the objects under test (see the module's docstring)."""

    def __init__(
        self,
        root: int,
        objects: list[Watched],
        hp: int,
        scan: Engine | None,
        *,
        anonymous: bool,
        shared: dict[tuple[int, int], str] | None = None,
    ) -> None:
        """`shared`: root's shared copies, (device, inode) -> the path of the copy they
        are of (Watched.copy's file)."""
        super().__init__(root)
        self.objects = objects
        self.hp = hp
        self.scan = scan
        self.anonymous = anonymous
        self.by_inode: dict[int, list[tuple[Watched, str, tuple[int, int]]]] = {}
        for o in objects:
            self.by_inode.setdefault(o.original[1], []).append((o, "original", o.original))
            self.by_inode.setdefault(o.copy[1], []).append((o, "copy", o.copy))
        copy_of = {o.copy: o for o in objects}
        for identity, path in (shared or {}).items():
            try:
                st = os.stat(path)
            except OSError:
                continue
            of = copy_of.get((st.st_dev, st.st_ino))
            if of is not None:
                self.by_inode.setdefault(identity[1], []).append((of, "copy", identity))
        self.seen: dict[str, Seen] = {o.name: Seen() for o in objects}
        #: (object, window) -> the processes seen with it small and not huge since.
        self.small_pids: dict[tuple[str, int], set[int]] = {}
        self.anon_held = 0  # most AnonHugePages of the runtime's copies in one process at one time
        self.copied_in: set[int] = set()

    def _which(self, v: Vma) -> tuple[Watched, str] | None:
        found = self.by_inode.get(v.inode, [])
        exact = [(o, kind) for o, kind, identity in found if identity == (v.dev, v.inode)]
        if exact:
            return exact[0]
        # btrfs: stat's st_dev is the subvolume's, maps shows the filesystem's
        return found[0][:2] if len(found) == 1 else None

    def look(self, pid: int) -> None:
        per: dict[str, tuple[int, int]] = {}
        for v, sizes in of_inodes(pid, set(self.by_inode)):
            hit = self._which(v)
            if hit is None:
                continue
            o, kind = hit
            s = self.seen[o.name]
            s.mapped.add(kind)
            if not v.executable:
                continue
            pmd, rss = per.get(o.name, (0, 0))
            huge = sizes.get("FilePmdMapped", 0) + sizes.get("ShmemPmdMapped", 0)
            per[o.name] = (pmd + huge, rss + sizes.get("Rss", 0))
            if kind == "copy" and self.scan and o.windows and not self.anonymous:
                self._scan(pid, o, v, s)
        if self.anonymous:
            copies = [c for c in anoncopies.running_copies(self.hp, pids=[pid]) if c.path in self.seen]
            for c in copies:
                pmd, rss = per.get(c.path, (0, 0))
                per[c.path] = (pmd + c.anon_huge, rss + c.rss)
            held = sum(c.anon_huge for c in copies)
            self.anon_held = max(self.anon_held, held)
            if held:
                self.copied_in.add(pid)
        for name, (pmd, rss) in per.items():
            s = self.seen[name]
            s.pmd, s.rss = max(s.pmd, pmd), max(s.rss, rss)

    def _scan(self, pid: int, o: Watched, v: Vma, s: Seen) -> None:
        """Classifies the copy's windows inside this mapping: PMD-mapped, or some page
        of it present on small pages (executed), or neither (not executed yet)."""
        assert self.scan is not None
        hp = self.hp
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            both = Engine.PAGE_IS_PRESENT | Engine.PAGE_IS_HUGE
            regions = self.scan.page_regions(fd, v.start, v.end, both, both)
        finally:
            os.close(fd)
        for w in o.windows:
            lo = v.start + w - v.offset
            if w < v.offset or lo + hp > v.end:
                continue
            hit = [(a, b, c) for a, b, c in regions if a < lo + hp and b > lo]
            pids = self.small_pids.setdefault((o.name, w), set())
            if any(c & Engine.PAGE_IS_HUGE and a <= lo and b >= lo + hp for a, b, c in hit):
                s.huge.add(w)
                pids.discard(pid)
            elif hit:
                pids.add(pid)
            if pids:
                s.small.add(w)
                s.small_in[w] = f"pid {min(pids)}"
            else:
                s.small.discard(w)
                s.small_in.pop(w, None)
