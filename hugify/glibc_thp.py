"""What glibc's own huge-page advice (the tunable ``glibc.elf.thp``, glibc 2.44) would do
for the hugified files present, for ``hugify status``.

With ``glibc.elf.thp=1`` ld.so itself advises ``MADV_HUGEPAGE`` for every read-only load
of whole huge pages at aligned addresses and offsets, so a cold start reads such code
as 2 MiB folios with no runtime at all; which windows of a file it covers and how much
of the kernel's read-ahead the file's layout tolerates before the loader's own faults
fill them with small pages first are the core's answer (``_core.windows``'s
``glibc_thp``, core/src/glibc_thp.rs). This module adds what the system says: the
running glibc, whether the tunable is set system-wide (``/etc/tunables.conf``, in
effect once ``ldconfig`` put it into ``/etc/ld.so.cache``), each file's block device
and its ``read_ahead_kb``, and whether its filesystem gives large folios on this kernel.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugify import kernel

if TYPE_CHECKING:
    from hugify.engine import Engine

TUNABLE = "glibc.elf.thp"
#: The first glibc with the tunable.
SINCE = (2, 44)
_LIST_LINE = re.compile(rf"^{re.escape(TUNABLE)}: (-?\d+)", re.M)


def libc_version() -> tuple[int, int] | None:
    """The running glibc's version (confstr), None for another C library."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    m = re.fullmatch(r"glibc (\d+)\.(\d+).*", text)
    return (int(m[1]), int(m[2])) if m else None


def loader() -> str | None:
    """The dynamic loader of this process (the one every program of the system uses)."""
    try:
        mapped = kernel.maps("self")
    except OSError:
        return None
    for v in mapped:
        if re.fullmatch(r"ld-linux[^/]*\.so\.\d+|ld\.so\.\d+|ld64\.so\.\d+", Path(v.name).name):
            return v.name
    return None


def system_wide(ld_so: str) -> int | None:
    """The tunable's value for a program that sets nothing itself: what ld.so reads from
    /etc/ld.so.cache (``ld.so --list-tunables`` without GLIBC_TUNABLES); None if it
    cannot tell."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    try:
        out = subprocess.run(
            [ld_so, "--list-tunables"], env=env, capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _LIST_LINE.search(out)
    return int(m[1]) if m else None


def read_ahead_kb(st_dev: int) -> tuple[str, int] | None:
    """The block device holding a filesystem (st_dev) and its read_ahead_kb; None for
    filesystems on no block device of their own (btrfs subvolumes, overlay, tmpfs)."""
    major, minor = os.major(st_dev), os.minor(st_dev)
    if major == 0:
        return None
    dev = Path(f"/sys/dev/block/{major}:{minor}")
    try:
        real = dev.resolve(strict=True)
    except OSError:
        return None
    for disk in (real, real.parent):  # a partition's queue is its disk's
        try:
            return disk.name, int((disk / "queue" / "read_ahead_kb").read_text())
        except (OSError, ValueError):
            continue
    return None


@dataclass
class FileFacts:
    """One hugified file as glibc.elf.thp would treat it."""

    path: str
    windows: int  # bytes of its whole windows
    advised: int  # of them, in loads ld.so advises
    header: int  # of those, the window holding the ELF header: never cold
    limit: int | None  # read_ahead bytes its layout tolerates (core); None: any
    device: str | None = None
    device_read_ahead_kb: int | None = None
    large_folios: bool | None = None  # whether its filesystem gives large folios on this kernel

    @property
    def helped(self) -> bool:
        """ld.so would advise windows of it that can come cold, and its filesystem can
        hold them huge."""
        return self.advised > self.header and self.large_folios is not False

    @property
    def defeated(self) -> bool:
        """Its device reads ahead more than its layout tolerates."""
        kb = self.device_read_ahead_kb
        return self.helped and kb is not None and self.limit is not None and kb << 10 > self.limit

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "windows": self.windows,
            "advised": self.advised,
            "header": self.header,
            "read_ahead_limit": self.limit,
            "device": self.device,
            "device_read_ahead_kb": self.device_read_ahead_kb,
            "large_folios": self.large_folios,
            "defeated": self.defeated,
        }


@dataclass
class Advice:
    """The running glibc, the tunable's system-wide value and the files it would help."""

    glibc: tuple[int, int] | None
    system_wide: int | None = None
    files: list[FileFacts] = field(default_factory=list)
    #: Whether ld.so advises at all here: on x86-64 always (glibc assumes THP `madvise`
    #: without reading sysfs); elsewhere only when THP is `madvise`.
    advises: bool = False

    @property
    def has_tunable(self) -> bool:
        return self.glibc is not None and self.glibc >= SINCE

    def as_json(self) -> dict[str, Any]:
        return {
            "glibc": ".".join(map(str, self.glibc)) if self.glibc else None,
            "has_tunable": self.has_tunable,
            "system_wide": self.system_wide,
            "advises": self.advises,
            "files": [f.as_json() for f in self.files],
        }

    def lines(self) -> list[str]:
        """What `hugify status` says: nothing where glibc has no such tunable."""
        if not self.has_tunable or not self.files:
            return []
        glibc = ".".join(map(str, self.glibc or ()))
        helped = [f for f in self.files if f.helped] if self.advises else []
        state = {1: "on", 0: "off"}.get(self.system_wide if self.system_wide is not None else -1, "unknown")
        head = f"{TUNABLE} (glibc {glibc}): {state} system-wide; "
        if not helped:
            return [head + "it would make none of these files' code huge (" + self._why_not() + ")"]
        if self.system_wide == 1:
            head += f"ld.so itself asks for huge pages for the code of {len(helped)} of {len(self.files)} files"
        else:
            head += (
                f"set, ld.so itself would ask for huge pages for the code of {len(helped)} of {len(self.files)} "
                f"files at every cold start, with no runtime (add {TUNABLE}=1 to /etc/tunables.conf, run ldconfig)"
            )
        out = [head]
        by_device: dict[tuple[str, int], list[FileFacts]] = {}
        for f in helped:
            if f.defeated and f.device is not None and f.device_read_ahead_kb is not None:
                by_device.setdefault((f.device, f.device_read_ahead_kb), []).append(f)
        for (dev, kb), files in sorted(by_device.items()):
            lowerable = [f for f in files if f.limit]
            never = [f for f in files if not f.limit]
            text = f"{TUNABLE}: read_ahead_kb {kb} of {dev} defeats it for {len(files)} of them (the loader's"
            text += " faults read small pages into their code first)"
            if lowerable:
                best = min(f.limit or 0 for f in lowerable) >> 10
                text += f": {best} or less keeps {len(lowerable)} (echo {best} > /sys/block/{dev}/queue/read_ahead_kb)"
            if never:
                text += f"; none keeps {_names(never)} (their writable data follows their code too closely)"
            out.append(text + "; hugify prefetch loads them all the same")
        return out

    def _why_not(self) -> str:
        if not self.advises:
            return "on this architecture ld.so asks for huge pages only when transparent huge pages are `madvise`"
        if all(f.advised <= f.header for f in self.files):
            return "their code does not start on a huge-page boundary after the ELF header"
        return "their filesystems give no large folios on this kernel"


def _names(files: list[FileFacts]) -> str:
    shown = ", ".join(f.path for f in files[:2])
    return shown + (f" and {len(files) - 2} more" if len(files) > 2 else "")


def advise(paths: list[str], hp: int, thp_enabled: str | None, engine: Engine) -> Advice:
    """The advice for the files `paths` (hugified, one per inode), with transparent
    huge pages `thp_enabled` (always, madvise, never; None: none in this kernel);
    `engine` knows which filesystems give large folios on which kernel."""
    from hugify import _core

    out = Advice(libc_version())
    if not out.has_tunable:
        return out
    out.advises = thp_enabled is not None and (os.uname().machine == "x86_64" or thp_enabled == "madvise")
    ld_so = loader()
    out.system_wide = system_wide(ld_so) if ld_so else None
    mounted = kernel.mounts()
    for path in paths:
        try:
            st = os.stat(path)
            p = _core.probe(path)
        except (OSError, _core.HugifyError):
            continue
        if p is None or p["problem"]:
            continue
        w = _core.windows(p, hp)
        facts = FileFacts(
            path,
            windows=sum(r["len"] for r in w["runs"]),
            advised=w["glibc_thp"]["advised"],
            header=w["glibc_thp"]["header"],
            limit=w["glibc_thp"]["read_ahead_limit"],
        )
        ra = read_ahead_kb(st.st_dev)
        if ra:
            facts.device, facts.device_read_ahead_kb = ra
        fs = kernel.mount_holding(path, mounted)
        facts.large_folios = kernel.gives_large_folios(engine, fs.fstype) if fs else None
        out.files.append(facts)
    return out
