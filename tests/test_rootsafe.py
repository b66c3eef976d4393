"""Root-safe file handling (docs/security.md, hugify/files.py): hugify runs as root
in directories other users can write and in build trees upstream code made, so
every path it reads to replace, or writes, could be swapped under it.

Races are forced deterministically: hugify.files calls `step_hook` at each step of a
replacement (opened, created, written, before-chown, before-chmod, before-xattrs,
before-rename, renamed, linked); these tests replace it in-process and run the
CLI's main() in the same process, swapping the target, the temporary file or a
directory for a symlink to a root-owned file outside (a stand-in for /etc), or for
another file, at exactly that step. Whatever happens, nothing outside changes (bytes,
owner, mode, xattrs, ctime) and the original stays byte-identical or is replaced
only by the correct output.

Hostile trees and inputs are real: FIFOs, device nodes (mknod), a socket, hard
links to files outside the tree, files with capabilities (setcap), symlinks into
the stand-in; `strace -f` shows no path-based chown/chmod/setxattr/utime."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from hugify import files
from hugify.cli import main
from testkit import HP, REPO
from testkit.cli import command, hugify
from testkit.elf import readelf_loads
from testkit.recipes import BY_NAME, build

NOBODY = 65534
INVALID, UNSAFE = 3, 6
CAPABILITY = "security.capability"


@pytest.fixture(scope="module")
def program() -> Path:
    """A PIE with more than 1 MiB of code (the default threshold)."""
    return build(BY_NAME["gcc-bfd"]) / "prog"


# --- what must not change ------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """Everything about a directory entry hugify could change."""

    kind: int
    uid: int
    gid: int
    mode: int
    data: bytes  # a regular file's bytes, a symlink's target
    xattrs: tuple[tuple[str, bytes], ...]
    ctime_ns: int  # any chown, chmod, setxattr, write or link count change moves it
    ino: int

    def same_file(self, other: State) -> bool:
        """The same content and metadata (a rename moves the ctime, nothing else)."""
        return (self.kind, self.uid, self.gid, self.mode, self.data, self.xattrs) == (
            other.kind,
            other.uid,
            other.gid,
            other.mode,
            other.data,
            other.xattrs,
        )


def state(p: Path) -> State:
    st = os.lstat(p)
    data, xattrs = b"", ()
    if stat.S_ISLNK(st.st_mode):
        data = os.readlink(p).encode()
    elif stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else "\n".join(sorted(os.listdir(p))).encode()
        names = sorted(os.listxattr(p, follow_symlinks=False))
        xattrs = tuple((n, os.getxattr(p, n, follow_symlinks=False)) for n in names)
    return State(
        stat.S_IFMT(st.st_mode), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), data, xattrs, st.st_ctime_ns, st.st_ino
    )


def snapshot(top: Path) -> dict[str, State]:
    """Every entry under `top`, `top` itself too."""
    out = {".": state(top)}
    for p in sorted(top.rglob("*")):
        out[str(p.relative_to(top))] = state(p)
    return out


@pytest.fixture
def outside(tmp_path: Path, program: Path) -> Path:
    """A stand-in for /etc: root-owned files no run may touch, on the same file
    system as the trees (so that hard links to them can be made)."""
    etc = tmp_path / "etc"
    (etc / "sub").mkdir(parents=True)
    (etc / "shadow").write_text("root:$6$secret:19000:0:99999:7:::\n")
    shutil.copyfile(program, etc / "capped")
    shutil.copyfile(program, etc / "sub" / "libouter.so")
    for p in (etc / "shadow", etc / "capped", etc / "sub" / "libouter.so"):
        os.chown(p, 0, 0)
        os.chmod(p, 0o600)
    subprocess.run(["setcap", "cap_net_admin+ep", str(etc / "capped")], check=True)
    os.setxattr(etc / "capped", "user.origin", b"etc")
    os.chmod(etc / "sub", 0o700)
    return etc


def exec_aligned(path: Path) -> bool:
    (x,) = [s for s in readelf_loads(path) if "E" in s.flags]
    return x.offset % HP == 0 and x.vaddr % HP == 0


def run_cli(*args: str | Path) -> tuple[int, str, str]:
    """hugify's main() in this process (where the test's step hook is installed)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def leftovers(directory: Path) -> list[str]:
    """hugify's temporary files, and its private directories (where the filesystem
    cannot make a file without a name) but those holding what an attacker put there (a
    symlink, which may stay)."""
    out = []
    for p in directory.iterdir():
        if ".hugify-" not in p.name or p.is_symlink():
            continue
        if p.is_file() or (p.is_dir() and not any(c.is_symlink() for c in p.iterdir())):
            out.append(p.name)
    return out


@contextmanager
def bindfs(parent: Path) -> Iterator[Path]:
    """A directory on a filesystem that cannot make a file without a name (O_TMPFILE
    answers EOPNOTSUPP, as on NFS and vfat): bindfs (FUSE) over a directory of
    `parent`, with owners, modes and extended attributes (security.capability too),
    other users' access checked by the kernel (default_permissions, allow_other).
    hugify's new files are made in a private directory there."""
    backing, mounted = parent / "fuse-backing", parent / "fuse"
    backing.mkdir()
    mounted.mkdir()
    subprocess.run(["bindfs", str(backing), str(mounted)], check=True)
    try:
        with pytest.raises(OSError) as refused:
            os.close(os.open(mounted, os.O_TMPFILE | os.O_RDWR, 0o600))
        assert refused.value.errno == errno.EOPNOTSUPP
        yield mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


@pytest.fixture
def fuse(tmp_path: Path) -> Iterator[Path]:
    with bindfs(tmp_path) as mounted:
        yield mounted


#: Where hugify's new file is made: without a name (O_TMPFILE, on tmp_path's ext4), or
#: in a private directory (on the FUSE filesystem, which cannot make one without).
WAYS = ("unnamed", "private-directory")


@pytest.fixture
def raced(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[tuple[str, ...], Path]:
    """An indirect parameter (..., way): the parameter, and the directory to work in
    for that way (tmp_path, or the FUSE filesystem)."""
    param = cast(tuple[str, ...], request.param)
    base = cast(Path, request.getfixturevalue("fuse")) if param[-1] == "private-directory" else tmp_path
    return param, base


# --- the race hook -----------------------------------------------------------------------------

#: The steps of an in-place transform. hugify's new file has a name (the step's
#: `temporary`) only from before-rename on where the filesystem makes it without one,
#: at every step from created on where it is made in a private directory.
IN_PLACE_STEPS = [
    "opened",
    "created",
    "written",
    "before-chown",
    "before-chmod",
    "before-xattrs",
    "before-rename",
    "renamed",
]
#: Steps at which a temporary file exists under its own name, per way.
WITH_TEMPORARY = {"unnamed": ["before-rename"], "private-directory": IN_PLACE_STEPS[1:-1]}


@dataclass
class Race:
    """One swap, done once, when hugify reaches `step` for `target`."""

    step: str
    target: Path
    swap: Callable[[files.Step], None]
    fired: list[files.Step] = field(default_factory=list)

    def hook(self, step: files.Step) -> None:
        if step.name == self.step and Path(step.target) == self.target and not self.fired:
            self.fired.append(step)
            self.swap(step)


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Race], Race]]:
    def install(r: Race) -> Race:
        monkeypatch.setattr(files, "step_hook", r.hook)
        return r

    yield install


@dataclass
class Scene:
    """A directory another user can write, with their file in it and the root-owned
    stand-in for /etc beside it."""

    work: Path
    target: Path
    outside: Path
    before: State
    aside: Path  # where the attacker moves the original
    stolen: Path  # where the attacker moves hugify's temporary file

    def swap_target_for_symlink(self, step: files.Step) -> None:
        os.rename(self.target, self.aside)
        os.symlink(self.outside / "capped", self.target)

    def swap_target_for_file(self, step: files.Step) -> None:
        os.rename(self.target, self.aside)
        self.target.write_bytes(b"#!/bin/sh\necho the attacker's own file\n")
        os.chown(self.target, NOBODY, NOBODY)

    def swap_temporary_for_symlink(self, step: files.Step) -> None:
        assert step.temporary is not None
        os.rename(step.temporary, self.stolen)
        os.symlink(self.outside / "shadow", step.temporary)


def scene(base: Path, program: Path, outside: Path, *, uid: int = NOBODY, mode: int = 0o755) -> Scene:
    work = base / "work"
    work.mkdir()
    os.chmod(work, 0o777)  # the other user may write here
    target = work / "app"
    shutil.copyfile(program, target)
    os.chown(target, uid, uid)
    os.chmod(target, mode)
    return Scene(work, target, outside, state(target), work / "app.moved", work / "stolen")


def assert_correct_output(path: Path, original: State) -> None:
    """`path` is the transform of the original: its metadata, new bytes, code on
    whole huge-page windows (read by readelf)."""
    now = state(path)
    assert (now.kind, now.uid, now.gid, now.mode, now.xattrs) == (
        original.kind,
        original.uid,
        original.gid,
        original.mode,
        original.xattrs,
    )
    assert now.data != original.data and exec_aligned(path)


ATTACKS = ["swap_target_for_symlink", "swap_target_for_file", "swap_temporary_for_symlink"]


@pytest.mark.parametrize(
    "raced",
    [
        (step, attack, way)
        for attack in ATTACKS
        for way in WAYS
        for step in IN_PLACE_STEPS
        if (step in WITH_TEMPORARY[way] if attack == "swap_temporary_for_symlink" else way == "unnamed")
    ],
    ids="-".join,
    indirect=True,
)
def test_transform_in_place_raced_at_each_step(
    program: Path, outside: Path, race: Callable[[Race], Race], raced: tuple[tuple[str, ...], Path]
) -> None:
    """The other user's file, 0755 and theirs (uid 65534), in their directory: at
    each step they swap the target or hugify's temporary file (where it has a name)
    for a symlink to a root-owned 0600 file, or the target for another file. The
    issue's reproduced case is the temporary file swapped after the transform (step
    written): the root-owned file became uid 65534, mode 0755. (In the private
    directory the other user cannot reach the temporary file; the test, as root, does.)"""
    (step, attack, _), base = raced
    s = scene(base, program, outside)
    before = snapshot(outside)
    r = race(Race(step, s.target, getattr(s, attack)))
    code, _, err = run_cli("transform", "--in-place", s.target)
    assert r.fired, f"step {step} never reached"
    assert snapshot(outside) == before
    assert leftovers(s.work) == []
    original = s.aside if s.aside.exists() else s.target
    if step == "renamed":  # the swap came after hugify was done: its output was in place
        assert code == 0, err
        assert_correct_output(s.aside if attack != "swap_temporary_for_symlink" else s.target, s.before)
        return
    assert code == UNSAFE, err
    assert len(err.strip().splitlines()) == 1 and err.rstrip().endswith("(changed-meanwhile)"), err
    assert state(original).same_file(s.before)
    if attack == "swap_target_for_symlink":
        assert os.readlink(s.target) == str(outside / "capped")


def test_issue_case_root_file_never_becomes_nobody_0755(
    tmp_path: Path, program: Path, outside: Path, race: Callable[[Race], Race], fuse: Path
) -> None:
    """Issue 28 as reproduced: after the transform, before the chown, the temporary
    file is swapped for a symlink to a root-owned 0600 file (where it has a name
    then: in its private directory, on a filesystem without O_TMPFILE)."""
    s = scene(fuse, program, outside)
    victim = outside / "shadow"
    r = race(Race("before-chown", s.target, s.swap_temporary_for_symlink))
    code, _, err = run_cli("transform", "--in-place", s.target)
    assert r.fired
    st = victim.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    assert code == UNSAFE and "(changed-meanwhile)" in err
    assert state(s.target).same_file(s.before)


@pytest.mark.parametrize(
    "raced",
    [
        (step, way)
        for way in WAYS
        for step in ("written", "before-chown", "before-xattrs", "before-rename")
        if step in WITH_TEMPORARY[way]
    ],
    ids="-".join,
    indirect=True,
)
def test_a_capability_file_gives_its_capability_to_nobody_else(
    program: Path, outside: Path, race: Callable[[Race], Race], raced: tuple[tuple[str, ...], Path]
) -> None:
    """A root-owned setuid file with a capability in a writable directory: swapping
    the temporary file for a symlink never copies the capability or the mode onto
    the symlink's target (without the race, tests/test_tree.py shows both kept)."""
    (step, _), base = raced
    s = scene(base, program, outside, uid=0, mode=0o4755)
    subprocess.run(["setcap", "cap_net_raw+ep", str(s.target)], check=True)
    s.before = state(s.target)
    before = snapshot(outside)
    r = race(Race(step, s.target, s.swap_temporary_for_symlink))
    code, _, err = run_cli("transform", "--in-place", s.target)
    assert r.fired
    assert snapshot(outside) == before
    assert code == UNSAFE and "(changed-meanwhile)" in err, err
    assert state(s.target).same_file(s.before)


#: Run as the other user: WORK TARGET PID [PATH...]. Opens for writing every file it
#: can find under WORK, the PATHs given (hugify's temporary file, where it has a name)
#: and the descriptors of process PID (/proc/PID/fd/*), writes its own bytes into each
#: but TARGET (its own file, opened as a control), and prints those it opened.
ATTACKER = """
import os, sys
work, target, pid, *paths = sys.argv[1:]
for d, _, names in os.walk(work):
    paths += [os.path.join(d, n) for n in names]
try:
    paths += [f"/proc/{pid}/fd/{n}" for n in os.listdir(f"/proc/{pid}/fd")]
except OSError:
    pass
for path in dict.fromkeys(paths):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    if path != target:
        os.pwrite(fd, b"the other user's bytes", 0)
    os.close(fd)
    print(path)
"""
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
#: The steps before hugify's new file is complete (owner, mode, capabilities given).
INCOMPLETE = ["created", "written", "before-chown", "before-chmod", "before-xattrs"]


@pytest.fixture
def public() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="hugify-rootsafe-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("way", WAYS)
def test_no_one_else_can_open_the_new_file_before_it_is_complete(
    public: Path, program: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """The other user's setgid file (theirs, uid 65534, mode 02755, with a capability
    root gave it) in a directory they can write: at every step until hugify's new
    file has its owner, mode and capability, they (really uid 65534, setpriv) try to
    open for writing every file they can find there, hugify's temporary file by its
    name, and hugify's descriptors. They open only their own file: the new one has no
    name (O_TMPFILE) or lies in hugify's private directory (on a filesystem without
    O_TMPFILE) until it is complete, and the output is exactly the transform of their
    file, with its owner, setgid mode and capability. On the old code the temporary
    file was theirs before its mode and capability were set: they wrote their bytes
    into it at before-chmod, and root made those setgid with the capability."""
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(bindfs(public)) if way == "private-directory" else public
        s = scene(base, program, outside, uid=NOBODY, mode=0o2755)
        subprocess.run(["setcap", "cap_net_raw+ep", str(s.target)], check=True)
        before = state(s.target)
        code, _, err = run_cli("transform", s.target, "-o", public / "expected")
        assert code == 0, err
        opened: dict[str, list[str]] = {}

        def attack(step: files.Step) -> None:
            if step.name in INCOMPLETE and Path(step.target) == s.target:
                named = [step.temporary] if step.temporary else []
                cmd = [*AS_NOBODY, "/usr/bin/python3", "-c", ATTACKER, str(s.work), str(s.target), str(os.getpid())]
                res = subprocess.run([*cmd, *named], capture_output=True, text=True, check=True)
                opened[step.name] = res.stdout.split()

        monkeypatch.setattr(files, "step_hook", attack)
        code, _, err = run_cli("transform", "--in-place", s.target)
        assert code == 0, err
        assert opened == {step: [str(s.target)] for step in INCOMPLETE}
        after = state(s.target)
        assert (after.uid, after.gid, after.mode, after.xattrs) == (NOBODY, NOBODY, 0o2755, before.xattrs)
        assert after.data == (public / "expected").read_bytes() != before.data
        assert leftovers(s.work) == []


@pytest.mark.parametrize("step", ["opened", "written", "before-rename"])
def test_transform_to_output_raced(
    tmp_path: Path, program: Path, outside: Path, race: Callable[[Race], Race], step: str
) -> None:
    """`transform SRC -o OUT`: the source swapped for a symlink to a root-owned file
    after it was opened is still read from the file opened; OUT swapped for a
    symlink is replaced, never written through."""
    s = scene(tmp_path, program, outside)
    out = s.work / "out"
    before = snapshot(outside)

    def swap_both(st: files.Step) -> None:
        os.rename(s.target, s.aside)
        os.symlink(outside / "capped", s.target)
        if out.exists() or out.is_symlink():
            out.unlink()
        os.symlink(outside / "shadow", out)

    r = race(Race(step, out if step != "opened" else s.target, swap_both))
    code, _, err = run_cli("transform", s.target, "-o", out)
    assert r.fired and code == 0, err
    assert snapshot(outside) == before
    assert state(s.aside).same_file(s.before)
    assert_correct_output(out, s.before)


def test_transform_to_output_reads_through_a_symlink(tmp_path: Path, program: Path, outside: Path) -> None:
    """`transform LINK -o OUT` only reads LINK, so it reads the file LINK names, as
    `cp` and `readelf` do (Debian's libstdc++.so.6 is such a link): OUT is that
    file's transform with its metadata, byte for byte what naming the real path
    gives, and neither the link nor its target changes. In place, the same link is
    refused (test_fifo_device_and_symlinks_are_refused_without_blocking)."""
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(outside / "capped", work / "link")
    before, link = snapshot(outside), state(work / "link")
    code, _, err = run_cli("transform", work / "link", "-o", work / "out")
    assert code == 0, err
    assert snapshot(outside) == before and state(work / "link") == link
    assert_correct_output(work / "out", before["capped"])
    code, _, err = run_cli("transform", outside / "capped", "-o", work / "direct")
    assert code == 0, err
    assert (work / "out").read_bytes() == (work / "direct").read_bytes()


# --- refused inputs ----------------------------------------------------------------------------


def one_line(err: str, reason: str) -> None:
    assert len(err.strip().splitlines()) == 1 and err.rstrip().endswith(f"({reason})"), err


def test_fifo_device_and_symlinks_are_refused_without_blocking(tmp_path: Path, program: Path, outside: Path) -> None:
    """Each refused with one line and left as it was; a FIFO without a writer does not
    block (the run has a time limit). A FIFO or device named as the file to transform is
    the wrong type of file (wrong-file-type, exit status 3, as a directory); a symlink
    where hugify would replace a file is unsafe (6)."""
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / "fifo")
    os.mknod(work / "null", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(work / "loop", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    os.symlink(outside / "capped", work / "link")
    os.symlink(outside / "sub", work / "dir")
    shutil.copyfile(program, outside / "sub" / "prog")
    before, here = snapshot(outside), snapshot(work)
    cases = [
        (work / "fifo", "wrong-file-type", "a FIFO", INVALID),
        (work / "null", "wrong-file-type", "a character device", INVALID),
        (work / "loop", "wrong-file-type", "a block device", INVALID),
        (work / "link", "symlink", "a symbolic link", UNSAFE),
        (work / "dir" / "prog", "symlink", "a symbolic link", UNSAFE),  # its directory
    ]
    for path, reason, words, status in cases:
        for args in (["--in-place"], ["-o", str(work / "out")]):
            if args[0] == "-o" and path.name in ("prog", "link"):
                continue  # -o only reads its source: test_transform_to_output_reads_through_a_symlink
            res = hugify("transform", *args, path, timeout=60, check=False)
            assert res.returncode == status, (path, args, res.stderr)
            one_line(res.stderr, reason)
            assert words in res.stderr
    assert snapshot(work) == here and snapshot(outside) == before
    explained = hugify("explain", "not-regular", "symlink", "outside-links", "changed-meanwhile").stdout
    assert explained.count("(unsafe, exit status 6)") == 4, explained


# --- hostile build trees -----------------------------------------------------------------------


@dataclass
class Hostile:
    root: Path
    outside: Path
    originals: dict[str, State]


SPECIALS = {
    "usr/bin/fifo": "a FIFO",
    "usr/bin/null": "a character device",
    "usr/bin/loop": "a block device",
    "usr/bin/sock": "a socket",
}


@pytest.fixture
def hostile(tmp_path: Path, program: Path, outside: Path) -> Iterator[Hostile]:
    """A build tree with symlinks into the stand-in for /etc (a file and a
    directory), a FIFO, device nodes, a socket, a hard link to a file outside,
    programs with a capability and a setuid bit, and ordinary programs."""
    root = tmp_path / "root"
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/libexec/app"):
        (root / d).mkdir(parents=True)
    for rel in ("usr/bin/prog", "usr/bin/capped", "usr/libexec/app/helper", "usr/sbin/suid"):
        shutil.copyfile(program, root / rel)
        os.chmod(root / rel, 0o755)
    os.chmod(root / "usr/sbin/suid", 0o4755)
    subprocess.run(["setcap", "cap_net_raw,cap_net_admin+ep", str(root / "usr/bin/capped")], check=True)
    os.link(root / "usr/bin/prog", root / "usr/sbin/prog-link")
    os.link(outside / "sub" / "libouter.so", root / "usr/lib/libouter.so")  # a hard link to a file outside
    os.symlink(outside / "capped", root / "usr/bin/evil")
    os.symlink(outside / "sub", root / "usr/lib64")
    os.mkfifo(root / "usr/bin/fifo")
    os.mknod(root / "usr/bin/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(root / "usr/bin/loop", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "usr/bin/sock"))
    try:
        yield Hostile(root, outside, snapshot(root))
    finally:
        sock.close()


def tree_log(h: Hostile, *extra: str) -> tuple[int, list[str]]:
    args = ("tree", h.root, "--no-progress", "--jobs", "2", *extra)
    res = hugify(*args, add_env={"HUGIFY_POLICY_PATH": ""}, timeout=600, check=False)
    return res.returncode, res.stdout.splitlines() + res.stderr.splitlines()


def lines_for(log: list[str], path: str) -> list[str]:
    return [ln for ln in log if ln.startswith(f"hugify: {path}: ") or ln.startswith(f"hugify: warning: {path}: ")]


def test_hostile_tree_changes_nothing_outside_and_refuses_each_with_one_line(hostile: Hostile) -> None:
    before = snapshot(hostile.outside)
    manifest = hostile.root / "usr/lib/hugify/manifest.d/p.list"
    code, log = tree_log(hostile, "--manifest", str(manifest))
    assert code == 0, log
    assert snapshot(hostile.outside) == before
    for rel, what in SPECIALS.items():
        (line,) = lines_for(log, "/" + rel)
        assert line == f"hugify: /{rel}: skipped (not-regular): {what}, not a regular file; hugify never opens one"
        assert state(hostile.root / rel) == hostile.originals[rel]  # not even its times or mode
    (line,) = lines_for(log, "/usr/lib/libouter.so")
    assert "skipped (outside-links): 1 hard link outside the tree" in line, line
    for rel in ("usr/bin/evil", "usr/lib64"):  # symlinks: never followed, never touched
        assert state(hostile.root / rel) == hostile.originals[rel]
        assert lines_for(log, "/" + rel) == []
    for rel in ("usr/bin/prog", "usr/sbin/prog-link", "usr/bin/capped", "usr/sbin/suid", "usr/libexec/app/helper"):
        assert_correct_output(hostile.root / rel, hostile.originals[rel])
    assert os.path.samefile(hostile.root / "usr/bin/prog", hostile.root / "usr/sbin/prog-link")
    caps = subprocess.run(["getcap", str(hostile.root / "usr/bin/capped")], capture_output=True, text=True, check=True)
    assert caps.stdout.split()[-1] == "cap_net_admin,cap_net_raw=ep"
    assert manifest.is_file() and "/usr/bin/capped" in manifest.read_text()


def test_hostile_tree_manifest_through_a_symlink_is_refused(hostile: Hostile) -> None:
    """The manifest's directory in the tree is a symlink to the stand-in: nothing is
    written there, one line, exit status 6."""
    os.symlink(hostile.outside, hostile.root / "usr/lib/hugify")
    before = snapshot(hostile.outside)
    code, log = tree_log(hostile, "--manifest", str(hostile.root / "usr/lib/hugify/manifest.d/p.list"))
    assert code == UNSAFE, log
    assert snapshot(hostile.outside) == before
    (line,) = [ln for ln in log if "cannot write" in ln]
    assert line.endswith("(symlink)") and "usr/lib/hugify" in line, line


def tree_in_process(root: Path, *extra: str) -> tuple[int, list[str]]:
    code, out, err = run_cli("tree", root, "--no-progress", "--jobs", "1", *extra)
    return code, out.splitlines() + err.splitlines()


@pytest.mark.parametrize(
    ("step", "swap"),
    [
        ("opened", "file-for-symlink"),
        ("written", "file-for-symlink"),
        ("before-rename", "temporary-for-symlink"),
        ("before-rename", "file-for-other"),
        ("opened", "directory-for-symlink"),
        ("linked", "other-name-for-symlink"),
        ("probed", "directory-for-symlink"),
    ],
)
def test_hostile_tree_with_files_swapped_while_hugify_runs(
    hostile: Hostile, race: Callable[[Race], Race], step: str, swap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `hugify tree` works on /usr/bin/prog, the other user swaps it, its
    temporary file, a directory not yet walked into (/usr/libexec/app) or the other
    name of its hard link for a symlink into the stand-in, or for another file
    (probed: while the walk reads it; the other steps: while it is replaced)."""
    monkeypatch.setenv("HUGIFY_POLICY_PATH", "")
    root, out = hostile.root, hostile.outside
    prog = root / "usr/bin/prog"
    aside = root / "usr/bin/prog.moved"

    def do(st: files.Step) -> None:
        if swap == "file-for-symlink":
            os.rename(prog, aside)
            os.symlink(out / "capped", prog)
        elif swap == "file-for-other":
            os.rename(prog, aside)
            prog.write_bytes(b"#!/bin/sh\n")
        elif swap == "temporary-for-symlink":
            assert st.temporary is not None
            os.rename(st.temporary, root / "usr/bin/stolen")
            os.symlink(out / "shadow", st.temporary)
        elif swap == "directory-for-symlink":
            os.rename(root / "usr/libexec/app", root / "usr/libexec/app.moved")
            os.symlink(out / "sub", root / "usr/libexec/app")
        elif swap == "other-name-for-symlink":
            os.rename(root / "usr/sbin/prog-link", root / "usr/sbin/prog-link.moved")
            os.symlink(out / "capped", root / "usr/sbin/prog-link")

    target = root / ("usr/sbin/prog-link" if step == "linked" else "usr/bin/prog")
    before = snapshot(out)
    r = race(Race(step, target, do))
    code, log = tree_in_process(root)
    assert r.fired, f"step {step} never reached"
    assert code == 0, log  # on_error = "warn"
    assert snapshot(out) == before
    failed = [ln for ln in log if ": not transformed (" in ln]
    if step == "probed":  # during the walk: the symlink is not entered, the directory moved is walked
        assert failed == [] and lines_for(log, "/usr/libexec/app/helper") == [], log
        assert_correct_output(root / "usr/libexec/app.moved/helper", hostile.originals["usr/libexec/app/helper"])
        return
    if swap == "directory-for-symlink":
        (line,) = failed
        assert line.startswith("hugify: warning: /usr/libexec/app/helper: not transformed (symlink)"), line
        assert state(root / "usr/libexec/app.moved/helper").same_file(hostile.originals["usr/libexec/app/helper"])
        assert_correct_output(prog, hostile.originals["usr/bin/prog"])
        return
    (line,) = failed
    assert line.startswith("hugify: warning: /usr/bin/prog: not transformed (changed-meanwhile)"), line
    if swap == "other-name-for-symlink":  # the first name was replaced, the other one refused
        assert "re-linking its other names failed" in line
        assert_correct_output(prog, hostile.originals["usr/bin/prog"])
        assert state(root / "usr/sbin/prog-link.moved").same_file(hostile.originals["usr/sbin/prog-link"])
    else:
        original = aside if aside.exists() else prog
        assert state(original).same_file(hostile.originals["usr/bin/prog"])
    for rel in ("usr/bin/capped", "usr/sbin/suid", "usr/libexec/app/helper"):  # the others go on
        assert_correct_output(root / rel, hostile.originals[rel])
    assert leftovers(root / "usr/bin") == []


# --- the walk never opens what is swapped in for a directory ---------------------------------

#: Run as `python -c WALK_RACE ROOT KIND OUTSIDE ASIDE MARK`: `hugify tree ROOT` in this
#: process, where, while the walk reads usr/bin/a (step probed), usr/bin/sub (already
#: listed as a directory, not yet entered) is moved to ASIDE and replaced by KIND: a
#: FIFO, a character device (1:3, /dev/null's) or a symlink to OUTSIDE. A watchdog
#: writes MARK if anything ever opens the FIFO for reading (opening it to write, with
#: O_NONBLOCK, succeeds only then), which also ends the wait of a reader stuck on it.
WALK_RACE = """
import os, sys, threading, time
from hugify import files
from hugify.cli import main

root, kind, outside, aside, mark = sys.argv[1:6]
sub = os.path.join(root, "usr/bin/sub")

def watch():
    while True:
        try:
            os.close(os.open(sub, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            time.sleep(0.02)
            continue
        open(mark, "w").close()

def swap(step):
    if step.name != "probed" or step.target != os.path.join(root, "usr/bin/a") or os.path.exists(aside):
        return
    os.rename(sub, aside)
    if kind == "fifo":
        os.mkfifo(sub)
        threading.Thread(target=watch, daemon=True).start()
    elif kind == "device":
        os.mknod(sub, 0o666 | 0o020000, os.makedev(1, 3))
    else:
        os.symlink(outside, sub)

files.step_hook = swap
sys.exit(main(["tree", root, "--no-progress", "--jobs", "1"]))
"""
OPENAT = re.compile(
    r'^\d+\s+openat\((?P<dir>[^,]+), "(?P<name>[^"]*)", (?P<flags>[^,)]+)(?:, \d+)?\) = (?P<result>.*)$'
)


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink"])
def test_the_walk_never_opens_what_is_swapped_in_for_a_directory(
    tmp_path: Path, program: Path, outside: Path, kind: str
) -> None:
    """A directory already listed is swapped, before the walk enters it, for a FIFO,
    a device node or a symlink to the stand-in for /etc. The walk opens each directory
    relative to its parent with O_DIRECTORY|O_NOFOLLOW|O_NONBLOCK (strace), so the
    swapped-in file is refused without being opened: the FIFO does not hang the run,
    the device is not opened, the stand-in is not entered; the walk goes on and
    transforms the program after it. On the old walk (os.fwalk opens each directory
    O_RDONLY after an lstat) the FIFO was opened (it blocked), the device opened,
    the stand-in's directory opened."""
    root = tmp_path / "root"
    for d in ("usr/bin/sub", "usr/sbin"):
        (root / d).mkdir(parents=True)
    (root / "usr/bin/a").write_text("not an ELF file\n")
    (root / "usr/bin/sub/b").write_text("not an ELF file either\n")
    shutil.copyfile(program, root / "usr/sbin/prog")
    before = snapshot(outside)
    aside, mark, log = tmp_path / "aside", tmp_path / "fifo-was-opened", tmp_path / "strace.log"
    race = [sys.executable, "-c", WALK_RACE, str(root), kind, str(outside / "sub"), str(aside), str(mark)]
    res = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", "trace=open,openat,openat2", "-o", str(log), *race],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HUGIFY_POLICY_PATH": ""},
        timeout=300,
        check=False,
    )
    assert aside.is_dir(), "the swap never happened"
    assert not mark.exists(), "the walk opened the FIFO swapped in for a directory"
    assert res.returncode == 0, res.stdout + res.stderr
    assert exec_aligned(root / "usr/sbin/prog"), res.stdout
    assert snapshot(outside) == before
    opens = [m for m in map(OPENAT.match, log.read_text().splitlines()) if m]
    walked = [m for m in opens if f"<{root}" in m["dir"] and "O_DIRECTORY" in m["flags"]]
    assert {m["name"] for m in walked} >= {"usr", "bin", "sbin", "sub"}, walked
    for m in walked:  # every directory below the root: relative to its parent, never following, never blocking
        assert {"O_DIRECTORY", "O_NOFOLLOW", "O_NONBLOCK"} <= set(m["flags"].split("|")), m.group(0)
    swapped = [m for m in opens if m["name"] == "sub"]  # the walk's (the watchdog names the whole path)
    assert swapped and all(m["result"].startswith(("-1 ENOTDIR", "-1 ELOOP")) for m in swapped), swapped
    reached = [m.group(0) for m in opens if f"<{outside}" in m["result"] or f"{root}/usr/bin/sub>" in m["result"]]
    assert reached == []


def test_the_walk_lists_files_before_subdirectories_by_name(tmp_path: Path) -> None:
    """The walk's order (the log's and the report's, and the order of a hard-linked
    file's names): a directory's files by name, then each subdirectory by name, whole;
    symlinks, FIFOs and the like listed as the files they are, links not followed."""
    from hugify import tree

    root = tmp_path / "root"
    for d in ("a/y", "c", "usr/lib/debug/usr/bin"):
        (root / d).mkdir(parents=True)
    for rel in ("b", "0", "a/z", "a/y/x", "c/d", "usr/lib/debug/usr/bin/p.debug"):
        (root / rel).write_text(rel)
    os.link(root / "b", root / "c/b-link")
    os.symlink("a", root / "link-to-a")
    os.mkfifo(root / "a/fifo")
    order = [e.rel for e in tree.entries(root)]
    assert order == ["0", "b", "a/fifo", "a/z", "a/y/x", "c/b-link", "c/d"]


# --- no metadata change by path ----------------------------------------------------------------

#: System calls that change a file's owner, mode, attributes or times; the path-based
#: forms are what a swapped path turns against another file.
METADATA_CALLS = (
    "chown,lchown,fchown,fchownat,chmod,fchmod,fchmodat,setxattr,lsetxattr,fsetxattr,"
    "utime,utimes,futimesat,utimensat,rename,renameat,renameat2"
)
PATH_BASED = re.compile(r"^\d+\s+(chown|lchown|chmod|setxattr|lsetxattr|utime|utimes|rename)\(")
AT_WITH_PATH = re.compile(r'^\d+\s+(fchownat|fchmodat|futimesat|utimensat)\([^,]+, "[^"]+"')


def strace(tmp_path: Path, *args: str | Path) -> list[str]:
    log = tmp_path / "strace.log"
    subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-s",
            "256",
            "-e",
            f"trace={METADATA_CALLS}",
            "-o",
            str(log),
            *command(*args),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HUGIFY_POLICY_PATH": ""},
        capture_output=True,
        check=True,
    )
    return log.read_text().splitlines()


def assert_fd_based(calls: list[str]) -> None:
    path_based = [c for c in calls if PATH_BASED.match(c) or AT_WITH_PATH.match(c)]
    assert path_based == [], path_based
    assert any(" fchown(" in c for c in calls) and any(" fchmod(" in c for c in calls), calls
    assert any("fsetxattr(" in c and CAPABILITY in c for c in calls), calls
    renames = [c for c in calls if "renameat" in c]
    assert renames and all("AT_FDCWD" not in c for c in renames), renames


def test_strace_transform_in_place_changes_metadata_through_descriptors_only(tmp_path: Path, program: Path) -> None:
    target = tmp_path / "app"
    shutil.copyfile(program, target)
    os.chown(target, NOBODY, NOBODY)
    os.chmod(target, 0o750)
    subprocess.run(["setcap", "cap_net_raw+ep", str(target)], check=True)
    calls = strace(tmp_path, "transform", "--in-place", target)
    assert_fd_based(calls)
    assert exec_aligned(target)


def test_strace_tree_changes_metadata_through_descriptors_only(tmp_path: Path, hostile: Hostile) -> None:
    calls = strace(
        tmp_path,
        "tree",
        hostile.root,
        "--no-progress",
        "--jobs",
        "2",
        "--manifest",
        hostile.root / "usr/lib/hugify/manifest.d/p.list",
    )
    assert_fd_based(calls)
    assert exec_aligned(hostile.root / "usr/bin/capped")


# --- repack's staging and signing's outputs ------------------------------------------------------


def test_repack_never_writes_through_a_symlink_the_package_holds(tmp_path: Path, program: Path, outside: Path) -> None:
    """A vendor's package whose /usr/lib/hugify is an absolute symlink to the
    stand-in: the manifest hugify adds is refused there, not written outside the
    staging directory; nothing is written to the output directory."""
    tree = tmp_path / "evil"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: evil\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: evil\n"
    )
    (tree / "usr/bin").mkdir(parents=True)
    shutil.copyfile(program, tree / "usr/bin/prog")
    os.chmod(tree / "usr/bin/prog", 0o755)
    (tree / "usr/lib").mkdir()
    os.symlink(outside, tree / "usr/lib/hugify")
    deb = tmp_path / "evil.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True, capture_output=True)
    before = snapshot(outside)
    out = tmp_path / "out"
    res = hugify("repack", deb, "-o", out, check=False)
    assert snapshot(outside) == before
    assert res.returncode == UNSAFE, res.stderr
    one_line(res.stderr, "symlink")
    assert list(out.iterdir()) == []


def test_sign_never_writes_its_statement_through_a_symlink(tmp_path: Path, program: Path, outside: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copyfile(program, root / "usr/bin/prog")
    report = tmp_path / "report.json"
    hugify("tree", root, "--no-progress", "--package", "p", "--report", report)
    (root / "usr/share").mkdir()
    os.symlink(outside, root / "usr/share/hugify")
    before = snapshot(outside)
    res = hugify("sign", root, "--report", report, "--package", "p", check=False)
    assert snapshot(outside) == before
    assert res.returncode == UNSAFE, (res.stdout, res.stderr)
    one_line(res.stderr, "symlink")
