"""What the runtime concludes, and records for the boot, from what it sees (issue 32 item
2): a record that a filesystem (or a file) gives no large folios is written only on
evidence that the filesystem refuses, not from the circumstances of the process that
saw small folios; a record never stops a measurement, and the first window seen in a
2 MiB folio drops a record that said otherwise; the kernel verdict ("the kernel maps
exec code huge by itself") is held to the same; `hugify prefetch --clear-records`
forgets them all.

The files live on XFS (conftest.large_folio_dir), which gives them 2 MiB folios on every
kernel since 5.18 (measured there), so that a small folio is the process's doing, never
the filesystem's; what the kernel does by itself is measured without hugify
(testkit.runtime.kernel_maps_exec_huge). Each case failed on the runtime before this
(main 5e7ab4b): the memory cgroup and the seccomp filter made it record the filesystem as
giving none, and a record stood against every window seen huge afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import command, hugify
from testkit.elf import exec_load
from testkit.runtime import (
    AS_NOBODY,
    HUGIFY_RUN,
    NO_MADV_HUGEPAGE,
    REPO,
    Programs,
    build_idle,
    clean_env,
    copy_programs,
    drop_caches,
    evict,
    exec_segment_size,
    file_backed_only,
    gives_large_folios,
    hugify_as_nobody,
    in_cgroup,
    kernel_maps_exec_huge,
    limited_cgroup,
    locked,
    loop_fs,
    parse_smaps,
    public_dir,
    read_plainly,
    run_mappings,
    thp_setting,
)

XFS_MAGIC = "58465342"
BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def progs(built: Programs, large_folio_dir: Path, tmp_path: Path) -> Iterator[Programs]:
    copy = copy_programs(built, large_folio_dir / tmp_path.name)
    yield copy
    shutil.rmtree(copy.dir)


@pytest.fixture
def idle(large_folio_dir: Path, tmp_path: Path) -> Iterator[Path]:
    prog = build_idle(large_folio_dir / tmp_path.name)
    yield prog
    shutil.rmtree(prog.parent)


def records(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir()) if run.is_dir() else []


def verdicts(run: Path) -> list[str]:
    return [n for n in records(run) if n.startswith("no-large-folios-")]


def fs_record(path: Path) -> str:
    dev = os.stat(path).st_dev
    return f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"


def file_record(path: Path) -> tuple[str, str]:
    st = os.stat(path)
    ctime = f"{st.st_ctime_ns // 10**9}.{st.st_ctime_ns % 10**9}"
    return f"{fs_record(path)}-{st.st_ino}", f"{BOOT} {XFS_MAGIC} {ctime} {st.st_size}\n"


def force(run: Path, name: str, text: str) -> None:
    """Plants a record as root's runtime would have written it."""
    run.mkdir(exist_ok=True)
    (run / name).write_text(text)
    (run / name).chmod(0o644)


def prefetch(run: Path, *files: Path, env: dict[str, str] | None = None) -> tuple[int, dict[str, list[dict]]]:
    no_copies = file_backed_only(run.parent)  # the file-backed way's verdicts: no shared copies
    res = hugify("prefetch", "--json", "--policy", no_copies, "--runtime-dir", run, *files, add_env=env, check=False)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, {f["path"]: f.get("windows", []) for f in json.loads(res.stdout)["files"]}


def debug_line(stderr: str, path: Path) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"hugify-run: {path}: ")]
    return line


# --- the process's circumstances are not the filesystem's -----------------------------------


def test_a_memory_cgroup_at_its_limit_records_nothing(idle: Path, tmp_path: Path):
    """The issue's case: a root `hugify-run` (and the audit library in the program it
    starts) inside a memory cgroup limited to 2 MiB - 4 KiB, the program's windows cached
    in small folios. No 2 MiB folio can be charged there, so the windows read in again
    come small: `failed` (cgroup-limit), nothing recorded. Outside the cgroup the same
    windows are repaired: nothing was concluded about the filesystem."""
    run = tmp_path / "run"
    env = clean_env(run, HUGIFY_DEBUG="1")
    nwin = exec_segment_size(idle) // HP
    with locked():
        drop_caches()
        read_plainly([idle])
        with limited_cgroup(HP - 4096) as procs:
            res = subprocess.run(
                in_cgroup(procs, [HUGIFY_RUN, idle]), capture_output=True, text=True, env=env, check=False, timeout=300
            )
        code, after = prefetch(run, idle)
    assert res.returncode == 0, res.stderr
    assert f"{nwin} windows: 0 huge (0 loaded, 0 repaired), 0 busy, {nwin} failed, 0 unsupported" in debug_line(
        res.stderr, idle
    ), res.stderr
    assert verdicts(run) == [], records(run)
    # (the cgroup's reclaim may have evicted what it read: loaded then)
    assert code == 0 and {w["state"] for w in after[str(idle)]} <= {"repaired", "loaded"}, after


def test_madvise_hugepage_refused_by_seccomp_records_nothing(idle: Path, tmp_path: Path):
    """A seccomp filter refuses MADV_HUGEPAGE (as a service's SystemCallFilter can): no
    read can give a 2 MiB folio then, so hugify-run and the audit library neither read,
    evict nor conclude anything (`madvise-refused`), cold or cached small; `hugify
    prefetch` under the filter says so with exit status 4. Outside it, the windows are
    loaded: nothing was recorded against the filesystem."""
    run = tmp_path / "run"
    env = clean_env(run, HUGIFY_DEBUG="1")
    nwin = exec_segment_size(idle) // HP
    filtered = [sys.executable, "-c", NO_MADV_HUGEPAGE]
    with locked():
        outcomes = []
        for cache in ("cold", "small"):
            drop_caches()
            if cache == "small":
                read_plainly([idle])
            res = subprocess.run([*filtered, HUGIFY_RUN, idle], capture_output=True, text=True, env=env, check=False)
            outcomes.append((cache, res.returncode, debug_line(res.stderr, idle)))
        drop_caches()
        under = subprocess.run(
            [*filtered, *command("prefetch", "--json", "--runtime-dir", run, idle)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        code, after = prefetch(run, idle)
    skipped = f"{nwin} windows: 0 huge (0 loaded, 0 repaired), 0 busy, 0 failed, 0 unsupported, {nwin} skipped"
    for cache, rc, line in outcomes:
        assert rc == 0 and skipped in line, (cache, line)
    assert under.returncode == 4, under.stderr
    (f,) = json.loads(under.stdout)["files"]
    assert {(w["state"], w["reason"]) for w in f["windows"]} == {("cold", "madvise-refused")}, f
    assert verdicts(run) == [], records(run)
    assert code == 0 and [w["state"] for w in after[str(idle)]] == ["loaded"] * nwin, after


# --- a record never stops a measurement ------------------------------------------------------


def test_status_measures_and_drops_a_record_that_a_huge_window_contradicts(progs: Programs, tmp_path: Path):
    """A record saying the filesystem (or the file) gives no large folios, forced, while
    the windows are in 2 MiB folios: `hugify status` measures them (100 %, `huge`, not
    `unsupported` at 0 %), and the window seen huge drops both records."""
    run = tmp_path / "run"
    with locked():
        drop_caches()
        code, _ = prefetch(run, progs.prog)
        force(run, fs_record(progs.prog), f"{BOOT} {XFS_MAGIC}\n")
        force(run, *file_record(progs.prog))
        res = hugify("status", "--json", "--runtime-dir", run, progs.prog, check=False)
    assert code == 0 and res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    (f,) = status["files"]
    assert f["coverage"] == 1.0 and {w["state"] for w in f["windows"]} == {"huge"}, f
    assert status["system"]["filesystems_without_large_folios"] == []
    assert status["system"]["files_without_large_folios"] == []
    assert verdicts(run) == [], records(run)


@pytest.mark.parametrize("how", ["prefetch", "hugify-run"])
def test_the_runtime_drops_a_record_that_a_huge_window_contradicts(progs: Programs, tmp_path: Path, how: str):
    """The same for `hugify prefetch` and hugify-run: each measures the windows it is
    given before it looks at a record, and a window in place drops the records of its
    filesystem and its file. The windows in small folios that it meets then (the
    library's) are repaired, not left `unsupported`."""
    run = tmp_path / "run"
    with locked():
        drop_caches()
        assert hugify("prefetch", "--runtime-dir", run, progs.prog, check=False).returncode == 0
        read_plainly([progs.lib])
        force(run, fs_record(progs.prog), f"{BOOT} {XFS_MAGIC}\n")
        force(run, *file_record(progs.prog))
        if how == "prefetch":
            code, got = prefetch(run, progs.prog, progs.lib)
            assert code == 0, got
            states = {p: [w["state"] for w in ws] for p, ws in got.items()}
        else:
            res = subprocess.run(
                [HUGIFY_RUN, progs.prog, "-"],
                capture_output=True,
                text=True,
                env=clean_env(run, HUGIFY_DEBUG="1", HUGIFY_AUDIT_LIB=""),
                check=False,
            )
            assert res.returncode == 0, res.stderr
            states = {
                str(progs.prog): debug_line(res.stderr, progs.prog),
                str(progs.lib): debug_line(res.stderr, progs.lib),
            }
    assert verdicts(run) == [], records(run)
    if how == "prefetch":
        assert states == {str(progs.prog): ["huge"] * 3, str(progs.lib): ["repaired"] * 2}, states
    else:
        assert "3 windows: 3 huge (0 loaded, 0 repaired)" in states[str(progs.prog)], states
        assert "2 windows: 2 huge (0 loaded, 2 repaired)" in states[str(progs.lib)], states


# --- a file unlike its filesystem ------------------------------------------------------------

EXT4_MAGIC = "ef53"


def journal_data(mnt: Path, image: Path, path: Path) -> None:
    """Gives `path` (on the ext4 of loop_fs's `image`, mounted at `mnt`) data journalling,
    what chattr +j does: set offline with debugfs, as chattr +j needs CAP_SYS_RESOURCE,
    which a container's root may lack. Checked with lsattr after mounting again."""
    inside = "/" + str(path.relative_to(mnt))
    subprocess.run(["umount", str(mnt)], check=True)
    stat = subprocess.run(["debugfs", "-R", f"stat {inside}", str(image)], capture_output=True, text=True, check=True)
    flags = int(stat.stdout.split("Flags: ")[1].split()[0], 16)
    cmd = f"set_inode_field {inside} flags {flags | 0x4000:#x}"  # EXT4_JOURNAL_DATA_FL
    subprocess.run(["debugfs", "-w", "-R", cmd, str(image)], capture_output=True, check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    attrs = subprocess.run(["lsattr", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert "j" in attrs, attrs


def test_a_file_unlike_its_filesystem_gets_a_verdict_of_its_own(built: Programs, tmp_path: Path):
    """ext4 decides large folios per inode from Linux 6.16 on: a file whose data is
    journalled (chattr +j) gets none where its neighbours get 2 MiB folios. Two copies of
    the library on a fresh ext4, the first with data journalling, each measured without hugify
    (a cold window read through MADV_HUGEPAGE), then prefetched cold together, the
    journalled one first: one that gets no large folios where the other does is the
    file's verdict alone (file-no-large-folios, recorded for its inode with its ctime and
    size), never the filesystem's, so the plain copy is loaded, `hugify status` says
    each for what it is, and hugify-run still makes the code of the program beside them
    huge. Where neither gets them (ext4 before 6.16) the second file makes it the
    filesystem's. On main 5e7ab4b the journalled file's small window recorded the whole
    filesystem: the plain copy and the program were left small."""
    with loop_fs(tmp_path, "ext4", "", built) as mnt, locked():
        progs = Programs(mnt / "bin", built.orig)
        files = mnt / "files"
        files.mkdir()
        journalled, plain = files / "journalled.so", files / "plain.so"
        for f in (journalled, plain):
            f.write_bytes(progs.lib.read_bytes())
        journal_data(mnt, tmp_path / "ext4.img", journalled)
        large = {f: gives_large_folios(f) for f in (journalled, plain, progs.prog)}
        by_itself = kernel_maps_exec_huge(plain)
        run = tmp_path / "run"
        drop_caches()
        code, got = prefetch(run, journalled, plain)
        status = json.loads(hugify("status", "--json", "--runtime-dir", run, journalled, plain, check=False).stdout)
        drop_caches()
        dispatched = subprocess.run(
            [HUGIFY_RUN, progs.prog, "-"], capture_output=True, text=True, env=clean_env(run), check=False
        )
        verdicts_after = verdicts(run)
        texts = {n: (run / n).read_text() for n in verdicts_after}
        fs = fs_record(plain)
        inode = {f: os.stat(f).st_ino for f in (journalled, plain)}
        code_size = {p: exec_segment_size(p) for p in (progs.prog, progs.lib)}
    at = f"ext4 on Linux {os.uname().release}: large folios {large}, by itself {by_itself}"
    assert large[plain] == large[progs.prog], at  # the same filesystem, the same answer
    states = {p: {(w["state"], w.get("reason", "")) for w in ws} for p, ws in got.items()}
    coverage = {f["path"]: f["coverage"] for f in status["files"]}
    assert dispatched.returncode == 0, (at, dispatched.stderr)
    maps = parse_smaps(dispatched.stdout)
    read_in = ("kernel", "") if by_itself else ("loaded", "")  # left to the kernel, or read by prefetch
    if large[journalled]:  # chattr +j took nothing from the file
        assert states == {str(journalled): {read_in}, str(plain): {read_in}}, (at, states)
        assert code == 0 and verdicts_after == [], (at, verdicts_after)
    elif large[plain]:
        assert code == 4, (at, got)
        assert states == {
            str(journalled): {("unsupported", "file-no-large-folios")},
            str(plain): {read_in},
        }, (at, states)
        name = f"{fs}-{inode[journalled]}"
        assert verdicts_after == [name] and texts[name].split()[:2] == [BOOT, EXT4_MAGIC], (at, texts)
        # (where the kernel reads the window huge by itself, prefetch left it cold)
        assert coverage == {str(journalled): 0.0, str(plain): 0.0 if by_itself else 1.0}, (at, coverage)
        assert status["system"]["filesystems_without_large_folios"] == [], (at, status["system"])
        assert [f["inode"] for f in status["system"]["files_without_large_folios"]] == [inode[journalled]], at
        for p in (progs.prog, progs.lib):
            assert maps[str(p)].pmd == code_size[p], (at, p, maps[str(p)])
    else:
        assert code == 4, (at, got)
        assert states == {
            str(journalled): {("unsupported", "file-no-large-folios")},
            str(plain): {("unsupported", "no-large-folios")},
        }, (at, states)
        assert verdicts_after == sorted([fs, f"{fs}-{inode[journalled]}"]), (at, verdicts_after)
        assert coverage == {str(journalled): 0.0, str(plain): 0.0}, (at, coverage)
        for p in (progs.prog, progs.lib):
            assert maps[str(p)].pmd == 0, (at, p, maps[str(p)])


# --- the kernel verdict ------------------------------------------------------------------------

#: Runs `hugify prefetch ARGS` in this process with a reader racing the kernel probe: the
#: engine's test hook reads the probed window through a MADV_HUGEPAGE mapping of its own
#: (as another process's prefetch would) between the probe's check that the window is
#: cold and its fault, the first time only.
RACE = r"""
import ctypes, mmap, os, sys
from hugify.cli import main
from hugify.engine import engine_path

hp = 2 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
raced = []

@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64)
def racer(fd, off):
    if raced:
        return
    raced.append(off)
    res = libc.mmap(None, 2 * hp, 0, 0x22 | 0x4000, -1, 0)
    at = (res + hp - 1) & ~(hp - 1)
    assert libc.mmap(at, hp, 1, 0x12, fd, off) == at
    assert libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(hp), 14) == 0  # MADV_HUGEPAGE
    ctypes.string_at(at, 1)
    libc.munmap(ctypes.c_void_p(res), ctypes.c_size_t(2 * hp))

engine = ctypes.CDLL(str(engine_path()))  # the library the Engine loads: one instance
engine.hp_engine_set_fault_hook(racer)
code = main(sys.argv[1:])
print(f"raced {raced}", file=sys.stderr)
sys.exit(code)
"""


def test_a_reader_racing_the_kernel_probe_never_makes_its_verdict(progs: Programs, tmp_path: Path):
    """By reading: the probe's "yes" could be won by another process reading the window
    through MADV_HUGEPAGE between the probe's cold check and its fault, after which
    nothing would be prefetched that boot. Forced with the engine's test hook: the
    verdict (and its record) is still what the kernel does by itself, measured without
    hugify, because a "yes" counts only when seen twice with the window evicted between."""
    run = tmp_path / "run"
    with locked():
        by_itself = kernel_maps_exec_huge(progs.lib)
        drop_caches()
        res = subprocess.run(
            [sys.executable, "-c", RACE, "prefetch", "--json", "--runtime-dir", str(run), str(progs.lib)],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
    assert res.returncode == 0, res.stderr
    assert "raced [2097152]" in res.stderr, res.stderr  # the racer read the probed window
    report = json.loads(res.stdout[: res.stdout.rindex("}") + 1])
    assert report["system"]["exec_pmd_readahead"] is by_itself, report["system"]
    thp = thp_setting()
    assert (run / "kernel-exec-pmd").read_text() == f"{BOOT} {int(by_itself)} {thp}\n"
    (f,) = report["files"]
    assert {w["state"] for w in f["windows"]} <= ({"kernel", "huge"} if by_itself else {"loaded", "huge"}), f


# --- another user's reads are not the file's doing -----------------------------------------------

#: Another user's one-byte reader (issue 38 item 3): reads one byte at OFFSET of FILE
#: each time a byte comes on descriptor REQUEST, and answers with a byte on DONE.
READER = r"""
import os, sys
fd, off, request, done = os.open(sys.argv[1], os.O_RDONLY), *map(int, sys.argv[2:])
while os.read(request, 1):
    os.pread(fd, 1, off)
    os.write(done, b".")
"""

#: Runs `hugify prefetch ARGS` in this process with the engine's fault hook making the
#: reader (descriptors $REQUEST, $DONE) read, between the engine's check that a window
#: holds nothing in the page cache and the fault that reads it. Unforced, the reader's
#: reads land there by chance (on the issue's machine at once, on 2 loaded cores seldom).
OTHERS_READ = r"""
import ctypes, os, sys
from hugify.cli import main
from hugify.engine import engine_path

hooked = []

@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint64)
def others_read(fd, off):
    hooked.append(off)
    os.write(int(os.environ["REQUEST"]), b".")
    assert os.read(int(os.environ["DONE"]), 1) == b"."

engine = ctypes.CDLL(str(engine_path()))  # the library the Engine loads: one instance
engine.hp_engine_set_fault_hook(others_read)
code = main(sys.argv[1:])
print(f"hooked {hooked}", file=sys.stderr)
sys.exit(code)
"""


def test_another_users_reads_during_prefetch_record_nothing(built: Programs):
    """Issue 38 item 3: the user nobody reads one byte in the middle of the library's
    first window, in a loop, while root's `hugify prefetch` evicts and reads it again;
    the engine's hook makes each of its reads fall between prefetch's check that nothing
    of the window is cached and its fault, every time. The page nobody read keeps the
    2 MiB folio out and the rest comes small, but prefetch did not read the window whole
    (its thread's I/O accounting): nothing is concluded or recorded (`busy`,
    `read-meanwhile`), from small folios and cold alike, on XFS, which gives large
    folios. Once the reader stops, the window is huge. On main cd6bc40 (with the hook
    called there) the first round recorded the file as getting no large folios
    (`unsupported` for the rest of the boot; a second such file, the filesystem)."""
    with public_dir() as public, loop_fs(public, "xfs", "", built) as mnt, locked():
        mnt.chmod(0o755)
        progs = Programs(mnt / "bin", built.orig)
        assert gives_large_folios(progs.lib)
        run, no_copies = public / "run", file_backed_only(public)
        window = exec_load(progs.lib).offset
        (request, ask), (answer, done) = os.pipe(), os.pipe()
        reader = subprocess.Popen(
            [*AS_NOBODY, sys.executable, "-c", READER, str(progs.lib), str(window + 0x100000), str(request), str(done)],
            pass_fds=(request, done),
        )
        os.close(request)
        os.close(done)
        rounds = []
        try:
            for cache in ("small", "cold", "small"):
                evict([progs.lib])
                if cache == "small":
                    read_plainly([progs.lib])
                else:  # a page of nobody's in the window before prefetch reads it: read in small
                    os.write(ask, b".")
                    assert os.read(answer, 1) == b"."
                args = ["prefetch", "--json", "--policy", str(no_copies), "--runtime-dir", str(run), str(progs.lib)]
                res = subprocess.run(
                    [sys.executable, "-c", OTHERS_READ, *args],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                    env={**os.environ, "REQUEST": str(ask), "DONE": str(answer)},
                    pass_fds=(ask, answer),
                    check=False,
                )
                assert "Traceback" not in res.stderr, res.stderr
                (f,) = json.loads(res.stdout)["files"]
                rounds.append((cache, res.returncode, [(w["state"], w.get("reason", "")) for w in f["windows"]]))
                assert verdicts(run) == [], (rounds, records(run), res.stderr)
        finally:
            os.close(ask)
            reader.wait(timeout=30)
            os.close(answer)
        evict([progs.lib])
        code, after = prefetch(run, progs.lib)
        maps = run_mappings([progs.prog])
        size = exec_segment_size(progs.lib)
    for cache, rc, states in rounds:
        assert rc == 0 and states[0] == ("busy", "read-meanwhile"), (cache, rounds)
    assert code == 0 and [w["state"] for w in after[str(progs.lib)]] == ["loaded"] * (size // HP), after
    assert maps[str(progs.lib)].pmd == size, maps
    assert verdicts(run) == []


# --- clearing ------------------------------------------------------------------------------------


def test_clear_records_forgets_the_verdicts_and_only_root_may(progs: Programs, tmp_path: Path):
    """`hugify prefetch --clear-records` removes this boot's verdicts (what gives no large
    folios, the kernel's), not the policy's record; with files it then runs as usual and
    finds out again. Another user is refused in one line, exit status 4."""
    with public_dir() as public:
        clear_records(progs, public / "run")


def clear_records(progs: Programs, run: Path) -> None:
    run.mkdir()
    run.chmod(0o755)
    force(run, fs_record(progs.prog), f"{BOOT} {XFS_MAGIC}\n")
    force(run, *file_record(progs.lib))
    force(run, "kernel-exec-pmd", f"{BOOT} 0 madvise\n")
    force(run, "anonymous", "# hugify prefetch, from the policy's [runtime] anonymous\n/usr/bin/x\n")
    nobody = hugify_as_nobody("prefetch", "--clear-records", "--runtime-dir", run)
    assert nobody.returncode == 4, nobody.stderr
    assert nobody.stderr.splitlines() == [
        f"hugify: only root clears the records in {run} (a directory of root's that nobody else may write)"
    ]
    assert len(records(run)) == 4
    res = hugify("prefetch", "--clear-records", "--runtime-dir", run, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"3 records cleared in {run}\n"
    assert records(run) == ["anonymous"]
    force(run, fs_record(progs.prog), f"{BOOT} {XFS_MAGIC}\n")
    with locked():
        drop_caches()
        res = hugify("prefetch", "--json", "--clear-records", "--runtime-dir", run, progs.prog, check=False)
        maps = run_mappings([progs.prog])
    assert res.returncode == 0, res.stderr
    assert maps[str(progs.prog)].pmd == exec_segment_size(progs.prog)
