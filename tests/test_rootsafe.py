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

import io
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hugify import files
from hugify.cli import main
from testkit import HP, REPO
from testkit.cli import hugify
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
    """Regular files hugify's temporary names are (an attacker's symlink may stay)."""
    return [p.name for p in directory.iterdir() if ".hugify-" in p.name and p.is_file() and not p.is_symlink()]


# --- the race hook -----------------------------------------------------------------------------

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
#: Steps at which a temporary file exists under its own name.
WITH_TEMPORARY = IN_PLACE_STEPS[1:-1]


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


def scene(tmp_path: Path, program: Path, outside: Path, *, uid: int = NOBODY, mode: int = 0o755) -> Scene:
    work = tmp_path / "work"
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
    "case",
    [
        (step, attack)
        for attack in ATTACKS
        for step in IN_PLACE_STEPS
        if attack != "swap_temporary_for_symlink" or step in WITH_TEMPORARY
    ],
    ids="-".join,
)
def test_transform_in_place_raced_at_each_step(
    tmp_path: Path, program: Path, outside: Path, race: Callable[[Race], Race], case: tuple[str, str]
) -> None:
    """The other user's file, 0755 and theirs (uid 65534), in their directory: at
    each step they swap the target or hugify's temporary file for a symlink to a
    root-owned 0600 file, or the target for another file. The issue's reproduced
    case is the temporary file swapped after the transform (step written): the
    root-owned file became uid 65534, mode 0755."""
    step, attack = case
    s = scene(tmp_path, program, outside)
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
    tmp_path: Path, program: Path, outside: Path, race: Callable[[Race], Race]
) -> None:
    """Issue 28 as reproduced: after the transform, before the chown, the temporary
    file is swapped for a symlink to a root-owned 0600 file."""
    s = scene(tmp_path, program, outside)
    victim = outside / "shadow"
    r = race(Race("before-chown", s.target, s.swap_temporary_for_symlink))
    code, _, err = run_cli("transform", "--in-place", s.target)
    assert r.fired
    st = victim.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    assert code == UNSAFE and "(changed-meanwhile)" in err
    assert state(s.target).same_file(s.before)


@pytest.mark.parametrize("step", ["written", "before-chown", "before-xattrs", "before-rename"])
def test_a_capability_file_gives_its_capability_to_nobody_else(
    tmp_path: Path, program: Path, outside: Path, race: Callable[[Race], Race], step: str
) -> None:
    """A root-owned setuid file with a capability in a writable directory: swapping
    the temporary file for a symlink never copies the capability or the mode onto
    the symlink's target (without the race, tests/test_tree.py shows both kept)."""
    s = scene(tmp_path, program, outside, uid=0, mode=0o4755)
    subprocess.run(["setcap", "cap_net_raw+ep", str(s.target)], check=True)
    s.before = state(s.target)
    before = snapshot(outside)
    r = race(Race(step, s.target, s.swap_temporary_for_symlink))
    code, _, err = run_cli("transform", "--in-place", s.target)
    assert r.fired
    assert snapshot(outside) == before
    assert code == UNSAFE and "(changed-meanwhile)" in err, err
    assert state(s.target).same_file(s.before)


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
            res = subprocess.run(
                [sys.executable, "-m", "hugify.cli", "transform", *args, str(path)],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=60,
                check=False,
            )
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
    res = subprocess.run(
        [sys.executable, "-m", "hugify.cli", "tree", str(h.root), "--no-progress", "--jobs", "2", *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, "HUGIFY_POLICY_PATH": ""},
        check=False,
    )
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
        ("before-chown", "temporary-for-symlink"),
        ("before-xattrs", "temporary-for-symlink"),
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
            sys.executable,
            "-m",
            "hugify.cli",
            *map(str, args),
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
