"""The runtime on a filesystem that gives the page cache no large folios: found on two of
its files, then nothing is read, evicted or re-read for it by anyone this boot.

An ext4 image mounted with data=journal stands in for every such filesystem: ext4 gives
no large folios to files whose data is journalled on any kernel (before 6.16 it gives
none at all), so the premise holds whatever kernel runs the suite; it is still observed
first, independently of hugify: a file read through a MADV_HUGEPAGE mapping, and the
FilePmdMapped of that mapping in smaps (testkit.runtime.gives_large_folios). ext4 before
6.16 and btrfs are booted for real in tests/test_kernel_matrix.py.

Every component is pointed at a private runtime directory (HUGIFY_RUNTIME_DIR, which
the audit library reads from the process's environment too); the tests hold the runtime
tests' lock like every test that touches the page cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cli import hugify
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    MADV_COLLAPSE,
    Programs,
    blocks_read_by,
    cached_pages,
    clean_env,
    cold_window,
    copy_programs,
    drop_caches,
    file_backed_only,
    gives_large_folios,
    kernel_maps_exec_huge,
    locked,
    loop_fs,
    read_plainly,
    thp_alone,
    thp_set,
)

EXT4_MAGIC = "ef53"


def on_loop_fs(built: Programs, tmp_path: Path, fs: str, options: str = "") -> Iterator[tuple[Programs, Path]]:
    """The hugified programs on a fresh `fs` filesystem (loop device), and an empty
    runtime directory; the runtime tests' lock held throughout."""
    with loop_fs(tmp_path, fs, options, built) as mnt, locked():
        yield Programs(mnt / "bin", built.orig), tmp_path / "run"


@pytest.fixture
def on_journalled(built: Programs, tmp_path: Path) -> Iterator[tuple[Programs, Path]]:
    """On ext4 with data=journal: no large folios on any kernel."""
    yield from on_loop_fs(built, tmp_path, "ext4", "data=journal")


@pytest.fixture
def on_xfs(built: Programs, tmp_path: Path) -> Iterator[tuple[Programs, Path]]:
    yield from on_loop_fs(built, tmp_path, "xfs")


def records(run: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in run.glob("no-large-folios-*")} if run.is_dir() else {}


def test_a_filesystem_without_large_folios_is_found_on_two_files_then_left_alone(
    on_journalled: tuple[Programs, Path],
):
    progs, run = on_journalled
    # The premise, seen without hugify: this filesystem gives its files no PMD folios.
    assert not gives_large_folios(progs.prog), "ext4 with data=journal gave a 2 MiB folio"

    # The boot service's run: cold files, read in one window at a time, found small, the
    # window evicted and read again to be sure: that is the program's verdict. The
    # library's window does the same: a second file, so it is the filesystem's, recorded
    # for this boot; the rest of the library's windows are not read at all.
    drop_caches()
    no_copies = file_backed_only(run.parent)
    res = hugify(
        "prefetch",
        "--json",
        "--policy",
        no_copies,
        progs.prog,
        progs.lib,
        add_env={"HUGIFY_RUNTIME_DIR": str(run)},
        check=False,
    )
    assert res.returncode == 4, res.stderr
    by_path = {f["path"]: f for f in json.loads(res.stdout)["files"]}
    assert {(w["state"], w["reason"]) for w in by_path[str(progs.prog)]["windows"]} == {
        ("unsupported", "file-no-large-folios")
    }, by_path[str(progs.prog)]
    lib = by_path[str(progs.lib)]["windows"]
    assert {(w["state"], w["reason"]) for w in lib} == {("unsupported", "no-large-folios")}, lib
    assert all(w["detail"].startswith("the ext4 filesystem gives no large folios") for w in lib), lib
    dev, st = os.stat(progs.prog).st_dev, os.stat(progs.prog)
    fs_record = f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    file_text = f"{boot} {EXT4_MAGIC} {st.st_ctime_ns // 10**9}.{st.st_ctime_ns % 10**9} {st.st_size}\n"
    assert records(run) == {fs_record: f"{boot} {EXT4_MAGIC}\n", f"{fs_record}-{st.st_ino}": file_text}
    for rec in run.glob("no-large-folios-*"):  # root's, for every process to read
        assert (rec.stat().st_uid, rec.stat().st_mode & 0o777) == (0, 0o644), rec

    # From then on: hugify-run and the audit library read and evict nothing. The files
    # are cached (small) now, so plain starts read nothing either; with the old engine
    # every start evicted and read a window again (2-4 MiB each).
    read_plainly(progs.files)
    plain = blocks_read_by([str(progs.prog)], 20, clean_env(run))
    audited = blocks_read_by([str(progs.prog)], 20, clean_env(run, LD_AUDIT=str(AUDIT_LIB)))
    dispatched = blocks_read_by([str(HUGIFY_RUN), str(progs.prog)], 20, clean_env(run))
    assert plain < 1 << 20, plain
    assert audited <= plain + (256 << 10), (audited, plain)
    assert dispatched <= plain + (256 << 10), (dispatched, plain)

    debug = subprocess.run(
        [str(HUGIFY_RUN), str(progs.prog)],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(run, HUGIFY_DEBUG="1"),
    )
    line = f"{progs.prog}: 3 windows: 0 huge (0 loaded, 0 repaired), 0 busy, 0 failed, 3 unsupported, 0 skipped"
    assert line in debug.stderr

    # hugify status measures (the windows are small) and says it once, naming the
    # filesystem and what would do it.
    status = hugify("status", "--runtime-dir", run, progs.prog, check=False)
    notes = [line for line in status.stdout.splitlines() if "gives no large folios" in line]
    assert len(notes) == 1, status.stdout
    assert "ext4" in notes[0] and f"{os.major(dev)}:{os.minor(dev)}" in notes[0]
    assert "--clear-records" in notes[0]
    js = json.loads(hugify("status", "--json", "--runtime-dir", run, progs.prog, check=False).stdout)
    (fs,) = [x for x in js["system"]["filesystems_without_large_folios"] if x["device"] == fs_record[16:]]
    assert fs["type"] == "ext4" and "ext4" in fs["remedy"]
    assert js["system"]["files_without_large_folios"] == [
        {"device": fs_record[16:], "inode": st.st_ino, "type": "ext4"}
    ]
    # And each window is what every process gets there: unsupported, not cold or small.
    (f,) = js["files"]
    assert {(w["state"], w["reason"]) for w in f["windows"]} == {("unsupported", "no-large-folios")}, f
    assert records(run) == {fs_record: f"{boot} {EXT4_MAGIC}\n", f"{fs_record}-{st.st_ino}": file_text}


def test_a_record_of_another_boot_or_filesystem_type_is_ignored(on_journalled: tuple[Programs, Path]):
    """A stale record (another boot, or a filesystem of another type that had the same
    device number) must not keep files from being tried."""
    progs, run = on_journalled
    dev = os.stat(progs.prog).st_dev
    record = run / f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for stale in ("00000000-0000-0000-0000-000000000000 " + EXT4_MAGIC, f"{boot} 9123683e"):
        run.mkdir(exist_ok=True)
        for old in run.iterdir():
            old.unlink()
        record.write_text(stale + "\n")
        drop_caches()
        # Not skipped: the files are read in (the windows leave the "cold" state), and
        # the verdict is found again on two files and rewritten.
        res = hugify(
            "prefetch",
            "--json",
            "--policy",
            file_backed_only(run.parent),
            progs.prog,
            progs.lib,
            add_env={"HUGIFY_RUNTIME_DIR": str(run)},
            check=False,
        )
        assert res.returncode == 4, res.stderr
        (prog,) = [f for f in json.loads(res.stdout)["files"] if f["path"] == str(progs.prog)]
        assert {w["reason"] for w in prog["windows"]} == {"file-no-large-folios"}, prog
        assert record.read_text() == f"{boot} {EXT4_MAGIC}\n"


def test_a_process_without_huge_pages_records_nothing(built: Programs, tmp_path: Path):
    """A process with prctl(PR_SET_THP_DISABLE) reads small folios on any filesystem: its
    audit library must neither take that for the filesystem's verdict (which would stop
    every other process for the rest of the boot) nor read or evict anything."""
    progs = copy_programs(built, tmp_path / "bin")  # ext4 here, which gives large folios
    run = tmp_path / "run"
    run.mkdir()
    disabled = (
        "import ctypes, os, sys; ctypes.CDLL(None).prctl(41, 1, 0, 0, 0); "  # PR_SET_THP_DISABLE
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    with locked():
        drop_caches()
        read_plainly(progs.files)  # small folios: the audit library would repair them
        res = subprocess.run(
            [sys.executable, "-c", disabled, str(progs.prog)],
            capture_output=True,
            text=True,
            check=False,
            env=clean_env(run, LD_AUDIT=str(AUDIT_LIB)),
        )
    assert res.returncode == 0, res.stderr
    assert not list(run.glob("no-large-folios-*")), [p.read_text() for p in run.iterdir()]


@pytest.fixture
def changing_thp() -> Iterator[None]:
    """thp_alone for the whole test: asked for before on_xfs, which holds the
    runtime tests' lock (the settings lock is taken first)."""
    with thp_alone():
        yield


def test_cold_code_is_loaded_unless_the_kernel_makes_it_huge_by_itself(
    changing_thp: None, on_xfs: tuple[Programs, Path]
):
    """Issue 20 item 5 on whatever kernel runs the suite, on XFS (large folios from 5.18),
    with THP `always`: prefetch's probe must say what the kernel does by itself, and
    prefetch loads the windows itself (`loaded`) where it does not, or leaves them to it
    (`kernel`) where it does. What the kernel does is measured first without hugify:
    - XFS gives this file 2 MiB folios (a cold window read through MADV_HUGEPAGE);
    - PMD exec readahead, what the probe looks for: whether a cold window mapped like the
      ELF loader maps it, and faulted, is PMD-mapped;
    - khugepaged's collapse of file-backed code (7.2 and 7.3 do it for a program that
      stays mapped, tests/test_kernel_matrix.py's "held" run) is not the fault's doing:
      whatever MADV_COLLAPSE, the same collapse asked for at once, does here (refused with
      EINVAL where CONFIG_READ_ONLY_THP_FOR_FS is off, as on 6.18), the verdict follows
      the fault alone."""
    progs, run = on_xfs
    with thp_set("enabled", "always"):
        assert gives_large_folios(progs.prog), "XFS gave no 2 MiB folio"
        by_itself = kernel_maps_exec_huge(progs.prog)
        cold_window(progs.prog, MADV_COLLAPSE)  # whatever it does, it changes nothing below
        drop_caches()
        res = hugify("prefetch", "--json", "--runtime-dir", run, progs.prog, progs.lib, check=False)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["system"]["exec_pmd_readahead"] is by_itself and report["system"]["thp_enabled"] == "always"
    for f in report["files"]:
        assert {w["state"] for w in f["windows"]} == ({"kernel"} if by_itself else {"loaded"}), f
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert (run / "kernel-exec-pmd").read_text() == f"{boot} {int(by_itself)} always\n"


def test_a_cold_window_is_measured_with_its_file_alone_evicted(on_xfs: tuple[Programs, Path]):
    """The measurement every verdict above is checked against evicts the file it measures
    and no other: a test beside it (pytest -n 2) keeps the page cache of its own files,
    such as test_boot's container asking `hugify status` of the windows its boot service
    loaded, which a drop of the whole page cache here once failed."""
    progs, _ = on_xfs
    read_plainly([progs.prog, progs.lib])
    pages = -(-progs.lib.stat().st_size // 4096)
    assert cached_pages(progs.lib) == pages
    # The program's small folios went: its first window came back as one 2 MiB folio.
    assert gives_large_folios(progs.prog), "XFS gave no 2 MiB folio"
    assert cached_pages(progs.lib) == pages
