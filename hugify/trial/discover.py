"""The first run of `hugify try`: the command once on the original files, in the
originals' namespace, and every object its processes loaded.

Two witnesses, merged:

* the record library (runtime/record.c) in LD_AUDIT: every object ld.so loads, in
  every process that inherits the variable, the program included, also what is
  dlopen'ed and closed again before anyone could look;
* a watcher (hugify.trial.watch) reading the executable file mappings of every
  process below the side's process every few milliseconds: static programs, and
  processes whose environment dropped LD_AUDIT, if they live long enough to be seen.

Neither sees what setuid or setgid programs load (ld.so ignores LD_AUDIT for them, and
/proc does not show their mappings to another user); the watcher names such processes
when it meets them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hugify.engine import runtime_file
from hugify.trial.sides import Result, Side
from hugify.trial.watch import FileSampler

RECORD_LIB = "libhugify-record.so"
RECORD_ENV = "HUGIFY_RECORD"


@dataclass
class Loaded:
    """A file the command's processes mapped executable or ld.so loaded."""

    path: str  # its real path
    names: set[str] = field(default_factory=set)  # the paths the processes used
    processes: set[int] = field(default_factory=set)  # by the record library's lines


@dataclass
class FirstRun:
    result: Result
    loaded: dict[str, Loaded]  # by real path
    processes: int  # processes seen (recorded or watched)
    unreadable: dict[int, str]  # processes /proc would not show: pid -> command
    stdout: Path
    stderr: Path


def with_audit(env: dict[str, str], library: Path) -> dict[str, str]:
    """`env` with `library` added to LD_AUDIT (after what the user has there)."""
    have = env.get("LD_AUDIT", "")
    return {**env, "LD_AUDIT": f"{have}:{library}" if have else str(library)}


def first_run(side: Side, program: str, argv: list[str], *, env: dict[str, str], cwd: str, scratch: Path) -> FirstRun:
    """Runs the command once with both witnesses; OSError if it cannot start, or if
    the runtime's record library is missing."""
    library = runtime_file(RECORD_LIB)
    if library is None:
        raise FileNotFoundError(f"{RECORD_LIB} is not installed")
    record = scratch / "record"
    record.write_bytes(b"")
    watcher = FileSampler(side.pid)
    out, err = scratch / "first.stdout", scratch / "first.stderr"
    run_env = {**with_audit(env, library), RECORD_ENV: str(record)}
    try:
        result = side.run(program, argv, run_env, cwd, stdout=out, stderr=err, started=lambda pid: watcher.start())
    finally:
        if watcher.is_alive():
            watcher.finish()
    loaded: dict[str, Loaded] = {}
    recorded: set[int] = set()

    def add(name: str, pid: int | None) -> None:
        real = os.path.realpath(name)
        entry = loaded.setdefault(real, Loaded(real))
        entry.names.add(name)
        if pid is not None:
            entry.processes.add(pid)
            recorded.add(pid)

    for line in record.read_text(errors="surrogateescape").splitlines():
        pid, _, name = line.partition("\t")
        if pid.isdigit() and name.startswith("/"):
            add(name, int(pid))
    for name in watcher.files:
        add(name, None)
    return FirstRun(
        result,
        loaded,
        len(recorded | watcher.processes),
        dict(watcher.unreadable),
        out,
        err,
    )


def privileged(st: os.stat_result, path: str) -> str | None:
    """Why a program runs with privileges of its own (setuid, setgid, file
    capabilities), or None."""
    if st.st_mode & stat.S_ISUID:
        return "setuid"
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IXGRP:
        return "setgid"
    try:
        if os.getxattr(path, "security.capability"):
            return "file capabilities"
    except OSError:
        pass
    return None
