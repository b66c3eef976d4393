"""Reading and writing package manifests (format: docs/manifest.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hugify import _core

MARKER = "# hugify manifest v1"
#: The format version of `hugify tree --report`, which carries each file's manifest
#: entry: 2 since the entry's span keys are named for it (`manifest_offset`,
#: `manifest_size`; 1 called them `exec_offset`, `exec_size`). Here, where both its
#: writer (hugify/tree.py) and its reader (hugify/signing.py) can import it.
TREE_REPORT_VERSION = 2
#: Where packages install their manifests.
MANIFEST_DIR = Path("/usr/lib/hugify/manifest.d")
#: Where the rpm file trigger records the hugified files that packages installed
#: without a manifest of their own (`hugify manifest record`); $HUGIFY_STATE_DIR
#: replaces the directory (tests, image builders working on another root).
STATE_DIR = Path("/var/lib/hugify")
DISCOVERED = "discovered.list"


def discovered_list() -> Path:
    return Path(os.environ.get("HUGIFY_STATE_DIR") or STATE_DIR) / DISCOVERED


@dataclass(frozen=True, order=True)
class Entry:
    path: str
    build_id: str  # hex, or "-" when the file has none
    offset: int
    size: int
    huge_page: int

    @classmethod
    def of(cls, path: str, p: _core.Probe, w: _core.Windows) -> Entry | None:
        """The entry of a probed file, the one way `tree` and `manifest record` make
        one: the core's manifest span at the windows' huge-page size and the build-id
        ("-" without one); None when the code has no whole window."""
        span = w["manifest_span"]
        return None if span is None else cls(path, p["build_id"] or "-", *span, w["huge_page"])

    def line(self) -> str:
        return f"{self.path}\t{self.build_id}\t{self.offset:#x}\t{self.size:#x}\t{self.huge_page:#x}"


def render(entries: Iterable[Entry]) -> str:
    """The manifest text: marker line, then entries sorted by path."""
    return "\n".join([MARKER, *(e.line() for e in sorted(entries))]) + "\n"


def parse(text: str, origin: str = "<manifest>") -> list[Entry]:
    """Parses a manifest; malformed lines are reported on stderr and skipped."""
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        try:
            path, build_id, offset, size, huge = fields[:5]
            entries.append(Entry(path, build_id, int(offset, 0), int(size, 0), int(huge, 0)))
        except ValueError:
            print(f"hugify: {origin}:{n}: skipping malformed manifest line", file=sys.stderr)
    return entries
