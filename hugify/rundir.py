"""The runtime directory (/run/hugify; $HUGIFY_RUNTIME_DIR, --runtime-dir) and this
boot's records in it: the kernel verdict, the anonymous programs of the policy, and what
gives no large folios. Every record is read, written and removed through the engine,
which honours only root's records in a directory of root's and lets only root write
(runtime/hp_verdict.h). Root's shared copies, in its shared/, are hugify.shared's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hugify import kernel

if TYPE_CHECKING:
    from hugify.engine import Engine

#: The runtime directory, where this boot's records are kept (tmpfs on most systems).
RUNTIME_DIR = Path("/run/hugify")
VERDICT_FILE = "kernel-exec-pmd"
#: What gives no large folios, this boot (hp_verdict.h HP_NO_LARGE_FOLIOS_PREFIX), written by
#: the engine: "no-large-folios-MAJOR:MINOR" (a filesystem) holding "BOOT-ID FS-MAGIC",
#: "no-large-folios-MAJOR:MINOR-INODE" (a file) holding "BOOT-ID FS-MAGIC CTIME SIZE".
NO_LARGE_FOLIOS_PREFIX = "no-large-folios-"


def runtime_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("HUGIFY_RUNTIME_DIR") or RUNTIME_DIR)


def _record(engine: Engine) -> list[str] | None:
    """The fields of this boot's kernel-verdict record, or None."""
    text = engine.record_read(VERDICT_FILE)
    bid = kernel.boot_id()
    fields = (text or "").split()
    if not bid or len(fields) < 2 or fields[0] != bid:
        return None
    return fields


def first_run_this_boot(engine: Engine) -> bool:
    """Whether no prefetch has run yet this boot (every root run records the boot it ran in)."""
    return _record(engine) is None


def read_verdict(engine: Engine) -> bool | None:
    """The recorded answer to "does the kernel read executable mappings as PMD folios
    by itself?" for this boot, or None if nobody found out yet."""
    fields = _record(engine)
    if not fields or fields[1] not in ("0", "1"):
        return None
    return fields[1] == "1"


def write_record(engine: Engine, aware: bool | None, thp: str | None) -> bool:
    """Records, for this boot, the kernel verdict and the THP mode, for later runs and
    for the C runtime (the audit library reads this instead of sysfs):
    "BOOT-ID 0|1|- MODE". Rewritten only when it changes; False if this process writes
    no records (not root, or no runtime directory of root's)."""
    bid = kernel.boot_id()
    if not bid:
        return False
    text = f"{bid} {'-' if aware is None else int(aware)} {thp or 'none'}\n"
    if engine.record_read(VERDICT_FILE) == text:
        return True
    return engine.record_write(VERDICT_FILE, text)


#: The programs of the policy's [runtime] anonymous, for the audit library (hp_anon.h).
ANONYMOUS_FILE = "anonymous"


def write_anonymous_record(engine: Engine, programs: Iterable[str]) -> bool:
    """Records the programs whose code the audit library copies into anonymous huge
    pages, one real path a line (the audit library compares /proc/self/exe); without
    programs the record is removed. Rewritten only when it changes; False if this
    process writes no records."""
    paths = sorted({os.path.realpath(p) for p in programs})
    if not paths:
        return engine.record_read(ANONYMOUS_FILE) is None or engine.record_drop(ANONYMOUS_FILE)
    text = "# hugify prefetch, from the policy's [runtime] anonymous\n" + "".join(f"{p}\n" for p in paths)
    if engine.record_read(ANONYMOUS_FILE) == text:
        return True
    return engine.record_write(ANONYMOUS_FILE, text)


def verdict_records(directory: Path) -> list[str]:
    """The names of this boot's verdicts in the runtime directory, whoever wrote them:
    the kernel's and those of what gives no large folios (not the policy's record)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if n == VERDICT_FILE or n.startswith(NO_LARGE_FOLIOS_PREFIX))


def clear_records(engine: Engine, directory: Path) -> list[str]:
    """Removes the verdicts of this boot (hugify prefetch --clear-records): the next
    runs find them out again. The names it could not remove (not root)."""
    return [n for n in verdict_records(directory) if not engine.record_drop(n)]


@dataclass(frozen=True)
class NoLargeFolios:
    """A filesystem (or one file of it: `inode`) that the runtime found, this boot, to
    give no large folios, by a record that is honoured."""

    device: str  # st_dev of the files it was found on, "MAJOR:MINOR"
    fstype: str
    mountpoint: str | None
    inode: int | None = None


def without_large_folios(engine: Engine, directory: Path) -> list[NoLargeFolios]:
    """The engine's records of this boot in the runtime directory (only those it honours)."""
    bid = kernel.boot_id()
    by_device = {fs.device: fs for fs in kernel.mounts()}
    out = []
    for name in verdict_records(directory):
        fields = (engine.record_read(name) or "").split() if name.startswith(NO_LARGE_FOLIOS_PREFIX) else []
        if not bid or len(fields) not in (2, 4) or fields[0] != bid:
            continue
        device, _, inode = name[len(NO_LARGE_FOLIOS_PREFIX) :].partition("-")
        with contextlib.suppress(ValueError):
            fstype = kernel.FS_MAGIC.get(int(fields[1], 16), f"type {fields[1]}")
            mount = by_device.get(device)
            where = mount.mountpoint if mount else None
            out.append(NoLargeFolios(device, fstype, where, int(inode) if inode else None))
    return out
