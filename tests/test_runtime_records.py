"""The runtime's records in its directory (/run/hugify, $HUGIFY_RUNTIME_DIR) are root's
(issue 28 item 4 for the runtime, issue 32 item 2): a record steers every process of the
boot, so only records that root wrote in a directory of root's that nobody else may write
are honoured, neither reached through a symlink; a process that is not root never writes
one (what it finds out stays in its memory, and where it can keep nothing it takes the
kernel's version and the filesystem's type for a hint instead); root writes each record
under a fresh name beside it (O_CREAT|O_EXCL|O_NOFOLLOW, relative to the directory's
descriptor) and renames it into place, so that a symlink planted at either name is
replaced, never followed.

Observed through what the records do: a record that XFS gives no large folios, honoured,
leaves a cold window `unsupported` (nothing read); ignored, the window is `loaded` (XFS
gives 2 MiB folios on every kernel since 5.18, measured by conftest.large_folio_dir). Each
test failed on the runtime before this (main 5e7ab4b), which honoured any record it could
read and wrote through predictable temporary names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cli import command, hugify
from testkit.runtime import (
    AS_NOBODY,
    AUDIT_LIB,
    HUGIFY_RUN,
    REPO,
    Programs,
    clean_env,
    copy_programs,
    drop_caches,
    file_backed_only,
    gives_large_folios,
    hugify_as_nobody,
    locked,
    loop_fs,
    public_dir,
)

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
NOBODY = 65534


@pytest.fixture
def progs(built: Programs, large_folio_dir: Path, tmp_path: Path) -> Iterator[Programs]:
    copy = copy_programs(built, large_folio_dir / tmp_path.name)
    yield copy
    shutil.rmtree(copy.dir)


def fs_record(path: Path) -> tuple[str, str]:
    """The record that the file's filesystem (XFS) gives no large folios, this boot."""
    dev = os.stat(path).st_dev
    return f"no-large-folios-{os.major(dev)}:{os.minor(dev)}", f"{BOOT} 58465342\n"


def cold_states(run: Path, prog: Path) -> set[str]:
    """The states `hugify prefetch` (root) gives the program's cold windows."""
    drop_caches()
    no_copies = file_backed_only(run.parent)  # the file-backed way: no shared copies
    res = hugify("prefetch", "--json", "--policy", no_copies, "--runtime-dir", run, prog, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    (f,) = json.loads(res.stdout)["files"]
    return {w["state"] for w in f["windows"]}


def planted(tmp: Path, how: str, name: str, text: str) -> Path:
    """A runtime directory holding the record `name` as someone other than root (or
    root through a symlink, or root in a directory others may write) could plant it."""
    good = tmp / "good"  # a record as root writes it, for the symlinks to point at
    good.mkdir(mode=0o755, exist_ok=True)
    (good / name).write_text(text)
    run = tmp / how
    run.mkdir(mode=0o755)
    record = run / name
    if how == "dir-a-symlink":
        run.rmdir()
        run.symlink_to(good)
        return run
    if how == "record-a-symlink":
        record.symlink_to(good / name)
        return run
    record.write_text(text)
    record.chmod(0o644)
    if how == "record-of-another-user":
        os.chown(record, NOBODY, NOBODY)
    elif how == "record-writable-by-others":
        record.chmod(0o666)
    elif how == "dir-of-another-user":
        os.chown(run, NOBODY, NOBODY)
    elif how == "dir-writable-by-others":
        run.chmod(0o1777)
    elif how == "dir-writable-by-group":
        run.chmod(0o775)
    else:
        assert how == "root's", how
    return run


WAYS = (
    "record-of-another-user",
    "record-writable-by-others",
    "record-a-symlink",
    "dir-of-another-user",
    "dir-writable-by-others",
    "dir-writable-by-group",
    "dir-a-symlink",
)


@pytest.mark.parametrize("how", WAYS)
def test_a_record_planted_by_another_user_is_ignored(progs: Programs, tmp_path: Path, how: str):
    """The record says XFS gives no large folios: planted so, prefetch ignores it (the
    windows are `loaded`) and status does not list it; the same record written as root
    writes it is honoured (`unsupported`, listed)."""
    name, text = fs_record(progs.prog)
    run = planted(tmp_path, how, name, text)
    trusted = planted(tmp_path, "root's", name, text)
    with locked():
        got, honoured = cold_states(run, progs.prog), cold_states(trusted, progs.prog)
    status = json.loads(hugify("status", "--json", "--runtime-dir", run, progs.prog, check=False).stdout)
    assert got == {"loaded"}, (how, got)
    assert status["system"]["filesystems_without_large_folios"] == [], status["system"]
    assert honoured == {"unsupported"}


def test_a_policy_record_planted_by_another_user_turns_no_copies_on(progs: Programs, tmp_path: Path):
    """The record of the policy's anonymous-copy programs counts only as root's too: one of
    another user's naming the program does not put the audit library in the mode."""
    text = f"# planted\n{os.path.realpath(progs.prog)}\n"
    run = planted(tmp_path, "record-of-another-user", "anonymous", text)
    trusted = planted(tmp_path, "root's", "anonymous", text)
    lines = {}
    for which, rdir in (("planted", run), ("root's", trusted)):
        res = subprocess.run(
            [str(progs.prog)],
            capture_output=True,
            text=True,
            env=clean_env(rdir, LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1", HUGIFY_PERF_MAP="0"),
            check=False,
        )
        assert res.returncode == 0, res.stderr
        lines[which] = [x for x in res.stderr.splitlines() if "anonymous" in x]
    assert lines["planted"] == []
    assert lines["root's"] and all("not-needed" in x for x in lines["root's"]), lines  # on: XFS needs none


@pytest.mark.parametrize("owner", ["nobody", "root"])
def test_an_unprivileged_process_never_writes_a_record(built: Programs, owner: str):
    """hugify-run and the audit library run as nobody, with a runtime directory nobody may
    write, on a filesystem without large folios (ext4 with data=journal, whatever the
    kernel; its type's hint says nothing against it): nothing is written there.
    - The files nobody's own (a build of its own): it finds out as root would, each
      window read in again small with nothing in the way, the program's its file's
      verdict, the library's its filesystem's; and keeps that in its memory only.
    - The files root's: the kernel does not tell another user which of their pages are
      cached, so it cannot make sure an eviction worked; it reads the cold windows through
      MADV_HUGEPAGE, and where its thread read a window whole (nothing of it was cached,
      nor read by another meanwhile) and it came small, it concludes as the owner would,
      in its memory (issue 38: before, it left them `small`, not-owner, and the audit
      library in the program hugify-run started read each window once more). Windows
      found cached small it leaves so (`small`, not-owner), concluding nothing.
    Root's record of the filesystem, where there is one, is honoured by such processes:
    every window `unsupported` by it."""
    with public_dir() as public, loop_fs(public, "ext4", "data=journal", built) as mnt:
        mnt.chmod(0o755)
        progs = Programs(mnt / "bin", built.orig)
        if owner == "nobody":
            for f in progs.files:
                os.chown(f, NOBODY, NOBODY)
        run = public / "run"
        run.mkdir()
        os.chown(run, NOBODY, NOBODY)
        env = clean_env(run, HUGIFY_DEBUG="1")
        with locked():
            assert not gives_large_folios(progs.prog)
            drop_caches()
            res = subprocess.run(
                [*AS_NOBODY, HUGIFY_RUN, progs.prog, "-"], capture_output=True, text=True, env=env, check=False
            )
            written = sorted(p.name for p in run.iterdir())
            told = hugify_as_nobody("prefetch", "--runtime-dir", run, progs.prog)  # the windows small now
            # root's record of the filesystem, honoured by nobody's processes
            root_run = public / "root-run"
            drop_caches()
            no_copies = file_backed_only(public)  # the file-backed way: no shared copies of root's
            by_root = hugify(
                "prefetch", "--policy", no_copies, "--runtime-dir", root_run, progs.prog, progs.lib, check=False
            )
            assert by_root.returncode == 4, by_root.stderr
            drop_caches()
            again = hugify_as_nobody("prefetch", "--json", "--runtime-dir", root_run, progs.prog, progs.lib)
    assert res.returncode == 0, res.stderr
    assert written == [], written
    small = "0 failed, 3 unsupported, 0 skipped"
    prog_line = f"{progs.prog}: 3 windows: 0 huge (0 loaded, 0 repaired), 0 busy, {small}"
    lib_line = f"{progs.lib}: 2 windows: 0 huge (0 loaded, 0 repaired), 0 busy, " + small.replace("3", "2")
    assert prog_line in res.stderr and lib_line in res.stderr, res.stderr
    if owner == "root":  # said so, with the reason, and not an error
        assert told.returncode == 0 and "3 left as they are: " in told.stdout, told.stdout + told.stderr
        assert told.stdout.splitlines()[0].endswith("(not-owner)"), told.stdout
    else:  # found out in its own memory: the program's file gets none
        assert told.returncode == 4 and "file-no-large-folios" in told.stdout, told.stdout + told.stderr
    assert again.returncode == 4, again.stderr
    reasons = {f["path"]: {w["reason"] for w in f["windows"]} for f in json.loads(again.stdout)["files"]}
    assert reasons == {str(progs.prog): {"no-large-folios"}, str(progs.lib): {"no-large-folios"}}, reasons


def prefetch_after(plant: str, run: Path, prog: Path, policy: Path) -> subprocess.CompletedProcess[str]:
    """Root's `hugify prefetch --runtime-dir RUN PROG`, the policy's anonymous programs
    from `policy`, in a shell that first runs `plant` with $$ the pid prefetch then keeps
    (it execs)."""
    cli = command("prefetch", "--runtime-dir", run, prog)
    return subprocess.run(
        ["sh", "-c", f'{plant} && exec "$@"', "sh", *cli],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "HUGIFY_POLICY_PATH": f"{REPO / 'policy' / 'policy.toml'}:{policy}"},
        check=False,
    )


def test_a_symlink_at_a_records_name_never_redirects_a_root_write(built: Programs, tmp_path: Path):
    """Symlinks to root's files planted at every name root's runtime writes a record under
    (the records' own names and the temporary names beside them, of the engine's C writer
    and of the Python writer it replaced, for the writing process's pid: the wrapper
    plants them and execs, keeping its pid): hugify-run finds a filesystem without large
    folios and records it, `hugify prefetch` records the kernel verdict and the policy's
    programs. Every file a symlink points at is byte-identical afterwards, with its mode
    and owner; the records are regular files, or not written where a name was taken."""
    victims = tmp_path / "victims"
    victims.mkdir()
    with loop_fs(tmp_path, "ext4", "data=journal", built) as mnt:
        progs = Programs(mnt / "bin", built.orig)
        dev, ino = os.stat(progs.prog).st_dev, os.stat(progs.prog).st_ino
        fs = f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"
        names = [
            fs,
            f"{fs}-{ino}",
            "kernel-exec-pmd",
            "anonymous",
            ".tmp-$$",
            *(f".tmp-$$-{k}" for k in range(4)),
            *(f".kernel-exec-pmd.hugify-$$-{k}" for k in range(2)),
            ".anonymous.$$",
        ]
        before = {}
        for k in range(len(names)):
            v = victims / f"victim-{k}"
            v.write_bytes(f"root's file {k}\n".encode())
            v.chmod(0o600)
            before[v] = v.read_bytes()
        run = tmp_path / "run"
        run.mkdir(mode=0o755)
        plant = " && ".join(f'ln -sfn {victims}/victim-{k} "{run}/{name}"' for k, name in enumerate(names))
        policy = tmp_path / "policy.toml"
        policy.write_text(f'[runtime]\nanonymous = ["{progs.prog}"]\nshared = "off"\n')  # the records alone
        with locked():
            drop_caches()
            dispatched = subprocess.run(
                ["sh", "-c", f'{plant} && exec "$@"', "sh", str(HUGIFY_RUN), str(progs.prog), "-"],
                capture_output=True,
                text=True,
                env=clean_env(run),
                check=False,
            )
            prefetch = prefetch_after(plant, run, progs.prog, policy)
    assert dispatched.returncode == 0, dispatched.stderr
    assert prefetch.returncode == 4, prefetch.stderr
    for v, data in before.items():
        st = v.lstat()
        assert (v.read_bytes(), st.st_mode & 0o7777, st.st_uid, v.is_symlink()) == (data, 0o600, 0, False), v
    for p in run.iterdir():
        if not p.is_symlink():
            assert p.is_file() and p.stat().st_uid == 0 and p.stat().st_mode & 0o777 == 0o644, p
            assert not p.name.startswith("."), p  # no temporary file left behind
    # What could be written was: the records not kept from their names by a planted link.
    assert (run / "kernel-exec-pmd").is_file() and not (run / "kernel-exec-pmd").is_symlink()
    assert (run / "anonymous").read_text().splitlines()[1:] == [str(progs.prog)]


def test_the_policys_record_is_never_written_through_a_planted_symlink(progs: Programs, tmp_path: Path):
    """The policy's record (the programs of [runtime] anonymous, which `hugify prefetch`
    keeps for the audit library) was written by path through a predictable temporary name,
    `.anonymous.PID` in the runtime directory: a symlink planted there made root's prefetch
    overwrite the file it points at (main 5e7ab4b). Now the engine writes it under a fresh
    name (O_CREAT|O_EXCL|O_NOFOLLOW relative to the directory's descriptor): the root's
    file a symlink at the old name points at is byte-identical, with its mode and owner,
    and the record is a regular file of root's holding the program."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    victim.chmod(0o600)
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[runtime]\nanonymous = ["{progs.prog}"]\n')
    with locked():
        res = prefetch_after(f'ln -s {victim} "{run}/.anonymous.$$"', run, progs.prog, policy)
    assert res.returncode == 0, res.stderr
    st = victim.lstat()
    assert (victim.read_bytes(), st.st_mode & 0o7777, st.st_uid) == (b"root's file\n", 0o600, 0)
    record = run / "anonymous"
    assert record.is_file() and not record.is_symlink() and record.stat().st_uid == 0
    assert record.read_text().splitlines()[1:] == [str(progs.prog)]


def test_no_runtime_directory_is_made_by_what_keeps_nothing(progs: Programs, tmp_path: Path):
    """`hugify status`, and hugify-run and the audit library run as root on a filesystem
    that gives large folios (nothing to record there), make no runtime directory where
    there is none: only a record written makes one (root's prefetch, which records the
    kernel verdict, does: mode 0755, root's)."""
    run = tmp_path / "run"
    with locked():
        drop_caches()
        status = hugify("status", "--runtime-dir", run, progs.prog, check=False)
        drop_caches()
        dispatched = subprocess.run(
            [str(HUGIFY_RUN), str(progs.prog), "-"], capture_output=True, text=True, env=clean_env(run), check=False
        )
        made_before_prefetch = run.exists()
        prefetch = hugify("prefetch", "--runtime-dir", run, progs.lib, check=False)
    assert status.returncode == 0 and dispatched.returncode == 0, status.stderr + dispatched.stderr
    assert not made_before_prefetch
    assert prefetch.returncode == 0, prefetch.stderr
    st = run.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
