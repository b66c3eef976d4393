"""The test cache, shared by every checkout on the machine: where it is
(HUGIFY_TEST_CACHE, /var/cache/hugify-tests as root, ~/.cache/hugify-tests otherwise),
the lock every test process and benchmark takes before building into it, and the one
way a build lands there: NAME-KEY, made once in a scratch directory and renamed into
place, the older keys of the same name dropped once they are no longer recent. A KEY is
the caller's hash of everything the build depends on (testkit.recipes: recipe_key,
cached_dir; testkit.debian: files_key); a build whose result includes a failure
(a package build that is meant to fail) is a CachedBuild with its exit status and log.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
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
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock shared by every test process (pytest-xdist workers too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached(name: str, key: str, make: Callable[[Path], None]) -> Path:
    """cache_root()/NAME-KEY, made by `make` in a temporary directory on first use
    (under a lock, so that one process builds it while the others wait)."""
    root = cache_root()
    final = root / f"{name}-{key}"
    if final.is_dir():
        return final
    with locked(final.parent / f"{name}.lock"):
        if final.is_dir():
            return final
        work = final.parent / f".{final.name}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            make(work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        drop_stale(final, name)
    return final


def build_dir(group: str, name: str, key: str) -> Path:
    """Where a cached build lives; older builds of the same name are removed."""
    root = cache_root() / group
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{name}-{key}"


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
    if (final / "rc").exists():
        return final
    with locked(lock):
        if (final / "rc").exists():
            return final
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        work = final.with_name(final.name + ".tmp")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rc, log = build(scratch, work)
        save_result(work, rc, log)
        work.rename(final)
        shutil.rmtree(scratch, ignore_errors=True)
        drop_stale(final)
    return final


def save_result(out: Path, rc: int, log: str) -> None:
    (out / "log").write_text(log)
    (out / "rc").write_text(str(rc))
