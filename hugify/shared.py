"""Root's shared copies of hugified files (docs/runtime-reference.md, "Shared copies").

Where the filesystem gives a file no 2 MiB folios (the engine's `unsupported`), `hugify
prefetch` run by root keeps one copy of the whole file on a tmpfs mounted with
``huge=within_size``, written at its final size so that its windows are shared-memory
huge pages; the audit library maps the file's code windows from it in every process
(runtime/hp_shared.h says what it proves first). Whole files, so that perf reads the
build-id and symbols of the mapped file and core dumps name it as before.

This module mounts the tmpfs where it may, writes, keeps and drops the copies and their
records — only of files every user may read already ("who may read an original" below),
within the policy's budget of all the memory the store holds, in the order it is given
the files (the boot's order) — and says what the copies hold for `hugify status`. Every file it creates is
made under a name no reader looks at and renamed into place whole; the directory is
locked for one run at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import struct
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from hugify import files, kernel, reasons
from hugify.docs import doc
from hugify.engine import UNSUPPORTED
from hugify.hugified import NotHugified, read_hugified

if TYPE_CHECKING:
    from hugify.engine import Engine

#: The copies' directory in the runtime directory, the tmpfs hugify mounts there, the
#: record beside each copy and its first word (runtime/hp_shared.h: one format).
SHARED_DIR = "shared"
RECORD = "record"
MAGIC = "hugify-shared-1"
#: What `mount` shows as the tmpfs's source.
MOUNT_SOURCE = "hugify-shared"
#: The tmpfs's options besides its size: root's, nobody else may create anything in it;
#: nosuid and nodev, but not noexec, since the copies are mapped executable;
#: huge=within_size gives a file written at its final size a huge page for every whole
#: 2 MiB of it (and none for a partial tail), with no madvise.
MOUNT_OPTIONS = "mode=0755,uid=0,gid=0,huge=within_size"
#: Room in the tmpfs beyond the budget: each record takes a page, each directory none.
MOUNT_SLACK = 4 << 20
#: The drop-in hugify-shared-generator writes for run-hugify-shared.mount, in the
#: directory systemd gives it: the tmpfs's size from the policy.
MOUNT_UNIT = "run-hugify-shared.mount"
MOUNT_DROPIN = "50-hugify-shared-budget.conf"
#: huge= values with which a file written at its final size gets huge pages.
HUGE_MOUNT_VALUES = ("within_size", "always")
_CHUNK = 1 << 20


class Refused(Exception):
    """No copy for a file: a reason id of the core's table and a one-line detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Record:
    """What root writes beside a copy: the original's identity as the audit library
    sees it (the mapping's device and inode, size, times in ns), the copy's inode and
    change time when sealed, the SHA-256 of the bytes copied, the copy's name and the
    original's path."""

    major: int
    minor: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    copy_inode: int
    copy_ctime_ns: int
    sha256: str
    name: str
    path: str

    @property
    def key(self) -> str:
        """The directory of the copy: MAJOR:MINOR:INODE of the original."""
        return f"{self.major}:{self.minor}:{self.inode}"

    def text(self) -> str:
        numbers = (
            self.major,
            self.minor,
            self.inode,
            self.size,
            self.mtime_ns,
            self.ctime_ns,
            self.copy_inode,
            self.copy_ctime_ns,
        )
        return f"{MAGIC} {' '.join(map(str, numbers))} {self.sha256} {self.name}\n{self.path}\n"

    @classmethod
    def parse(cls, text: str) -> Record | None:
        first, _, rest = text.partition("\n")
        fields = first.split(" ")
        if len(fields) != 11 or fields[0] != MAGIC or not all(f.isdigit() for f in fields[1:9]):
            return None
        major, minor, inode, size, mtime_ns, ctime_ns, copy_inode, copy_ctime_ns = (int(f) for f in fields[1:9])
        return cls(
            major,
            minor,
            inode,
            size,
            mtime_ns,
            ctime_ns,
            copy_inode,
            copy_ctime_ns,
            fields[9],
            fields[10],
            rest.rstrip("\n"),
        )


def key_of(identity: tuple[int, int, int]) -> str:
    return "{}:{}:{}".format(*identity)


def shared_dir(rdir: Path) -> Path:
    return rdir / SHARED_DIR


# --- the tmpfs ------------------------------------------------------------------------


def mount_of(path: Path) -> kernel.Mount | None:
    """The tmpfs mounted exactly on `path` (the last mount there), or None."""
    m = kernel.mount_on(path)
    return m if m is not None and m.fstype == "tmpfs" else None


def mount_size(budget: int) -> int:
    """The tmpfs's size= for a budget: the copies' and the records' room."""
    return budget + MOUNT_SLACK


def mount_unit_options(budget: int) -> str:
    """The Options= of run-hugify-shared.mount for a budget (its mount flags as words)."""
    return f"{MOUNT_OPTIONS},nosuid,nodev,size={mount_size(budget)}"


def write_mount_dropin(unit_dir: Path, budget: int) -> Path:
    """Writes the drop-in that sizes run-hugify-shared.mount for `budget` into a unit
    directory; its path."""
    d = unit_dir / f"{MOUNT_UNIT}.d"
    d.mkdir(parents=True, exist_ok=True)
    path = d / MOUNT_DROPIN
    path.write_text(
        "# Written by hugify-shared-generator, at boot and at every daemon-reload, from the\n"
        f'# policy\'s runtime.shared_budget ({doc("runtime.md")}, "Shared copies").\n'
        f"[Mount]\nOptions={mount_unit_options(budget)}\n"
    )
    return path


def generate(argv: list[str]) -> int:
    """hugify-shared-generator, a systemd generator (systemd.generator(7)): `argv` is
    systemd's normal, early and late directories; the drop-in goes to the first, so
    that an administrator's own in /etc (systemctl edit) still wins. A policy that is
    not usable leaves the unit's own size, said in one line."""
    if len(argv) not in (1, 3):
        print("usage: hugify-shared-generator NORMAL_DIR [EARLY_DIR LATE_DIR]", file=sys.stderr)
        return 2
    from hugify import policy

    try:
        budget = policy.resolve(policy.load(), for_build=False).shared_budget
    except policy.PolicyError as e:
        first = str(e).strip().splitlines()[0]
        print(
            f"hugify-shared-generator: {MOUNT_UNIT} keeps its own size: the policy is not usable: {first}",
            file=sys.stderr,
        )
        return 1
    write_mount_dropin(Path(argv[0]), budget)
    return 0


def ensure_mounted(rdir: Path, budget: int) -> kernel.Mount:
    """The tmpfs of the copies, mounted now (as root with CAP_SYS_ADMIN) if it is not,
    sized for `budget`. Refused if there is none and it cannot be mounted (the boot
    service's sandbox may not mount: run-hugify-shared.mount does), or the one there
    gives no huge pages or has no size (a tmpfs counts the memory it holds only when
    bounded: the budget is kept with that count)."""
    where = shared_dir(rdir)
    m = mount_of(where)
    if m is None:
        try:
            os.makedirs(where, mode=0o755, exist_ok=True)
        except OSError as e:
            raise Refused("shared-unavailable", f"cannot make {where}: {reasons.io_detail(e, with_file=False)}") from e
        opts = f"{MOUNT_OPTIONS},size={mount_size(budget)}"
        try:
            kernel.mount(MOUNT_SOURCE, where, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, opts)
        except OSError as e:
            why = reasons.io_detail(e, with_file=False)
            raise Refused("shared-unavailable", f"cannot mount a tmpfs on {where}: {why}") from e
        m = mount_of(where)
        if m is None:
            raise Refused("shared-unavailable", f"the tmpfs mounted on {where} is not seen in mountinfo")
    if m.huge not in HUGE_MOUNT_VALUES:
        raise Refused(
            "shared-unavailable",
            f"the tmpfs on {where} is mounted with huge={m.huge}: its files get no huge pages (needs huge=within_size)",
        )
    if not m.size:
        raise Refused(
            "shared-unavailable",
            f"the tmpfs on {where} is mounted without size=: what its copies hold cannot be counted "
            "against runtime.shared_budget",
        )
    return m


def _roots_alone(st: os.stat_result) -> bool:
    return st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@contextlib.contextmanager
def opened(rdir: Path) -> Iterator[int]:
    """The copies' directory, open and locked against other runs; checked as the audit
    library checks it (root's alone, on tmpfs), so that a copy root writes is one the
    runtime may use."""
    where = shared_dir(rdir)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise Refused("shared-unavailable", f"cannot open {where}: {reasons.io_detail(e, with_file=False)}") from e
    try:
        st, run = os.fstat(fd), os.stat(rdir)
        if not (_roots_alone(st) and _roots_alone(run)):
            raise Refused("shared-unavailable", f"{where} or {rdir} is not root's alone (owner root, mode 0755)")
        if not _on_tmpfs(fd):
            raise Refused("shared-unavailable", f"{where} is not on tmpfs")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _on_tmpfs(fd: int) -> bool:
    try:
        return kernel.fs_type(fd) == kernel.TMPFS_MAGIC
    except OSError:
        return False


# --- who may read an original --------------------------------------------------------
#
# A copy is 0444 in directories every user may enter, and its record names the original:
# it would show the file's bytes, name and path to every user. So a copy is made only of
# a file every user but its owner may read already, by a path every such user may list:
# the file and each directory of its path are checked on the descriptors the copy is made
# from, and again on the same descriptors once it is written. What counts as "may":
# - the mode: group and others may read the file, and read and search each directory
#   (a group denied what others get is a restriction too);
# - a POSIX ACL (system.posix_acl_access): every entry but the owner's grants as much
#   (a named user, the owning group, a named group, the mask, others);
# - an access control list hugify cannot judge (NFSv4's, richacl) restricts;
# - a security label restricts unless it restricts nothing by its module's own rules:
#   Smack's floor "_" and star "*"; SELinux's type enforcement is the loaded policy's to
#   decide, which hugify does not judge, so any SELinux label restricts (no copies
#   where files carry them); attributes that decide no access (file capabilities,
#   IMA/EVM's, Smack's exec and transmute labels) do not.
# A store only root may reach (the runtime directory of hugify try, in its own 0700
# directory) shows nobody anything: there the originals are not checked.

_ACL_ACCESS = "system.posix_acl_access"
_ACL_VERSION = 2
#: The tags of a POSIX ACL's entries (linux/posix_acl.h), as the detail names them.
_ACL_TAGS = {1: "its owner", 2: "user {}", 4: "its group", 8: "group {}", 0x10: "the mask", 0x20: "others"}
_ACL_USER_OBJ = 1
#: Access control lists whose entries hugify does not read: any of them restricts.
_OTHER_ACLS = ("system.nfs4_acl", "system.richacl")
#: security.* attributes that decide no access to the file itself.
_NOT_ACCESS_LABELS = (
    "security.capability",
    "security.ima",
    "security.evm",
    "security.SMACK64EXEC",
    "security.SMACK64TRANSMUTE",
)
#: Smack labels every process may read: the floor and the star.
_SMACK_OPEN = (b"_", b"*")
_READ, _LIST = 4, 5  # rwx bits a user needs: read a file; read and search a directory


def _denied(fd: int, st: os.stat_result, need: int) -> str | None:
    """Why a user other than the owner of the open file or directory `fd` (state `st`)
    may not `need` it (mode bits, 4 or 5), or None: every such user may."""
    names = _xattrs(fd)
    # Under an ACL the mode's group bits are its mask, checked with the entries below.
    for who, shift in (("its group", 3), ("others", 0)):
        if (st.st_mode >> shift) & need != need and not (shift and _ACL_ACCESS in names):
            return f"mode {stat.S_IMODE(st.st_mode):04o} denies {who}"
    for name in names:
        if name == _ACL_ACCESS:
            acl = os.getxattr(fd, name)
            if len(acl) < 4 or (len(acl) - 4) % 8 or int.from_bytes(acl[:4], "little") != _ACL_VERSION:
                return "an ACL of an unknown format"
            for tag, perm, ident in struct.iter_unpack("<HHI", acl[4:]):
                if tag not in _ACL_TAGS:
                    return f"an ACL entry of an unknown tag ({tag:#x})"
                if tag != _ACL_USER_OBJ and perm & need != need:
                    return f"its ACL denies {_ACL_TAGS[tag].format(ident)}"
        elif name in _OTHER_ACLS:
            return f"an access control list hugify does not judge ({name})"
        elif name.startswith("security.") and name not in _NOT_ACCESS_LABELS:
            if name == "security.SMACK64" and os.getxattr(fd, name).rstrip(b"\0") in _SMACK_OPEN:
                continue
            return f"a security label that may deny some users ({name})"
    return None


def _xattrs(fd: int) -> list[str]:
    """The extended attributes' names of an open file (none where the filesystem has
    none)."""
    try:
        return os.listxattr(fd)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            return []
        raise


class WorldReadable:
    """The proof that every user may read an original by its path: the directories of
    its real path, open from / down."""

    def __init__(self, src_fd: int, path: str) -> None:
        self.path = os.path.realpath(path)
        self.names = self.path.split("/")[1:]
        self.dirs: list[tuple[int, str]] = []  # each open directory and its path
        self.src_fd = src_fd

    def prove(self) -> None:
        """Opens the directories (no symbolic link followed) and checks them and the
        file; Refused (copy-private) where some user may not read it."""
        where = "/"
        try:
            self.dirs.append((os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), where))
            for part in self.names[:-1]:
                where = os.path.join(where, part)
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dirs[-1][0])
                self.dirs.append((fd, where))
        except OSError as e:
            raise Refused("copy-private", f"its path cannot be checked: {where}: {reasons.io_detail(e)}") from e
        self.check()

    def check(self) -> None:
        """Checks, on the open directories and the open file: every user may read and
        search each directory and read the file, and each is still the entry of its
        name in the directory before it (nothing renamed the path elsewhere). Refused
        (copy-private) otherwise."""
        try:
            for i, (fd, where) in enumerate(self.dirs):
                st = os.fstat(fd)
                why = _denied(fd, st, _LIST)
                if why:
                    raise Refused("copy-private", f"not readable by every user: {where}: {why}")
                entry = os.stat(self.names[i], dir_fd=fd, follow_symlinks=False)
                below = os.fstat(self.dirs[i + 1][0] if i + 1 < len(self.dirs) else self.src_fd)
                if (entry.st_dev, entry.st_ino) != (below.st_dev, below.st_ino):
                    raise Refused("copy-private", f"{os.path.join(where, self.names[i])} is not the file opened")
            why = _denied(self.src_fd, os.fstat(self.src_fd), _READ)
        except OSError as e:
            raise Refused("copy-private", f"its path cannot be checked: {reasons.io_detail(e)}") from e
        if why:
            raise Refused("copy-private", f"not readable by every user: {why}")

    def close(self) -> None:
        for fd, _ in self.dirs:
            os.close(fd)
        self.dirs.clear()


def reached_by_root_alone(store: int, where: Path) -> bool:
    """Whether only root may reach the store's files: a directory of its real path (the
    store's included) is root's and neither its group nor others may search it (under
    an ACL the group bits are its mask, which bounds every named entry). Checked on
    descriptors down to the store that is open."""
    fds: list[int] = []
    private = False
    try:
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.append(fd)
        for part in os.path.realpath(where).split("/")[1:]:
            fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            fds.append(fd)
        for fd in fds:
            st = os.fstat(fd)
            private |= st.st_uid == 0 and not st.st_mode & (stat.S_IXGRP | stat.S_IXOTH)
        st, mine = os.fstat(fds[-1]), os.fstat(store)
        return private and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


# --- the copies -----------------------------------------------------------------------


def _ns(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def read_record(store: int, key: str) -> Record | None:
    try:
        fd = os.open(f"{key}/{RECORD}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
    except OSError:
        return None
    try:
        if not _roots_alone(os.fstat(fd)):
            return None
        return Record.parse(os.read(fd, 16384).decode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def copy_problem(store: int, rec: Record, original: os.stat_result | None) -> tuple[str, str] | None:
    """Why a recorded copy is of no use (reason id, detail), as the audit library would
    find it; None if it is usable: the original unchanged since the copy (when given),
    the copy root's alone, the inode root sealed, unwritten since."""
    if original is not None and _ns(original) != (rec.size, rec.mtime_ns, rec.ctime_ns):
        return "copy-stale", "the file changed since it was copied"
    try:
        fd = os.open(f"{rec.key}/{rec.name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
    except OSError as e:
        return "no-copy", f"the copy cannot be opened: {reasons.io_detail(e, with_file=False)}"
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not (_roots_alone(st) and stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
        return "copy-untrusted", "the copy is not root's alone"
    if (st.st_ino, st.st_ctime_ns, st.st_size) != (rec.copy_inode, rec.copy_ctime_ns, rec.size):
        return "copy-changed", "the copy was written since root sealed it"
    return None


def memory_for(size: int) -> int:
    """Bytes of tmpfs a copy of a file of `size` bytes takes: whole pages."""
    return -(-size // 4096) * 4096


def held(store: int, rec: Record) -> int:
    """Bytes of memory the copy holds (its tmpfs blocks)."""
    try:
        return os.stat(f"{rec.key}/{rec.name}", dir_fd=store, follow_symlinks=False).st_blocks * 512
    except OSError:
        return 0


def copy_name(path: str) -> str:
    """The copy's name: the original's (perf and core dumps show it), if the record can
    hold it."""
    name = os.path.basename(path)
    if not name or name in (".", "..") or "\n" in name or " " in name:
        return "copy"
    return name


def _remove_tree(store: int, name: str) -> None:
    """Removes the directory `name` of the store and the files in it (a copy mapped by
    running processes lives on for them, unlinked)."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
        try:
            for entry in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=store)


def drop(store: int, key: str) -> None:
    """Removes a copy and its record: renamed out of the runtime's way first, so that no
    process finds a record without its copy."""
    gone = f".old-{key}-{os.getpid()}"
    try:
        os.rename(key, gone, src_dir_fd=store, dst_dir_fd=store)
    except FileNotFoundError:
        return
    _remove_tree(store, gone)


@dataclass(frozen=True)
class Original:
    """A hugified file to copy, open: its identity as the audit library sees it (the
    mapping's device and inode), its state before the copy, its windows' offsets and
    the huge-page size they are windows of."""

    fd: int
    path: str
    identity: tuple[int, int, int]
    offsets: tuple[int, ...]
    before: os.stat_result
    hp: int
    #: The proof that every user may read it (None: the store is root's alone).
    readable: WorldReadable | None = None


def write_copy(store: int, engine: Engine, src: Original) -> Record:
    """Copies the original into the store and records it: written at its final size
    (huge=within_size needs it; the tmpfs's space is taken at once, so a full one refuses
    before anything is written), hashed while copying, checked unchanged since (size and
    times) and, mapped, one PMD per window; then sealed read-only and renamed into place
    with its record. Refused, leaving nothing behind, otherwise."""
    tmp = f".new-{key_of(src.identity)}-{os.getpid()}"
    _remove_tree(store, tmp)
    os.mkdir(tmp, 0o700, dir_fd=store)
    try:
        d = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
        try:
            rec = _fill(d, engine, src)
            fd = os.open(RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444, dir_fd=d)
            try:
                text = rec.text().encode("utf-8", "surrogateescape")
                if os.write(fd, text) != len(text):
                    raise Refused("shared-full", "the record could not be written whole")
            finally:
                os.close(fd)
            os.fchmod(d, 0o755)
        finally:
            os.close(d)
        drop(store, rec.key)  # a copy of an earlier state of this inode
        os.rename(tmp, rec.key, src_dir_fd=store, dst_dir_fd=store)
        return rec
    except OSError as e:
        _remove_tree(store, tmp)
        if e.errno == errno.ENOSPC:
            raise Refused("shared-full", "the shared copies' tmpfs is full") from e
        raise Refused("io-error", f"cannot copy it: {reasons.io_detail(e, with_file=False)}") from e
    except BaseException:
        _remove_tree(store, tmp)
        raise


def _fill(d: int, engine: Engine, src: Original) -> Record:
    size, name = src.before.st_size, copy_name(src.path)
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
    digest = hashlib.sha256()
    try:
        os.ftruncate(out, size)
        os.posix_fallocate(out, 0, size)
        os.posix_fadvise(src.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        done = 0
        while done < size:
            chunk = os.pread(src.fd, min(_CHUNK, size - done), done)
            if not chunk:
                raise Refused("copy-stale", "the file was truncated while it was copied")
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.pwrite(out, view, done + len(chunk) - len(view)) :]
            done += len(chunk)
        os.fchmod(out, 0o444)
    finally:
        os.close(out)
    if _ns(os.fstat(src.fd)) != _ns(src.before):
        raise Refused("copy-stale", "the file changed while it was copied")
    if src.readable is not None:
        try:
            src.readable.check()
        except Refused as e:
            raise Refused(e.reason, f"{e.detail} (changed while it was copied)") from None
    check = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
    try:
        pmd = engine.pmd_windows(check, list(src.offsets))
        if False in pmd:
            raise Refused(
                "shmem-not-huge",
                f"{pmd.count(False)} of {len(pmd)} windows of the copy are not huge pages "
                "(shared-memory huge pages refused: transparent_hugepage/shmem_enabled deny?)",
            )
        st = os.fstat(check)
    finally:
        os.close(check)
    # The original's code windows are now held by the copy: the page cache's small folios
    # of them are dropped where no process maps them (read back if a process needs them).
    for off in src.offsets:
        os.posix_fadvise(src.fd, off, src.hp, os.POSIX_FADV_DONTNEED)
    return Record(
        *src.identity,
        size,
        src.before.st_mtime_ns,
        src.before.st_ctime_ns,
        st.st_ino,
        st.st_ctime_ns,
        digest.hexdigest(),
        name,
        src.path,
    )


def records(store: int) -> dict[str, Record]:
    """The copies in the store, by key; what is left of interrupted runs is removed."""
    out: dict[str, Record] = {}
    for entry in sorted(os.listdir(store)):
        if entry.startswith((".new-", ".old-")):
            pid = entry.rsplit("-", 1)[-1]
            if not (pid.isdigit() and kernel.alive(int(pid))) or int(pid) == os.getpid():
                _remove_tree(store, entry)
            continue
        rec = read_record(store, entry)
        if rec is None or rec.key != entry:
            _remove_tree(store, entry)  # not a record of this format: nothing to trust
            continue
        out[entry] = rec
    return out


# --- one run of hugify prefetch -----------------------------------------------------------


@dataclass
class Outcome:
    """What became of one file's shared copy in a run."""

    state: str  # "kept", "made", "none"
    reason: str = ""
    detail: str = ""
    copy: str = ""
    held: int = 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state}
        for k in ("reason", "detail", "copy"):
            if getattr(self, k):
                out[k] = getattr(self, k)
        if self.held:
            out["held_bytes"] = self.held
        return out


@dataclass
class Report:
    """A run's work on the copies: per file, and what was dropped."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)  # by target path
    dropped: list[str] = field(default_factory=list)  # paths of the originals
    problem: tuple[str, str] | None = None  # the store as a whole could not be used

    @property
    def held(self) -> int:
        return sum(o.held for o in self.outcomes.values())


class _Window(Protocol):
    offset: int
    state: str  # the engine's state of the window (hugify.engine)


class Opened(Protocol):
    """A file a run of hugify prefetch holds open, as the copies need it (hugify.prefetch's
    Target is one): its path, descriptor (-1: not opened), huge-page size and windows."""

    path: str
    fd: int
    hp: int

    @property
    def windows(self) -> Sequence[_Window]: ...


def wanted(t: Opened) -> bool:
    """Whether a file's windows are for shared copies: the engine found file-backed huge
    pages unsupported for it."""
    return t.fd >= 0 and any(w.state == UNSUPPORTED for w in t.windows)


class StandsFor(NamedTuple):
    """The file a target was copied from (hugify try's hugified copies), as it was when
    its bytes were read: the readers of that file, and only while it is still that
    file, decide who may be shown a shared copy of the target."""

    path: str
    version: files.Version


def settle(
    rdir: Path,
    engine: Engine,
    targets: Iterable[Opened],
    budget: int,
    complete: bool,
    *,
    stands_for: Mapping[str, StandsFor] | None = None,
) -> Report:
    """Keeps or makes the copies of the `targets` that want one, in their order, while
    what they hold stays within `budget`; drops the copies that are of no use (stale,
    changed, beyond the budget) and, when the run saw every installed file (`complete`),
    those of files it did not see or that want none. Root only: nobody else may write
    the store. A target that `stands_for` another file (by path) gets a copy only if
    that path is still the file it was copied from and every user may read it."""
    report = Report()
    targets = list(targets)
    want = [t for t in targets if wanted(t)]
    if os.geteuid() != 0 or (not want and not shared_dir(rdir).is_dir()):
        return report
    try:
        if want:
            ensure_mounted(rdir, budget)
        with opened(rdir) as store:
            _Settling(store, rdir, engine, budget, report, stands_for=stands_for or {}).apply(targets, want, complete)
    except Refused as e:
        report.problem = (e.reason, e.detail)
        for t in want:
            report.outcomes[t.path] = Outcome("none", e.reason, e.detail)
    return report


def tmpfs_used(store: int) -> int | None:
    """Bytes of memory the store's tmpfs holds: every file in it, and every file removed
    from it that a process still maps or holds open (freed when the last lets go). None
    where the tmpfs has no size (it counts nothing then)."""
    st = os.fstatvfs(store)
    return (st.f_blocks - st.f_bfree) * st.f_frsize if st.f_blocks else None


def in_store(store: int) -> int:
    """Bytes of memory the files present in the store hold (copies, records, what a run
    left)."""
    total = 0
    for entry in os.scandir(store):
        if entry.is_dir(follow_symlinks=False):
            d = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
            try:
                total += sum(e.stat(follow_symlinks=False).st_blocks * 512 for e in os.scandir(d))
            finally:
                os.close(d)
        else:
            total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


@dataclass
class _Want:
    """A file that wants a copy, as planned: its copy kept, or one to make."""

    target: Opened
    src: Original
    kept: Record | None  # its usable copy, or None: one is to be made
    size: int  # bytes it holds or will


@dataclass
class _Settling:
    store: int
    rdir: Path
    engine: Engine
    budget: int
    report: Report
    #: Users other than root may reach the store: its copies must show them nothing new.
    exposed: bool = True
    #: For a target that is a copy made for the occasion (hugify try's hugified copies,
    #: in root's own directories), the file it stands for, whose readers decide.
    stands_for: Mapping[str, StandsFor] = field(default_factory=dict)
    #: Bytes that copies removed from the store still hold (processes map them).
    removed: int = 0

    def apply(self, targets: list[Opened], want: list[Opened], complete: bool) -> None:
        """Plans in the run's order what the budget holds, beside what the run leaves
        alone (copies of files it did not see) and what copies removed while mapped
        still hold; drops every other copy; then makes the planned ones in order, each
        only if the budget, measured again, still holds it."""
        have = records(self.store)
        self.exposed = not reached_by_root_alone(self.store, shared_dir(self.rdir))
        seen = {key_of(i) for i in (self.engine.file_id(t.fd) for t in targets if t.fd >= 0) if i}
        stays = {
            key: held(self.store, rec)
            for key, rec in have.items()
            if key not in seen and not complete and copy_problem(self.store, rec, _stat_original(rec)) is None
        }
        outcomes: dict[str, Outcome] = {}
        self.removed = self._removed_but_held()
        used = self.removed + sum(stays.values())
        plan: list[_Want] = []
        for t in want:
            w = self.plan(t, have, outcomes)
            if w is None:
                continue
            if used + w.size > self.budget:
                outcomes[t.path] = self._over(used, w.size)
                continue
            used += w.size
            plan.append(w)
        keep = {key_of(w.src.identity) for w in plan if w.kept is not None}
        remade = {key_of(w.src.identity) for w in plan if w.kept is None}
        for key, rec in have.items():
            if key not in stays and key not in keep:
                drop(self.store, key)  # first: what it frees is room for the copies to make
                if key not in remade:
                    self.report.dropped.append(rec.path)
        self.removed = self._removed_but_held()
        used = self.removed + sum(stays.values()) + sum(w.size for w in plan if w.kept is not None)
        for w in plan:
            if w.kept is not None:
                copy = shared_dir(self.rdir) / w.kept.key / w.kept.name
                outcomes[w.target.path] = Outcome("kept", copy=str(copy), held=w.size)
            elif used + w.size > self.budget:
                outcomes[w.target.path] = self._over(used, w.size)
            else:
                outcomes[w.target.path] = self.make(w)
                used += outcomes[w.target.path].held
        self.report.outcomes.update((t.path, outcomes[t.path]) for t in want)

    def plan(self, t: Opened, have: dict[str, Record], outcomes: dict[str, Outcome]) -> _Want | None:
        """What the file's copy takes: its copy kept, if usable, or one to make; None
        (its outcome said) if it can have none."""
        identity = self.engine.file_id(t.fd)
        if identity is None:
            outcomes[t.path] = Outcome("none", "no-file", "its mapping names no inode")
            return None
        before = os.fstat(t.fd)
        src = Original(t.fd, os.path.realpath(t.path), identity, tuple(w.offset for w in t.windows), before, t.hp)
        try:
            with self._shown(t.fd, t.path):
                pass
        except Refused as e:
            outcomes[t.path] = Outcome("none", e.reason, e.detail)
            return None
        rec = have.get(key_of(identity))
        if rec is not None and copy_problem(self.store, rec, before) is None and self._huge(rec, src.offsets):
            return _Want(t, src, rec, held(self.store, rec))
        return _Want(t, src, None, memory_for(before.st_size))

    @contextlib.contextmanager
    def _shown(self, fd: int, path: str) -> Iterator[WorldReadable | None]:
        """Proves that every user may read what a copy of the target (open as `fd`)
        would show them, holding the proof's descriptors while the caller works: the
        target itself, or the file it stands for, still the one it was copied from (a
        public file renamed over a private one's path since proves nothing of the
        bytes copied: copy-stale). None where the store shows nobody anything. Refused
        (copy-private) otherwise."""
        if not self.exposed:
            yield None
            return
        original = self.stands_for.get(path)
        if original is not None:
            try:
                fd = os.open(original.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                raise Refused("copy-private", f"{original.path} cannot be checked: {reasons.io_detail(e)}") from e
        try:
            if original is not None and files.version(os.fstat(fd)) != original.version:
                raise Refused("copy-stale", f"{original.path} is no longer the file its copy was made from")
            proof = WorldReadable(fd, original.path if original else path)
            try:
                proof.prove()
                yield proof
            finally:
                proof.close()
        finally:
            if original is not None:
                os.close(fd)

    def make(self, w: _Want) -> Outcome:
        """Writes the planned copy, proving again, on descriptors held until it is
        written, that every user may read the original."""
        try:
            with self._shown(w.src.fd, w.target.path) as proof:
                rec = write_copy(self.store, self.engine, replace(w.src, readable=proof))
        except Refused as e:
            return Outcome("none", e.reason, e.detail + self._too_small() if e.reason == "shared-full" else e.detail)
        where = shared_dir(self.rdir) / rec.key
        return Outcome("made", copy=str(where / rec.name), held=held(self.store, rec))

    def _too_small(self) -> str:
        """What to do where the tmpfs is smaller than the budget needs."""
        m = mount_of(shared_dir(self.rdir))
        if m is None or not m.size or m.size >= mount_size(self.budget):
            return ""
        return (
            f" (size={m.size >> 20}M, below the {mount_size(self.budget) >> 20}M runtime.shared_budget needs: "
            f"systemctl daemon-reload && systemctl reload {MOUNT_UNIT})"
        )

    def _removed_but_held(self) -> int:
        used = tmpfs_used(self.store)
        return max(0, used - in_store(self.store)) if used is not None else 0

    def _over(self, used: int, need: int) -> Outcome:
        of_them = f" ({self.removed >> 20} MiB of them removed but still mapped)" if self.removed >> 20 else ""
        return Outcome(
            "none",
            "shared-budget",
            f"the copies hold {used >> 20} MiB{of_them}; {need >> 20} MiB more would pass runtime.shared_budget "
            f"({self.budget >> 20} MiB)",
        )

    def _huge(self, rec: Record, offsets: tuple[int, ...]) -> bool:
        """Whether every window of a recorded copy is still one PMD (one split, or swapped
        out and back in small pages, is made again)."""
        fd = os.open(f"{rec.key}/{rec.name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.store)
        try:
            return all(self.engine.pmd_windows(fd, list(offsets)))
        finally:
            os.close(fd)


def _stat_original(rec: Record) -> os.stat_result | None:
    try:
        return os.stat(rec.path)
    except OSError:
        return None


def drop_all(rdir: Path) -> list[str]:
    """Removes every copy (policy runtime.shared = "off"); the paths of their originals."""
    if os.geteuid() != 0 or not shared_dir(rdir).is_dir():
        return []
    try:
        with opened(rdir) as store:
            out = []
            for key, rec in records(store).items():
                drop(store, key)
                out.append(rec.path)
            return out
    except Refused:
        return []


# --- what the copies hold, for hugify status ---------------------------------------------


@dataclass
class Held:
    """One copy in the store, as `hugify status` shows it."""

    record: Record
    copy: str
    windows: int = 0
    huge_windows: int = 0
    held: int = 0  # bytes of memory (its tmpfs blocks), once whatever maps it
    mapped_by: list[int] = field(default_factory=list)
    problem: tuple[str, str] | None = None  # why the runtime would not use it now

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.record.path,
            "key": self.record.key,
            "copy": self.copy,
            "size": self.record.size,
            "sha256": self.record.sha256,
            "windows": self.windows,
            "huge_windows": self.huge_windows,
            "held_bytes": self.held,
            "mapped_by": self.mapped_by,
        }
        if self.problem:
            out["problem"] = {"reason": self.problem[0], "detail": self.problem[1]}
        return out


@dataclass
class Removed:
    """A copy removed from the store (dropped, or its store unmounted) that processes
    still map: its memory is held until the last of them exits."""

    copy: str
    inode: int
    mapped: int  # bytes of it the processes map (the most any one maps)
    mapped_by: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"copy": self.copy, "inode": self.inode, "bytes": self.mapped, "mapped_by": self.mapped_by}


def _mappers(store: Path) -> tuple[dict[str, set[int]], dict[tuple[str, int], dict[int, int]]]:
    """Who maps what of the store, from every process's maps: copy path -> pids; for
    removed copies (path, inode) -> pid -> bytes mapped."""
    prefix = f"{store}/"
    live: dict[str, set[int]] = {}
    gone: dict[tuple[str, int], dict[int, int]] = {}
    for pid in kernel.pids():
        try:
            vmas = kernel.maps(pid)
        except OSError:
            continue
        for v in vmas:
            if not v.name.startswith(prefix):
                continue
            if v.deleted:
                per = gone.setdefault((v.path, v.inode), {})
                per[pid] = per.get(pid, 0) + v.end - v.start
            else:
                live.setdefault(v.path, set()).add(pid)
    return live, gone


def inventory(rdir: Path, engine: Engine, hp: int) -> tuple[list[Held], list[Removed]]:
    """The copies in the store and what they hold now (reading nothing from a disk: a
    window swapped out counts as not huge), who maps them, and the removed copies still
    mapped."""
    where = shared_dir(rdir)
    live, gone = _mappers(where)
    out: list[Held] = []
    try:
        store = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        store = -1
    try:
        for entry in sorted(os.listdir(store)) if store >= 0 else []:
            rec = None if entry.startswith(".") else read_record(store, entry)
            if rec is None:
                continue
            h = Held(rec, str(where / rec.key / rec.name), held=held(store, rec))
            h.problem = copy_problem(store, rec, _stat_original(rec))
            h.mapped_by = sorted(live.get(h.copy, ()))
            with contextlib.suppress(OSError, NotHugified):
                fd = os.open(f"{rec.key}/{rec.name}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=store)
                try:
                    offsets = list(read_hugified(fd, hp, h.copy).offsets)
                    h.windows = len(offsets)
                    h.huge_windows = sum(1 for p in engine.pmd_windows(fd, offsets, measure=True) if p)
                finally:
                    os.close(fd)
            out.append(h)
    finally:
        if store >= 0:
            os.close(store)
    removed = [Removed(path, ino, max(per.values()), sorted(per)) for (path, ino), per in sorted(gone.items())]
    return out, removed
