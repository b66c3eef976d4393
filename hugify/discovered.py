"""The discovered list: hugified files that packages installed without shipping a
manifest (an rpm spec without ``%{?hugify_manifest}`` in ``%files``, built where
the distribution turns hugify on for every build).

rpm's file triggers of the ``hugify`` package hand the installed and the erased
paths under the program and library directories to ``hugify manifest record`` and
``forget``; a file is recognised as hugified from its program headers, the way the
prefetcher recognises it, and recorded in the manifest format (docs/manifest.md)
in ``/var/lib/hugify/discovered.list``, which ``hugify prefetch --all`` and
``hugify status`` read after the shipped manifests.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hugify import kernel, manifest
from hugify.files import write_text_atomic
from hugify.hugified import NotHugified, read_hugified


def entry_of(path: str, hp: int) -> manifest.Entry | None:
    """The manifest entry of a hugified file: its whole huge-page windows and its
    build-id. None for anything else (symlinks, small files, other ELF files)."""
    try:
        st = os.lstat(path)
        # A hugified file holds at least one whole window: smaller files are not opened.
        if not stat.S_ISREG(st.st_mode) or st.st_size < hp:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # No readahead for the header reads: it would cache code pages as small folios.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return read_hugified(fd, hp, path).entry
    except (NotHugified, OSError):
        return None
    finally:
        os.close(fd)


def _listed(listing: Path) -> list[manifest.Entry]:
    try:
        return manifest.parse(listing.read_text(encoding="utf-8"), str(listing))
    except FileNotFoundError:
        return []


def _write(listing: Path, entries: list[manifest.Entry]) -> None:
    # hugify's own state directory (/var/lib/hugify, $HUGIFY_STATE_DIR): made here, as
    # no output path a user names is (files.directory_for makes none).
    listing.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_text_atomic(listing, manifest.render(entries))


def _usable(paths: Iterable[str]) -> set[str]:
    """The absolute paths a manifest can hold (no TAB or newline)."""
    return {p for p in paths if p.startswith("/") and "\t" not in p and "\n" not in p}


def record(paths: Iterable[str], listing: Path | None = None) -> list[manifest.Entry]:
    """Looks at each path again: hugified files are (re)listed with their current
    windows and build-id, the others are dropped from the list. Returns the entries
    added or changed."""
    listing = listing or manifest.discovered_list()
    wanted = _usable(paths)
    hp = kernel.pmd_size()
    old = {e.path: e for e in _listed(listing)}
    found = [e for e in (entry_of(p, hp) for p in sorted(wanted)) if e is not None]
    new = [e for p, e in old.items() if p not in wanted] + found
    if sorted(new) != sorted(old.values()):
        _write(listing, new)
    return [e for e in found if old.get(e.path) != e]


def forget(paths: Iterable[str], listing: Path | None = None) -> list[manifest.Entry]:
    """Drops the given paths from the list; returns the entries dropped."""
    listing = listing or manifest.discovered_list()
    gone = _usable(paths)
    old = _listed(listing)
    dropped = [e for e in old if e.path in gone]
    if dropped:
        _write(listing, [e for e in old if e.path not in gone])
    return dropped
