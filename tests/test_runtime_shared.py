"""The shared mode (issue 31; runtime/hp_shared.c, hugify/shared.py, docs/runtime.md
"Shared copies"), on the real kernel: where the filesystem gives a file no 2 MiB folios,
root's `hugify prefetch` keeps one copy of the whole file on a tmpfs it mounts with
huge=within_size, and the audit library maps every window of the program and of its
libraries (DT_NEEDED and dlopen) from that copy, at the same addresses: ShmemPmdMapped
covers each window, the output is the plain run's, a second process adds no memory.
Every fault leaves the program on its file mapping with one HUGIFY_DEBUG line: the
tmpfs full, the budget reached, shared-memory huge pages refused, a copy or directory
tampered with, a seccomp filter forbidding the mmap, the copy removed while mapped.

The files are on a tmpfs the tests mount without huge= (the engine says `unsupported`,
memory-fs, as on a filesystem without large folios; tests/test_kernel_matrix.py boots
ext4 and btrfs kernels that give none), and one test on a btrfs image. Every test uses
a runtime directory of its own (never the host's /run/hugify) and unmounts what it
mounted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hugify import shared
from testkit import HP
from testkit.cli import hugify
from testkit.runtime import (
    AS_NOBODY,
    AUDIT_LIB,
    HUGIFY_RUN,
    SECCOMP_EPERM,
    Programs,
    copy_programs,
    hugify_as_nobody,
    locked,
    seccomp_program,
    thp_alone,
    thp_set,
)
from testkit.shared import (
    ANY_COPY,
    Env,
    assert_kept,
    assert_mapped_from_copies,
    copies_of,
    files_in_public,
    files_on_tmpfs,
    finish,
    meminfo,
    mount_tmpfs,
    nwin,
    plain,
    prefetch,
    result,
    run,
    shared_lines,
    tempfile_dir,
    unmount,
    waiting,
)
from testkit.smaps import vmas


@pytest.fixture
def env(built: Programs) -> Iterator[Env]:
    """The files and the runtime directory where every user may reach them, as on a
    machine: root copies only what every user may read (tests/test_runtime_shared_private.py)."""
    with files_in_public(built) as e:
        yield e


# --- the mode at work -------------------------------------------------------------------


def test_root_copies_and_every_process_maps_the_copies(env: Env):
    out = plain(env)
    res = prefetch(env)
    assert res.returncode == 0, res.stdout + res.stderr
    mount = shared.mount_of(env.store)
    assert mount is not None and mount.huge == "within_size", mount
    st = env.store.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
    opts = next(line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {env.store} " in line)
    assert "nosuid" in opts and "nodev" in opts and "noexec" not in opts, opts
    copies = copies_of(env)
    assert set(copies) == {os.path.realpath(f) for f in env.progs.files}
    for f in env.progs.files:
        rec = copies[os.path.realpath(f)]
        copy = env.store / rec.key / rec.name
        data = f.read_bytes()
        assert copy.read_bytes() == data
        assert rec.sha256 == hashlib.sha256(data).hexdigest()
        fst, cst = f.stat(), copy.stat()
        assert (rec.size, rec.mtime_ns, rec.ctime_ns) == (fst.st_size, fst.st_mtime_ns, fst.st_ctime_ns)
        assert (rec.copy_inode, rec.copy_ctime_ns) == (cst.st_ino, cst.st_ctime_ns)
        assert (cst.st_uid, cst.st_mode & 0o7777, cst.st_nlink) == (0, 0o444, 1)
        assert "shared copy made" in res.stdout and str(copy) in res.stdout
    # Through the audit library (the library by DT_NEEDED, the plugin by dlopen), and
    # through hugify-run.
    for argv in ([env.progs.prog, env.progs.plug], [HUGIFY_RUN, env.progs.prog, env.progs.plug]):
        got = run(env, argv)
        assert result(got.stdout) == out
        assert_mapped_from_copies(env, got)
    # A second run keeps them: nothing made again.
    again = prefetch(env)
    assert again.returncode == 0 and again.stdout.count("shared copy kept") == 3, again.stdout
    assert copies_of(env) == copies


def test_processes_share_the_copies(built: Programs):
    """Ten processes holding the copies mapped add no shared-memory huge pages: the copy
    is one per machine (the anonymous mode's copies are one per process). Read off the
    machine's counts with no other test's copies made or mapped meanwhile (thp_alone;
    its own files, not the `env` fixture's, which holds thp_steady)."""
    with thp_alone(), files_in_public(built, steady=False) as env:
        assert prefetch(env).returncode == 0
        with locked():
            before = meminfo("ShmemHugePages")
            procs = [waiting(env) for _ in range(10)]
            try:
                during = meminfo("ShmemHugePages")
                pmd = meminfo("ShmemPmdMapped")
            finally:
                outs = [finish(p) for p in procs]
        windows = sum(nwin(f) for f in env.progs.files)
        for o in outs:
            assert result(o) == plain(env)
            mapped = [v for v in vmas(o.split("--- smaps\n", 1)[1]) if v.name.startswith(str(env.store))]
            assert sum(v.shmem_pmd for v in mapped if "x" in v.perms) == windows * HP, mapped
    assert during - before < HP, (before, during)  # other tests may add at most a bit
    # The kernel counts a huge page mapped by PMDs once, however many processes map it.
    assert windows * HP <= pmd < 2 * windows * HP, pmd


def test_a_user_never_writes_a_copy_and_maps_root_s(built: Programs):
    """`hugify prefetch` as a user writes nothing; the user's processes map root's copies."""
    base = Path(tempfile_dir())
    try:
        with files_on_tmpfs(built, base) as e:
            res = prefetch(e, user="nobody")
            assert not e.store.exists(), res.stdout + res.stderr
            assert "shared copy" not in res.stdout
            assert prefetch(e).returncode == 0
            got = subprocess.run(
                ["runuser", "-u", "nobody", "--", str(e.progs.prog), str(e.progs.plug)],
                capture_output=True,
                text=True,
                env=e.env(LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1"),
                check=True,
            )
            assert_mapped_from_copies(e, got)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


COPIED = re.compile(r"^hugify-audit: anonymous (\S+): (\d+)/(\d+) windows copied$", re.M)
SETTLED = re.compile(
    r"^hugify-(?:audit|run): (\S+): (\d+) windows: \d+ huge .*, (\d+) unsupported, (\d+) skipped, ", re.M
)


def test_a_user_s_windows_on_tmpfs_are_unsupported_as_root_s_are(built: Programs):
    """Another user's process may not see which pages of root's files are cached, but the
    type of a tmpfs (statfs, which anyone may ask) says its windows can never be evicted
    and read in again, whatever is cached: the audit library, hugify-run and `hugify
    prefetch` run as nobody find every window `unsupported` (memory-fs), as root's do,
    never `skipped` (not-owner). It is the state the shared copies and the anonymous mode
    take over: left `skipped`, every user's process kept its small file mapping beside
    root's copies (the test above), and the user's anonymous mode copied nothing. No
    shared copy is made or mapped here (HUGIFY_SHARED=0)."""
    base = Path(tempfile_dir())
    try:
        with files_on_tmpfs(built, base) as e:
            files = [os.path.realpath(f) for f in e.progs.files]
            want = {f: (nwin(Path(f)), nwin(Path(f)), 0) for f in files}
            audit = subprocess.run(
                [*AS_NOBODY, str(e.progs.prog), str(e.progs.plug)],
                capture_output=True,
                text=True,
                env=e.env(LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1", HUGIFY_SHARED="0"),
                check=True,
            )
            by_run = subprocess.run(
                [*AS_NOBODY, str(HUGIFY_RUN), str(e.progs.prog), str(e.progs.plug)],
                capture_output=True,
                text=True,
                env=e.env(HUGIFY_DEBUG="1", HUGIFY_AUDIT_LIB=""),
                check=True,
            )
            anonymous = subprocess.run(
                [*AS_NOBODY, str(HUGIFY_RUN), "--anonymous", str(e.progs.prog), str(e.progs.plug)],
                capture_output=True,
                text=True,
                env=e.env(HUGIFY_DEBUG="1", HUGIFY_SHARED="0"),
                check=True,
            )
            told = hugify_as_nobody("prefetch", "--json", "--runtime-dir", e.run, *e.progs.files)
        for res, objects in ((audit, files), (by_run, files[:2])):  # hugify-run: DT_NEEDED only
            got = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in SETTLED.finditer(res.stderr)}
            assert got == {f: want[f] for f in objects}, res.stderr
        copied = {m[1]: (int(m[2]), int(m[3])) for m in COPIED.finditer(anonymous.stderr)}
        assert copied == {f: want[f][:2] for f in files}, anonymous.stderr  # the anonymous mode takes them
        assert told.returncode == 4, told.stdout + told.stderr  # nothing can be prefetched
        reasons = {f["path"]: {w["reason"] for w in f["windows"]} for f in json.loads(told.stdout)["files"]}
        assert reasons == {str(f): {"memory-fs"} for f in e.progs.files}, told.stdout
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_on_btrfs_the_engine_s_verdict_brings_the_copies(built: Programs, tmp_path: Path):
    """Files on btrfs (no large folios on any Debian kernel): the engine finds the
    windows unsupported, root copies them, the process maps the copies."""
    image, mnt, run_dir = tmp_path / "btrfs.img", tmp_path / "mnt", tmp_path / "run"
    with image.open("wb") as f:
        f.truncate(320 << 20)
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(image)], check=True, capture_output=True)
    mnt.mkdir()
    run_dir.mkdir(mode=0o755)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        with locked():
            e = Env(copy_programs(built, mnt / "bin"), run_dir)
            res = prefetch(e)
            assert res.stdout.count("shared copy made") == 3, res.stdout + res.stderr
            got = run(e, [e.progs.prog, e.progs.plug])
            assert_mapped_from_copies(e, got)
    finally:
        unmount(run_dir / "shared")
        subprocess.run(["umount", str(mnt)], check=True)


# --- policy and memory --------------------------------------------------------------------


def test_the_budget_fills_in_order_and_the_rest_stays_as_today(env: Env):
    """A budget that holds the program's copy (the first file) but not the library's:
    the library stays on its file mapping, with one line."""
    prog_size = -(-env.progs.prog.stat().st_size // 4096) * 4096
    res = prefetch(env, policy=f"[runtime]\nshared_budget = {prog_size + (1 << 20)}\n")
    assert "shared copy made" in res.stdout.splitlines()[0], res.stdout
    assert "no shared copy" in res.stdout and "(shared-budget)" in res.stdout, res.stdout
    got = run(env, [env.progs.prog, env.progs.plug])
    lines = shared_lines(got.stderr)
    n = nwin(env.progs.prog)
    assert lines[os.path.realpath(env.progs.prog)][:2] == (n, n)
    for f in (env.progs.lib, env.progs.plug):
        assert lines[os.path.realpath(f)] == (0, nwin(f), ", window 0 no-copy: file mapping kept"), got.stderr
    assert result(got.stdout) == plain(env)


def store_holds(e: Env) -> int:
    """Bytes of memory the copies' tmpfs holds, as the kernel counts it: its files and
    those removed from it that processes still map."""
    st = os.statvfs(e.store)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_the_budget_bounds_every_copy_the_store_holds(env: Env):
    """Two runs of `hugify prefetch FILE`, each for one file whose copy fits the budget
    alone, both together not: the second makes none (the first's copy, of a file this
    run did not see, is kept and counted), and the store holds at most the budget and a
    page per record. On the old code each run counted only its own copies: the store
    held both (10 MiB under an 8 MiB budget)."""
    budget = max(shared.memory_for(f.stat().st_size) for f in (env.progs.lib, env.progs.plug)) + (1 << 20)
    assert sum(shared.memory_for(f.stat().st_size) for f in (env.progs.lib, env.progs.plug)) > budget
    policy = f"[runtime]\nshared_budget = {budget}\n"
    first = prefetch(env, env.progs.lib, policy=policy)
    assert "shared copy made" in first.stdout, first.stdout + first.stderr
    second = prefetch(env, env.progs.plug, policy=policy)
    assert store_holds(env) <= budget + len(copies_of(env)) * 4096, (store_holds(env), budget)
    assert "(shared-budget)" in second.stdout, second.stdout + second.stderr
    assert set(copies_of(env)) == {os.path.realpath(env.progs.lib)}


def test_a_copy_removed_while_mapped_counts_until_its_memory_is_freed(env: Env):
    """The library's copy, mapped by a running process, goes stale (its original
    written in place) and is dropped: its memory stays held until the process exits,
    so a new copy that would pass the budget beside it waits (shared-budget, the line
    saying what the removed copy holds), and is made once the process is gone. On the
    old code the new copy was made at once: the store held both, twice the budget."""
    plug = env.progs.plug
    budget = shared.memory_for(plug.stat().st_size) + (1 << 20)
    policy = f"[runtime]\nshared_budget = {budget}\n"
    assert "shared copy made" in prefetch(env, plug, policy=policy).stdout
    (rec,) = copies_of(env).values()
    p = waiting(env)
    try:
        assert str(env.store / rec.key / rec.name) in Path(f"/proc/{p.pid}/maps").read_text()
        with plug.open("r+b") as fh:  # same inode, same bytes: a write in place
            byte = fh.read(1)
            fh.seek(0)
            fh.write(byte)
        again = prefetch(env, plug, policy=policy)
        assert store_holds(env) <= budget, (store_holds(env), budget)
        assert re.search(r"no shared copy: .*MiB of them removed but still mapped.*\(shared-budget\)", again.stdout), (
            again.stdout + again.stderr
        )
        assert copies_of(env) == {}
    finally:
        finish(p)
    last = prefetch(env, plug, policy=policy)
    assert "shared copy made" in last.stdout, last.stdout + last.stderr
    assert store_holds(env) <= budget + 4096


def test_the_tmpfs_hugify_mounts_is_sized_by_the_policy(env: Env):
    budget = 24 << 20
    assert prefetch(env, env.progs.plug, policy=f"[runtime]\nshared_budget = {budget}\n").returncode == 0
    mount = shared.mount_of(env.store)
    assert mount is not None and mount.size == budget + shared.MOUNT_SLACK, mount


def test_a_tmpfs_without_a_size_is_not_used(env: Env):
    """A tmpfs without size= counts none of the memory it holds (statfs says nothing):
    the budget could not be kept, so no copy is made there."""
    mount_tmpfs(env.store, "mode=0755,huge=within_size")
    res = prefetch(env)
    assert "mounted without size=" in res.stdout and "(shared-unavailable)" in res.stdout, res.stdout
    assert not list(env.store.iterdir())


def test_shared_off_drops_every_copy(env: Env):
    assert prefetch(env).returncode == 0
    res = prefetch(env, policy='[runtime]\nshared = "off"\n')
    assert "dropped 3" in res.stderr, res.stderr
    assert not list(env.store.iterdir())
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug]), "no-copy")


def test_a_process_can_turn_the_mode_off(env: Env):
    assert prefetch(env).returncode == 0
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug], HUGIFY_SHARED="0"), "off")


def test_status_shows_the_copies_and_who_maps_them_counting_them_once(env: Env):
    assert prefetch(env).returncode == 0
    procs = [waiting(env) for _ in range(3)]
    try:
        res = hugify("status", "--json", *env.progs.files, add_env={"HUGIFY_RUNTIME_DIR": str(env.run)}, check=False)
        text = hugify("status", *env.progs.files, add_env={"HUGIFY_RUNTIME_DIR": str(env.run)}, check=False).stdout
    finally:
        for p in procs:
            finish(p)
    import json

    doc = json.loads(res.stdout)
    copies = {c["path"]: c for c in doc["shared_copies"]["copies"]}
    assert set(copies) == {str(f) for f in env.progs.files}
    pids = sorted(p.pid for p in procs)
    for f in env.progs.files:
        c = copies[str(f)]
        assert c["windows"] == nwin(f) and c["huge_windows"] == nwin(f)
        assert c["held_bytes"] == (env.store / c["key"] / f.name).stat().st_blocks * 512
        assert sorted(c["mapped_by"]) == pids, c
    assert doc["shared_copies"]["held_bytes"] == sum(c["held_bytes"] for c in copies.values())
    assert "shared copies (one per file, held once" in text, text
    for f in env.progs.files:
        assert re.search(rf"{re.escape(str(f))}: {nwin(f)} windows, .* mapped by 3 processes", text), text


# --- faults: each leaves the program on its file mapping, with one line -----------------


def test_a_full_tmpfs_leaves_the_files_as_they_are(env: Env):
    """The copies' tmpfs mounted small (an administrator's size=): what does not fit is
    refused before anything is written, and nothing half-written is left; the line says
    the tmpfs is smaller than the budget needs and how to resize the boot's."""
    mount_tmpfs(env.store, "size=2M,mode=0755,huge=within_size")
    res = prefetch(env)
    assert res.stdout.count("(shared-full)") == 3, res.stdout
    hint = "(size=2M, below the 260M runtime.shared_budget needs: systemctl daemon-reload && systemctl reload"
    assert res.stdout.count(hint) == 3, res.stdout
    assert not [p for p in env.store.iterdir()], list(env.store.iterdir())
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug]), "no-copy")


def test_shared_memory_huge_pages_refused(built: Programs):
    """shmem_enabled "deny" (the kernel's emergency switch, restored after): root's copies
    would be small pages, so none is kept, and the program runs on its file mappings.
    (Its own files, not the `env` fixture's: that holds the settings steady.)"""
    with (
        thp_alone(),
        files_in_public(built, steady=False) as env,
        locked(),
        thp_set("shmem_enabled", "deny"),
    ):
        res = prefetch(env)
        got = run(env, [env.progs.prog, env.progs.plug])
        assert res.stdout.count("(shmem-not-huge)") == 3, res.stdout
        assert not [p for p in env.store.iterdir()]
        assert_kept(env, got, "no-copy")


def test_a_copy_in_small_pages_is_not_mapped(env: Env):
    """A copy that passes every other check but is in small pages (here: on a tmpfs
    mounted without huge=, written as root writes one): the runtime's own check of each
    window keeps the file mapping."""
    mount_tmpfs(env.store, "mode=0755,huge=never")
    for f in env.progs.files:
        plant_copy(env, f)
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug]), "shmem-not-huge")


def plant_copy(e: Env, f: Path, data: bytes | None = None) -> Path:
    """A copy of `f` and its record in the store, as root writes them (hugify/shared.py's
    format), without root's checks: what another tool, or an older hugify, could leave."""
    from hugify.engine import Engine
    from hugify.kernel import pmd_size

    fd = os.open(f, os.O_RDONLY)
    try:
        identity = Engine(pmd_size(), None).file_id(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    assert identity is not None
    key = shared.key_of(identity)
    (e.store / key).mkdir(mode=0o755)
    copy = e.store / key / f.name
    copy.write_bytes(f.read_bytes() if data is None else data)
    copy.chmod(0o444)
    cst = copy.stat()
    rec = shared.Record(
        *identity, st.st_size, st.st_mtime_ns, st.st_ctime_ns, cst.st_ino, cst.st_ctime_ns, "0" * 64, f.name, str(f)
    )
    (e.store / key / "record").write_text(rec.text())
    return copy


@pytest.mark.parametrize(
    "tamper,why",
    [
        ("chown", "copy-untrusted"),
        ("chmod", "copy-untrusted"),
        ("bytes", "copy-changed"),
        ("swap", "copy-changed"),
        ("symlink", "copy-untrusted"),
        ("record", "copy-untrusted"),
        ("rundir", "copy-untrusted"),
        ("original", "copy-stale"),
    ],
)
def test_a_copy_tampered_with_is_not_mapped(env: Env, tamper: str, why: str):
    """Not root's (owned by a user, writable by others), other bytes (written since root
    sealed it, or another root-owned file swapped in), a symbolic link planted for the
    copy's directory, a record of another format, a runtime directory others may write
    (a user could plant anything there), the original written in place since the copy:
    nothing is mapped, one line says why."""
    assert prefetch(env).returncode == 0
    copies = copies_of(env)
    for f in env.progs.files:
        rec = copies[os.path.realpath(f)]
        d = env.store / rec.key
        copy = d / rec.name
        if tamper == "chown":
            os.chown(copy, 65534, 65534)
        elif tamper == "chmod":
            copy.chmod(0o446)
        elif tamper == "bytes":
            copy.chmod(0o644)
            with copy.open("r+b") as fh:
                fh.seek(rec.size // 2)
                fh.write(b"\xcc")
            copy.chmod(0o444)
        elif tamper == "swap":
            other = d / "other"
            other.write_bytes(copy.read_bytes())
            other.chmod(0o444)
            other.replace(copy)
        elif tamper == "symlink":
            real = env.store / f".real-{rec.key}"
            d.rename(real)
            d.symlink_to(real.name)
        elif tamper == "record":
            text = (d / "record").read_text()
            (d / "record").chmod(0o644)
            (d / "record").write_text(text.replace(shared.MAGIC, "hugify-shared-0"))
        elif tamper == "rundir":
            env.run.chmod(0o777)
        elif tamper == "original":
            with f.open("r+b") as fh:  # same inode, same size: a write in place
                fh.seek(rec.size - 1)
                byte = fh.read(1)
                fh.seek(rec.size - 1)
                fh.write(byte)
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug]), why)
    if tamper in ("bytes", "swap", "original"):
        # root's next run finds it, drops it and makes a new one
        again = prefetch(env)
        assert again.stdout.count("shared copy made") == 3, again.stdout
        assert_mapped_from_copies(env, run(env, [env.progs.prog, env.progs.plug]))


#: Forbids mmap of a file at a fixed address with exactly the flags the audit library
#: maps a copy with (MAP_PRIVATE | MAP_FIXED): ld.so maps objects with MAP_DENYWRITE too
#: (glibc's MAP_COPY), so loading works and only the copies' mmap fails.
SECCOMP_MMAP = seccomp_program(
    {"x86_64": 9, "aarch64": 222},
    SECCOMP_EPERM,
    equal={3: 0x12},
    unequal={4: 0xFFFFFFFF},  # the fd: not -1, a file
)


def test_a_seccomp_filter_forbidding_the_mmap_keeps_the_file_mapping(env: Env):
    assert prefetch(env).returncode == 0
    got = run(env, [sys.executable, "-c", SECCOMP_MMAP, env.progs.prog, env.progs.plug])
    assert_kept(env, got, r"mmap \(errno 1\)")


def test_a_copy_removed_while_processes_map_it(env: Env):
    """Removed (shared = "off") while a process maps it: that process runs on correctly
    on the removed copy, `hugify status` shows it, and a new process maps the files."""
    assert prefetch(env).returncode == 0
    p = waiting(env)
    try:
        assert "dropped 3" in prefetch(env, policy='[runtime]\nshared = "off"\n').stderr
        status = hugify("status", "--json", *env.progs.files, add_env={"HUGIFY_RUNTIME_DIR": str(env.run)}, check=False)
        maps = Path(f"/proc/{p.pid}/maps").read_text()
    finally:
        out = finish(p)
    assert result(out) == plain(env)
    removed = [v for v in vmas(out.split("--- smaps\n", 1)[1]) if v.name.endswith(" (deleted)")]
    assert sum(v.shmem_pmd for v in removed) == sum(nwin(f) for f in env.progs.files) * HP, removed
    assert " (deleted)" in maps
    import json

    gone = json.loads(status.stdout)["shared_copies"]["removed_but_mapped"]
    assert len(gone) == 3 and all(g["mapped_by"] == [p.pid] for g in gone), gone
    assert sum(g["bytes"] for g in gone) == sum(nwin(f) for f in env.progs.files) * HP, gone
    assert_kept(env, run(env, [env.progs.prog, env.progs.plug]), "no-copy")


def test_under_a_debugger_the_windows_it_wrote_breakpoints_into_stay(env: Env):
    """gdb writes breakpoints into the program's code before ld.so runs, and into a
    dlopen'ed library when ld.so announces it, before la_objopen: mapping the copy over
    such a window would drop them, so under a debugger a window is mapped only if its
    bytes are the copy's. The breakpoints all stop; the library loaded at start-up (no
    breakpoint yet) runs from its copy, and a breakpoint set in it afterwards stops too.
    The loader's list names the files, not the copies."""
    assert prefetch(env).returncode == 0
    commands = (
        f"set environment LD_AUDIT={AUDIT_LIB}",
        f"set environment HUGIFY_RUNTIME_DIR={env.run}",
        "set environment HUGIFY_DEBUG=1",
        "set breakpoint pending on",
        "break exe_all",
        "break plug_all",
        f"run {env.progs.plug}",
        "break lib_all",
        "continue",
        "bt 2",
        "continue",
        "bt 2",
        "info sharedlibrary",
        "kill",
    )
    argv = ["gdb", "-nx", "-batch", *(a for c in commands for a in ("-ex", c)), str(env.progs.prog)]
    res = subprocess.run(argv, capture_output=True, text=True, env=env.env(), timeout=300, check=False)
    out = res.stdout + res.stderr
    stops = re.findall(r"^Breakpoint (\d), 0x[0-9a-f]+ in (\w+) \(", out, re.M)
    assert stops == [("1", "exe_all"), ("3", "lib_all"), ("2", "plug_all")], out
    assert len(re.findall(r"^#1 +0x[0-9a-f]+ in main \(", out, re.M)) == 2, out
    lines = shared_lines(out)
    n = nwin(env.progs.prog)
    mapped, total, rest = lines[os.path.realpath(env.progs.prog)]
    assert (total, mapped) == (n, n - 1) and re.fullmatch(r" from \S+, window \d traced: file mapping kept", rest), out
    assert lines[os.path.realpath(env.progs.lib)] == (nwin(env.progs.lib), nwin(env.progs.lib), ANY_COPY), out
    assert lines[os.path.realpath(env.progs.plug)] == (0, 1, ", window 0 traced: file mapping kept"), out
    libs = re.findall(r"^0x[0-9a-f]+\s+0x[0-9a-f]+\s+\S+(?: \(\*\))?\s+(/\S+)$", out, re.M)
    assert str(env.progs.lib) in libs and str(env.progs.plug) in libs, out
    assert not [x for x in libs if x.startswith(str(env.store))], libs
