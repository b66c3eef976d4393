"""The running kernel, as hugify's Python side knows it: the one reader of what /proc
and /sys say, and the one caller of the system calls Python's os module lacks (in the
manner of mkosi's sandbox.py).

It owns the C library's handle (ctypes, one ``CDLL(None)`` with the argument types of
every call made through it) and the wrappers mount, umount, unshare, fs_type (fstatfs)
and die_with_parent (prctl), which raise OSError as os does, so that every caller says
a failure the one way (reasons.io_detail); the constants they take (MS_*, MNT_*,
CLONE_*) and the filesystem magics (linux/magic.h); the one reader of /proc/PID/maps
lines (Vma: maps, and the heading lines of smaps), the one smaps reader and the one
mountinfo reader (Mount, mounts); the PMD size, the THP settings, sysctls, the boot
id, the kernel's release and build configuration; and what the runtime's table of
large folios (hp_large_folios_since, asked through hugify.engine) means for this
kernel. ctypes is loaded on first use: the CLI must start fast.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

    from hugify.engine import Engine

# --- system calls ---------------------------------------------------------------------

#: mount(2) flags (linux/mount.h).
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME = 0x4000, 0x40000, 0x200000
#: umount2(2) flag: detached now, freed when the last user lets go.
MNT_DETACH = 2
#: unshare(2) flags (linux/sched.h).
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_PR_SET_PDEATHSIG = 1

#: statfs f_type of a tmpfs, and of every filesystem the runtime's records name
#: (linux/magic.h).
TMPFS_MAGIC = 0x01021994
FS_MAGIC = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    TMPFS_MAGIC: "tmpfs",
    0xE0F5E1E2: "erofs",
    0x2FC12FC1: "zfs",
    0xCA451A4E: "bcachefs",
    0x794C7630: "overlay",
    0x6969: "nfs",
}

_Name = str | bytes | os.PathLike[str]


@functools.cache
def libc() -> ctypes.CDLL:
    """This process's C library, with the argument types of the calls made through it."""
    import ctypes  # lazily: ~5 ms that most commands do not need

    lib = ctypes.CDLL(None, use_errno=True)
    text = ctypes.c_char_p
    lib.mount.argtypes = [text, text, text, ctypes.c_ulong, text]
    lib.umount2.argtypes = [text, ctypes.c_int]
    lib.unshare.argtypes = [ctypes.c_int]
    lib.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    for f in (lib.mount, lib.umount2, lib.unshare, lib.fstatfs, lib.prctl):
        f.restype = ctypes.c_int
    return lib


def _checked(rc: int) -> None:
    """OSError (errno and its message, as os raises it) where a call returned nonzero."""
    if rc != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _bytes(name: _Name | None) -> bytes | None:
    return None if name is None else os.fsencode(name)


def mount(source: _Name | None, target: _Name, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); OSError on failure."""
    fs = fstype.encode() if fstype else None
    _checked(libc().mount(_bytes(source), _bytes(target), fs, flags, data.encode() if data else None))


def umount(target: _Name, flags: int = 0) -> None:
    """umount2(2); OSError on failure."""
    _checked(libc().umount2(_bytes(target), flags))


def unshare(flags: int) -> None:
    """unshare(2); OSError on failure."""
    _checked(libc().unshare(flags))


def die_with_parent(signal: int) -> None:
    """prctl(PR_SET_PDEATHSIG): this process gets `signal` when its parent dies."""
    libc().prctl(_PR_SET_PDEATHSIG, signal, 0, 0, 0)


def fs_type(fd: int) -> int:
    """statfs f_type of the filesystem holding the open file (os.statvfs does not give
    it); OSError on failure."""
    import ctypes

    class Statfs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_long * 15)]

    buf = Statfs()
    _checked(libc().fstatfs(fd, ctypes.byref(buf)))
    return int(buf.f_type) & 0xFFFFFFFF


# --- what /proc and /sys say ----------------------------------------------------------


def read_text(path: Path | str) -> str | None:
    """A file of /proc or /sys, stripped; None where it cannot be read."""
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


def sysctl(name: str) -> str | None:
    """A sysctl by its dotted name (kernel.unprivileged_userns_clone), or None."""
    return read_text(Path("/proc/sys", name.replace(".", "/")))


def boot_id() -> str | None:
    return read_text("/proc/sys/kernel/random/boot_id")


def pids() -> list[int]:
    """The processes /proc lists, by pid."""
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def alive(pid: int) -> bool:
    """Whether a process of this pid runs (in this process's PID namespace)."""
    return os.path.exists(f"/proc/{pid}")


def comm(pid: int) -> str | None:
    """A process's command name (/proc/PID/comm); None where it is gone."""
    return read_text(f"/proc/{pid}/comm")


#: A line of /proc/PID/maps, and the heading line of each mapping in smaps:
#: start-end perms offset major:minor inode [name].
_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")


@dataclass(frozen=True)
class Vma:
    """One mapping of a process, as a line of /proc/PID/maps (or the heading of its
    smaps entry) gives it."""

    start: int
    end: int
    perms: str
    offset: int
    dev: int  # os.makedev(major, minor) of the inode's filesystem
    inode: int
    #: As the kernel wrote it: a path (" (deleted)" after it once removed), a
    #: "[heap]"-like name, an "[anon:NAME]", or "" for unnamed anonymous memory.
    name: str

    @property
    def path(self) -> str:
        """The name without the " (deleted)" of a removed file."""
        return self.name.removesuffix(" (deleted)")

    @property
    def deleted(self) -> bool:
        return self.name.endswith(" (deleted)")

    @property
    def executable(self) -> bool:
        return "x" in self.perms


def maps_line(line: str) -> Vma | None:
    """The mapping a maps line (or smaps heading) describes; None for any other line."""
    m = _MAPS_LINE.match(line)
    if not m:
        return None
    return Vma(
        int(m[1], 16),
        int(m[2], 16),
        m[3],
        int(m[4], 16),
        os.makedev(int(m[5], 16), int(m[6], 16)),
        int(m[7]),
        m[8],
    )


def parse_maps(lines: Iterable[str]) -> list[Vma]:
    """The mappings of /proc/PID/maps text (or its lines)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    return [v for v in map(maps_line, lines) if v is not None]


def maps(pid: int | str) -> list[Vma]:
    """The mappings of a process ("self" for this one); OSError if it is gone or
    hidden (PermissionError: another user's, to a user other than root)."""
    with open(f"/proc/{pid}/maps", errors="replace") as f:
        return parse_maps(f)


def smaps(pid: int | str, keep: Callable[[Vma], bool]) -> list[tuple[Vma, dict[str, int]]]:
    """The mappings of a process that `keep` accepts, each with its sizes in bytes by
    smaps's names (Rss, Pss, AnonHugePages, FilePmdMapped, ShmemPmdMapped, ...).
    OSError if the process is gone or hidden."""
    out: list[tuple[Vma, dict[str, int]]] = []
    sizes: dict[str, int] | None = None
    with open(f"/proc/{pid}/smaps", errors="replace") as f:
        for line in f:
            v = maps_line(line)
            if v is not None:
                sizes = {} if keep(v) else None
                if sizes is not None:
                    out.append((v, sizes))
            elif sizes is not None and line.endswith(" kB\n"):
                key, _, value = line.partition(":")
                sizes[key] = int(value.split()[0]) * 1024
    return out


@dataclass(frozen=True)
class Mount:
    """A mounted filesystem, from /proc/self/mountinfo."""

    device: str  # "MAJOR:MINOR" as mountinfo says (btrfs files have st_dev of their subvolume)
    fstype: str
    mountpoint: str
    #: The filesystem's own options (mountinfo's super options: ext4's data=journal,
    #: tmpfs's huge= and size=), as a tuple of "key" or "key=value".
    options: tuple[str, ...] = ()

    def option(self, key: str) -> str | None:
        """The value of a "key=value" option (the last one given); None without it."""
        found = None
        for o in self.options:
            name, _, value = o.partition("=")
            if name == key:
                found = value
        return found

    @property
    def huge(self) -> str:
        """A tmpfs's huge= (never, within_size, always, advise)."""
        return self.option("huge") or "never"

    @property
    def size(self) -> int | None:
        """A tmpfs's size in bytes (it says KiB: size=262144k), or None: unbounded."""
        value = self.option("size") or ""
        units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
        if value[:-1].isdigit() and value[-1:] in units:
            return int(value[:-1]) * units[value[-1]]
        return int(value) if value.isdigit() else None


def mounts() -> list[Mount]:
    """The mounts of this process's namespace, in mountinfo's order."""
    out = []
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) > 4 and tail:
            options = tuple(tail[2].split(",")) if len(tail) > 2 else ()
            out.append(Mount(fields[2], tail[0], fields[4].replace("\\040", " "), options))
    return out


def mount_holding(path: str, mounted: list[Mount]) -> Mount | None:
    """The mount holding `path`: the last mount on the longest prefix of its real path
    (st_dev does not name it for btrfs, whose subvolumes have devices of their own)."""
    real = os.path.realpath(path)
    best: Mount | None = None
    for fs in mounted:
        mp = fs.mountpoint.rstrip("/") or ""
        if (real == mp or real.startswith(mp + "/")) and (best is None or len(mp) >= len(best.mountpoint.rstrip("/"))):
            best = fs
    return best


def mount_on(path: str | os.PathLike[str]) -> Mount | None:
    """The last mount exactly on `path` (its real path), or None."""
    real = os.path.realpath(path)
    return next((m for m in reversed(mounts()) if m.mountpoint == real), None)


# --- huge pages -----------------------------------------------------------------------

THP = Path("/sys/kernel/mm/transparent_hugepage")


def thp_setting(name: str) -> str | None:
    """The chosen value of a THP setting (enabled, defrag, shmem_enabled: the word in
    brackets); None where this kernel has none."""
    m = re.search(r"\[(\w[\w+]*)\]", read_text(THP / name) or "")
    return m.group(1) if m else None


def pmd_size() -> int:
    """The size of a PMD huge page on this system (the core's default where the kernel
    does not say)."""
    pmd = read_text(THP / "hpage_pmd_size")
    return int(pmd) if pmd and pmd.isdigit() else default_huge_page()


def default_huge_page() -> int:
    """The core's default huge-page size (its architecture table), imported lazily: the
    extension is only loaded where a file is read."""
    from hugify import _core

    return _core.DEFAULT_HUGE_PAGE


def kernel_config(option: str) -> bool | None:
    """A boolean kernel configuration option, from /proc/config.gz or /boot; None if
    neither can be read."""
    text = None
    try:
        import gzip  # only status needs it

        with gzip.open("/proc/config.gz", "rt") as f:
            text = f.read()
    except OSError:
        text = read_text(f"/boot/config-{os.uname().release}")
    if text is None:
        return None
    return re.search(rf"^{option}=[ym]$", text, re.M) is not None


def kernel_version(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# --- large folios ---------------------------------------------------------------------


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
    return since > 0 and kernel_version(release or os.uname().release) >= divmod(since, 1000)


def large_folios_remedy(engine: Engine, fstype: str, release: str | None = None) -> str:
    """Which kernel would give files on `fstype` large folios, in a few words (from the
    runtime's table, hp_large_folios_since)."""
    since = large_folios_since(engine, fstype)
    if since < 0:
        return f"whether a newer kernel gives {fstype} large folios is not known to hugify"
    if since == 0:
        return f"no kernel Debian ships gives {fstype} large folios yet (up to Linux 7.3)"
    major, minor = divmod(since, 1000)
    if kernel_version(release or os.uname().release) >= (major, minor):
        return f"{fstype} has large folios from Linux {major}.{minor}, yet this kernel gave none"
    hint = " (on Debian 13: the kernel of trixie-backports)" if (major, minor) >= (6, 13) else ""
    return f"{fstype} has them from Linux {major}.{minor}{hint}"
