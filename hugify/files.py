"""Every file hugify replaces or writes goes through this module, so that running
as root in a directory someone else can write (a package build tree, /opt/app,
Debian's group-staff /usr/local) never hands that someone a file, a mode or a
capability outside what they already own.

The rules (docs/security.md says what they guarantee):

* A directory is opened once (``O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK``; below a
  tree's root, component by component, each relative to its parent) and everything in it is done relative to that
  descriptor: ``openat``, ``fstatat``, ``linkat``, ``renameat``, ``unlinkat``.
* A file to be replaced is looked at with ``fstatat`` (no symlink followed) and
  opened once, only when it is a regular file (``O_NOFOLLOW|O_NONBLOCK``: no
  FIFO to block on, no device opened); its content, owner, mode and extended
  attributes (``security.capability`` too) are read through that descriptor.
* A new file is complete before anyone else can open it: made without a name
  (``O_TMPFILE``; where the filesystem cannot, ``O_CREAT|O_EXCL|O_NOFOLLOW`` in a
  private directory, mode 0700, made beside the target), filled, given owner,
  mode, extended attributes and times through its descriptor (``fchown`` first: it
  clears setuid bits and capabilities), ``fsync``ed when it replaces a live system
  file, and only then linked under a name no other run can guess (or renamed out
  of the private directory).
* Before the rename, the temporary name and the replaced name must still be the
  inodes hugify made and opened; otherwise nothing is renamed (changed-meanwhile).
  Nothing is ever chowned, chmodded, setxattr'd or utime'd by path.

Each step calls `step_hook`, a no-op that the tests replace in-process to swap
files at exactly that step (tests/test_rootsafe.py); nothing outside the process
can set it.

Refusals are `UnsafeFile` errors (an OSError, so that every caller that handles
I/O errors handles them too) carrying a reason id of the core's table, of kind
"unsafe" (exit status 6)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, Self

StrPath = str | os.PathLike[str]
#: (st_dev, st_ino): which inode a name is.
Identity = tuple[int, int]
#: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): which inode, and which state of
#: its bytes and attributes. A rename over the name changes the first two; a write, a
#: chmod or a chown the change time, which no user but root can set back.
Version = tuple[int, int, int, int, int]

#: O_NONBLOCK and O_DIRECTORY: a FIFO or a device node swapped in for a directory is
#: refused (ENOTDIR) before it is opened, never waited on or opened.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_MAX = 255


# --- the race hook ----------------------------------------------------------------------


class Step(NamedTuple):
    """Where a replacement is: the step's name, the file being written or replaced,
    and the temporary file beside it once there is one (paths for display)."""

    name: str
    target: str
    temporary: str | None = None


def _no_step(step: Step) -> None:
    """Production does nothing between steps."""


#: Called at each step (probed: opened by `hugify tree`'s walk; opened, created,
#: written, before-chown, before-chmod, before-xattrs, before-rename, renamed,
#: linked). A new file has a name (the step's `temporary`) from before-rename on, or
#: from created on where it is made in a private directory. Tests replace it in-process.
step_hook: Callable[[Step], None] = _no_step


def reached(step: Step) -> None:
    step_hook(step)


# --- refusals ---------------------------------------------------------------------------


class UnsafeFile(OSError):
    """A file that cannot be handled safely: `reason` is its reason id (kind
    "unsafe"), `filename` the path, `detail` (and `strerror`) the one-line why."""

    def __init__(self, reason: str, path: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail
        self.filename, self.strerror = path, detail

    def __str__(self) -> str:
        return f"{self.filename}: {self.detail} ({self.reason})"


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


def describe(mode: int) -> str:
    """What kind of file a mode says, for messages ("a FIFO")."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def version(st: os.stat_result) -> Version:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _symlink_detail(path: str) -> str:
    try:
        where = f" to {os.readlink(path)}"
    except OSError:
        where = ""
    real = os.path.realpath(path)
    return (
        f"a symbolic link{where}; hugify does not follow symlinks where it reads a file to replace it "
        f"or writes one (anyone who can write its directory could point it elsewhere): name the real path ({real})"
    )


# --- directories ------------------------------------------------------------------------


class _Descriptor:
    """Holds a descriptor that leaving a ``with`` block closes (unless borrowed)."""

    fd: int
    owned: bool = True

    def close(self) -> None:
        if self.owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Directory(_Descriptor):
    """An open directory: what is done in it is done relative to `fd`. `path` is
    for messages only; `owned`: False for a descriptor someone else closes."""

    def __init__(self, fd: int, path: str, *, owned: bool = True) -> None:
        self.fd, self.path, self.owned = fd, path, owned

    @classmethod
    def open(cls, path: StrPath, *, follow: bool) -> Directory:
        """`path` opened as a directory. `follow`: for a root the user named (a
        tree's root, a symlink to / included); otherwise its last component must not
        be a symbolic link (the directory of a file hugify replaces)."""
        text = os.fspath(path)
        try:
            fd = os.open(text, _DIR_FLAGS | (0 if follow else os.O_NOFOLLOW))
        except OSError as e:
            if not follow and e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(text):
                raise UnsafeFile("symlink", text, _symlink_detail(text)) from None
            raise
        return cls(fd, text)

    @classmethod
    def containing(cls, path: StrPath) -> tuple[Directory, str]:
        """The directory of `path` (opened without following its last component) and
        the name of `path` in it."""
        head, tail = os.path.split(os.fspath(path))
        if not tail or tail in (".", ".."):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", os.fspath(path))
        return cls.open(head or ".", follow=False), tail

    def beneath(self, rel: str, *, create: bool = False) -> Directory:
        """The directory `rel` ("/"-separated) below this one, each component opened
        with O_NOFOLLOW relative to the one before: a symbolic link on the way is
        refused, never followed out of the tree. `create`: missing components are
        made (mode 0755, whatever the umask)."""
        fd, path = os.dup(self.fd), self.path
        try:
            for part in (p for p in rel.split("/") if p not in ("", ".")):
                where = os.path.join(path, part)
                if part == "..":
                    raise UnsafeFile("symlink", where, "a path leading out of the tree (..)")
                made = False
                try:
                    child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                        made = True
                    child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_at(fd, part):
                        raise UnsafeFile("symlink", where, _symlink_detail(where)) from None
                    raise
                if made:
                    os.fchmod(child, 0o755)
                os.close(fd)
                fd, path = child, where
        except BaseException:
            os.close(fd)
            raise
        return Directory(fd, path)

    def subdirectory(self, name: str) -> Directory:
        """The directory `name` in this one, opened relative to it with
        O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK: a symbolic link (ELOOP), a FIFO, a device
        node or any other file (ENOTDIR) is refused without being opened."""
        return Directory(os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd), self.join(name))

    def identity_of(self, name: str) -> Identity | None:
        """Which inode `name` is now (a symlink itself, not its target); None if absent."""
        try:
            return identity(os.stat(name, dir_fd=self.fd, follow_symlinks=False))
        except FileNotFoundError:
            return None

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)


def _is_link_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def split_relative(rel: str) -> tuple[str, str]:
    """(directory, name) of a "/"-separated path relative to a tree's root."""
    head, _, tail = rel.strip("/").rpartition("/")
    return head, tail


# --- reading the file to be replaced ----------------------------------------------------------


class Metadata(NamedTuple):
    """What a replacement keeps of the file it replaces."""

    uid: int
    gid: int
    mode: int  # permission bits, setuid/setgid/sticky too
    xattrs: tuple[tuple[str, bytes], ...]  # in the order the file system lists them
    atime_ns: int
    mtime_ns: int

    @property
    def xattr_names(self) -> list[str]:
        return [n for n, _ in self.xattrs]


class Source(_Descriptor):
    """A regular file opened once for reading: its content (through `fd`), its
    metadata and its identity all come from that one descriptor."""

    def __init__(self, fd: int, st: os.stat_result, directory: Directory, name: str) -> None:
        self.fd, self.st, self.directory, self.name = fd, st, directory, name

    @property
    def path(self) -> str:
        return self.directory.join(self.name)

    @property
    def identity(self) -> Identity:
        return identity(self.st)

    def metadata(self) -> Metadata:
        """Owner, mode, extended attributes and times, read through the descriptor."""
        try:
            names = os.listxattr(self.fd)
        except OSError as e:
            if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            names = []  # no xattr support on this file system: nothing to keep
        xattrs = []
        for name in names:
            try:
                xattrs.append((name, os.getxattr(self.fd, name)))
            except OSError as e:
                if e.errno != errno.ENODATA:  # removed since it was listed
                    raise
        st = self.st
        return Metadata(st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), tuple(xattrs), st.st_atime_ns, st.st_mtime_ns)


def open_source(
    directory: Directory, name: str, *, expect: Identity | None = None, step: str = "opened", follow: bool = False
) -> Source:
    """The regular file `name` in `directory`, opened once. Refused: with `expect`,
    another inode than the one expected (changed-meanwhile); a symbolic link, unless
    `follow` (a file only read, such as the source of ``transform FILE -o OUT``, is
    read through one as ``cp`` and ``readelf`` do); anything but a regular file
    (looked at before it is opened: a FIFO would block, a device might act). `step`:
    the name the race hook sees once it is open."""
    path = directory.join(name)
    st = os.stat(name, dir_fd=directory.fd, follow_symlinks=follow)
    if expect is not None and identity(st) != expect:
        what = describe(st.st_mode) if not stat.S_ISREG(st.st_mode) else "another file"
        raise UnsafeFile("changed-meanwhile", path, f"replaced by {what} since hugify found it")
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile("symlink", path, _symlink_detail(path))
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile("not-regular", path, f"{describe(st.st_mode)}, not a regular file")
    try:
        fd = os.open(name, _READ_FLAGS & ~os.O_NOFOLLOW if follow else _READ_FLAGS, dir_fd=directory.fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise UnsafeFile("changed-meanwhile", path, "swapped for a symbolic link as it was opened") from None
        raise
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or identity(opened) != identity(st):
            raise UnsafeFile("changed-meanwhile", path, "replaced by another file as it was opened")
        source = Source(fd, opened, directory, name)
        reached(Step(step, path))
    except BaseException:
        os.close(fd)
        raise
    return source


# --- writing a new file in place of another -------------------------------------------------


def _temporary_names(target: str) -> Iterator[str]:
    """Names beside `target` that no other run uses and nobody can guess: an attacker
    who creates one first only makes hugify pick the next."""
    stem = os.fsdecode(os.fsencode(target)[: _NAME_MAX - 40])
    while True:
        yield f".{stem}.hugify-{os.getpid()}-{os.urandom(8).hex()}"


def _unnamed_files_linkable() -> bool:
    """Whether a file made without a name can be given one: linkat through
    /proc/self/fd (no capability needed; a chroot without /proc has none)."""
    return os.path.isdir("/proc/self/fd")


#: What openat(O_TMPFILE) answers on a filesystem (or kernel) that cannot make a
#: file without a name (FUSE, NFS, vfat; before Linux 3.11 EISDIR).
_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOSYS)


class NewFile:
    """A new file for `target` in `directory`, open for reading and writing, that
    nobody but this process can open until it is complete: made without a name
    (``O_TMPFILE``, mode 0600, owned by the running user), filled, given its owner,
    mode, extended attributes and times (`give`), and only then linked under a
    temporary name beside `target` and renamed over it (`commit`). Where the
    filesystem cannot make a file without a name, it is made in a private directory
    (mode 0700, the running user's) made beside `target` for it, which no other user
    can search, and renamed from there. Leaving the ``with`` block without a commit
    removes whatever was made."""

    def __init__(self, directory: Directory, target: str) -> None:
        self.directory, self.target = directory, target
        self.committed = False
        #: The directory the file has a name in before the rename, and that name:
        #: none until `commit` links it (O_TMPFILE), or the private directory's file.
        self.holder: Directory | None = None
        self.name: str | None = None
        #: The private directory's name in `directory` and its identity (the fallback).
        self._private: tuple[str, Identity] | None = None
        fd = self._unnamed() if _unnamed_files_linkable() else None
        if fd is None:
            fd = self._in_private_directory()
        self.fd = fd
        self.identity = identity(os.fstat(self.fd))
        self.step("created")

    def _unnamed(self) -> int | None:
        """A file without a name in the target's directory (its filesystem), or None
        where the filesystem cannot make one."""
        try:
            return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=self.directory.fd)
        except OSError as e:
            if e.errno in _NO_TMPFILE:
                return None
            raise

    def _in_private_directory(self) -> int:
        """A file in a new directory beside the target that only the running user can
        search: whoever else can write the target's directory can rename or remove that
        directory, never open what is inside."""
        d = self.directory
        for attempt, name in enumerate(_temporary_names(self.target)):
            try:
                os.mkdir(name, 0o700, dir_fd=d.fd)
                break
            except FileExistsError:
                if attempt >= 100:
                    raise
        private = d.subdirectory(name)
        st = os.fstat(private.fd)
        self._private = (name, identity(st))
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            private.close()
            raise UnsafeFile("changed-meanwhile", d.join(name), "hugify's private directory was replaced by another")
        self.holder, self.name = private, "new"
        try:
            return os.open(self.name, _CREATE_FLAGS, 0o600, dir_fd=private.fd)
        except BaseException:
            self.name = None
            self.discard()
            private.close()
            raise

    @property
    def path(self) -> str:
        """Where the file is, for messages: its name once it has one."""
        if self.holder is not None and self.name is not None:
            return self.holder.join(self.name)
        return f"{self.directory.join(self.target)} (hugify's new file, not yet linked)"

    def step(self, name: str) -> None:
        temporary = self.path if self.name is not None else None
        reached(Step(name, self.directory.join(self.target), temporary))

    def write(self, data: bytes) -> None:
        view, offset = memoryview(data), 0
        while offset < len(view):
            offset += os.pwrite(self.fd, view[offset:], offset)

    def copy_from(self, fd: int) -> None:
        """The whole content of the file open at `fd`, copied in the kernel where the
        file system can (a debug file may be hundreds of MiB)."""
        offset = 0
        while True:
            try:
                n = os.copy_file_range(fd, self.fd, 1 << 30, offset, offset)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                chunk = os.pread(fd, 1 << 20, offset)
                os.pwrite(self.fd, chunk, offset)
                n = len(chunk)
            if n == 0:
                return
            offset += n

    def give(self, meta: Metadata, *, skip: tuple[str, ...] = (), times: tuple[int, int] | None = None) -> None:
        """Owner, mode, extended attributes but `skip`, and times (ns) if given,
        through the descriptor, while nobody else can open the file. chown clears
        setuid bits and capabilities (even root's), so it comes first; then the mode,
        then the attributes (security.capability last of all that could clear it)."""
        self.step("before-chown")
        if os.geteuid() == 0 or meta.uid == os.geteuid():
            with contextlib.suppress(PermissionError):  # a group the user is not in
                os.fchown(self.fd, meta.uid, meta.gid)
        self.step("before-chmod")
        os.fchmod(self.fd, meta.mode)
        self.step("before-xattrs")
        for name, value in meta.xattrs:
            if name not in skip:
                os.setxattr(self.fd, name, value)
        if times is not None:
            os.utime(self.fd, ns=times)

    def _link(self) -> None:
        """Gives the complete file without a name its temporary name beside the target."""
        d = self.directory
        for attempt, name in enumerate(_temporary_names(self.target)):
            try:
                os.link(f"/proc/self/fd/{self.fd}", name, dst_dir_fd=d.fd, follow_symlinks=True)
                break
            except FileExistsError:
                if attempt >= 100:
                    raise
        self.holder, self.name = d, name

    def commit(self, *, replacing: Identity | None = None, durable: bool = False) -> None:
        """Renames the new file over `target`. Refused (changed-meanwhile) when the
        temporary name is no longer this file, or, with `replacing`, when `target` is
        no longer that inode (someone swapped it since it was opened). `durable`:
        the content is on disk before the rename and the rename after it."""
        d = self.directory
        if durable:
            os.fsync(self.fd)
        if self.holder is None:
            self._link()
        assert self.holder is not None and self.name is not None
        self.step("before-rename")
        if self.holder.identity_of(self.name) != self.identity:
            raise UnsafeFile(
                "changed-meanwhile",
                d.join(self.target),
                f"hugify's temporary file {self.path} was renamed, removed or replaced by someone else; "
                "nothing was renamed into place",
            )
        if replacing is not None and d.identity_of(self.target) != replacing:
            raise UnsafeFile(
                "changed-meanwhile",
                d.join(self.target),
                "renamed, removed or replaced (by a symlink or another file) while hugify worked on it; "
                "the new file was not renamed over it",
            )
        os.replace(self.name, self.target, src_dir_fd=self.holder.fd, dst_dir_fd=d.fd)
        self.committed = True
        if durable:
            os.fsync(d.fd)
        self.step("renamed")

    def discard(self) -> None:
        """Removes the temporary name and the private directory if they are still
        this run's (never someone else's)."""
        holder, name = self.holder, self.name
        if not self.committed and holder is not None and name is not None and holder.identity_of(name) == self.identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=holder.fd)
        if self._private is not None:
            private, made = self._private
            if self.directory.identity_of(private) == made:
                with contextlib.suppress(OSError):  # not empty: someone else's file, left
                    os.rmdir(private, dir_fd=self.directory.fd)

    def __enter__(self) -> NewFile:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.discard()
        finally:
            os.close(self.fd)
            if self.holder is not None and self.holder is not self.directory:
                self.holder.close()


def link_replace(
    source: Directory, name: str, inode: Identity, directory: Directory, target: str, *, replacing: Identity
) -> None:
    """Points `target` in `directory` at the inode `name` in `source` is (which must
    be `inode`), in place of the inode `replacing`, in one rename: how the other names
    of a hard-linked file follow its first name's replacement."""
    for attempt, tmp in enumerate(_temporary_names(target)):
        try:
            os.link(name, tmp, src_dir_fd=source.fd, dst_dir_fd=directory.fd, follow_symlinks=False)
            break
        except FileExistsError:
            if attempt >= 100:
                raise
    where = directory.join(target)
    try:
        if directory.identity_of(tmp) != inode:
            raise UnsafeFile("changed-meanwhile", where, f"{source.join(name)} was replaced before it could be linked")
        reached(Step("linked", where, directory.join(tmp)))
        if directory.identity_of(target) != replacing:
            raise UnsafeFile("changed-meanwhile", where, "replaced (by a symlink or another file) while hugify worked")
        os.replace(tmp, target, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
    except BaseException:
        if directory.identity_of(tmp) == inode:
            os.unlink(tmp, dir_fd=directory.fd)
        raise


# --- hugify's own small files -------------------------------------------------------------


def source_date_epoch() -> int | None:
    """$SOURCE_DATE_EPOCH (reproducible builds), or None when it is unset or not a
    number of seconds."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else None


def within(root: StrPath, path: StrPath) -> str | None:
    """`path`'s place below `root` ("/"-separated), judged on the names alone (no
    symlink resolved), or None when it is not below it."""
    top, full = os.path.abspath(root), os.path.abspath(path)
    if full == top or not full.startswith(top.rstrip("/") + "/"):
        return None
    return full[len(top.rstrip("/")) + 1 :]


@contextlib.contextmanager
def directory_for(path: StrPath, *, tree: StrPath | None = None) -> Iterator[tuple[Directory, str]]:
    """The directory of `path` and the file's name in it. Inside `tree` (a build root,
    an unpacked package) every directory below the tree's root is opened, or made,
    without following a symlink. Elsewhere (a report or statement path the user named
    outside any tree) the directory must exist, as for any output a command names
    (`transform -o`): a mistyped path is an error, not a new directory (as root, in
    /); it is opened as named, symlinks too: what goes there is hugify's own text,
    owned by the running user, mode 0644, renamed in under the name given, never
    written through a symlink there."""
    rel = within(tree, path) if tree is not None else None
    if tree is not None and rel is not None:
        head, name = split_relative(rel)
        with Directory.open(tree, follow=True) as top, top.beneath(head, create=True) as d:
            yield d, name
        return
    head, name = os.path.split(os.fspath(path))
    if not name:
        raise IsADirectoryError(errno.EISDIR, "a directory, not a file", os.fspath(path))
    with Directory.open(head or ".", follow=True) as d:
        yield d, name


def write_atomic(
    path: StrPath,
    data: bytes,
    *,
    mode: int = 0o644,
    epoch: int | None = None,
    tree: StrPath | None = None,
    durable: bool = False,
) -> None:
    """Replaces `path` with `data` (owned by the running user, `mode`) in one rename:
    a reader sees the old file or the new one, never a part; on failure the old one
    stays. `epoch`: the new file's access and modification time. `tree`: the root
    `path` may lie in (see `directory_for`)."""
    try:
        with directory_for(path, tree=tree) as (d, name), NewFile(d, name) as new:
            new.write(data)
            os.fchmod(new.fd, mode)
            if epoch is not None:
                os.utime(new.fd, (epoch, epoch))
            new.commit(durable=durable)
    except UnsafeFile:
        raise
    except OSError as e:  # said of the file written: not its directory, nor a temporary name
        raise OSError(e.errno, e.strerror or str(e), os.fspath(path)) from None


def write_text_atomic(path: StrPath, text: str, epoch: int | None = None, *, tree: StrPath | None = None) -> None:
    """`write_atomic` of UTF-8 text, mode 0644."""
    write_atomic(path, text.encode("utf-8"), epoch=epoch, tree=tree)


def resolve_within(root: Path, path: Path) -> Path:
    """Where `path` (below `root`, possibly through symlinks the tree holds, such as
    rpm's build-id links) really is, refused when that is outside `root`."""
    real, top = path.resolve(), root.resolve()
    if not real.is_relative_to(top):
        raise UnsafeFile("symlink", str(path), f"a symbolic link leading out of the tree, to {real}")
    return root / real.relative_to(top)
