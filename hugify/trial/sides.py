"""The sides of `hugify try`: each a process of its own, kept in a private mount
namespace, that starts the command's runs there and times them.

The hugified side's namespace has each hugified copy bind-mounted, read-only, over
the path of its original, so that the command, its children and ld.so find the copies
where the originals are: RUNPATH and $ORIGIN, /etc/ld.so.cache, PATH, `-B` options
and dlopen all work unchanged. The originals' side runs in a namespace of the same
kind without the binds, so that both pay the same overhead. Mounts are private to the
namespace (propagation turned off first), and a namespace ends with its last
process: nothing of the system's mount table changes.

Root gets a mount namespace (CLONE_NEWNS). Any other user gets it inside a user
namespace (CLONE_NEWUSER) that maps the user's own ids to themselves, so the command
runs with the same uid and gid; supplementary groups keep working but show as the
overflow group inside. Where the system allows neither, NamespaceError says why in one
line.

Each side is also a PID namespace of its own (CLONE_NEWPID, with its own /proc), so
that every process of a run ends with the comparison however it ends: the side's
process is forked before the comparison starts any thread, makes the namespaces and
forks the namespace's init, which starts the runs; both die with their parent
(PR_SET_PDEATHSIG), and the kernel kills every process of a PID namespace when its
init dies. So a hugify try killed with SIGKILL leaves no command running (as root,
reparented to the system's init), and no namespace, bind mount or tmpfs alive. The
init also kills and reaps, after each run, what the command left running when it
exited, so a run never leaks processes into the next one. The command's CPU time is
user + system time from wait4 (its own and that of the descendants it waited for);
its wall time runs from the spawn to its exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hugify import kernel, reasons

#: statvfs flags -> the mount flags a remount inside a user namespace must keep (the
#: kernel locks them on mounts it copied from a more privileged namespace).
LOCKED_FLAGS = {
    os.ST_NOSUID: kernel.MS_NOSUID,
    os.ST_NODEV: kernel.MS_NODEV,
    os.ST_NOEXEC: kernel.MS_NOEXEC,
    os.ST_NOATIME: kernel.MS_NOATIME,
    os.ST_NODIRATIME: kernel.MS_NODIRATIME,
    os.ST_RELATIME: kernel.MS_RELATIME,
}


class NamespaceError(Exception):
    """No private namespace for a side; the message says why, in one line."""


@dataclass(frozen=True)
class Bind:
    """A hugified copy, shown at the path of its original; `identity`, (st_dev,
    st_ino) of the copy whose bytes were checked: the inode the bind mount must show."""

    copy: Path
    target: str
    identity: tuple[int, int]


@dataclass
class Result:
    """One run of the command."""

    status: int  # exit status; -N: killed by signal N
    cpu: float  # user + system seconds of the command and the descendants it waited for
    wall: float
    leftovers: int  # processes it left running, killed after it exited

    @property
    def status_text(self) -> str:
        return f"killed by signal {-self.status}" if self.status < 0 else f"exit status {self.status}"


def why_no_namespace(step: str, e: OSError) -> str:
    """A one-line reason for a failed namespace step, naming the setting that forbids
    it where the system has one."""
    base = f"cannot make a private mount namespace ({step}: {reasons.io_detail(e, with_file=False)})"
    if os.getuid() == 0:
        return f"{base}: this root lacks CAP_SYS_ADMIN (a container?)"
    if kernel.sysctl("kernel.unprivileged_userns_clone") == "0":
        return f"{base}: unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0); run as root"
    if kernel.sysctl("user.max_user_namespaces") == "0":
        return f"{base}: user namespaces are disabled (user.max_user_namespaces = 0); run as root"
    if kernel.sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return (
            f"{base}: AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1); run as root, or give hugify an AppArmor "
            "profile that allows userns"
        )
    return f"{base}: the system does not let this user make one (a container's seccomp filter?); run as root"


def own_namespace(*, pids: bool = False) -> None:
    """Moves this process into a private mount namespace (inside a user namespace that
    maps the user's own ids unless root) with propagation turned off: what it mounts
    from then on is its own, seen by the processes it forks after, and ends with the
    last of them. `pids`: the processes it forks after go in a PID namespace of their
    own too, the first of them its init. NamespaceError on any failure. A process with
    threads cannot do it."""
    uid, gid = os.getuid(), os.getgid()
    flags = kernel.CLONE_NEWNS | (0 if uid == 0 else kernel.CLONE_NEWUSER) | (kernel.CLONE_NEWPID if pids else 0)
    try:
        kernel.unshare(flags)
    except OSError as e:
        what = "|".join(
            name
            for bit, name in (
                (kernel.CLONE_NEWUSER, "CLONE_NEWUSER"),
                (kernel.CLONE_NEWNS, "CLONE_NEWNS"),
                (kernel.CLONE_NEWPID, "CLONE_NEWPID"),
            )
            if flags & bit
        )
        raise NamespaceError(why_no_namespace(f"unshare {what}", e)) from None
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            try:
                Path("/proc/self", name).write_text(text)
            except OSError as e:
                raise NamespaceError(why_no_namespace(f"/proc/self/{name}", e)) from None
    try:
        kernel.mount("none", "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
    except OSError as e:
        raise NamespaceError(why_no_namespace("making / private", e)) from None


def _enter(binds: list[Bind]) -> None:
    """Moves this process into its own mount namespace (its children into their own
    PID namespace) and bind-mounts the copies; NamespaceError on any failure."""
    own_namespace(pids=True)
    for b in binds:
        try:
            kernel.mount(b.copy, b.target, None, kernel.MS_BIND)
        except OSError as e:
            why = reasons.io_detail(e, with_file=False)
            raise NamespaceError(f"cannot bind-mount {b.copy} over {b.target}: {why}") from None
        locked = os.statvfs(b.target).f_flag
        keep = sum(ms for st, ms in LOCKED_FLAGS.items() if locked & st)
        try:
            kernel.mount(None, b.target, None, kernel.MS_BIND | kernel.MS_REMOUNT | kernel.MS_RDONLY | keep)
        except OSError as e:
            raise NamespaceError(f"cannot make {b.target} read-only: {reasons.io_detail(e, with_file=False)}") from None
        seen = os.stat(b.target)
        if (seen.st_dev, seen.st_ino) != b.identity:
            raise NamespaceError(f"the bind mount over {b.target} does not show the copy checked, {b.copy}")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(k) for k in f.read().split()]
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before their children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _kill_leftovers() -> int:
    """Kills and reaps what runs below this process (the init of its PID namespace,
    which orphans are given to): the count."""
    killed = 0
    while True:
        rest = descendants(os.getpid())
        if not rest:
            return killed
        for pid in rest:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed += len(rest)
        for _ in rest:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-1, 0)


def _spawn(req: dict[str, Any], out: TextIO) -> dict[str, Any]:
    """One run: started, its pid said at once (the watcher starts), waited for.
    subprocess gives the command the signal dispositions a shell would (SIGPIPE and
    SIGXFSZ back to default; handlers do not survive exec); posix_spawn would leave
    glibc's internal signals 32 and 33 ignored in it."""
    start = time.perf_counter()
    try:
        with open(req["stdout"], "wb") as stdout, open(req["stderr"], "wb") as stderr:
            proc = subprocess.Popen(
                req["argv"], executable=req["program"], env=req["env"], cwd=req["cwd"],
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, process_group=0,
            )  # fmt: skip
    except OSError as e:
        return {"error": f"cannot execute {req['program']}: {reasons.io_detail(e, with_file=False)}"}
    out.write(json.dumps({"pid": proc.pid}) + "\n")
    out.flush()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # the rest of its process group, before it forks more
    return {
        "status": proc.returncode,
        "cpu": ru.ru_utime + ru.ru_stime,
        "wall": wall,
        "leftovers": _kill_leftovers(),
    }


def _mount_proc() -> None:
    """A /proc of the PID namespace this process is the init of (it sees its own
    processes by their pids there, and the command sees the same)."""
    try:
        kernel.mount("proc", "/proc", "proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC)
    except OSError as e:
        raise NamespaceError(why_no_namespace("mounting /proc for its PID namespace", e)) from None


def _parent_gone(alive: int) -> bool:
    """Whether the process holding the write end of the pipe `alive` has ended."""
    import select

    return bool(select.select([alive], [], [], 0)[0])


def _serve(requests: int, replies: int, binds: list[Bind], parent: int) -> int:
    """The side's process: dies with the comparison, enters its namespaces, says
    whether it could, and forks the init of its PID namespace, which runs what it is
    asked to until the request pipe closes; the init's exit status."""
    out = os.fdopen(replies, "w")
    kernel.die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the comparison ended before the death signal was set
        return 0
    try:
        _enter(binds)
    except (NamespaceError, OSError) as e:
        out.write(json.dumps({"error": str(e)}) + "\n")
        out.flush()
        return 0
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:  # pragma: no cover (the init of the side's PID namespace)
        code = 0
        try:
            os.close(alive_w)
            kernel.die_with_parent(signal.SIGKILL)
            if _parent_gone(alive_r):  # it died before the death signal was set
                os._exit(0)
            try:
                _mount_proc()
            except NamespaceError as e:
                out.write(json.dumps({"error": str(e)}) + "\n")
                out.flush()
                os._exit(0)
            out.write(json.dumps({"ready": True}) + "\n")
            out.flush()
            with os.fdopen(requests) as lines:
                for line in lines:
                    out.write(json.dumps(_spawn(json.loads(line), out)) + "\n")
                    out.flush()
        except BaseException:
            code = 70
        os._exit(code)
    # Only the init talks to the comparison: it sees an end of file when the init ends.
    os.close(alive_r)
    os.close(requests)
    out.close()
    _, status = os.waitpid(init, 0)
    return os.waitstatus_to_exitcode(status)


class Side:
    """A side's process in its namespace. Made before any thread of the caller runs
    (it is forked); closed (or killed with its runs) by close()."""

    def __init__(self, name: str, binds: list[Bind]) -> None:
        self.name = name
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 0
            try:
                # only its two pipe ends: the caller's other descriptors (the other
                # side's pipes too) must not be held open by it
                keep = sorted((requests_r, replies_w))
                os.closerange(3, keep[0])
                os.closerange(keep[0] + 1, keep[1])
                os.closerange(keep[1] + 1, os.sysconf("SC_OPEN_MAX"))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    # the caller ends it, and the command with it; a handler (unlike
                    # SIG_IGN) does not pass on to the command. A signal hugify try was
                    # started with ignored (nohup, a script's background job) stays
                    # ignored, so that the command gets it ignored as from a shell.
                    if signal.getsignal(sig) is not signal.SIG_IGN:
                        signal.signal(sig, lambda signum, frame: None)
                code = _serve(requests_r, replies_w, binds, parent)
            except BaseException:
                code = 70
            os._exit(code)
        os.close(requests_r)
        os.close(replies_w)
        self.pid = pid
        self._requests = os.fdopen(requests_w, "w")
        self._replies = os.fdopen(replies_r)
        first = self._reply()
        if "ready" not in first:
            self.close()
            raise NamespaceError(str(first.get("error", "the side's process ended before it was ready")))

    def _reply(self) -> dict[str, Any]:
        line = self._replies.readline()
        if not line:
            return {"error": f"the {self.name} side's process ended unexpectedly"}
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(
        self,
        program: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        *,
        stdout: Path,
        stderr: Path,
        started: Callable[[int], None] = lambda pid: None,
    ) -> Result:
        """Runs `program` with `argv` once in this side's namespace; `started` gets its
        pid as soon as it runs. OSError if it cannot be started."""
        req = {"program": program, "argv": argv, "env": env, "cwd": cwd, "stdout": str(stdout), "stderr": str(stderr)}
        self._requests.write(json.dumps(req) + "\n")
        self._requests.flush()
        reply = self._reply()
        if "pid" in reply:
            started(int(reply["pid"]))
            reply = self._reply()
        if "error" in reply:
            raise OSError(reply["error"])
        return Result(int(reply["status"]), float(reply["cpu"]), float(reply["wall"]), int(reply["leftovers"]))

    def close(self) -> None:
        """Ends the side: its process, and anything still running below it."""
        for pid in reversed(descendants(self.pid)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for f in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                f.close()
        if not _reaped_within(self.pid, 2.0):  # it ends when its request pipe closes
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)


def _reaped_within(pid: int, seconds: float) -> bool:
    """Waits up to `seconds` for the child to exit; whether it did (and was reaped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        time.sleep(0.01)
    return False
