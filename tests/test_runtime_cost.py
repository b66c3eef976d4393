"""What the runtime costs in bytes read from storage, bounded on both sides (issue 32 item
6): where it works, the windows are read once (plus noise); where it cannot, starts read
within noise of plain starts; and so also for a user who is not root, with no runtime
directory (no service ran, nothing can be kept between starts), where it used to evict and
read every window again at every start (40 MiB in 10 starts, the issue measured booted on
6.12 ext4 with a busybox init).

N starts of the test program, plainly, through the audit library and through hugify-run,
each series from the program's files cold or cached in small folios (the tools cached:
testkit.runtime.starts_read), on three filesystems whose answer is measured without
hugify: XFS gives 2 MiB folios on every kernel since 5.18, btrfs on none of Debian's, ext4
with data=journal on none. Bytes are the children's I/O accounting (ru_inblock), so other
work on the machine does not count."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import HP
from testkit.runtime import (
    AS_NOBODY,
    AUDIT_LIB,
    HUGIFY_RUN,
    Programs,
    clean_env,
    exec_segment_size,
    gives_large_folios,
    locked,
    loop_fs,
    parse_smaps,
    public_dir,
    set_read_ahead,
    starts_read,
)

STARTS = 10
#: What a series reads above the plain one that is still "nothing more": the plain
#: series reads what the program faults; a start through the runtime reads a few pages of
#: its own (headers through POSIX_FADV_RANDOM, /proc), not a window (2 MiB).
NOISE = 512 << 10
#: Where no runtime directory can be had: its parent does not exist.
NO_RUNTIME_DIR = Path("/nonexistent/hugify")


@dataclass
class OnFs:
    fs: str
    progs: Programs
    large: bool  # the filesystem gives the files 2 MiB folios (measured)
    run: Path  # a runtime directory of root's, for the runs as root


@pytest.fixture(params=["xfs", "btrfs", "ext4 data=journal"])
def on_fs(request: pytest.FixtureRequest, built: Programs) -> Iterator[OnFs]:
    """The programs on a fresh filesystem every user may enter."""
    fs, _, options = request.param.partition(" ")
    with public_dir() as public, loop_fs(public, fs, options, built) as mnt, locked():
        mnt.chmod(0o755)
        progs = Programs(mnt / "bin", built.orig)
        yield OnFs(fs, progs, gives_large_folios(progs.prog), public / "run")


def series(progs: Programs, run: Path, cache: str, nobody: bool) -> dict[str, int]:
    """KiB read by STARTS starts each way."""
    ways = {
        "plain": ([str(progs.prog)], {}),
        "audit": ([str(progs.prog)], {"LD_AUDIT": str(AUDIT_LIB)}),
        "hugify-run": ([str(HUGIFY_RUN), str(progs.prog)], {}),
    }
    prefix = AS_NOBODY if nobody else []
    files = [progs.prog, progs.lib]
    got = {
        way: starts_read([*prefix, *argv], STARTS, clean_env(run, **env), files, cache) >> 10
        for way, (argv, env) in ways.items()
    }
    # The figures, for the report (pytest -rP shows them; bench/README.md, "The runtime's own reads", quotes them).
    print(f"{progs.dir}: KiB read by {STARTS} starts, {'nobody' if nobody else 'root'}, {cache}: {got}")
    return got


def windows(progs: Programs) -> int:
    """KiB of the program's and its library's whole windows."""
    return sum(exec_segment_size(p) for p in (progs.prog, progs.lib)) >> 10


@pytest.mark.parametrize("cache", ["small", "cold"])
def test_a_user_without_a_runtime_directory_costs_nothing_where_it_cannot_work(on_fs: OnFs, cache: str):
    """As nobody, HUGIFY_RUNTIME_DIR with no directory to be had, the files root's. Where
    the filesystem gives no large folios: from files cached small, not a byte more than
    plain starts (the kernel does not tell another user what is cached, so nothing is
    evicted; btrfs is known from the kernel's version, nothing is even marked); from cold
    files, each window read at most once more (btrfs: nothing more; ext4's hint says 6.16
    gives large folios, and the windows are read through MADV_HUGEPAGE, whole). Where it
    gives them: never more than the windows once above plain starts, nothing evicted."""
    got = series(on_fs.progs, NO_RUNTIME_DIR, cache, nobody=True)
    once = windows(on_fs.progs) if cache == "cold" and (on_fs.large or on_fs.fs != "btrfs") else 0
    for way in ("audit", "hugify-run"):
        assert got[way] <= got["plain"] + once + (NOISE >> 10), (on_fs.fs, cache, on_fs.large, got, once)


def test_a_users_own_files_without_records_cost_at_most_two_windows_a_process(built: Programs):
    """The one case left that costs at every start: files the user owns (the kernel tells
    an owner what is cached, so the process finds out for itself), on a filesystem without
    large folios whose type the kernel's version does not rule out (ext4 with data=journal
    from 6.16, or a type hugify has no word for), with no record (not root): each process
    reads the first window of its first two files again before it knows (the second file
    makes it the filesystem's verdict, in its memory only). Bounded: the audit library two
    windows a start, hugify-run two more in its own process."""
    with public_dir() as public, loop_fs(public, "ext4", "data=journal", built) as mnt, locked():
        mnt.chmod(0o755)
        progs = Programs(mnt / "bin", built.orig)
        for f in progs.files:
            os.chown(f, 65534, 65534)
        assert not gives_large_folios(progs.prog)
        got = series(progs, NO_RUNTIME_DIR, "small", nobody=True)
    window = HP >> 10
    assert got["audit"] <= got["plain"] + STARTS * 2 * window + (NOISE >> 10), got
    assert got["hugify-run"] <= got["plain"] + STARTS * 4 * window + (NOISE >> 10), got


def test_where_it_works_root_reads_the_windows_once(on_fs: OnFs):
    """As root, with its runtime directory, from files cached in small folios: where the
    filesystem gives large folios the first start evicts and reads every window once, and
    the others read nothing (the windows are huge): within noise of the windows' size
    above plain starts, both sides; where it does not, one window of each file is read to
    find that out, and never again (recorded): twice (evicted again in between: what is
    recorded for the boot takes two reads of the process's own), once where the kernel's
    version says the filesystem gives none anyway (btrfs)."""
    got = series(on_fs.progs, on_fs.run, "small", nobody=False)
    reads = 1 if on_fs.fs == "btrfs" else 2
    want = windows(on_fs.progs) if on_fs.large else 2 * reads * (HP >> 10)
    noise = NOISE >> 10
    for way in ("audit", "hugify-run"):
        extra = got[way] - got["plain"]
        # hugify-run's series ran after the audit library's found out and recorded it:
        # nothing more than plain starts, within noise either way (a cold run read 8 KiB
        # in the plain series and none in hugify-run's)
        low = -noise if (way == "hugify-run" and not on_fs.large) else want - noise
        assert low <= extra <= want + noise, (on_fs.fs, way, on_fs.large, got, want)


@contextlib.contextmanager
def unwritable_runtime_dir(public: Path, how: str) -> Iterator[Path]:
    """A runtime directory root cannot keep records in: "missing" where it cannot be made
    (its parent does not exist: a chroot or container without /run), "read-only" a
    directory of root's on a filesystem mounted read-only (/run read-only)."""
    if how == "missing":
        yield NO_RUNTIME_DIR
        return
    ro = public / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M,mode=0755", "hugify-test-ro", str(ro)], check=True)
    try:
        (ro / "hugify").mkdir(mode=0o755)
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        yield ro / "hugify"
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.mark.parametrize("how", ["missing", "read-only"])
@pytest.mark.parametrize("cache", ["small", "cold"])
def test_root_that_can_keep_no_records_reads_nothing_where_the_kernel_rules_it_out(
    built: Programs, how: str, cache: str
):
    """Issue 38 item 4: root with no runtime directory it can write keeps nothing between
    starts, so it takes the kernel's version and the filesystem's type for a hint, as a
    user does: on btrfs (no large folios in any kernel hugify knows) 10 starts through the
    audit library and through hugify-run read nothing more than plain starts, from small
    folios and cold. On main cd6bc40 a directory that was merely missing counted as one
    root would make, the hint was skipped, the mkdir failed and nothing was recorded:
    every start read the windows again (40960 KiB more in 10 starts from small folios)."""
    with public_dir() as public, loop_fs(public, "btrfs", "", built) as mnt, locked():
        progs = Programs(mnt / "bin", built.orig)
        assert not gives_large_folios(progs.prog)
        with unwritable_runtime_dir(public, how) as run:
            got = series(progs, run, cache, nobody=False)
            left = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    for way in ("audit", "hugify-run"):
        assert got[way] <= got["plain"] + (NOISE >> 10), (how, cache, got)
    assert left == [], left


@pytest.mark.parametrize("how", ["missing", "read-only"])
def test_root_that_can_keep_no_records_gets_anonymous_copies(built: Programs, how: str):
    """Issue 38 item 4: `hugify-run --anonymous` as root with no runtime directory it can
    write, on btrfs, as on kernels without PAGEMAP_SCAN (6.1: HUGIFY_FORCE_SMAPS): every
    window of the program and its library is copied into anonymous huge pages (the hint
    says the file-backed way cannot work, nothing is read to find out). On main cd6bc40
    the windows were evicted and read again instead, and where the audit library cannot
    tell how its own mapping of a window is held (6.1) left `unverified`: nothing copied
    (0 kB, measured booted on Debian 12's 6.1 on ext4)."""
    with public_dir() as public, loop_fs(public, "btrfs", "", built) as mnt, locked():
        progs = Programs(mnt / "bin", built.orig)
        nwin = {p: exec_segment_size(p) // HP for p in (progs.prog, progs.lib)}
        with unwritable_runtime_dir(public, how) as run:
            env = clean_env(run, HUGIFY_DEBUG="1", HUGIFY_PERF_MAP="0", HUGIFY_FORCE_SMAPS="1")
            res = subprocess.run(
                [str(HUGIFY_RUN), "--anonymous", str(progs.prog)], capture_output=True, text=True, env=env, check=False
            )
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("hugify-audit: anonymous ")]
    for p, n in nwin.items():
        assert f"hugify-audit: anonymous {p}: {n}/{n} windows copied" in lines, (how, lines)


def test_where_it_works_a_user_gets_cold_windows_huge(on_fs: OnFs):
    """As nobody without a runtime directory, from cold files: where the filesystem gives
    large folios, the program's and its library's code is PMD-mapped (read through the
    MADV_HUGEPAGE mapping); where it does not, not."""
    progs, large = on_fs.progs, on_fs.large
    starts_read(
        [*AS_NOBODY, str(HUGIFY_RUN), str(progs.prog)], 1, clean_env(NO_RUNTIME_DIR), [progs.prog, progs.lib], "cold"
    )
    res = subprocess.run(
        [*AS_NOBODY, str(progs.prog)],
        capture_output=True,
        text=True,
        env=clean_env(NO_RUNTIME_DIR),
        check=False,
    )
    maps = parse_smaps(res.stdout)
    for p in (progs.prog, progs.lib):
        assert (maps[str(p)].pmd == exec_segment_size(p)) is large, (p, maps[str(p)], large)


@pytest.mark.parametrize("verify", ["pagemap-scan", "smaps"])
@pytest.mark.parametrize("fs", ["btrfs", "xfs"])
def test_the_anonymous_mode_works_with_no_verdict_kept(built: Programs, fs: str, verify: str):
    """`hugify-run --anonymous` as nobody with no runtime directory (issue 32: on 6.1 and
    6.12 ext4 without records it copied nothing). Where the filesystem gives no large
    folios (btrfs on Debian's kernels, known from the kernel's version) every window of
    the program and its library is copied into anonymous huge pages; where it gives them
    (XFS), none is ("not-needed"). Also as on kernels without PAGEMAP_SCAN (6.1:
    HUGIFY_FORCE_SMAPS), where the audit library cannot tell how its own mapping of a
    window is held and used to leave it "unverified", never copied. Measured first."""
    with public_dir() as public, loop_fs(public, fs, "", built) as mnt, locked():
        mnt.chmod(0o755)
        progs = Programs(mnt / "bin", built.orig)
        large = gives_large_folios(progs.prog)
        env = clean_env(NO_RUNTIME_DIR, HUGIFY_DEBUG="1", HUGIFY_PERF_MAP="0")
        if verify == "smaps":
            env["HUGIFY_FORCE_SMAPS"] = "1"
        res = subprocess.run(
            [*AS_NOBODY, str(HUGIFY_RUN), "--anonymous", str(progs.prog)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        nwin = {p: exec_segment_size(p) // HP for p in (progs.prog, progs.lib)}
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.startswith("hugify-audit: anonymous ")]
    for p, n in nwin.items():
        want = f"{n}/{n} windows copied" if not large else f"0/{n} windows copied, window 0 not-needed: file-backed"
        assert f"hugify-audit: anonymous {p}: {want}" in lines, (large, lines)


def test_a_user_gets_cold_windows_huge_through_the_audit_library_after_ld_so_read_into_them(built: Programs):
    """As nobody without a runtime directory, from cold files, through the audit library,
    with a large readahead on the files' device (read_ahead_kb 16 MiB, what RAID arrays
    and some virtual disks have; Debian's 7.3 under qemu reads the test package's files
    whole at a plain cold start): before la_objopen, ld.so's own faults on the objects'
    other loads (their dynamic sections) read around them into every window, in small
    folios, and a process that may not see the page cache cannot tell that from windows
    another process left small. It takes what its own thread read while the object was
    loaded for the evidence (the file was not wholly cached): the windows are evicted and
    read once more, and the code is PMD-mapped afterwards (it stayed small before: the
    kernel matrix's newest ext4 boot and this test); each window is read at most once
    more than by plain starts, and from files cached small not a byte more."""
    with public_dir() as public, loop_fs(public, "xfs", "", built) as mnt, locked():
        mnt.chmod(0o755)
        set_read_ahead(mnt, 16384)
        progs = Programs(mnt / "bin", built.orig)
        assert gives_large_folios(progs.prog)
        env = clean_env(NO_RUNTIME_DIR, LD_AUDIT=str(AUDIT_LIB))
        files = [progs.prog, progs.lib]
        got = {
            (way, cache): starts_read([*AS_NOBODY, str(progs.prog)], STARTS, e, files, cache) >> 10
            for cache in ("small", "cold")
            for way, e in (("plain", clean_env(NO_RUNTIME_DIR)), ("audit", env))
        }
        print(f"{progs.dir}: KiB read by {STARTS} starts, nobody, read_ahead_kb 16384: {got}")
        starts_read([*AS_NOBODY, str(progs.prog)], 1, env, files, "cold")
        res = subprocess.run([*AS_NOBODY, str(progs.prog)], capture_output=True, text=True, env=env, check=False)
        maps = parse_smaps(res.stdout)
        once, sizes = windows(progs), {str(p): exec_segment_size(p) for p in files}
    noise = NOISE >> 10
    assert got["audit", "small"] <= got["plain", "small"] + noise, got
    assert got["audit", "cold"] <= got["plain", "cold"] + once + noise, got
    for p, size in sizes.items():
        assert maps[p].pmd == size, (p, maps[p], got)
