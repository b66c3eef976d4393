"""The hugified copies of `hugify try`, made like a package build makes them and kept
by the content of their originals.

An entry is a directory ``SHA256-KEY`` under the cache's root: SHA256 of the
original's bytes, KEY of what decides the result (hugify's own code and the
effective policy). It holds ``outcome.json`` (what `hugify tree` would say of the file:
transformed, as-is, skipped or failed, with its reason; and the SHA-256 of the original
and of the copy) and, for the first two, the copy, ``file``, read-only and without
setuid bits. A file listed as-is is copied unchanged: its windows are loaded as 2 MiB
folios in the copy's page cache while the original keeps the small folios the kernel's
faults give it. Each entry is made in a temporary directory and renamed into place
whole, so a reader never sees half an entry and an interrupted run leaves none (a later
run removes the temporary directories of runs that are gone). Entries are never
changed, but their time says when a run last used them: those of another hugify or
another policy (another KEY) go once unused for a day. The whole cache can be removed
at any time (`hugify try --clear-cache`).

What an entry holds is what its name says, whoever else can write where the command's
files are: root's hugify try bind-mounts the copies over the originals of every command
it measures, so a copy of other bytes filed under, say, libc's digest would run another
user's code as root.

* The original is opened once and read once: the bytes hashed for the entry's name
  are the bytes copied into the work directory and transformed there (no second open
  of its path, which someone could have renamed other bytes over in between).
* The root and everything below it are the caller's alone: the root, and each
  directory hugify makes on the way to it, owned by the caller and writable by nobody
  else; each directory above it owned by root or the caller and writable by nobody
  else unless sticky (/tmp). A group nobody is in but the caller (a user private
  group) counts as nobody else. Otherwise it is refused (`try-cache-unsafe`), before
  anything is written or mounted there. Everything in it is done relative to the
  root's descriptor: entries and scratch directories made with mkdirat, files created
  O_CREAT|O_EXCL|O_NOFOLLOW, nothing followed through a symbolic link.
* An entry found again is used only when it is the caller's (directory, record and
  copy), nobody can write its copy, and the copy's bytes still have the SHA-256 its
  record gives (read through the descriptor whose inode the side then checks its bind
  mount shows); any other entry is removed and made again.

The root: --cache-dir, else /var/cache/hugify/try for root, else
$XDG_CACHE_HOME/hugify/try (~/.cache/hugify/try). The run's scratch files (the
command's captured output, the first run's record) live in it too, and go at its end.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hugify import _core, files, kernel, reasons, tree
from hugify.policy import Policy

ROOT_CACHE = Path("/var/cache/hugify/try")
OUTCOME = "outcome.json"
COPY = "file"
#: Entries another hugify (or policy) made are removed once unused this long.
STALE_SECONDS = 86400
#: The prefixes of a run's scratch directory and of an entry being made.
RUN, NEW = ".run", ".new"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class CacheError(Exception):
    """The cache cannot be written; the message says where and why, in one line."""


class UntrustedCache(Exception):
    """The cache's root, or a directory on the way to it, could be changed by another
    user (try-cache-unsafe); the message says which and why, in one line."""


def default_root() -> Path:
    if os.geteuid() == 0:
        return ROOT_CACHE
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg.startswith("/") else Path.home() / ".cache"
    return base / "hugify" / "try"


def code_key(policy: Policy) -> str:
    """What decides an entry besides the original's bytes: hugify's code (the
    package's modules and the core) and the policy's effective values."""
    h = hashlib.sha256(f"{_core.VERSION}\0{policy.digest()}\0".encode())
    package = Path(tree.__file__).resolve().parent
    for f in sorted([*package.glob("*.py"), Path(_core.__file__).resolve()]):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:16]


def _fail(root: Path, e: OSError) -> CacheError:
    return CacheError(f"cannot write the cache of hugified copies in {root} ({reasons.io_detail(e, with_file=False)})")


# --- the root -------------------------------------------------------------------------------


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int) -> bool:
    """Whether a group has nobody in it but the caller: its primary group, which no
    other user has as theirs or as a member (a user private group, as Debian makes
    them; its directories may be group-writable under umask 002)."""
    import grp
    import pwd

    me = os.geteuid()
    try:
        mine = pwd.getpwuid(me)
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    if gid != mine.pw_gid or members - {mine.pw_name}:
        return False
    return not any(p.pw_gid == gid and p.pw_uid != me for p in pwd.getpwall())


def _unsafe(st: os.stat_result, *, own: bool) -> str | None:
    """Why another user could change what a directory holds, or None. `own`: the
    directory must be the caller's (the root, and what hugify made on the way to it);
    otherwise root's will do, and a sticky directory (/tmp) may be writable by others,
    who cannot rename or remove what they do not own there. Its group may write it
    when that group is the caller's alone."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != me and (own or st.st_uid != 0):
        return f"is owned by {_owner(st.st_uid)}, not by {_owner(me)}"
    writers = ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "others"))
    others = [who for bit, who in writers if mode & bit]
    if others == ["its group"] and _private_group(st.st_gid):
        others = []
    if others and (own or not mode & stat.S_ISVTX):
        return f"is writable by {' and '.join(others)} (mode {mode:04o})"
    return None


def open_root(root: Path, *, create: bool) -> int | None:
    """The cache's root, open (O_DIRECTORY), each component from / opened relative to
    the one before without following a symbolic link (a symlink in the name given is
    resolved first) and checked as the module's docstring says; missing ones made
    (mode 0711) when `create`, else None. UntrustedCache when another user could
    change it; OSError when it cannot be opened or made."""
    real = Path(os.path.realpath(root))
    fd = os.open("/", _DIR)
    where = Path("/")
    made = False
    try:
        parts = real.parts[1:]
        for i, part in enumerate(parts):
            where = where / part
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o711, dir_fd=fd)
                    made = True
                child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            if made and st.st_uid == os.geteuid():
                # Whatever the umask: others may pass through (a command's processes
                # that run as another user reach the shared way's store in a run's
                # scratch directory), not list it; each entry is the caller's alone.
                os.fchmod(fd, 0o711)
                st = os.fstat(fd)
            why = _unsafe(st, own=made or i == len(parts) - 1)
            if why:
                raise UntrustedCache(
                    f"the cache of hugified copies, {root}, is not safe to use: {where} {why}; "
                    "give --cache-dir a directory of your own that nobody else can write"
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _rmtree_at(root_fd: int, name: str) -> None:
    shutil.rmtree(name, ignore_errors=True, dir_fd=root_fd)


def _mkdir_new(root_fd: int, prefix: str) -> str:
    """A directory of the caller's alone (0700) below the root, under a name no other
    run uses: its name."""
    while True:
        name = f"{prefix}-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            os.mkdir(name, 0o700, dir_fd=root_fd)
            return name
        except FileExistsError:
            continue


@contextlib.contextmanager
def _opened(name: str, flags: int, dir_fd: int | None = None, mode: int = 0o600) -> Iterator[int]:
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def copy_hashed(src: int, dir_fd: int, name: str, mode: int) -> str:
    """Copies the file open at `src`, from its start, into a new file `name` (made
    O_EXCL|O_NOFOLLOW in `dir_fd`, `mode`), hashing the very bytes it copies: their
    SHA-256."""
    h = hashlib.sha256()
    with _opened(name, _CREATE, dir_fd) as dst:
        offset = 0
        while chunk := os.pread(src, _CHUNK, offset):
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view) :]
            offset += len(chunk)
        os.fchmod(dst, mode)
    return h.hexdigest()


# --- the entries ------------------------------------------------------------------------------


@dataclass
class Copy:
    """What the cache holds for one original."""

    original: str
    sha256: str
    outcome: dict[str, Any]  # tree.FileReport's fields, for this original
    path: Path | None  # the copy (transformed or as-is), else None
    made: bool  # made by this run (not found in the cache)
    #: (st_dev, st_ino) of the copy whose bytes were checked: the inode the
    #: hugified side's bind mount must show.
    identity: files.Identity | None = None
    #: The original as it was when its bytes were read (fstat of the descriptor they
    #: were read through): what it must still be for the copy to stand for it.
    source: files.Version | None = None

    @property
    def status(self) -> str:
        return str(self.outcome["status"])


@dataclass(frozen=True)
class Usable:
    """An object under test: its original, the original's version whose bytes were
    copied, and its copy in the cache (the inode whose bytes were checked)."""

    original: str
    source: files.Version
    file: Path
    identity: files.Identity

    @classmethod
    def of(cls, copies: list[Copy]) -> list[Usable]:
        """The copies that can be tried."""
        return [cls(c.original, c.source, c.path, c.identity) for c in copies if c.path and c.identity and c.source]


@dataclass(frozen=True)
class _Entry:
    """An entry found: its record and its copy's inode (None without a copy); no
    record when it is not what its name says."""

    outcome: dict[str, Any] | None
    identity: files.Identity | None = None


#: An entry that is not what its name says.
_UNTRUSTED = _Entry(None)


class Cache:
    def __init__(self, root: Path, policy: Policy) -> None:
        self.root = Path(os.path.realpath(root))  # where every path below it is checked
        self.policy = policy
        self.key = code_key(policy)
        self.fd = -1

    def open(self) -> Path:
        """Opens the root (made if need be; UntrustedCache when another user could
        change it), checks that copies executed from it could run, and makes this
        run's scratch directory there; CacheError if not."""
        try:
            fd = open_root(self.root, create=True)
            assert fd is not None
            self.fd = fd
            self._remove_abandoned()
            scratch = self.root / _mkdir_new(self.fd, RUN)
        except OSError as e:
            raise _fail(self.root, e) from None
        if os.fstatvfs(self.fd).f_flag & os.ST_NOEXEC:
            _rmtree_at(self.fd, scratch.name)
            raise CacheError(
                f"the cache of hugified copies, {self.root}, is on a filesystem mounted noexec: "
                "the copies of programs could not run; give --cache-dir elsewhere"
            )
        return scratch

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def remove_scratch(self, scratch: Path) -> None:
        if self.fd >= 0:
            _rmtree_at(self.fd, scratch.name)

    def _remove_abandoned(self) -> None:
        _sweep(self.fd, self.key)

    def copies(self, originals: list[str], jobs: int) -> list[Copy]:
        """The cached copy of each original, made where the cache has none (in
        parallel, `jobs` at a time); CacheError when the cache cannot take them.
        Originals that cannot be read are left out."""
        found: list[Copy] = []
        todo: list[tuple[str, str, str, tree.Candidate, files.Version]] = []
        works: list[str] = []
        try:
            for original in originals:
                work = _mkdir_new(self.fd, NEW)
                works.append(work)
                made = self._copy_in(original, work)
                if made is None:
                    continue
                digest, candidate, source = made
                cached = self._entry(original, digest)
                if cached:
                    found.append(replace(cached, source=source))
                    continue
                todo.append((original, digest, work, candidate, source))
            outcomes = self._transform([c for _, _, _, c, _ in todo], jobs)
            for (original, digest, work, _, source), outcome in zip(todo, outcomes, strict=True):
                found.append(replace(self._store(original, digest, work, outcome), source=source))
        except OSError as e:
            raise _fail(self.root, e) from None
        finally:
            for work in works:
                _rmtree_at(self.fd, work)
        return found

    def _copy_in(self, original: str, work: str) -> tuple[str, tree.Candidate, files.Version] | None:
        """The original, opened once, copied into the work directory `work` while its
        bytes are hashed: their SHA-256, the copy as `hugify tree` sees a file of a
        build root, and the original's version read from that descriptor; None for an
        original that cannot be read (or is no regular file)."""
        try:
            src = os.open(original, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                return None
            with _opened(work, _DIR, self.fd) as wfd:
                digest = copy_hashed(src, wfd, COPY, stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
                # the hook of tests/test_try.py: its rename over the original here is one
                # between the hash and the copy of a reader that opens the original twice
                files.reached(files.Step("hashed", original, str(self.root / work / COPY)))
                probed = tree.probe(files.Directory(wfd, str(self.root / work), owned=False), COPY)
                copied = os.stat(COPY, dir_fd=wfd, follow_symlinks=False)
        finally:
            os.close(src)
        assert probed is not None  # the caller gives ELF files only
        # Named by the original (the policy's globs match installed paths), made of the copy.
        return digest, tree.Candidate([original], [self.root / work / COPY], probed, copied), files.version(st)

    def _entry(self, original: str, digest: str) -> Copy | None:
        """The entry of `digest`, if it is what it says (see the module's docstring);
        an entry that is not is removed (CacheError if it cannot be)."""
        name = f"{digest}-{self.key}"
        found = self._check(name, digest)
        if found is None:
            return None
        if found.outcome is None:
            _rmtree_at(self.fd, name)
            if name in os.listdir(self.fd):
                raise CacheError(
                    f"cannot remove {self.root / name}, an entry of the cache of hugified copies that is not "
                    "what its name says (another user's, or other bytes); remove it by hand"
                )
            return None
        with contextlib.suppress(OSError):
            os.utime(name, dir_fd=self.fd, follow_symlinks=False)  # an entry's time says when it was last used
        copy = self.root / name / COPY if found.identity else None
        return Copy(original, digest, found.outcome, copy, made=False, identity=found.identity)

    def _check(self, name: str, digest: str) -> _Entry | None:
        """An entry's record and its copy's inode when both are the caller's, nobody
        else can change them and the copy has the bytes the record says; _UNTRUSTED for
        an entry that is not all that, None where there is none."""
        try:
            d = os.open(name, _DIR, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError:
            return _UNTRUSTED  # a symbolic link, or no directory
        try:
            if _unsafe(os.fstat(d), own=True):
                return _UNTRUSTED
            with _opened(OUTCOME, _READ, d) as f:
                st = os.fstat(f)
                if not stat.S_ISREG(st.st_mode) or _unsafe(st, own=True) or st.st_size > 1 << 20:
                    return _UNTRUSTED
                outcome = json.loads(os.pread(f, st.st_size + 1, 0))
            if not isinstance(outcome, dict) or outcome.get("sha256") != digest:
                return _UNTRUSTED
            if outcome.get("status") not in ("transformed", "as-is"):
                return _Entry(outcome)
            with _opened(COPY, _READ, d) as f:
                st = os.fstat(f)
                writable = stat.S_IMODE(st.st_mode) & 0o7222  # by anyone, or setuid
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or writable:
                    return _UNTRUSTED
                if _sha256_fd(f) != outcome.get("copy_sha256"):
                    return _UNTRUSTED
                return _Entry(outcome, files.identity(st))
        except (OSError, ValueError):
            return _UNTRUSTED
        finally:
            os.close(d)

    def _transform(self, candidates: list[tree.Candidate], jobs: int) -> list[tree.Outcome]:
        """`hugify tree`'s decision and work for each candidate, in place."""
        pol = self.policy
        opts = tree.Options(root=Path("/"), policy=pol)
        stripped_rule = pol.where("refuse_stripped") if pol.refuse_stripped else None
        work: list[tree.Job | tree.Outcome] = []
        with contextlib.ExitStack() as opened:
            for c in candidates:
                decision = tree.decide(c, opts)
                if isinstance(decision, tree.Outcome):
                    work.append(decision)
                    continue
                # The job replaces the copy in its own work directory, never the original:
                # its tree is that directory, its one name the copy's.
                fd = os.open(c.files[0].parent.name, _DIR, dir_fd=self.fd)
                root = opened.enter_context(files.Directory(fd, str(c.files[0].parent)))
                copy = c._replace(paths=[c.files[0].name])
                work.append(tree.Job(copy, decision, False, stripped_rule, None, root=root))
            outcomes = [
                o._replace(paths=c.paths)
                for c, o in zip(candidates, tree.execute(work, jobs, lambda o: None), strict=True)
            ]
        for o in outcomes:
            if o.status == "failed" and o.reason == "io-error":
                raise CacheError(f"cannot write the cache of hugified copies in {self.root} ({o.detail})")
        return outcomes

    def _store(self, original: str, digest: str, work: str, outcome: tree.Outcome) -> Copy:
        """Moves a finished entry into place (another run's, if it got there first)."""
        report: dict[str, Any] = {**outcome.as_json(), "sha256": digest}
        keep = outcome.status in ("transformed", "as-is")
        identity = None
        with _opened(work, _DIR, self.fd) as wfd:
            if keep:
                with _opened(COPY, _READ, wfd) as f:
                    os.fchmod(f, stat.S_IMODE(os.fstat(f).st_mode) & 0o555)
                    report["copy_sha256"] = _sha256_fd(f)
                    identity = files.identity(os.fstat(f))
            else:
                os.unlink(COPY, dir_fd=wfd)
            with _opened(OUTCOME, _CREATE, wfd, 0o444) as f:
                os.write(f, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
            # The caller's alone, like the root hugify makes: a copy of a file in a
            # directory others cannot enter (root's /root/bin, a 0700 build tree) must
            # not become readable beside it. The command's processes reach the copies
            # through their bind mounts, whatever user they run as.
            os.fchmod(wfd, 0o700)
        name = f"{digest}-{self.key}"
        try:
            os.rename(work, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            cached = self._entry(original, digest)
            if cached is None:
                raise
            return cached
        return Copy(original, digest, report, self.root / name / COPY if keep else None, made=True, identity=identity)

    def plain_copies(self, originals: list[str], scratch: Path) -> list[Copy]:
        """Byte-identical copies, in this run's scratch directory, of the originals the
        policy selects (the A/A control: the whole method with nothing hugified); not
        kept."""
        out = []
        opts = tree.Options(root=Path("/"), policy=self.policy)
        try:
            with _opened(scratch.name, _DIR, self.fd) as sfd:
                for n, original in enumerate(originals):
                    with files.Directory.open(Path(original).parent, follow=True) as d:
                        probed = tree.probe(d, Path(original).name)
                    assert probed is not None  # the caller gives ELF files only
                    candidate = tree.Candidate([original], [Path(original)], probed, os.stat(original))
                    decision = tree.decide(candidate, opts)
                    if isinstance(decision, tree.Outcome):
                        out.append(Copy(original, "", dict(decision.as_json()), None, made=False))
                        continue
                    name = f"plain-{n}"
                    with _opened(original, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) as src:
                        st = os.fstat(src)
                        digest = copy_hashed(src, sfd, name, stat.S_IMODE(st.st_mode) & 0o555)
                    identity = files.identity(os.stat(name, dir_fd=sfd, follow_symlinks=False))
                    outcome = {"status": "copied", "reason": None, "detail": "a plain copy (--control)"}
                    source = files.version(st)
                    out.append(
                        Copy(original, digest, outcome, scratch / name, made=True, identity=identity, source=source)
                    )
        except OSError as e:
            raise _fail(self.root, e) from None
        return out

    def size(self) -> int:
        """Bytes the entries hold."""
        return sum(_entry_size(self.fd, d.name) for d in os.scandir(self.fd) if not d.name.startswith("."))


def _entry_size(root_fd: int, name: str) -> int:
    total = 0
    with contextlib.suppress(OSError), _opened(name, _DIR, root_fd) as d:
        for f in os.scandir(d):
            total += f.stat(follow_symlinks=False).st_size
    return total


def _sweep(root_fd: int, key: str | None) -> tuple[int, int]:
    """Removes the temporary directories of runs whose process is gone (interrupted
    hard), and the entries of another hugify or policy (not of `key`) unused for
    STALE_SECONDS, or every entry if `key` is None; how many entries went, and their
    bytes."""
    now = time.time()
    gone = held = 0
    for d in os.scandir(root_fd):
        kind, _, rest = d.name.partition("-")
        pid = rest.split("-")[0]
        if kind in (NEW, RUN) and pid.isdigit() and not kernel.alive(int(pid)):
            _rmtree_at(root_fd, d.name)
        elif not d.name.startswith(".") and (key is None or not d.name.endswith(f"-{key}")):
            with contextlib.suppress(OSError):
                if key is None or now - d.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                    size = _entry_size(root_fd, d.name)
                    _rmtree_at(root_fd, d.name)
                    gone, held = gone + 1, held + size
    return gone, held


def clear(root: Path) -> tuple[int, int] | None:
    """Removes every entry of the cache at `root`, and what runs that are gone left
    (not the scratch directories of runs under way); (entries, bytes) removed, None
    where there is no cache. UntrustedCache when another user could change it,
    OSError when it cannot be read."""
    fd = open_root(Path(os.path.realpath(root)), create=False)
    if fd is None:
        return None
    try:
        return _sweep(fd, None)
    finally:
        os.close(fd)
