"""The shared way of `hugify try` (docs/try.md, "What it does", the page cache).

Where the filesystem gives files no 2 MiB folios (ext4 before Linux 6.16, btrfs), a
machine's hugified code is mapped from root's shared copies: one copy of each file on a
tmpfs mounted with huge=within_size, which the audit library maps the code windows from
(hugify.shared, runtime/hp_shared.h). hugify try measures that way as the machine would
run it:

* The try process, as root, moves into a mount namespace of its own first: the tmpfs
  mounts below are its own and its sides', and end with it; the system's mount table
  does not change.
* The copies' store (the runtime directory's shared/) is mounted before the hugified
  side starts, so that its namespace, a copy of the try process's, sees it.
* `--way shared` asks for the way on any filesystem: the hugified copies are put on a
  tmpfs without huge pages first (where file-backed huge pages are unsupported, as on
  ext4 before 6.16), so that root's shared copies of them are what gives the code its
  huge pages. `--way auto` takes it as root where the cache's filesystem gives no
  2 MiB folios, with the copies where they are.

The shared copies are the comparison's own, held while it runs; the policy's
runtime.shared_budget is for a machine's lasting copies, so the store is sized for
every file under test instead (docs/try.md says so; the answer gives what they held).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from hugify import kernel, reasons, shared
from hugify.trial.sides import NamespaceError, own_namespace

#: Room in a tmpfs beyond its files (a page per record, directories).
SLACK = 8 << 20


class SharedWayError(Exception):
    """The shared way cannot be had here: one line saying why."""


class Mounts:
    """The tmpfs mounts of one comparison, unmounted (detached) by close()."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []
        self.entered = False  # the try process is in its own mount namespace

    def enter(self) -> None:
        """The try process's own mount namespace (root only); SharedWayError if none."""
        try:
            own_namespace()
        except NamespaceError as e:
            raise SharedWayError(str(e)) from None
        self.entered = True

    def store(self, rdir: Path, sizes: list[int]) -> int:
        """Mounts the copies' store in `rdir`, sized for files of `sizes`; the budget
        the copies are kept within. SharedWayError if it cannot be mounted or gives no
        huge pages."""
        budget = sum(shared.memory_for(s) for s in sizes)
        try:
            shared.ensure_mounted(rdir, budget)
        except shared.Refused as e:
            raise SharedWayError(e.detail) from None
        self.mounted.append(shared.shared_dir(rdir))
        return budget

    def plain(self, where: Path, copies: list[Path]) -> list[Path]:
        """The copies, copied onto a tmpfs without huge pages mounted on `where` (one
        directory each, the file keeps its name and mode); their paths there."""
        size = sum(shared.memory_for(os.stat(c).st_size) for c in copies) + SLACK
        where.mkdir(mode=0o755)
        opts = f"mode=0755,uid=0,gid=0,huge=never,size={size}"
        try:
            kernel.mount("hugify-try", where, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, opts)
        except OSError as e:
            raise SharedWayError(f"cannot mount a tmpfs on {where}: {reasons.io_detail(e, with_file=False)}") from None
        self.mounted.append(where)
        out = []
        for i, c in enumerate(copies):
            d = where / str(i)
            d.mkdir(mode=0o755)
            dst = d / c.name
            shutil.copyfile(c, dst)
            os.chmod(dst, os.stat(c).st_mode & 0o7777)
            out.append(dst)
        return out

    def close(self) -> None:
        for where in reversed(self.mounted):
            with contextlib.suppress(OSError):
                kernel.umount(where, kernel.MNT_DETACH)
        self.mounted.clear()
