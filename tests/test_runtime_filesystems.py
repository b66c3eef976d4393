"""The runtime on a filesystem that gives the page cache no large folios: found once,
then nothing is read, evicted or re-read for it by anyone this boot.

A btrfs image on a loop device stands in for every such filesystem (no Debian kernel up
to 7.3 gives btrfs large folios; ext4 before 6.16 is the other common case, booted for
real in tests/test_kernel_matrix.py). Whether this kernel gives btrfs large folios is
first observed independently of hugify: a file read through a MADV_HUGEPAGE mapping,
and the FilePmdMapped of that mapping in smaps.

Every component is pointed at a private runtime directory (HUGIFY_RUNTIME_DIR, which
the audit library reads from the process's environment too); the tests hold the runtime
tests' lock like every test that touches the page cache."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_support import (
    AUDIT_LIB,
    HUGIFY_RUN,
    Programs,
    copy_programs,
    drop_caches,
    file_backed_only,
    hugify,
    locked,
    read_plainly,
)

BTRFS_MAGIC = "9123683e"


def on_loop_fs(built: Programs, tmp_path: Path, fs: str) -> Iterator[tuple[Programs, Path]]:
    """The hugified programs on a fresh `fs` filesystem (loop device), and an empty
    runtime directory; the runtime tests' lock held throughout."""
    image, mnt = tmp_path / f"{fs}.img", tmp_path / "mnt"
    with image.open("wb") as f:
        f.truncate(320 << 20)  # mkfs.xfs wants 300 MiB
    subprocess.run([f"mkfs.{fs}", "-q", "-f", str(image)], check=True, capture_output=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        with locked():
            yield copy_programs(built, mnt / "bin"), tmp_path / "run"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def on_btrfs(built: Programs, tmp_path: Path) -> Iterator[tuple[Programs, Path]]:
    yield from on_loop_fs(built, tmp_path, "btrfs")


@pytest.fixture
def on_xfs(built: Programs, tmp_path: Path) -> Iterator[tuple[Programs, Path]]:
    yield from on_loop_fs(built, tmp_path, "xfs")


MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def cold_window(path: Path, advice: int | None) -> tuple[int, int]:
    """Maps the first 2 MiB window of the file's code like the ELF loader (PROT_READ |
    PROT_EXEC, MAP_PRIVATE, 2 MiB-aligned) in a child process, from a cold cache, gives it
    `advice` (if any), reads one byte, and returns (the madvise errno, 0 if it worked;
    FilePmdMapped of that mapping in KiB, from its smaps)."""
    code = r"""
import ctypes, os, re, sys
path, off, advice = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hp = 2 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
res = libc.mmap(None, 2 * hp, 0, 0x22 | 0x4000, -1, 0)  # PROT_NONE, PRIVATE|ANONYMOUS|NORESERVE
at = (res + hp - 1) & ~(hp - 1)
fd = os.open(path, os.O_RDONLY)
assert libc.mmap(at, hp, 5, 0x12, fd, off) == at  # PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_FIXED
err = 0
if advice >= 0 and libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(hp), advice) != 0:
    err = ctypes.get_errno()
ctypes.string_at(at, 1)
smaps = open("/proc/self/smaps").read()
block = smaps.split(f"{at:x}-", 1)[1]
print(err, int(re.search(r"FilePmdMapped:\s+(\d+)", block).group(1)))
"""
    phdrs = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    (offset,) = [int(f[1], 16) for f in map(str.split, phdrs.splitlines()) if f[:1] == ["LOAD"] and "E" in f[6:-1]]
    drop_caches()
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(offset), str(-1 if advice is None else advice)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    err, kb = out.stdout.split()
    return int(err), int(kb)


def gives_large_folios(path: Path) -> bool:
    """Whether the file's first window, read through a MADV_HUGEPAGE mapping, got a PMD."""
    return cold_window(path, MADV_HUGEPAGE)[1] > 0


def blocks_read_by(argv: list[str], times: int, env: dict[str, str]) -> int:
    """Bytes read from storage by `times` runs of argv (the children's I/O accounting,
    so that other processes on the machine do not count), after one run that brings
    the tools themselves (hugify-run, the audit library, libc) into the page cache."""
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    code = (
        "import resource, subprocess, sys, json\n"
        "argv, n, env = json.loads(sys.argv[1])\n"
        "for _ in range(n):\n"
        "    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([argv, times, env])], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def clean_env(run: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_DEBUG")}
    return env | {"HUGIFY_RUNTIME_DIR": str(run)} | extra


def test_the_filesystem_without_large_folios_is_found_once_and_then_left_alone(on_btrfs: tuple[Programs, Path]):
    progs, run = on_btrfs
    # The premise, seen without hugify: this kernel gives btrfs files no PMD folios.
    assert not gives_large_folios(progs.prog), "this kernel gives btrfs large folios: the test needs another fs"

    # The boot service's run: cold files, read in, found small, one window evicted and
    # read again to be sure, then the verdict is recorded for this boot.
    drop_caches()
    no_copies = file_backed_only(run.parent)
    res = hugify(
        "prefetch", "--json", "--policy", no_copies, progs.prog, progs.lib, env={"HUGIFY_RUNTIME_DIR": str(run)}
    )
    assert res.returncode == 4, res.stderr
    report = json.loads(res.stdout)
    for f in report["files"]:
        assert {(w["state"], w["reason"], w["detail"][:40]) for w in f["windows"]} == {
            ("unsupported", "no-large-folios", "the btrfs filesystem gives no large foli")
        }, f
    dev = os.stat(progs.prog).st_dev
    record = run / f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert record.read_text() == f"{boot} {BTRFS_MAGIC}\n"

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

    # hugify status says it once, naming the filesystem and what would do it.
    status = hugify("status", "--runtime-dir", run, progs.prog)
    notes = [line for line in status.stdout.splitlines() if "gives no large folios" in line]
    assert len(notes) == 1, status.stdout
    assert "btrfs" in notes[0] and f"{os.major(dev)}:{os.minor(dev)}" in notes[0]
    js = json.loads(hugify("status", "--json", "--runtime-dir", run, progs.prog).stdout)
    (fs,) = [x for x in js["system"]["filesystems_without_large_folios"] if x["device"] == record.name[16:]]
    assert fs["type"] == "btrfs" and "btrfs" in fs["remedy"]
    # And each window is what every process gets there: unsupported, not cold or small.
    (f,) = js["files"]
    assert {(w["state"], w["reason"]) for w in f["windows"]} == {("unsupported", "no-large-folios")}, f


def test_a_record_of_another_boot_or_filesystem_type_is_ignored(on_btrfs: tuple[Programs, Path]):
    """A stale record (another boot, or a filesystem of another type that had the same
    device number) must not keep files from being tried."""
    progs, run = on_btrfs
    dev = os.stat(progs.prog).st_dev
    record = run / f"no-large-folios-{os.major(dev)}:{os.minor(dev)}"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for stale in ("00000000-0000-0000-0000-000000000000 " + BTRFS_MAGIC, f"{boot} ef53"):
        run.mkdir(exist_ok=True)
        record.write_text(stale + "\n")
        drop_caches()
        # Not skipped: the files are read in (the windows leave the "cold" state), and
        # the verdict is found again and rewritten.
        res = hugify(
            "prefetch",
            "--json",
            "--policy",
            file_backed_only(run.parent),
            progs.prog,
            env={"HUGIFY_RUNTIME_DIR": str(run)},
        )
        assert res.returncode == 4, res.stderr
        assert record.read_text() == f"{boot} {BTRFS_MAGIC}\n"
        with contextlib.suppress(FileNotFoundError):
            record.unlink()


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


@contextlib.contextmanager
def thp_enabled(mode: str) -> Iterator[None]:
    """THP `enabled` set to `mode` for the block (the caller holds the runtime tests' lock)."""
    knob = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    before = knob.read_text().split("[")[1].split("]")[0]
    knob.write_text(mode)
    try:
        yield
    finally:
        knob.write_text(before)


def test_cold_code_is_loaded_where_the_kernel_makes_none_huge_by_itself(on_xfs: tuple[Programs, Path]):
    """Issue 20 item 5 on this kernel (6.18), on XFS, with THP `always`: the kernel would
    never make a cold program's code huge by itself here, so prefetch's probe says "no"
    and prefetch loads the windows itself (`loaded`, never `kernel`). The kernel's two
    ways, each seen not to happen:
    - PMD exec readahead, what the probe looks for: a cold window mapped like the ELF
      loader and faulted is not PMD-mapped (while the same read through MADV_HUGEPAGE is);
    - khugepaged's collapse of file-backed code, which 7.2 and 7.3 do for a program that
      stays mapped (tests/test_kernel_matrix.py, the "held" run): MADV_COLLAPSE, the same
      collapse asked for at once, is refused for this file (EINVAL:
      CONFIG_READ_ONLY_THP_FOR_FS is off), so khugepaged leaves it small however long
      it stays mapped."""
    progs, run = on_xfs
    with thp_enabled("always"):
        assert cold_window(progs.prog, MADV_HUGEPAGE) == (0, 2048)  # XFS gives 2 MiB folios here
        assert cold_window(progs.prog, None) == (0, 0)
        assert cold_window(progs.prog, MADV_COLLAPSE) == (errno.EINVAL, 0)
        drop_caches()
        res = hugify("prefetch", "--json", "--runtime-dir", run, progs.prog, progs.lib)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["system"]["exec_pmd_readahead"] is False and report["system"]["thp_enabled"] == "always"
    for f in report["files"]:
        assert {w["state"] for w in f["windows"]} == {"loaded"}, f
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert (run / "kernel-exec-pmd").read_text() == f"{boot} 0 always\n"
