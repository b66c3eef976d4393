"""Tools on code mapped from root's shared copies (issue 31 item 3; docs/runtime.md
"Shared copies"), for real: `perf record` launched, attached to the process (-p) and
system-wide (-a) names the hot function of the copied code (perf reads the mapped file,
a whole ELF copy with the original's build-id and symbols: no perf map); gdb attached to
the process breaks and backtraces there; a core dump, from gdb's gcore and from the
kernel (a signal, with core_pattern set for the test and restored), names every module
with the right build-id (eu-unstrip -n --core).

The programs are on a tmpfs without huge pages (the engine says `unsupported`), with a
runtime directory of the test's own; systemd-coredump is not tried here (systemd is not
PID 1 on the test machines)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.runtime import AUDIT_LIB, Programs, build_spin, locked, perf_attached, perf_record
from testkit.shared import Env, copies_of, files_on_tmpfs, nwin, prefetch, shared_lines

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


@pytest.fixture(scope="module")
def spin_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hugified program that spends its time in hugify_hot_spin, inside a window."""
    return build_spin(tmp_path_factory.mktemp("spin"))


@pytest.fixture
def env(built: Programs, spin_built: Path, tmp_path: Path) -> Iterator[tuple[Env, Path]]:
    """The test programs and the spinning one on the tmpfs, each with its shared copy."""
    with files_on_tmpfs(built, tmp_path) as e:
        spin = e.progs.dir / "spin"
        spin.write_bytes(spin_built.read_bytes())
        spin.chmod(0o755)
        res = prefetch(e, *e.progs.files, spin)
        assert res.returncode == 0 and res.stdout.count("shared copy made") == 4, res.stdout + res.stderr
        yield e, spin


def audit_env(e: Env) -> dict[str, str]:
    return e.env(LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1")


def copy_of(e: Env, f: Path) -> str:
    rec = copies_of(e)[os.path.realpath(f)]
    return str(e.store / rec.key / rec.name)


def build_id(path: Path | str) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    assert m, out
    return m[1]


@contextlib.contextmanager
def held(e: Env, argv: list[str], stdin: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """A program through the audit library, stopped before its work (waiting for a line
    on stdin), killed at the end if still there."""
    p = subprocess.Popen(
        argv,
        stdin=stdin if stdin is not None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=audit_env(e),
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "waiting\n"
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def mapped_from_copy(pid: int, copy: str) -> bool:
    return any(
        line.endswith(" " + copy) and " r-xp " in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
    )


# --- perf -------------------------------------------------------------------------------


def report(data: Path, pid: int | None = None) -> list[tuple[float, str, str]]:
    """perf report's rows: (share, object, symbol), hottest first; only the samples of
    `pid` when given (a system-wide recording also holds the other tests' programs, some
    running the same hot function)."""
    only = ["--pid", str(pid)] if pid is not None else []
    out = subprocess.run(
        ["perf", "report", "-i", str(data), *only, "--stdio", "-q", "--sort", "dso,sym", "--percent-limit", "5"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0].endswith("%"):
            rows.append((float(f[0][:-1]), f[1], f[-1]))
    return rows


def buildids(data: Path) -> dict[str, str]:
    """perf's build-id list of the recording: path -> build-id."""
    out = subprocess.run(["perf", "buildid-list", "-i", str(data)], capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in out.splitlines() if " " in line}


def test_perf_launched_names_the_hot_function_of_the_copied_code(env: tuple[Env, Path], tmp_path: Path):
    e, spin = env
    data = tmp_path / "perf.data"
    res = subprocess.run(
        perf_record(data, "--", spin),
        capture_output=True,
        text=True,
        env=audit_env(e),
        check=True,
    )
    n = nwin(spin)
    assert shared_lines(res.stderr)[str(spin)][:2] == (n, n), res.stderr
    top = report(data)[0]
    assert top[1:] == ("spin", "hugify_hot_spin"), report(data)


@pytest.mark.parametrize("how", ["-p", "-a"])
def test_perf_attached_names_the_hot_function_through_the_copy(env: tuple[Env, Path], tmp_path: Path, how: str):
    """Attached to the running process (-p) or system-wide (-a), perf learns the mapping
    from /proc/PID/maps: the copy's path, whose file it reads (build-id, symbols). The
    copy has the original's build-id, and no perf map is needed or written."""
    e, spin = env
    data = tmp_path / "perf.data"
    copy = copy_of(e, spin)
    with held(e, [str(spin), "wait"]) as p:
        assert mapped_from_copy(p.pid, copy)
        target = ["-p", str(p.pid)] if how == "-p" else ["-a"]
        perf = perf_attached(data, *target)
        try:
            time.sleep(2.0)  # perf is attached
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.close()
            assert p.wait(timeout=120) == 0
        finally:
            perf.send_signal(signal.SIGINT)
            _, err = perf.communicate(timeout=120)
        assert not Path(f"/tmp/perf-{p.pid}.map").exists()
    rows = [r for r in report(data, p.pid) if r[2] == "hugify_hot_spin"]
    assert rows and rows[0][1] == "spin", report(data, p.pid)
    assert buildids(data).get(copy) == build_id(spin), (buildids(data), err)


# --- gdb --------------------------------------------------------------------------------


def test_gdb_attached_breaks_and_backtraces_in_the_copied_code(env: tuple[Env, Path], tmp_path: Path):
    """gdb attached to the running process (its code mapped from the copy) stops at a
    breakpoint in the copied window, backtraces to main, and its pc is in the copy's
    mapping; its library list is the files'."""
    e, spin = env
    copy = copy_of(e, spin)
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # the program's stdin: gdb's shell writes the line
    try:
        with held(e, [str(spin), "wait"], stdin=fd) as p:
            commands = (
                "break hugify_hot_spin",
                f"shell echo go > {fifo}",
                "continue",
                "bt",
                "p/x $pc",
                "info proc mappings",
                "info sharedlibrary",
                "kill",
            )
            res = subprocess.run(
                ["gdb", "-nx", "-batch", "-p", str(p.pid), *(a for c in commands for a in ("-ex", c))],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
    finally:
        os.close(fd)
    out = res.stdout + res.stderr
    assert re.search(r"^Breakpoint 1, (0x[0-9a-f]+ in )?hugify_hot_spin \(", out, re.M), out
    assert re.search(r"^#1 +0x[0-9a-f]+ in main \(", out, re.M), out
    pc = int(re.findall(r"^\$1 = 0x([0-9a-f]+)$", out, re.M)[0], 16)
    maps = re.findall(r"^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+(\S+)\s*(\S*)$", out, re.M)
    (where,) = [obj for lo, hi, _, obj in maps if int(lo, 16) <= pc < int(hi, 16)]
    assert where == copy, (hex(pc), maps)
    libs = re.findall(r"^0x[0-9a-f]+\s+0x[0-9a-f]+\s+\S+(?: \(\*\))?\s+(/\S+)$", out, re.M)
    assert libs and not [x for x in libs if x.startswith(str(e.store))], libs


# --- core dumps -------------------------------------------------------------------------


def modules(core: Path, executable: Path | None = None) -> dict[str, tuple[str, str]]:
    """eu-unstrip -n --core: build-id -> (file found, module name)."""
    argv = ["eu-unstrip", "-n", "--core", str(core)] + (["-e", str(executable)] if executable else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        rows[f[1].split("@")[0]] = (f[2], f[4])
    return rows


def assert_modules_named(core: Path, e: Env) -> None:
    """Every hugified object's module has its file's build-id; the libraries are named by
    their paths (ld.so's list), the program by its build-id (elfutils names a module from
    the core's file note only when one file maps all of it: its windows are the copy's),
    and by its path with -e."""
    mods = modules(core)
    for lib in (e.progs.lib, e.progs.plug):
        bid = build_id(lib)
        assert bid in mods and mods[bid][1] == lib.name, (lib, mods)
    bid = build_id(e.progs.prog)
    assert bid in mods, mods
    assert modules(core, e.progs.prog)[bid][1] == e.progs.prog.name


def test_gcore_names_every_module_by_its_build_id(env: tuple[Env, Path], tmp_path: Path):
    e, _ = env
    with held(e, [str(e.progs.prog), str(e.progs.plug), "wait"]) as p:
        assert mapped_from_copy(p.pid, copy_of(e, e.progs.lib))
        subprocess.run(["gcore", "-o", str(tmp_path / "core"), str(p.pid)], capture_output=True, check=True)
        core = tmp_path / f"core.{p.pid}"
    assert_modules_named(core, e)


@contextlib.contextmanager
def core_pattern(pattern: str) -> Iterator[None]:
    """The kernel's core_pattern for the block, and the host's back after it."""
    with locked(Path("/tmp/hugify-core-pattern.lock")):
        before = CORE_PATTERN.read_text()
        CORE_PATTERN.write_text(pattern + "\n")
        try:
            yield
        finally:
            CORE_PATTERN.write_text(before)
        assert CORE_PATTERN.read_text() == before


def test_a_kernel_core_dump_names_every_module_by_its_build_id(env: tuple[Env, Path], tmp_path: Path):
    """A process killed by SIGSEGV dumps core (core_pattern set to a file of the test's
    for the test, the host's restored after); the dump keeps the objects' first pages
    (their ELF headers and build-id notes, which stay file-backed) and its file note
    names the copies for the windows."""
    e, _ = env
    # prlimit executes the program itself (one process): no core size limit for it.
    dumping = ["prlimit", "--core=unlimited", str(e.progs.prog), str(e.progs.plug), "wait"]
    with core_pattern(str(tmp_path / "core.%p")), held(e, dumping) as p:
        assert mapped_from_copy(p.pid, copy_of(e, e.progs.prog))
        p.send_signal(signal.SIGSEGV)
        p.wait(timeout=120)
    core = tmp_path / f"core.{p.pid}"
    assert p.returncode == -signal.SIGSEGV and core.is_file(), (p.returncode, list(tmp_path.iterdir()))
    assert_modules_named(core, e)
    notes = subprocess.run(["eu-readelf", "-n", str(core)], capture_output=True, text=True, check=True).stdout
    assert copy_of(e, e.progs.prog) in notes and str(e.progs.prog) in notes
