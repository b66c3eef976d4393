"""Support for the tests of the shared mode (tests/test_runtime_shared*.py): the
hugified test programs on a tmpfs without huge pages (the engine finds file-backed huge
pages `unsupported` there, as on a filesystem without large folios), a runtime
directory of the test's own, root's `hugify prefetch` and the program run through the
audit library, and the reading of what the process mapped from the copies."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hugify import kernel, shared
from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_windows
from testkit.runtime import AUDIT_LIB, Programs, copy_programs, thp_steady
from testkit.smaps import smaps_of

SHARED_LINE = re.compile(r"^hugify-audit: shared (\S+): (\d+)/(\d+) windows mapped(.*)$", re.M)


@dataclass
class Env:
    progs: Programs
    run: Path  # the runtime directory

    @property
    def store(self) -> Path:
        return self.run / "shared"

    def env(self, **extra: str) -> dict[str, str]:
        out = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
        return {**out, "HUGIFY_RUNTIME_DIR": str(self.run), **extra}


def mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "hugify-test", str(where)], check=True)


def unmount(where: Path) -> None:
    """Unmounts (detached if still busy: a process the test started may still map it)."""
    while kernel.mount_on(where) is not None:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


@contextlib.contextmanager
def files_on_tmpfs(built: Programs, base: Path, steady: bool = True) -> Iterator[Env]:
    """The hugified programs on a tmpfs without huge pages, and an empty runtime
    directory (root's, 0755); everything mounted is unmounted after. `steady`: THP's
    settings are not changed by another test meanwhile (the copies depend on
    shmem_enabled); the one test that changes them holds that lock itself."""
    with thp_steady() if steady else contextlib.nullcontext():
        src, run = base / "src", base / "run"
        mount_tmpfs(src, "size=96M,mode=0755")
        run.mkdir(mode=0o755)
        os.chmod(run, 0o755)
        try:
            yield Env(copy_programs(built, src / "bin"), run)
        finally:
            unmount(run / "shared")
            unmount(src)


@contextlib.contextmanager
def files_in_public(built: Programs, steady: bool = True) -> Iterator[Env]:
    """files_on_tmpfs in a directory every user may list and a runtime directory every
    user may enter, as /usr and /run/hugify are: root copies only what every user may
    read there (pytest's own directories are root's 0700: a store there is root's alone,
    whatever it copies)."""
    base = Path(tempfile_dir())
    try:
        with files_on_tmpfs(built, base, steady) as e:
            yield e
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def prefetch(
    e: Env, *files: Path, policy: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    args: list[str | Path] = ["prefetch", *(files or e.progs.files)]
    if policy is not None:
        pfile = e.run.parent / "policy.toml"
        pfile.write_text(policy)
        args += ["--policy", pfile]
    if user:
        return hugify(*args, runner=["runuser", "-u", user, "--"], env=e.env(), check=False)
    return hugify(*args, add_env={"HUGIFY_RUNTIME_DIR": str(e.run)}, check=False)


def nwin(path: Path) -> int:
    return sum(size for _, size in readelf_windows(path, False)) // HP


def run(e: Env, argv: list[str | Path], **extra: str) -> subprocess.CompletedProcess[str]:
    env = e.env(LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1", **extra)
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert res.returncode == 0, f"{argv} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr}"
    return res


def plain(e: Env) -> str:
    res = subprocess.run(
        [str(e.progs.prog), str(e.progs.plug)], capture_output=True, text=True, env=e.env(), check=True
    )
    return result(res.stdout)


def result(stdout: str) -> str:
    (line,) = [x for x in stdout.splitlines() if x.startswith("result ")]
    return line


class _AnyCopy(str):
    """Matches any " from COPY" tail of a shared line."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith(" from ")

    __hash__ = str.__hash__


ANY_COPY = _AnyCopy(" from ")


def shared_lines(stderr: str) -> dict[str, tuple[int, int, str]]:
    return {os.path.realpath(m[1]): (int(m[2]), int(m[3]), m[4]) for m in SHARED_LINE.finditer(stderr)}


def copies_of(e: Env) -> dict[str, shared.Record]:
    """The records in the store, by the original's real path."""
    out = {}
    for d in e.store.iterdir():
        rec = shared.Record.parse((d / "record").read_text())
        assert rec is not None, d
        out[os.path.realpath(rec.path)] = rec
    return out


def assert_mapped_from_copies(e: Env, res: subprocess.CompletedProcess[str]) -> None:
    """Every window of the three objects is one PMD of its shared copy, and the debug
    line says so."""
    maps = smaps_of(res)
    lines = shared_lines(res.stderr)
    for f in e.progs.files:
        rec = copies_of(e)[os.path.realpath(f)]
        copy = str(e.store / rec.key / rec.name)
        n = nwin(f)
        assert lines[os.path.realpath(f)] == (n, n, f" from {copy}"), res.stderr
        from_copy = [v for v in maps if v.name == copy and "x" in v.perms]
        assert sum(v.hi - v.lo for v in from_copy) == n * HP, (f, from_copy)
        assert all(v.shmem_pmd == v.hi - v.lo for v in from_copy), from_copy


def assert_kept(e: Env, res: subprocess.CompletedProcess[str], why: str, files: list[Path] | None = None) -> None:
    """The program ran as plainly, every window of `files` on its file mapping, and one
    shared line per object names the first window left and why."""
    assert result(res.stdout) == plain(e)
    maps = smaps_of(res)
    lines = shared_lines(res.stderr)
    for f in files or e.progs.files:
        n = nwin(f)
        assert lines[os.path.realpath(f)][:2] == (0, n), res.stderr
        assert re.fullmatch(rf", window 0 {why}: file mapping kept", lines[os.path.realpath(f)][2]), res.stderr
        assert not [v for v in maps if v.name.startswith(str(e.store))], maps
    assert len(SHARED_LINE.findall(res.stderr)) == len(files or e.progs.files), res.stderr


def meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(key)


def waiting(e: Env, **extra: str) -> subprocess.Popen[str]:
    """The program, started through the audit library, stopped after loading (it waits
    for a line on stdin) so that a test can look at it."""
    env = e.env(LD_AUDIT=str(AUDIT_LIB), HUGIFY_DEBUG="1", **extra)
    p = subprocess.Popen(
        [str(e.progs.prog), str(e.progs.plug), "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None and p.stdout.readline() == "waiting\n"
    return p


def finish(p: subprocess.Popen[str]) -> str:
    out, err = p.communicate("go\n", timeout=120)
    assert p.returncode == 0, err
    return out


def tempfile_dir() -> str:
    """A directory every user may enter (pytest's are root's 0700)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="hugify-shared-")
    os.chmod(d, 0o755)
    return d
