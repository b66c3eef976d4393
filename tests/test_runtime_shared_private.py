"""Root's shared copies show nobody what they could not read already (issue 38 item 2;
hugify/shared.py, docs/runtime.md "Shared copies"): a copy is 0444 in directories every
user may enter and its record names the original's path, so root copies only a file that
every user may read by a path every user may list. Run as root, with `nobody` as the
other user: a world-readable library in a 0700 directory, in a 0750 root:adm one, in a
0711 one (nobody may enter it, not list it), denied to nobody by a POSIX ACL on the file
or on its directory, or through the ACL's mask, reached through a symbolic link in a
public directory, and one carrying an SELinux label (no LSM
is active on the test hosts: the label is the file's attribute alone) — root's prefetch
refuses each (copy-private) and nobody finds either its bytes or its path in the
store. On the old code each was copied: nobody read the library's bytes from the copy and
its private path from the record. A library in a public directory is copied and nobody
reads it (the walk below finds what there is to find); a directory made private while
the copy is written (a hook in the copy's hashing) leaves no copy; and a store that only
root may reach (hugify try's, in a 0700 directory) shows nobody anything, so there the
private file is copied."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hugify import files, shared
from hugify import prefetch as pf
from testkit.runtime import AS_NOBODY, Programs
from testkit.shared import Env, copies_of, files_in_public, files_on_tmpfs, prefetch

#: What nobody finds in the store: every name, and the bytes of every file it may read.
WALK = r"""
import hashlib, json, os, sys
names, digests, texts = [], [], []
for top, dirs, files in os.walk(sys.argv[1], onerror=lambda e: names.append(f"! {e}")):
    for f in dirs + files:
        names.append(os.path.join(top, f))
    for f in files:
        try:
            data = open(os.path.join(top, f), "rb").read()
        except OSError:
            continue
        digests.append(hashlib.sha256(data).hexdigest())
        texts.append(data[:65536].decode("latin-1"))
print(json.dumps({"names": names, "digests": digests, "texts": texts}))
"""


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, *argv], capture_output=True, text=True, check=False)


def nobody_finds(e: Env) -> dict[str, list[str]]:
    res = as_nobody(sys.executable, "-c", WALK, str(e.store))
    assert res.returncode == 0, res.stderr
    found: dict[str, list[str]] = json.loads(res.stdout)
    return found


def digest(f: Path) -> str:
    import hashlib

    return hashlib.sha256(f.read_bytes()).hexdigest()


def nobody_can_read(f: Path) -> bool:
    return as_nobody("sh", "-c", 'exec 3< "$1"', "sh", str(f)).returncode == 0


@pytest.fixture
def public(built: Programs) -> Iterator[Env]:
    with files_in_public(built) as e:
        yield e


def placed(e: Env, mode: int, name: str = "secret-d1r") -> Path:
    """The plugin library (0755, world-readable) moved into a new directory `name` of
    the programs' tmpfs (0755)."""
    d = e.progs.dir.parent / name
    d.mkdir()
    os.chmod(d, mode)
    f = d / e.progs.plug.name
    e.progs.plug.rename(f)
    return f


def setfacl(*args: str | Path) -> None:
    subprocess.run(["setfacl", *map(str, args)], check=True)


def dir_0700(e: Env) -> Path:
    return placed(e, 0o700)


def dir_0750_group(e: Env) -> Path:
    f = placed(e, 0o750)
    os.chown(f.parent, 0, grp.getgrnam("adm").gr_gid)
    return f


def dir_0711(e: Env) -> Path:
    return placed(e, 0o711)


def with_acl(name: str, entries: str, on_directory: bool = False) -> Callable[[Env], Path]:
    """The library in a directory every user may list, the ACL `entries` set on it or
    on its directory."""

    def make(e: Env) -> Path:
        f = placed(e, 0o755)
        setfacl("-m", entries, f.parent if on_directory else f)
        return f

    make.__name__ = name
    return make


acl_on_the_file = with_acl("acl_on_the_file", "u:nobody:---")
acl_on_the_directory = with_acl("acl_on_the_directory", "u:nobody:---", on_directory=True)
# A mask that grants no read (an empty one would not do: Linux then gives a named user
# others' rights, the ACL unread).
acl_mask = with_acl("acl_mask", "u:nobody:r-x,m::--x")


def symlink_into_0700(e: Env) -> Path:
    """A public name for it: a symbolic link in a directory every user may list."""
    f = placed(e, 0o700)
    link = e.progs.dir / "libplug-link.so"
    link.symlink_to(f)
    return link


def selinux_label(e: Env) -> Path:
    f = placed(e, 0o755)
    subprocess.run(["setfattr", "-n", "security.selinux", "-v", "system_u:object_r:shadow_t:s0", str(f)], check=True)
    return f


@pytest.mark.parametrize(
    "make_private,why,nobody_denied",
    [
        (dir_0700, r"secret-d1r: mode 0700 denies its group", True),
        (dir_0750_group, r"secret-d1r: mode 0750 denies others", True),
        (dir_0711, r"secret-d1r: mode 0711 denies its group", False),
        (symlink_into_0700, r"secret-d1r: mode 0700 denies its group", True),
        (acl_on_the_file, r"its ACL denies user 65534", True),
        (acl_on_the_directory, r"secret-d1r: its ACL denies user 65534", True),
        (acl_mask, r"its ACL denies the mask", True),
        (selinux_label, r"a security label that may deny some users \(security\.selinux\)", False),
    ],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_a_file_some_user_may_not_read_gets_no_copy(
    public: Env, make_private: Callable[[Env], Path], why: str, nobody_denied: bool
):
    import re

    f = make_private(public)
    if nobody_denied:
        assert not nobody_can_read(f), "the set-up should deny nobody the file"
    if make_private is dir_0711:
        assert as_nobody("ls", str(f.parent)).returncode != 0 and nobody_can_read(f)
    res = prefetch(public, f)
    found = nobody_finds(public)
    assert digest(f) not in found["digests"], res.stdout  # the old code: nobody read the copy
    assert not [x for x in found["names"] + found["texts"] if "secret-d1r" in x], found["names"]
    assert re.search(rf"no shared copy: not readable by every user: .*{why}.* \(copy-private\)", res.stdout), res.stdout
    assert copies_of(public) == {}


def test_a_file_every_user_may_read_is_copied_and_nobody_reads_the_copy(public: Env):
    """The control: the same library in a directory every user may list is copied, and
    nobody reads the copy's bytes and the record's path (as it could the original's)."""
    f = placed(public, 0o755, "public-d1r")
    setfacl("-m", "u:nobody:r-x", f)  # an ACL that grants as much as others get
    res = prefetch(public, f)
    assert "shared copy made" in res.stdout, res.stdout + res.stderr
    found = nobody_finds(public)
    assert digest(f) in found["digests"] and any(str(f) in t for t in found["texts"]), found["names"]
    assert nobody_can_read(f)


@pytest.mark.parametrize("how", ["chmod", "moved"])
def test_a_directory_made_private_while_the_copy_is_written(public: Env, monkeypatch: pytest.MonkeyPatch, how: str):
    """The library's directory is made 0700, or moved into a 0700 directory, after root
    checked it, while the copy is written (forced there: a hook in the copy's hashing):
    the copy is refused, nothing is left; checked again on the directories root held
    open, not by their path."""
    import hashlib

    f = placed(public, 0o755)
    vault = f.parent.parent / "vault"
    vault.mkdir(mode=0o700)
    real = hashlib.sha256

    class Hooked:
        def __init__(self) -> None:
            self.h = real()

        def update(self, data: bytes) -> None:
            if how == "chmod":
                os.chmod(f.parent, 0o700)
            elif f.parent.exists():
                f.parent.rename(vault / f.parent.name)
            self.h.update(data)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

    monkeypatch.setattr(hashlib, "sha256", Hooked)
    with pf.session(str(public.run)) as r:
        work = pf.open_targets([pf.Target(str(f))], r.hp)
        try:
            r.prefetch(work)
            report = shared.settle(r.rdir, r.engine, work, 64 << 20, complete=False)
        finally:
            pf.close_targets(work)
    outcome = report.outcomes[str(f)]
    assert (outcome.state, outcome.reason) == ("none", "copy-private"), outcome
    assert "changed while it was copied" in outcome.detail, outcome
    assert not list(public.store.iterdir())


def test_a_copy_stands_for_its_original_only_while_it_is_the_file_copied(public: Env):
    """hugify try's hugified copy of a program only root may read (its own 0700
    directory) stands for that program: whoever may read the program's path decides
    who may be shown a shared copy. Someone who can rename in the program's directory
    puts a world-readable file over its path after try read the bytes: the path now
    proves nothing of the bytes copied, so no shared copy is made (copy-stale) and
    nobody finds the private bytes in the store. The control: the same copy, standing
    for the file now at the path as it is, is copied. On the old code (the original
    named by its path alone) the private program's copy was made and shown to all."""
    f = placed(public, 0o755, "prog-d1r")
    private_bytes = f.read_bytes()
    os.chmod(f, 0o700)
    copies = public.progs.dir.parent / "try-copies"  # try's cache: root's alone
    copies.mkdir(mode=0o700)
    copy = copies / f.name
    copy.write_bytes(private_bytes)
    read_then = files.version(os.stat(f))  # the version hugify try read the bytes of
    decoy = f.parent / "decoy"
    decoy.write_bytes(b"#!/bin/sh\n")
    decoy.chmod(0o755)
    os.rename(decoy, f)  # the world-readable file now at the program's path
    assert nobody_can_read(f) and files.version(os.stat(f)) != read_then

    def settle(version: files.Version) -> shared.Outcome:
        with pf.session(str(public.run)) as r:
            work = pf.open_targets([pf.Target(str(copy))], r.hp)
            try:
                r.prefetch(work)
                stands_for = {str(copy): shared.StandsFor(str(f), version)}
                report = shared.settle(r.rdir, r.engine, work, 64 << 20, complete=False, stands_for=stands_for)
            finally:
                pf.close_targets(work)
        return report.outcomes[str(copy)]

    outcome = settle(read_then)
    assert (outcome.state, outcome.reason) == ("none", "copy-stale"), outcome
    assert outcome.detail == f"{f} is no longer the file its copy was made from", outcome
    assert copies_of(public) == {} and digest(copy) not in nobody_finds(public)["digests"]
    outcome = settle(files.version(os.stat(f)))
    assert outcome.state == "made", outcome
    assert digest(copy) in nobody_finds(public)["digests"]


def test_a_store_only_root_may_reach_takes_copies_of_private_files(built: Programs, tmp_path: Path):
    """A runtime directory inside a 0700 directory of root's (pytest's tmp_path; hugify
    try's is in its own 0700 scratch directory): nobody may reach the copies or the
    records, so the library in a 0700 directory is copied."""
    assert (tmp_path.stat().st_mode & 0o077, tmp_path.stat().st_uid) == (0, 0)
    with files_on_tmpfs(built, tmp_path) as e:
        f = placed(e, 0o700)
        res = prefetch(e, f)
        assert "shared copy made" in res.stdout, res.stdout + res.stderr
        assert set(copies_of(e)) == {str(f)}
        assert as_nobody("ls", str(e.store)).returncode != 0
