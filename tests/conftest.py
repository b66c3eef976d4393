"""Shared pytest set-up. Every hugify command the suite runs, directly or through
rpmbuild, dpkg-buildpackage, brp-hugify and dh_hugify, notes the reason ids it
prints in one log (hugify/reasons.py); when the run ends, each must be one that
`hugify explain` knows, or the run fails.

No test touches the host's runtime directory: each runs with HUGIFY_RUNTIME_DIR set to
a directory of its own (what every component reads and writes records in), and the run
fails if /run/hugify is not exactly as it was before it.

The summary says how far apart pytest-xdist's workers ended: one worker idle at the end
while the other still runs is time a run from empty caches could lose. (Handing items
out one at a time, the longest first, was measured worse: 50:26 against 44:47 from
empty caches. Items of one module then ran on both workers, each setting up the
module's fixtures, one waiting on the other's kernel boot.)

Fixtures more than one test file uses live here too."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hugify.reasons import LOG_ENV
from testkit import REPO
from testkit.cli import hugify
from testkit.runtime import Programs, build_programs, build_runtime, gives_large_folios, locked, loop_fs

#: The host's runtime directory, which the suite must leave as it found it.
HOST_RUNTIME_DIR = Path("/run/hugify")


def runtime_dir_state(directory: Path = HOST_RUNTIME_DIR) -> list[tuple[str, int, int, int, str]] | None:
    """What the directory holds: (name, mode, owner, modification time, content or link
    target) of each entry, itself first; None if it does not exist."""
    try:
        st = directory.lstat()
    except FileNotFoundError:
        return None
    out = [(".", st.st_mode, st.st_uid, st.st_mtime_ns, "")]
    for entry in sorted(directory.iterdir()):
        est = entry.lstat()
        if entry.is_symlink():
            what = "-> " + os.readlink(entry)
        elif entry.is_file():
            what = entry.read_bytes().decode(errors="replace")
        else:
            what = ""
        out.append((entry.name, est.st_mode, est.st_uid, est.st_mtime_ns, what))
    return out


_WORKERS_ENDED = pytest.StashKey[dict[str, float]]()
_HOST_RUN = pytest.StashKey[list[tuple[str, int, int, int, str]] | None]()
_OPENED = pytest.StashKey[list[tuple[Path, int]]]()


def open_checkout_to_others(repo: Path = REPO) -> list[tuple[Path, int]]:
    """Lets the tests that run as nobody or another user (setpriv, runuser) reach this
    checkout's programs and modules. `git clone . "$(mktemp -d)"` keeps mktemp's 0700 on
    the checkout: each directory above it that others may not search is given o+x
    (search only), and the checkout itself o+rx (Python finds a package on its path by
    listing the directory). The caller puts the modes back when the run ends. A directory
    of another owner is not changed: the run stops at once and says which. Returns
    (directory, former mode)."""
    opened = []
    top = repo.resolve()
    for d in (*reversed(top.parents), top):
        st, wanted = d.stat(), 0o005 if d == top else 0o001
        if st.st_mode & wanted == wanted:
            continue
        if st.st_uid != os.geteuid():
            raise pytest.UsageError(
                f"{d} (mode {st.st_mode & 0o7777:04o}, uid {st.st_uid}) keeps the tests that run as nobody out of "
                f"the checkout: clone it where others may {'list' if d == top else 'search'}"
            )
        d.chmod(st.st_mode | wanted)
        opened.append((d, st.st_mode & 0o7777))
        what = "readable and searchable by others (o+rx)" if d == top else "searchable by others (o+x)"
        print(f"conftest: {d} made {what} for the run's unprivileged tests; put back at its end")
    return opened


def pytest_configure(config: pytest.Config) -> None:
    # hugify as the tests run it reads the shipped policy, not this machine's
    # /etc/hugify/policy.toml (an administrator's policy must not change what the
    # suite sees). Tests about the policy layers set HUGIFY_POLICY_PATH themselves.
    os.environ.setdefault("HUGIFY_POLICY_PATH", str(REPO / "policy" / "policy.toml"))
    # The controller picks the log; xdist workers and every child process inherit it.
    if not hasattr(config, "workerinput") and LOG_ENV not in os.environ:
        fd, path = tempfile.mkstemp(prefix="hugify-reasons-", suffix=".log")
        os.close(fd)
        os.environ[LOG_ENV] = path
    if not hasattr(config, "workerinput"):
        config.stash[_HOST_RUN] = runtime_dir_state()
        config.stash[_OPENED] = open_checkout_to_others()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the controller (an xdist hook): when each worker finished its last item."""
    node.config.stash.setdefault(_WORKERS_ENDED, {})[node.gateway.id] = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    ended = config.stash.get(_WORKERS_ENDED, {})
    if len(ended) > 1:
        last = max(ended.values())
        apart = ", ".join(f"{w} {last - t:.0f} s before the last" for w, t in sorted(ended.items()) if t < last)
        terminalreporter.write_line(f"pytest's workers ended {last - min(ended.values()):.0f} s apart ({apart})")


def pytest_unconfigure(config: pytest.Config) -> None:
    opened: list[tuple[Path, int]] = config.stash.get(_OPENED, [])
    for d, mode in reversed(opened):
        d.chmod(mode)


@pytest.fixture(autouse=True)
def own_runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs with a runtime directory of its own (root's, mode 0700, empty): the
    records one test's runs keep never steer another's, nor the host's services."""
    rdir = tmp_path_factory.mktemp("run")
    monkeypatch.setenv("HUGIFY_RUNTIME_DIR", str(rdir))
    return rdir


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    before, after = session.config.stash.get(_HOST_RUN, None), runtime_dir_state()
    if before != after:
        report = session.config.pluginmanager.get_plugin("terminalreporter")
        say = report.write_line if report else print
        say(f"the run changed the host's {HOST_RUNTIME_DIR}: before {before}, after {after}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    log = Path(os.environ.get(LOG_ENV, ""))
    if not log.is_file():
        return
    seen = sorted(set(log.read_text(encoding="utf-8").split()))
    log.unlink()
    if not seen:
        return
    res = hugify("explain", *seen, check=False)
    if res.returncode != 0:
        print(f"\nreason ids printed during the run that `hugify explain` does not know:\n{res.stderr}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        print(f"\nall {len(seen)} reason ids printed during the run are explainable")


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Programs:
    """The runtime tests' hugified programs (testkit.runtime), built once per test file."""
    assert os.geteuid() == 0, "the runtime tests drop the page cache and need root (CI runs as root)"
    build_runtime()
    return build_programs(tmp_path_factory.mktemp(f"{request.module.__name__}-programs"))


@pytest.fixture(scope="module")
def large_folio_dir(built: Programs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory on a filesystem whose files get 2 MiB folios whatever kernel runs the
    suite: XFS (large folios since Linux 5.18; Debian 12 ships 6.1), on a loop device.
    The runtime tests keep their files there, so that what they assert does not hang on
    the filesystem of the host's /tmp (ext4 has large folios only from 6.16; the
    verdicts there are tests/test_runtime_host.py's, whatever they are). That XFS gives
    them is measured first (testkit.runtime.gives_large_folios), not assumed."""
    work = tmp_path_factory.mktemp("xfs")
    with loop_fs(work, "xfs", programs=built, size=4 << 30) as mnt:
        with locked():
            assert gives_large_folios(mnt / "bin" / "prog"), "XFS gave no 2 MiB folio (the tests need Linux 5.18 on)"
        yield mnt


@pytest.fixture
def fake_hugify(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in `hugify` for brp-hugify: it appends its arguments to the file returned
    with it and exits with $FAKE_STATUS (0 by default)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-hugify"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit ${{FAKE_STATUS:-0}}\n')
    fake.chmod(0o755)
    return fake, calls
