"""One booted trixie container: systemd-nspawn over an overlay of read-only layers.

The layers are the cached root and, above it, the cached provisioned layer (testkit.debusine
.deploy); what the running instance writes goes to an upper directory under its run
directory, dropped when it stops. The container runs in a session of its own: `unshare
--mount --pid --fork --kill-child` starts a shell in private mount and PID namespaces that
mounts the overlay there (the host's mount table never sees it) and becomes
`systemd-nspawn --boot`. Whatever ends that session (down, a crash, SIGKILL) ends every
process of the container with it and takes the overlay mount away; nothing of it survives
on the host but the run directory, which `stop` removes.

This host has no systemd as PID 1: nspawn runs with --register=no --keep-unit (nothing
registers with machined), so commands reach the container through nsenter into its PID 1's
namespaces rather than machinectl, and `stop` asks nspawn (SIGTERM) for the container's
orderly shutdown. The container shares the host's network namespace: see
testkit.debusine.ADDRESS for why and what listens where.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testkit.debian_roots import PRIVATE_SESSION

#: The niceness of every process of the container (its builds included).
NICE = 10
#: The environment commands run with inside the container.
INSIDE_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root", "TERM=dumb")

#: Runs on the host in the session's private mount namespace: $1 the run directory, $2 the
#: overlay's lowerdir (layers, top first); the rest are nspawn options.
SESSION = r"""
set -euo pipefail
W=$1 LOWER=$2
shift 2
mount -t overlay hugify-debusine -o "lowerdir=$LOWER,upperdir=$W/upper,workdir=$W/work" "$W/merged"
exec systemd-nspawn --register=no --keep-unit --quiet --console=read-only -D "$W/merged" --boot "$@"
"""


class ContainerError(RuntimeError):
    pass


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _nspid(pid: int) -> list[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(p) for p in line.split()[1:]]
    except OSError:
        pass
    return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Container:
    """A container whose state lives in `run` (upper, work, merged, session.log, the
    session's pid); `layers` are the read-only lower layers, top first."""

    run: Path
    layers: Sequence[Path]

    @property
    def log(self) -> Path:
        return self.run / "session.log"

    def session_pid(self) -> int | None:
        try:
            pid = int((self.run / "session.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def nspawn_pid(self) -> int | None:
        session = self.session_pid()
        if session is None:
            return None
        children = _children(session)
        return children[0] if children else None

    def init_pid(self) -> int | None:
        """The container's PID 1 (systemd), seen from the host."""
        todo = [p for p in [self.nspawn_pid()] if p is not None]
        while todo:
            pid = todo.pop()
            ns = _nspid(pid)
            if len(ns) >= 3 and ns[-1] == 1:
                return pid
            todo += _children(pid)
        return None

    def start(self, binds: Sequence[tuple[Path, str, bool]] = (), lock_fd: int | None = None) -> None:
        """Boots the container in the background: binds are (host path, container path,
        read-only). lock_fd, if given, is held by the session for as long as it lives."""
        if self.session_pid() is not None:
            raise ContainerError(f"a container already runs from {self.run}")
        shutil.rmtree(self.run, ignore_errors=True)
        for d in ("upper", "work", "merged"):
            (self.run / d).mkdir(parents=True)
        for host, _, _ in binds:
            host.mkdir(parents=True, exist_ok=True)
        options = [f"--{'bind-ro' if ro else 'bind'}={host}:{inside}" for host, inside, ro in binds]
        lower = ":".join(str(p) for p in self.layers)
        with self.log.open("w") as log:
            proc = subprocess.Popen(
                [
                    # The instance shares a loaded machine: everything in it runs niced.
                    "nice",
                    "-n",
                    str(NICE),
                    *PRIVATE_SESSION,
                    "bash",
                    "-c",
                    SESSION,
                    "session",
                    str(self.run),
                    lower,
                    *options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=[lock_fd] if lock_fd is not None else [],
            )
        (self.run / "session.pid").write_text(f"{proc.pid}\n")

    def wait_booted(self, timeout: float = 300) -> str:
        """Waits for the container's systemd to finish booting; its state (running, or
        degraded with the failed units named by the caller's checks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.session_pid() is None:
                raise ContainerError(f"the container stopped while booting:\n{self._log_tail()}")
            if self.init_pid() is not None:
                res = self.run_inside(["systemctl", "is-system-running", "--wait"], check=False, timeout=timeout)
                state = res.stdout.strip()
                if state in ("running", "degraded"):
                    return state
            time.sleep(1)
        raise ContainerError(f"the container did not boot in {timeout:.0f} s:\n{self._log_tail()}")

    def run_inside(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = 600,
        env: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """argv run as root inside the running container (all its namespaces, its root),
        with a clean environment (INSIDE_ENV and env's NAME=VALUE)."""
        pid = self.init_pid()
        if pid is None:
            raise ContainerError("the container is not running")
        res = subprocess.run(
            ["nsenter", "--target", str(pid), "--all", "--root", "--wd", "env", "-i", *INSIDE_ENV, *env, *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and res.returncode != 0:
            output = res.stdout[-4000:] + res.stderr[-4000:]
            raise ContainerError(f"{' '.join(argv)} exited with {res.returncode} in the container:\n{output}")
        return res

    def stop(self, timeout: float = 120, keep_upper: Path | None = None) -> bool:
        """Orderly shutdown (nspawn passes SIGTERM on as the container's poweroff signal);
        the whole session killed if it has not ended after `timeout`. Then the run
        directory (the instance's writes) is removed; with keep_upper, its upper layer is
        moved there first, if the shutdown was orderly. Whether it was."""
        orderly = True
        session = self.session_pid()
        if session is not None:
            nspawn = self.nspawn_pid()
            if nspawn is not None:
                os.kill(nspawn, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(session) and time.monotonic() < deadline:
                _reap(session)
                time.sleep(0.5)
            if _alive(session):
                orderly = False
                # unshare's child is the session's PID namespace init (--kill-child):
                # when unshare dies, every process of the namespace dies with it.
                os.kill(session, signal.SIGKILL)
                while _alive(session):
                    _reap(session)
                    time.sleep(0.2)
        if keep_upper is not None and orderly:
            (self.run / "upper").rename(keep_upper)
        self.remove()
        return orderly

    def remove(self) -> None:
        shutil.rmtree(self.run, ignore_errors=True)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def _reap(pid: int) -> None:
    """Collects the session if this process started it (it would stay a zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def try_lock(path: Path) -> int | None:
    """An exclusive lock on path, as an open file descriptor, or None if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
