"""The test cache, shared by every checkout on the machine: where it is
(HUGIFY_TEST_CACHE, /var/cache/hugify-tests as root, ~/.cache/hugify-tests otherwise),
the lock every test process and benchmark takes before building into it, and the one
way a build lands there (`building`): NAME-KEY, made once in a scratch directory and
renamed into place, the older keys of the same name dropped once they are no longer
recent. A KEY is the caller's hash of everything the build depends on
(testkit.recipes: recipe_key, cached_dir; testkit.debian: files_key); a build whose
result includes a failure (a package build that is meant to fail) is a CachedBuild with
its exit status and log.

What a run from an empty cache would cost is kept beside the entries: each build
writes its own time (less the builds nested in it) into the cost ledger, and each use
of an entry, built or found, is noted in the file HUGIFY_CACHE_USED names (set by
tools/run-tests, inherited by the suite's workers and children). tools/run-tests adds
the costs of the entries a run found to its own time: the projection of a cold run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self


def cache_root() -> Path:
    env = os.environ.get("HUGIFY_TEST_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/hugify-tests")
    return Path.home() / ".cache" / "hugify-tests"


#: Builds of the same name younger than this are kept: another checkout sharing the
#: cache (a second worktree, a CI run beside a developer's) may be using them. A single
#: checkout, as in CI, never has two keys of one name at once.
KEEP_RECENT_SECONDS = float(os.environ.get("HUGIFY_TEST_CACHE_KEEP_HOURS", "6")) * 3600


def drop_stale(final: Path, name: str | None = None) -> None:
    """Removes the other cached builds of final's name (NAME-KEY) but recent ones."""
    name = name or final.name.rsplit("-", 1)[0]
    now = time.time()
    for stale in final.parent.glob(f"{name}-*"):
        if stale == final or not re.fullmatch(r"[0-9a-f]{16}", stale.name[len(name) + 1 :]):
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - stale.stat().st_mtime < KEEP_RECENT_SECONDS:
                continue
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def locked(path: Path, shared: bool = False) -> Iterator[None]:
    """A lock shared by every test process (pytest-xdist workers too): exclusive, or
    `shared` with other shared holders (readers of what an exclusive holder changes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(final: Path, lock: Path, make: Callable[[Path], None], product: str = "") -> Path:
    """`final / product` (the entry itself by default, else what it holds that shows it
    complete), built once: unless it exists, `make` fills building()'s scratch directory
    under `lock`, so that one process builds it while the others wait and then find it."""
    made = final / product
    if made.exists():
        return made
    with locked(lock):
        if made.exists():
            return made
        with building(final) as work:
            make(work)
    return made


def cached(name: str, key: str, make: Callable[[Path], None]) -> Path:
    """cache_root()/NAME-KEY, made by `make` in a temporary directory on first use
    (under a lock, so that one process builds it while the others wait)."""
    root = cache_root()
    final = root / f"{name}-{key}"
    note_used(final)
    return build_once(final, final.parent / f"{name}.lock", make)


# --- the cost ledger ---------------------------------------------------------------------

#: The environment variable naming the file where a run notes the entries it used.
USED_ENV = "HUGIFY_CACHE_USED"
#: Where each entry's build time is kept: LEDGER/<its path under the cache root>.
LEDGER = ".costs"
_nested = threading.local()


def _ledger_file(final: Path) -> Path | None:
    """The entry's record in the ledger; None for a build outside the cache (a test's
    own, in its temporary directory)."""
    root = cache_root()
    try:
        return root / LEDGER / final.relative_to(root)
    except ValueError:
        return None


def _note(final: Path, built: bool) -> None:
    log = os.environ.get(USED_ENV)
    if not log:
        return
    line = json.dumps({"entry": str(final), "built": built}) + "\n"
    # One write of a short line to a file opened O_APPEND: the workers' lines never mix.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def note_used(final: Path) -> None:
    """Notes that this run uses the entry `final` (found or about to be built)."""
    _note(final, built=False)


def build_cost(final: Path) -> float | None:
    """The seconds the entry took to build when it was built (its nested builds not
    counted), or None where the ledger has no record of it."""
    ledger = _ledger_file(final)
    try:
        return float(ledger.read_text()) if ledger else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def building(final: Path, stale: bool = True, finished: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """The one way a build lands in the cache. Yields an empty scratch directory beside
    `final`; when the body returns, the scratch directory replaces whatever unfinished
    `final` there was, the older keys of its name are dropped (unless not `stale`), and
    the build's time, less that of the builds nested in it, goes into the cost ledger.
    If the body raises, the scratch directory goes and nothing lands; if it returns but
    `finished(scratch)` says no, nothing lands and the scratch directory stays for the
    caller to report from. The caller holds the entry's lock."""
    work = final.with_name(f".{final.name}.tmp")  # hidden: no glob of entries matches it
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    outer = getattr(_nested, "seconds", None)
    _nested.seconds = 0.0
    started = time.monotonic()
    landed = unfinished = False
    try:
        yield work
        if finished is None or finished(work):
            shutil.rmtree(final, ignore_errors=True)
            work.rename(final)
            landed = True
        else:
            unfinished = True
    finally:
        if not unfinished:
            shutil.rmtree(work, ignore_errors=True)
        spent = time.monotonic() - started
        inner, _nested.seconds = _nested.seconds, outer
        if outer is not None:
            _nested.seconds = outer + spent
    if not landed:
        return
    ledger = _ledger_file(final)
    if ledger:
        ledger.parent.mkdir(parents=True, exist_ok=True)
        ledger.write_text(f"{spent - inner:.1f}\n")
        _note(final, built=True)
    if stale:
        drop_stale(final)


def build_dir(group: str, name: str, key: str) -> Path:
    """Where a cached build lives (noted as used by this run); its build lands there
    through `building`, which removes the older builds of the same name."""
    root = cache_root() / group
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{name}-{key}"
    note_used(final)
    return final


@dataclass
class CachedBuild:
    """A finished build in the test cache (see cached_build): its exit status, its
    log, and everything it produced unpacked into `root`."""

    dir: Path
    rc: int = field(init=False)
    log: str = field(init=False)

    def __post_init__(self) -> None:
        self.rc = int((self.dir / "rc").read_text())
        self.log = (self.dir / "log").read_text()

    @property
    def root(self) -> Path:
        return self.dir / "root"

    def ok(self) -> Self:
        assert self.rc == 0, self.log[-6000:]
        return self


def cached_build(final: Path, lock: Path, scratch: Path, build: Callable[[Path, Path], tuple[int, str]]) -> Path:
    """`final`, built once per cache key: build(scratch, out) runs in an empty scratch
    directory, puts what it produced into `out` and returns its exit status and log.
    A worker that waited on the lock finds the other's result."""
    note_used(final)

    def make(work: Path) -> None:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        rc, log = build(scratch, work)
        save_result(work, rc, log)
        shutil.rmtree(scratch, ignore_errors=True)

    build_once(final, lock, make, "rc")
    return final


def save_result(out: Path, rc: int, log: str) -> None:
    (out / "log").write_text(log)
    (out / "rc").write_text(str(rc))


# --- what a run from an empty cache would take (tools/run-tests) ----------------------------


def stage_cost(stage: str) -> float | None:
    """The seconds a suite stage took the last time it ran cold, or None."""
    return build_cost(cache_root() / f"stage-{stage}")


def record_stage_cost(stage: str, seconds: float) -> None:
    ledger = _ledger_file(cache_root() / f"stage-{stage}")
    assert ledger is not None
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text(f"{seconds:.1f}\n")


def run_costs(used_log: Path) -> dict[str, object]:
    """What the entries noted in `used_log` cost: those built by the run (entry, seconds;
    slowest first), the sum of the build times of those it found, and how many it found
    without a record in the ledger (built before the ledger existed)."""
    used: dict[str, bool] = {}
    try:
        lines = used_log.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        note = json.loads(line)
        used[note["entry"]] = used.get(note["entry"], False) or note["built"]
    built, found, unknown = [], 0.0, 0
    for entry, was_built in used.items():
        cost = build_cost(Path(entry))
        if was_built:
            built.append((entry, cost or 0.0))
        elif cost is None:
            unknown += 1
        else:
            found += cost
    built.sort(key=lambda x: -x[1])
    return {"built": built, "found_seconds": found, "found_unknown": unknown}


if __name__ == "__main__":
    # python -m testkit.cache costs USED_LOG | stage NAME [SECONDS]: the ledger for
    # tools/run-tests, which runs before the virtualenv exists (stdlib only here).
    import sys

    match sys.argv[1:]:
        case ["costs", log]:
            print(json.dumps(run_costs(Path(log))))
        case ["stage", name]:
            print(json.dumps(stage_cost(name)))
        case ["stage", name, seconds]:
            record_stage_cost(name, float(seconds))
        case _:
            sys.exit("usage: python -m testkit.cache costs USED_LOG | stage NAME [SECONDS]")
