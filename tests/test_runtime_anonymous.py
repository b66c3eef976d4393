"""The anonymous-copy mode of the runtime (runtime/hp_anon.c, docs/runtime.md
"Anonymous copies"), on the real kernel: every whole window of the program and of the
libraries it loads (also dlopen'ed) becomes one anonymous PMD at the same address, the
program's output is the same, the real perf and gdb still name and break in the copied
code, and every fault leaves the program running on its file mapping with one
HUGIFY_DEBUG line.

The programs live on XFS (conftest.large_folio_dir), which gives file-backed 2 MiB
folios on every kernel since 5.18 (measured, not assumed), so the copies are forced
here with `always`, and the default mode must do nothing there; it is seen copying on
tmpfs, where hp_settle finds file-backed huge pages unsupported.
"No free 2 MiB block" proper (memory fragmentation) is provoked in the kernel matrix's
guests (tests/test_kernel_matrix.py); here a memory cgroup's limit refuses the huge page
and a replaced /proc/buddyinfo says whether blocks are free."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import hugify
from testkit.elf import exec_load, readelf_windows
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    REPO,
    SECCOMP_EPERM,
    Programs,
    build_spin,
    copy_programs,
    locked,
    memory_cgroup,
    perf_attached,
    perf_record,
    seccomp_program,
    thp_alone,
    thp_set,
)
from testkit.smaps import Vma, smaps_of

COPIED = re.compile(r"^hugify-audit: anonymous (\S+): (\d+)/(\d+) windows copied(.*)$", re.M)


@pytest.fixture
def progs(built: Programs, large_folio_dir: Path, tmp_path: Path) -> Iterator[Programs]:
    copy = copy_programs(built, large_folio_dir / tmp_path.name)
    yield copy
    shutil.rmtree(copy.dir)


@pytest.fixture(scope="module")
def spin(built: Programs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hugified program that spends its time in hugify_hot_spin, inside a window."""
    return build_spin(tmp_path_factory.mktemp("spin"))


# --- reading what the process had ----------------------------------------------------


def window_addresses(maps: list[Vma], path: Path) -> list[int]:
    """Run-time addresses of the whole windows of `path` (readelf's program headers),
    placed where its first page (file offset 0, address 0) is mapped."""
    base = min(v.lo for v in maps if os.path.realpath(v.name) == os.path.realpath(path))
    x = exec_load(path)
    return [
        base + off + x.vaddr - x.offset + k * HP
        for off, size in readelf_windows(path, False)
        for k in range(size // HP)
    ]


def anonymous_pmds(maps: list[Vma], path: Path) -> list[bool]:
    """For each window of `path`: is it inside an anonymous executable VMA that is all
    anonymous huge pages?"""
    out = []
    for a in window_addresses(maps, path):
        (v,) = [v for v in maps if v.lo <= a < v.hi]
        out.append(v.inode == 0 and "x" in v.perms and v.anon_huge == v.hi - v.lo)
    return out


def run(argv: list, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs a command (hugify-run execs the program: same PID) and removes the perf map
    the copies left in /tmp."""
    base = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_ANONYMOUS")}
    argv = [str(a) for a in argv]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **(env or {})})
    try:
        out, err = p.communicate(timeout=120)
    finally:
        Path(f"/tmp/perf-{p.pid}.map").unlink(missing_ok=True)
    res = subprocess.CompletedProcess(argv, p.returncode, out, err)
    assert res.returncode == 0, f"{argv} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr}"
    return res


def result(res: subprocess.CompletedProcess[str]) -> str:
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("result ")]
    return line


def copy_lines(stderr: str) -> dict[str, tuple[int, int, str]]:
    """The mode's debug lines: real path -> (copied, windows, the rest)."""
    return {os.path.realpath(m[1]): (int(m[2]), int(m[3]), m[4]) for m in COPIED.finditer(stderr)}


def nwin(path: Path) -> int:
    return sum(size // HP for _, size in readelf_windows(path, False))


DEBUG = {"HUGIFY_DEBUG": "1"}


# --- the copies ------------------------------------------------------------------------


def test_always_makes_every_window_one_anonymous_pmd(progs: Programs):
    plain = run([progs.prog, progs.plug], {"LD_AUDIT": str(AUDIT_LIB)})
    res = run([HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], DEBUG)
    assert result(res) == result(plain)
    maps = smaps_of(res)
    lines = copy_lines(res.stderr)
    for f in progs.files:
        n = nwin(f)
        assert n >= 1
        assert lines[os.path.realpath(f)] == (n, n, ""), res.stderr
        assert anonymous_pmds(maps, f) == [True] * n, f
    # the original mapping had them file-backed
    assert all(not any(anonymous_pmds(smaps_of(plain), f)) for f in progs.files)


def test_default_mode_copies_where_the_filesystem_gives_no_huge_pages(progs: Programs):
    """On tmpfs (/dev/shm, no huge= option) no window can be a file-backed 2 MiB folio
    (hp_settle: unsupported, memory-fs): `--anonymous` alone copies them all."""
    shm = Path("/dev/shm") / f"hugify-anon-test-{os.getpid()}"
    shm.mkdir()
    try:
        for f in progs.files:
            (shm / f.name).write_bytes(f.read_bytes())
            (shm / f.name).chmod(0o755)
        on_shm = Programs(shm, progs.orig)
        plain = run([on_shm.prog, on_shm.plug], {"LD_AUDIT": str(AUDIT_LIB)})
        res = run([HUGIFY_RUN, "--anonymous", on_shm.prog, on_shm.plug], DEBUG)
        lines = copy_lines(res.stderr)
        maps = smaps_of(res)
        assert result(res) == result(plain)
        for f in on_shm.files:
            assert lines[os.path.realpath(f)] == (nwin(f), nwin(f), ""), res.stderr
            assert anonymous_pmds(maps, f) == [True] * nwin(f), f
            assert not any(anonymous_pmds(smaps_of(plain), f))
    finally:
        for f in shm.iterdir():
            f.unlink()
        shm.rmdir()


def test_copies_checked_from_smaps_as_before_linux_6_7(progs: Programs):
    """Without PAGEMAP_SCAN (Debian 12's 6.1) each copy is checked by its AnonHugePages."""
    res = run([HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], {**DEBUG, "HUGIFY_FORCE_SMAPS": "1"})
    lines = copy_lines(res.stderr)
    maps = smaps_of(res)
    for f in progs.files:
        assert lines[os.path.realpath(f)] == (nwin(f), nwin(f), ""), res.stderr
        assert anonymous_pmds(maps, f) == [True] * nwin(f), f


def test_mode_off_changes_nothing(progs: Programs, tmp_path: Path):
    rdir = tmp_path / "run"
    rdir.mkdir()
    (rdir / "anonymous").write_text(f"{os.path.realpath(progs.prog)}\n")
    for env in (DEBUG, {**DEBUG, "HUGIFY_ANONYMOUS": "0", "HUGIFY_RUNTIME_DIR": str(rdir)}):
        res = run([HUGIFY_RUN, progs.prog, progs.plug], env)
        assert "anonymous" not in res.stderr, res.stderr
        maps = smaps_of(res)
        for f in progs.files:
            assert not any(anonymous_pmds(maps, f))
            assert all(v.inode != 0 for v in maps if v.lo in window_addresses(maps, f))


def test_not_used_without_always_where_file_backed_works(progs: Programs):
    res = run([HUGIFY_RUN, "--anonymous", progs.prog, progs.plug], DEBUG)
    lines = copy_lines(res.stderr)
    maps = smaps_of(res)
    for f in progs.files:
        n = nwin(f)
        assert lines[os.path.realpath(f)] == (0, n, ", window 0 not-needed: file-backed"), res.stderr
        assert not any(anonymous_pmds(maps, f))
        for a in window_addresses(maps, f):
            (v,) = [v for v in maps if v.lo <= a < v.hi]
            assert v.inode != 0 and v.file_pmd > 0, v


def test_policy_reaches_the_audit_library(progs: Programs, tmp_path: Path):
    pol = tmp_path / "policy.toml"
    link = tmp_path / "prog-link"
    link.symlink_to(progs.prog)
    pol.write_text(f'[runtime]\nanonymous = ["{link}"]\n')
    rdir = tmp_path / "run"
    env = {"HUGIFY_POLICY_PATH": str(pol)}
    res = hugify("prefetch", "--runtime-dir", rdir, progs.prog, add_env=env, check=False)
    assert res.returncode == 0, res.stderr
    record = (rdir / "anonymous").read_text().splitlines()
    assert record[1:] == [os.path.realpath(progs.prog)]
    audit = {**DEBUG, "LD_AUDIT": str(AUDIT_LIB), "HUGIFY_RUNTIME_DIR": str(rdir)}
    lines = copy_lines(run([progs.prog, progs.plug], audit).stderr)
    # on: only where unsupported, which XFS is not
    assert lines[os.path.realpath(progs.prog)] == (0, nwin(progs.prog), ", window 0 not-needed: file-backed")
    # a program that is not listed: off
    other = progs.dir / "other"
    other.write_bytes(progs.prog.read_bytes())
    other.chmod(0o755)
    assert "anonymous" not in run([other, progs.plug], audit).stderr
    # the list emptied: the record goes
    pol.write_text("[runtime]\nanonymous = []\n")
    assert hugify("prefetch", "--runtime-dir", rdir, progs.prog, add_env=env, check=False).returncode == 0
    assert not (rdir / "anonymous").exists()


def test_status_lists_the_processes_and_their_memory(progs: Programs, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "HUGIFY_ANONYMOUS")}
    p = subprocess.Popen(
        [str(HUGIFY_RUN), "--anonymous=always", str(progs.prog), str(progs.plug), "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == "waiting\n"
        empty = tmp_path / "manifests"
        empty.mkdir()
        res = hugify("status", "--json", "--manifest-dir", empty, check=False)
        assert res.returncode == 0, res.stderr
        import json

        mine = {c["path"]: c for c in json.loads(res.stdout)["anonymous_copies"] if c["pid"] == p.pid}
        text = hugify("status", "--manifest-dir", empty, check=False).stdout
    finally:
        if p.stdin:
            p.stdin.write("\n")
            p.stdin.close()
        p.wait(timeout=60)
        Path(f"/tmp/perf-{p.pid}.map").unlink(missing_ok=True)
    assert p.returncode == 0
    assert set(mine) == {os.path.realpath(f) for f in progs.files}
    for f in progs.files:
        c = mine[os.path.realpath(f)]
        assert (c["windows"], c["anon_huge_bytes"], c["command"]) == (nwin(f), nwin(f) * HP, "prog")
    assert f"pid {p.pid} (prog): {os.path.realpath(progs.prog)}: {nwin(progs.prog)} windows, " in text


# --- perf and gdb -----------------------------------------------------------------------


def perf_top_symbol(data: Path) -> str:
    rep = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--sort", "sym", "--percent-limit", "20"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in rep.splitlines() if line.strip() and not line.startswith("#")]
    return rows[0][-1]


def test_perf_resolves_the_copied_code_by_name(spin: Path, tmp_path: Path):
    data = tmp_path / "perf.data"
    # launched under perf, the copies are named through the file (perf saw it mapped and no
    # new mapping since): without the map (HUGIFY_PERF_MAP=0, nothing left in /tmp)
    res = run(
        perf_record(data, "--", HUGIFY_RUN, "--anonymous=always", spin),
        {**DEBUG, "HUGIFY_PERF_MAP": "0"},
    )
    assert copy_lines(res.stderr)[str(spin)] == (nwin(spin), nwin(spin), "")
    assert perf_top_symbol(data) == "hugify_hot_spin"


def test_perf_attached_later_resolves_through_the_perf_map(spin: Path, tmp_path: Path):
    """perf attached to a running process sees the copies as anonymous memory (from
    /proc/PID/maps): the names come from /tmp/perf-PID.map, written when asked
    (HUGIFY_PERF_MAP=1; tests/test_runtime_perfmap.py has the rest of it)."""
    data = tmp_path / "perf.data"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "HUGIFY_ANONYMOUS")}
    env["HUGIFY_PERF_MAP"] = "1"
    p = subprocess.Popen(
        [str(HUGIFY_RUN), "--anonymous=always", str(spin), "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    perf = None
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == "waiting\n"
        perf_map = Path(f"/tmp/perf-{p.pid}.map")
        hot = [line for line in perf_map.read_text().splitlines() if line.endswith(" hugify_hot_spin")]
        assert len(hot) == 1
        perf = perf_attached(data, "-p", p.pid)
        time.sleep(1.0)  # perf is attached
        p.stdin.write("\n")
        p.stdin.close()
        assert p.wait(timeout=60) == 0
        assert perf.wait(timeout=60) == 0
    finally:
        for proc in (p, perf):
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    try:
        assert perf_top_symbol(data) == "hugify_hot_spin"  # perf report reads the map
    finally:
        Path(f"/tmp/perf-{p.pid}.map").unlink(missing_ok=True)


def gdb(spin: Path, env: dict[str, str]) -> str:
    cmds = [f"set environment {k}={v}" for k, v in env.items()]
    cmds += ["break hugify_hot_spin", "run", "bt", "p/x $pc", "info sharedlibrary", "info proc mappings", "kill"]
    res = subprocess.run(
        ["gdb", "-nx", "-batch", *(x for c in cmds for x in ("-ex", c)), str(spin)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return res.stdout + res.stderr


def test_gdb_breaks_and_backtraces_in_the_copied_code(spin: Path):
    audit = {"LD_AUDIT": str(AUDIT_LIB)}
    out = gdb(spin, {**audit, "HUGIFY_ANONYMOUS": "always", "HUGIFY_DEBUG": "1", "HUGIFY_PERF_MAP": "0"})
    without = gdb(spin, audit)
    assert f"hugify-audit: anonymous {spin}: {nwin(spin)}/{nwin(spin)} windows copied" in out
    # without copies too: the audit library used to drop the page holding gdb's breakpoint
    # when it repaired the window under it
    for text in (out, without):
        assert re.search(r"^Breakpoint 1, hugify_hot_spin \(", text, re.M), text
    assert re.search(r"^#1 +0x[0-9a-f]+ in main \(", out, re.M), out
    # where it stopped is anonymous memory (no objfile): one of the copied windows
    pc = int(re.findall(r"^\$1 = 0x([0-9a-f]+)$", out, re.M)[0], 16)
    maps = re.findall(r"^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+(\S+)\s*(\S*)$", out, re.M)
    anon = [(int(lo, 16), int(hi, 16)) for lo, hi, perms, obj in maps if "x" in perms and obj == ""]
    assert len(anon) == nwin(spin), out
    assert any(lo <= pc < hi for lo, hi in anon), (hex(pc), anon)

    def libs(text: str) -> list[str]:
        return re.findall(r"^0x[0-9a-f]+\s+0x[0-9a-f]+\s+\S+\s+(/\S+)$", text, re.M)

    assert libs(out) == libs(without) and "/lib/x86_64-linux-gnu/libc.so.6" in " ".join(libs(out))


# --- faults: the program runs on its file mapping, one debug line ------------------------


def assert_kept(res: subprocess.CompletedProcess[str], progs: Programs, plain: str, why: str) -> None:
    assert result(res) == plain
    lines = copy_lines(res.stderr)
    maps = smaps_of(res)
    for f in progs.files:
        n = nwin(f)
        copied, total, rest = lines[os.path.realpath(f)]
        assert (copied, total) == (0, n), res.stderr
        assert re.fullmatch(rf", window 0 {why}: file mapping kept", rest), rest
        for a in window_addresses(maps, f):
            (v,) = [v for v in maps if v.lo <= a < v.hi]
            assert v.inode != 0, v  # still the file
    assert len(COPIED.findall(res.stderr)) == len(progs.files)


def test_thp_never_is_respected(progs: Programs):
    plain = result(run([progs.prog, progs.plug]))
    with thp_alone(), locked(), thp_set("enabled", "never"):
        res = run([HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], DEBUG)
    # thp-off from sysfs; not-huge where /run/hugify still records the earlier mode (the
    # audit library trusts that record until the next `hugify prefetch`)
    assert_kept(res, progs, plain, "(thp-off|not-huge)")


def test_thp_disabled_process_keeps_its_file_mapping(progs: Programs):
    plain = result(run([progs.prog, progs.plug]))
    code = "import ctypes, os, sys; ctypes.CDLL(None).prctl(41, 1, 0, 0, 0); os.execv(sys.argv[1], sys.argv[1:])"
    res = run([sys.executable, "-c", code, HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], DEBUG)
    # The runtime asks prctl before anything (a THP-disabled process must not take its
    # own small folios for the filesystem's verdict): the copy is not even tried.
    assert_kept(res, progs, plain, "thp-off")


#: Runs argv[1:] with every mremap refused with EPERM.
SECCOMP = seccomp_program({"x86_64": 25, "aarch64": 216}, SECCOMP_EPERM)


def test_seccomp_forbidding_mremap_keeps_the_file_mapping(progs: Programs):
    plain = result(run([progs.prog, progs.plug]))
    res = run([sys.executable, "-c", SECCOMP, HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], DEBUG)
    assert_kept(res, progs, plain, r"mremap \(errno 1\)")


#: /proc/buddyinfo as it reads with free 2 MiB blocks (orders 9 and 10 in DMA32) or with
#: none outside ZONE_DMA (whose reserve keeps huge pages out: its blocks do not count).
BUDDYINFO = {
    "free": "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3\n"
    "Node 0, zone    DMA32    120     80     40     20     10      5      3      2      1      4    700\n",
    "fragmented": "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3\n"
    "Node 0, zone    DMA32  90000  40000   9000   2000    500    100     30     10      2      0      0\n",
}


@pytest.mark.parametrize("buddyinfo,why", [("fragmented", "fragmented"), ("free", "not-huge")])
def test_a_copy_without_a_huge_page_says_whether_memory_is_fragmented(
    progs: Programs, tmp_path: Path, buddyinfo: str, why: str
):
    """The kernel gives the copy small pages: the line names fragmentation (the core's
    reason id `fragmented`, which `hugify explain` knows) when /proc/buddyinfo lists no
    free 2 MiB block, `not-huge` when it does. Here the kernel refuses the huge page by a
    memory cgroup limit below 2 MiB, and /proc/buddyinfo is replaced in a private mount
    namespace; real fragmentation is provoked in the kernel matrix's guests
    (tests/test_kernel_matrix.py)."""
    plain = result(run([progs.prog, progs.plug]))
    # The windows made huge in the page cache first, charged outside the small cgroup:
    # in it, hugify-run finds them in place and reads nothing.
    run([HUGIFY_RUN, progs.prog, progs.plug])
    fake = tmp_path / "buddyinfo"
    fake.write_text(BUDDYINFO[buddyinfo])
    cg = memory_cgroup(f"hugify-anon-test-{os.getpid()}")
    cg.mkdir()
    try:
        limit = "memory.limit_in_bytes" if (cg / "memory.limit_in_bytes").exists() else "memory.max"
        (cg / limit).write_text(f"{HP - 4096}\n")  # a 2 MiB page can never be charged
        script = 'mount --bind "$1" /proc/buddyinfo && echo $$ > "$2" && shift 2 && exec "$@"'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", fake, cg / "cgroup.procs"]
        res = run([*argv, HUGIFY_RUN, "--anonymous=always", progs.prog, progs.plug], DEBUG)
    finally:
        cg.rmdir()
    assert_kept(res, progs, plain, why)


def test_hugify_run_usage_names_the_option():
    res = subprocess.run([str(HUGIFY_RUN), "--help"], capture_output=True, text=True, check=True, cwd=REPO)
    assert "--anonymous[=always]" in res.stdout


def test_status_finds_copies_by_name_or_by_place():
    """Named copies ([anon:hugify:PATH], kernels with CONFIG_ANON_VMA_NAME, which this
    one lacks) and unnamed ones that a mapping of their file adjoins at the matching
    offsets (before or after them); other anonymous executable memory (a JIT's) is not
    a copy."""
    from hugify.anoncopies import copy_ranges
    from hugify.kernel import parse_maps

    maps = (
        "55e000000000-55e000003000 r--p 00000000 fe:00 12 /usr/bin/prog\n"
        "55e000200000-55e000400000 r-xp 00000000 00:00 0 [anon:hugify:/usr/bin/prog]\n"
        "55e000400000-55e000600000 r-xp 00000000 00:00 0 \n"
        "55e000600000-55e000601000 r-xp 00600000 fe:00 12 /usr/bin/prog\n"
        "7f0000000000-7f0000003000 r--p 00000000 fe:00 13 /usr/lib/libfoo.so\n"
        "7f0000003000-7f0000200000 ---p 00003000 fe:00 13 /usr/lib/libfoo.so\n"
        "7f0000200000-7f0000400000 r-xp 00000000 00:00 0 \n"
        "7f0000400000-7f0000402000 r--p 00400000 fe:00 13 /usr/lib/libfoo.so\n"
        "7f0800000000-7f0800001000 rw-p 000de000 fe:00 15 /usr/lib/libm.so.6\n"
        "7f0800200000-7f0800400000 r-xp 00000000 00:00 0 \n"
        "7f0800400000-7f0800562000 r-xp 00200000 fe:00 16 /usr/lib/libLLVM.so\n"
        "7f1000000000-7f1000200000 rwxp 00000000 00:00 0 \n"
        "7f1000200000-7f1000201000 r--p 00000000 fe:00 14 /usr/lib/libbar.so\n"
    )
    assert copy_ranges(parse_maps(maps), HP) == {
        (0x55E000200000, 0x55E000400000): "/usr/bin/prog",
        (0x55E000400000, 0x55E000600000): "/usr/bin/prog",
        (0x7F0000200000, 0x7F0000400000): "/usr/lib/libfoo.so",
        (0x7F0800200000, 0x7F0800400000): "/usr/lib/libLLVM.so",  # code from the file's start
    }
