"""A hugified file as the runtime side works on it: the file offsets of its whole
huge-page windows, its code size and its manifest entry, from the core's probe
(core/src/probe.rs, Probe::windows); or why it is not one (NotHugified). Read by
hugify prefetch and status, the shared copies, the rpm file triggers' discovered list
and hugify try, from an open descriptor: the name a caller opened may be replaced
meanwhile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hugify.manifest import Entry


class NotHugified(Exception):
    """The file is not (or no longer) a hugified ELF file; the message says why."""


@dataclass(frozen=True)
class Hugified:
    """The whole huge-page windows of a file's executable segments (the core's probe)."""

    offsets: tuple[int, ...]  # file offsets, each a multiple of the huge-page size
    code_size: int  # bytes of the executable segments in the file
    entry: Entry  # the manifest entry the file itself gives (build-id, span)


def read_hugified(fd: int, hp: int, path: str) -> Hugified:
    """The windows of the open file `fd`, whose name is `path`, as the core sees them
    (core/src/windows.rs); NotHugified if it has none here."""
    from hugify import _core, manifest
    from hugify.policy import canonical_arch

    p = _core.probe(f"/proc/self/fd/{fd}")
    if p is None:
        raise NotHugified("not an ELF file")
    if p["problem"]:
        raise NotHugified(f"{p['problem']['detail']} ({p['problem']['reason']})")
    host = canonical_arch(os.uname().machine)
    if p["arch"] != host:
        raise NotHugified(f"built for {p['arch'] or 'an unknown architecture'}, not this system's {host}")
    x = p["exec_load"]
    if x is None:
        raise NotHugified("no executable segment")
    w = _core.windows(p, hp)
    if not w["runs"] or w["manifest_span"] is None:
        if p["kind"] != "executable" and x["align"] < hp:
            raise NotHugified(f"not hugified: its executable segment is aligned to {x['align']:#x}, not {hp >> 20} MiB")
        raise NotHugified(f"not hugified: its code spans no whole {hp >> 20} MiB window at a matching offset")
    offsets = tuple(r["offset"] + k * hp for r in w["runs"] for k in range(r["len"] // hp))
    entry = manifest.Entry.of(path, p, w)
    assert entry is not None  # it has windows
    return Hugified(offsets, p["code_size"], entry)
