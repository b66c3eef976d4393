"""perf's map of the anonymous copies (runtime/hp_anon.c, docs/runtime-reference.md "perf and
gdb"), on the real kernel with the real perf: /tmp/perf-PID.map is written only when
asked (HUGIFY_PERF_MAP=1), then created 0600 by the process's own user, exclusively,
never through a name someone else planted, completely or not at all; a forked child
gets a map of its own pid, so that `perf record -p CHILD` and `perf record -a` started
after the fork name the child's copied code; the copies carry no VMA name (perf reads a
named anonymous VMA, `[anon:NAME]`, as a file it cannot find, never as a JIT map's
memory).

The copies are forced (`--anonymous=always`): this host's ext4 gives file-backed 2 MiB
folios. Every test points HUGIFY_RUNTIME_DIR at a directory of its own. The programs
and runtime directories live under /var/tmp, not /tmp: some tests mount a tmpfs of
their own over /tmp (in a mount namespace: what is left there is what their processes
left, whatever else runs on this shared machine), and one runs them as an unprivileged
user (pytest's own /tmp directory is root's alone)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import HP
from testkit.elf import exec_load, readelf_windows
from testkit.runtime import (
    AUDIT_LIB,
    HOT_SPIN,
    HUGIFY_RUN,
    SECCOMP_KILL_PROCESS,
    Programs,
    build_hugified,
    build_runtime,
    copy_programs,
    padded_functions,
    perf_attached,
    seccomp_program,
)

NOBODY = pwd.getpwnam("nobody")
#: What the audit library says about the map with HUGIFY_DEBUG=1.
MAP_LINE = re.compile(r"^hugify-audit: perf map (/tmp/perf-\d+\.map): (.*)$", re.M)

PROGRAM = (
    r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
"""
    + HOT_SPIN
    + padded_functions("spin", 200)
    + r"""
static void wait_for_a_line(void) { char c; if (read(0, &c, 1) != 1) exit(2); }

/* quick: exits at once. wait: says so, waits for a line on stdin, spins.
 * fork [LIB]: forks; the child says its pid, waits for a line, spins; the parent
 * then dlopen()s LIB if given, says so, and waits for the child. */
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "quick";
    if (!strcmp(mode, "quick")) { printf("result %ld\n", spin_all(1)); return 0; }
    if (!strcmp(mode, "wait")) {
        printf("waiting\n"); fflush(stdout); wait_for_a_line();
        printf("result %ld %ld\n", spin_all(1), hugify_hot_spin(1)); return 0;
    }
    fflush(stdout);
    /* The parent goes on once the child has said its pid: the two lines come in one
     * order however the scheduler runs them. */
    int said[2];
    if (pipe(said)) return 3;
    pid_t child = fork();
    if (child < 0) return 3;
    if (child == 0) {
        printf("child %d\n", (int)getpid()); fflush(stdout);
        if (write(said[1], "", 1) != 1) return 5;
        wait_for_a_line();
        printf("result %ld %ld\n", spin_all(1), hugify_hot_spin(2)); fflush(stdout);
        return 0;
    }
    char c;
    if (read(said[0], &c, 1) != 1) return 3;
    if (argc > 2) {
        void *h = dlopen(argv[2], RTLD_NOW);
        if (!h) { printf("dlopen: %s\n", dlerror()); fflush(stdout); }
        else { printf("parent dlopened\n"); fflush(stdout); }
    }
    int st;
    return waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 4;
}
"""
)


@dataclass
class Files:
    """The hugified test program (`prog`), a hugified library to dlopen (`plug`) and the
    runtime that starts them (`run`: hugify-run, with the audit library beside it), in a
    directory everyone may read. The runtime is copied there because the checkout may be
    under /tmp, where the tmpfs some tests mount would hide it."""

    dir: Path

    @property
    def run(self) -> Path:
        return self.dir / "hugify-run"

    @property
    def prog(self) -> Path:
        return self.dir / "prog"

    @property
    def plug(self) -> Path:
        return self.dir / "libplug.so"


@pytest.fixture(scope="module")
def files(built: Programs) -> Iterator[Files]:
    build_runtime()
    work = Path(tempfile.mkdtemp(prefix="hugify-perfmap-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        build_hugified(work, "prog", PROGRAM, "-g", "-ldl")
        copy_programs(built, work / "lib")
        shutil.copy(work / "lib" / "libplug.so", work / "libplug.so")
        for runtime in (HUGIFY_RUN, AUDIT_LIB):
            shutil.copy(runtime, work / runtime.name)
        for f in (work / "prog", work / "libplug.so"):
            f.chmod(0o755)
        yield Files(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def rundir() -> Iterator[Path]:
    """The test's runtime directory (HUGIFY_RUNTIME_DIR), outside /tmp as well."""
    d = Path(tempfile.mkdtemp(prefix="hugify-perfmap-run-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def perf_map(pid: int) -> Path:
    return Path(f"/tmp/perf-{pid}.map")


def environment(rundir: Path, **more: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    return {**base, "HUGIFY_RUNTIME_DIR": str(rundir), "HUGIFY_DEBUG": "1", **more}


def made_since(path: Path, t0_ns: int) -> bool:
    """Whether a file is at `path` that was made (or changed) after `t0_ns`: a map of the
    same pid left by an earlier process on this shared machine does not count."""
    try:
        return path.lstat().st_ctime_ns >= t0_ns
    except FileNotFoundError:
        return False


def windows(path: Path) -> int:
    return sum(size // HP for _, size in readelf_windows(path, False))


def copy_line(stderr: str, path: Path) -> str:
    m = re.search(rf"^hugify-audit: anonymous {re.escape(str(path))}: (\d+/\d+) windows copied", stderr, re.M)
    assert m, stderr
    return m[1]


def functions_in_windows(path: Path) -> set[str]:
    """The names of the functions (FUNC and IFUNC symbols of .symtab, readelf's) that
    start in the whole windows of `path`: what its perf map must name."""
    x = exec_load(path)
    lo = x.vaddr + (-x.vaddr % HP)
    hi = lo + windows(path) * HP
    out = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    table = out.split("Symbol table '.symtab'", 1)[1]
    names = set()
    for line in table.splitlines():
        f = line.split()
        if len(f) == 8 and f[3] in ("FUNC", "IFUNC") and f[6] != "UND" and lo <= int(f[1], 16) < hi:
            names.add(f[7].split("@")[0])
    return names


def map_entries(text: str) -> list[tuple[int, int, str]]:
    """perf's JIT map format, `START SIZE NAME` in hex, one a line, every line complete."""
    assert text.endswith("\n"), text[-200:]
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"([0-9a-f]+) ([0-9a-f]+) (\S+)", line)
        assert m, line
        out.append((int(m[1], 16), int(m[2], 16), m[3]))
    return out


def anonymous_code(pid: int) -> list[tuple[int, int]]:
    """The anonymous executable ranges of a process (its copies), from /proc/PID/maps."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        f = line.split()
        if "x" in f[1] and f[4] == "0" and len(f) == 5:
            lo, hi = (int(a, 16) for a in f[0].split("-"))
            out.append((lo, hi))
    return out


class Running:
    """The program started in the mode (hugify-run execs it: same pid), talked to
    through stdin/stdout; its stderr (the debug lines) is read when it ends."""

    def __init__(self, argv: list[str | Path], env: dict[str, str], before: str = ""):
        """`before`: shell commands run first by the process that then becomes the
        program (its pid is $$ there)."""
        self.t0 = time.time_ns()
        self.proc = subprocess.Popen(
            ["sh", "-c", f'{before or "true"} && exec "$@"', "sh", *map(str, argv)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pids = [self.proc.pid]
        self.stderr = ""

    def line(self) -> str:
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        assert text, f"the program ended: {self.finish()}"
        return text.rstrip("\n")

    def child(self) -> int:
        line = self.line()
        m = re.fullmatch(r"child (\d+)", line)
        assert m, line
        self.pids.append(int(m[1]))
        return int(m[1])

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 120) -> str:
        """Waits for the end (after telling it to go on); the rest of stdout."""
        try:
            out, self.stderr = self.proc.communicate("\n", timeout=timeout)
        except (subprocess.TimeoutExpired, ValueError, BrokenPipeError):
            self.proc.kill()
            out, self.stderr = self.proc.communicate()
        return out

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids:  # the maps it made (or a name planted for it), no other's
            if made_since(perf_map(pid), self.t0):
                perf_map(pid).unlink()


@pytest.fixture
def started() -> Iterator[list[Running]]:
    runs: list[Running] = []
    yield runs
    for r in runs:
        r.cleanup()


def start(started: list[Running], argv: list[str | Path], env: dict[str, str], before: str = "") -> Running:
    r = Running(argv, env, before)
    started.append(r)
    return r


# --- when the map is written ---------------------------------------------------------------


def in_own_tmp(argv: list[str | Path], env: dict[str, str], size: str = "64m", times: int = 1) -> tuple[str, str]:
    """Runs `argv` `times` times in a mount namespace of its own with an empty tmpfs of
    `size` on /tmp (so that what is found there is what these processes left, whatever
    else runs on the machine); stdout gets, after the runs' own output, "LEFT NAME SIZE"
    for each file left in /tmp and then its contents."""
    script = (
        'mount -t tmpfs -o "size=$1,mode=1777" hugify-test /tmp && n=$2 && shift 2 && '
        'while [ "$n" -gt 0 ]; do "$@" > /dev/null || exit 1; n=$((n - 1)); done && '
        'for f in /tmp/* /tmp/.[!.]*; do [ -e "$f" ] && echo "LEFT $f $(stat -c %s "$f")" && cat "$f"; done; true'
    )
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", size, str(times), *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60 + 2 * times,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout, res.stderr


def left_maps(stdout: str) -> dict[str, str]:
    """The files left in the private /tmp (in_own_tmp): name -> contents."""
    out = {}
    for part in stdout.split("LEFT ")[1:]:
        header, text = part.split("\n", 1)
        name, size = header.rsplit(" ", 1)
        assert len(text.encode()) == int(size), header
        out[name] = text
    return out


def test_short_processes_leave_nothing_in_tmp_by_default(files: Files, rundir: Path):
    """The bound: no map unless asked. 100 short processes that each copied their
    windows leave no byte in /tmp (each would have left its map, which nothing removes:
    perf report reads it after the process ended); asked, each leaves exactly its own."""
    quick = [files.run, "--anonymous=always", files.prog, "quick"]
    n = windows(files.prog)
    out, err = in_own_tmp(quick, environment(rundir), times=100)
    assert len(re.findall(rf"^hugify-audit: anonymous \S+/prog: {n}/{n} windows copied$", err, re.M)) == 100
    assert left_maps(out) == {}
    out, err = in_own_tmp(quick, environment(rundir, HUGIFY_PERF_MAP="1"), times=5)
    assert len(re.findall(rf"^hugify-audit: anonymous \S+/prog: {n}/{n} windows copied$", err, re.M)) == 5
    left = left_maps(out)
    assert len(left) == 5 and all(re.fullmatch(r"/tmp/perf-\d+\.map", name) for name in left), list(left)
    names = functions_in_windows(files.prog)
    for text in left.values():
        assert {name for _, _, name in map_entries(text)} == names


# --- how it is created -----------------------------------------------------------------------


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_map_is_the_users_own_and_private(files: Files, rundir: Path, started: list[Running], user: str):
    """0600 whatever the umask (0 here), owned by the process's user (a root daemon's
    map gives away the exact addresses of its code, which /proc/PID/maps keeps from
    other users), a regular file naming the functions of the copied windows at their
    run-time addresses, inside the process's anonymous copies."""
    rundir.chmod(0o777)
    nobody = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
    r = start(
        started,
        [*(nobody if user == "nobody" else []), files.run, "--anonymous=always", files.prog, "wait"],
        environment(rundir, HUGIFY_PERF_MAP="1"),
        "umask 0",
    )
    assert r.line() == "waiting"
    st = os.lstat(perf_map(r.proc.pid))
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert st.st_uid == (NOBODY.pw_uid if user == "nobody" else 0)
    entries = map_entries(perf_map(r.proc.pid).read_text())
    assert {name for _, _, name in entries} == functions_in_windows(files.prog)
    copies = anonymous_code(r.proc.pid)
    assert len(copies) >= 1
    assert all(any(lo <= start < hi for lo, hi in copies) for start, _, _ in entries)
    r.finish()
    assert r.proc.returncode == 0, r.stderr


#: What is at /tmp/perf-PID.map before the program (which will have PID) starts,
#: planted by the shell that becomes the program, as a local user would plant it.
PLANT = {
    # a map left by an earlier process of the same user and pid
    "stale-own": 'echo "1000 10 a_function_of_an_earlier_process" > "$M" && chmod 644 "$M"',
    # a name that would send the writes elsewhere
    "symlink-to-root-file": 'ln -s "$TARGET" "$M" && chown -h nobody "$M"',
    # to read the addresses from it
    "file-of-another-user": 'touch "$M" && chmod 666 "$M" && chown nobody "$M"',
    # to stop the process at its start
    "fifo-of-another-user": 'mkfifo -m 666 "$M" && chown nobody "$M"',
}


def plant(kind: str) -> str:
    # (a map at the name already, of an earlier process with this pid, goes first)
    return f'M=/tmp/perf-$$.map && rm -f "$M" && {PLANT[kind]}'


def test_stale_map_of_the_same_user_is_replaced(files: Files, rundir: Path, started: list[Running]):
    """A map left by an earlier process of this user with the same pid (pids are
    reused) names other code: it is removed and the map made afresh (O_EXCL), 0600."""
    r = start(
        started,
        [files.run, "--anonymous=always", files.prog, "wait"],
        environment(rundir, HUGIFY_PERF_MAP="1"),
        plant("stale-own"),
    )
    assert r.line() == "waiting"
    text = perf_map(r.proc.pid).read_text()
    assert "a_function_of_an_earlier_process" not in text
    assert {name for _, _, name in map_entries(text)} == functions_in_windows(files.prog)
    assert stat.S_IMODE(perf_map(r.proc.pid).stat().st_mode) == 0o600
    r.finish()
    assert r.proc.returncode == 0, r.stderr


@pytest.mark.parametrize("kind", ["symlink-to-root-file", "file-of-another-user", "fifo-of-another-user"])
def test_a_name_planted_by_someone_else_is_left_alone(
    files: Files, rundir: Path, started: list[Running], tmp_path: Path, kind: str
):
    """As root, with the kernel's protected_symlinks/protected_regular off as on this
    host: the planted name is neither followed, written, truncated nor removed, the
    program runs on (its copies made, no map), and the debug line says why."""
    target = tmp_path / "root-file"
    target.write_text("precious\n")
    target.chmod(0o644)
    r = start(
        started,
        [files.run, "--anonymous=always", files.prog, "quick"],
        environment(rundir, HUGIFY_PERF_MAP="1", TARGET=str(target)),
        plant(kind),
    )
    out = r.finish(timeout=60)
    pid = r.proc.pid
    name = perf_map(pid)
    try:
        assert r.proc.returncode == 0 and out.startswith("result "), (r.proc.returncode, r.stderr)
        assert copy_line(r.stderr, files.prog) == f"{windows(files.prog)}/{windows(files.prog)}"
        st = os.lstat(name)
        assert st.st_uid == NOBODY.pw_uid
        if kind == "symlink-to-root-file":
            assert stat.S_ISLNK(st.st_mode) and os.readlink(name) == str(target)
        elif kind == "file-of-another-user":
            assert stat.S_ISREG(st.st_mode) and st.st_size == 0
        else:
            assert stat.S_ISFIFO(st.st_mode)
        assert target.read_text() == "precious\n"
        (line,) = [m[2] for m in MAP_LINE.finditer(r.stderr) if m[1] == str(name)]
        assert re.fullmatch(r"left alone, not this user's regular file \((symlink|owner \d+|fifo)\)", line), line
    finally:
        name.unlink(missing_ok=True)


def test_map_is_written_completely_or_not_at_all(files: Files, rundir: Path):
    """On a /tmp that is full (a 4 KiB tmpfs, in a mount namespace of its own) no map is
    left, rather than a cut one (a cut line names a function with a wrong size or the
    wrong name); with room, the same run leaves the whole map."""
    quick = [files.run, "--anonymous=always", files.prog, "quick"]
    n = windows(files.prog)
    out, err = in_own_tmp(quick, environment(rundir, HUGIFY_PERF_MAP="1"), size="4k")
    assert re.search(rf"^hugify-audit: anonymous \S+/prog: {n}/{n} windows copied$", err, re.M), err
    assert left_maps(out) == {}
    assert re.search(r"^hugify-audit: perf map /tmp/perf-\d+\.map: not written \(errno 28\)$", err, re.M), err
    out, err = in_own_tmp(quick, environment(rundir, HUGIFY_PERF_MAP="1"), size="1m")
    (text,) = left_maps(out).values()
    assert {name for _, _, name in map_entries(text)} == functions_in_windows(files.prog)


# --- VMA names -------------------------------------------------------------------------------

#: Runs argv[1:] killed by a seccomp filter at prctl(PR_SET_VMA, …) (args[0]), every
#: other prctl allowed.
SECCOMP_KILL_PR_SET_VMA = seccomp_program({"x86_64": 157, "aarch64": 167}, SECCOMP_KILL_PROCESS, equal={0: 0x53564D41})


def test_copies_carry_no_vma_name(files: Files, rundir: Path):
    """perf (Debian's 6.1 and 6.12, tools/perf/util/map.c is_anon_memory and
    synthetic-events.c) takes only a nameless anonymous VMA ("//anon") for a JIT's
    memory, named by /tmp/perf-PID.map; a named one, `[anon:NAME]` in /proc/PID/maps
    where the kernel has CONFIG_ANON_VMA_NAME, it takes for a file of that name and
    names nothing in it. So the runtime never names its copies: a process that would
    die at prctl(PR_SET_VMA, ...) runs, its windows copied. (None of Debian's kernels
    names anonymous VMAs, this host's neither: there /proc cannot show the difference.)"""
    res = subprocess.run(
        [sys.executable, "-c", SECCOMP_KILL_PR_SET_VMA, str(files.run), "--anonymous=always", str(files.prog)],
        capture_output=True,
        text=True,
        env=environment(rundir),
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert copy_line(res.stderr, files.prog) == f"{windows(files.prog)}/{windows(files.prog)}"


# --- forked children ---------------------------------------------------------------------------


def perf_top_symbol(data: Path, pid: int) -> str:
    rep = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--sort", "sym", "--pid", str(pid), "--percentage", "relative"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in rep.splitlines() if line.strip() and not line.startswith("#")]
    assert rows, rep
    return rows[0][-1]


def test_a_forked_child_has_a_map_of_its_own(files: Files, rundir: Path, started: list[Running]):
    """The child gets /tmp/perf-CHILD.map at the fork, naming the copies it inherited;
    what the parent copies after the fork (a dlopen) goes into the parent's map only:
    the child's map is then a file of its own, 0600, owned by the user."""
    r = start(
        started,
        [files.run, "--anonymous=always", files.prog, "fork", files.plug],
        environment(rundir, HUGIFY_PERF_MAP="1"),
    )
    child = r.child()
    assert r.line() == "parent dlopened"
    parent = r.proc.pid
    prog_names = functions_in_windows(files.prog)
    plug_names = functions_in_windows(files.plug)
    parent_names = {name for _, _, name in map_entries(perf_map(parent).read_text())}
    child_names = {name for _, _, name in map_entries(perf_map(child).read_text())}
    assert parent_names == prog_names | plug_names
    assert child_names == prog_names
    st = os.lstat(perf_map(child))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    assert (st.st_dev, st.st_ino) != (os.stat(perf_map(parent)).st_dev, os.stat(perf_map(parent)).st_ino)
    out = r.finish()
    assert r.proc.returncode == 0 and "result " in out, r.stderr


def test_no_map_for_a_forked_child_by_default(files: Files, rundir: Path, started: list[Running]):
    t0 = time.time_ns()
    r = start(started, [files.run, "--anonymous=always", files.prog, "fork"], environment(rundir))
    child = r.child()
    assert not made_since(perf_map(child), t0) and not made_since(perf_map(r.proc.pid), t0)
    out = r.finish()
    assert r.proc.returncode == 0 and "result " in out, r.stderr


@pytest.mark.parametrize("how", ["-p", "-a"])
def test_perf_started_after_the_fork_names_the_childs_copied_code(
    files: Files, rundir: Path, started: list[Running], tmp_path: Path, how: str
):
    """`perf record -p CHILD` and `perf record -a`, started after the fork, read the
    child's mappings from /proc/CHILD/maps (the copies: anonymous) and name them from
    /tmp/perf-CHILD.map: the child's hot function is perf report's first row for the
    child (cpu-clock: this host has no hardware PMU)."""
    r = start(
        started,
        [files.run, "--anonymous=always", files.prog, "fork"],
        environment(rundir, HUGIFY_PERF_MAP="1"),
    )
    child = r.child()
    data = tmp_path / "perf.data"
    target = ["-p", str(child)] if how == "-p" else ["-a"]
    perf = perf_attached(data, *target)
    try:
        time.sleep(2.0)  # perf has read /proc and is recording
        out = r.finish()
        assert r.proc.returncode == 0 and "result " in out, r.stderr
        if how == "-a":
            perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=120)
        assert perf.returncode in (0, -signal.SIGINT), err  # -a: ended by SIGINT, which perf raises again
    finally:
        if perf.poll() is None:
            perf.kill()
            perf.wait()
    assert perf_top_symbol(data, child) == "hugify_hot_spin"


def test_perf_recording_before_the_start_needs_no_map(
    files: Files, rundir: Path, started: list[Running], tmp_path: Path
):
    """Why no map is the default: `perf record -a` running when the program starts (as
    perf launching it) saw its files mapped, and the kernel tells perf nothing of the
    mremap that put each copy in place: the copies are named through the files, in the
    parent and, through perf's fork event, in the forked child, with no map written."""
    data = tmp_path / "perf.data"
    perf = perf_attached(data, "-a")
    try:
        time.sleep(2.0)
        t0 = time.time_ns()
        r = start(started, [files.run, "--anonymous=always", files.prog, "fork"], environment(rundir))
        child = r.child()
        out = r.finish()
        assert r.proc.returncode == 0 and "result " in out, r.stderr
        assert copy_line(r.stderr, files.prog) == f"{windows(files.prog)}/{windows(files.prog)}"
        assert not made_since(perf_map(child), t0) and not made_since(perf_map(r.proc.pid), t0)
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=120)
        assert perf.returncode in (0, -signal.SIGINT), err
    finally:
        if perf.poll() is None:
            perf.kill()
            perf.wait()
    assert perf_top_symbol(data, child) == "hugify_hot_spin"
