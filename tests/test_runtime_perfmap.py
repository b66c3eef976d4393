"""The anonymous copies seen by perf (runtime/hp_anon.c, docs/runtime.md "perf and
gdb"), on the real kernel: the copies carry no VMA name (perf reads a named anonymous
VMA, `[anon:NAME]`, as a file it cannot find, never as a JIT map's memory).

The copies are forced (`--anonymous=always`): this host's ext4 gives file-backed 2 MiB
folios. Every test points HUGIFY_RUNTIME_DIR at a directory of its own. The programs
and runtime directories live under /var/tmp."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import readelf_windows
from runtime_support import HOT_SPIN, HP, HUGIFY_RUN, Programs, _functions, build_runtime, copy_programs, hugify

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
    + _functions("spin", 200, 16384)
    + r"""
static void wait_for_a_line(void) { char c; if (read(0, &c, 1) != 1) exit(2); }

/* quick: exits at once. wait: says so, waits for a line on stdin, spins.
 * fork [LIB]: forks; the child says its pid, waits for a line, spins; the parent
 * dlopen()s LIB meanwhile if given, says so, and waits for the child. */
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "quick";
    if (!strcmp(mode, "quick")) { printf("result %ld\n", spin_all(1)); return 0; }
    if (!strcmp(mode, "wait")) {
        printf("waiting\n"); fflush(stdout); wait_for_a_line();
        printf("result %ld %ld\n", spin_all(1), hugify_hot_spin(1)); return 0;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) return 3;
    if (child == 0) {
        printf("child %d\n", (int)getpid()); fflush(stdout);
        wait_for_a_line();
        printf("result %ld %ld\n", spin_all(1), hugify_hot_spin(2)); fflush(stdout);
        return 0;
    }
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
    """The hugified test program (`prog`) and a hugified library to dlopen (`plug`), in
    a directory everyone may read."""

    dir: Path

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
        (work / "prog.c").write_text(PROGRAM)
        cc = ["gcc", "-O1", "-g", "-fPIE", "-pie", "-o", "prog.orig", "prog.c", "-ldl"]
        subprocess.run(cc, cwd=work, check=True)
        res = hugify("transform", "--threshold", "0", work / "prog.orig", "-o", work / "prog")
        assert res.returncode == 0, res.stderr
        copy_programs(built, work / "lib")
        shutil.copy(work / "lib" / "libplug.so", work / "libplug.so")
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


def environment(rundir: Path, **more: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    return {**base, "HUGIFY_RUNTIME_DIR": str(rundir), "HUGIFY_DEBUG": "1", **more}


def windows(path: Path) -> int:
    return sum(size // HP for _, size in readelf_windows(path, False))


def copy_line(stderr: str, path: Path) -> str:
    m = re.search(rf"^hugify-audit: anonymous {re.escape(str(path))}: (\d+/\d+) windows copied", stderr, re.M)
    assert m, stderr
    return m[1]


# --- VMA names -------------------------------------------------------------------------------

SECCOMP_KILL_PR_SET_VMA = r"""
import ctypes, os, platform, struct, sys
nr = {"x86_64": 157, "aarch64": 167}[platform.machine()]  # prctl
insns = [
    struct.pack("HBBI", 0x20, 0, 0, 0),  # ld [0]: the system call number
    struct.pack("HBBI", 0x15, 0, 3, nr),  # jeq prctl, else allow
    struct.pack("HBBI", 0x20, 0, 0, 16),  # ld [16]: args[0], low half
    struct.pack("HBBI", 0x15, 0, 1, 0x53564D41),  # jeq PR_SET_VMA, else allow
    struct.pack("HBBI", 0x06, 0, 0, 0x80000000),  # ret KILL_PROCESS
    struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000),  # ret ALLOW
]
prog = ctypes.create_string_buffer(b"".join(insns))
buf = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(insns), ctypes.addressof(prog)))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.addressof(buf), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_copies_carry_no_vma_name(files: Files, rundir: Path):
    """perf (Debian's 6.1 and 6.12, tools/perf/util/map.c is_anon_memory and
    synthetic-events.c) takes only a nameless anonymous VMA ("//anon") for a JIT's
    memory, named by /tmp/perf-PID.map; a named one, `[anon:NAME]` in /proc/PID/maps
    where the kernel has CONFIG_ANON_VMA_NAME, it takes for a file of that name and
    names nothing in it. So the runtime never names its copies: a process that would
    die at prctl(PR_SET_VMA, ...) runs, its windows copied. (None of Debian's kernels
    names anonymous VMAs, this host's neither: there /proc cannot show the difference.)"""
    res = subprocess.run(
        [sys.executable, "-c", SECCOMP_KILL_PR_SET_VMA, str(HUGIFY_RUN), "--anonymous=always", str(files.prog)],
        capture_output=True,
        text=True,
        env=environment(rundir),
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert copy_line(res.stderr, files.prog) == f"{windows(files.prog)}/{windows(files.prog)}"
