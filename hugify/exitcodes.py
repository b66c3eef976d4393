"""Exit statuses. Each failure kind has its own, so scripts and build systems can
tell a malformed file from a refused one from a bug without parsing text."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0
    #: Some files of a batch failed (``hugify tree``); the log says which.
    FAILED = 1
    #: Bad command line.
    USAGE = 2
    #: The input is malformed (truncated, inconsistent, not ELF).
    INVALID = 3
    #: The input is valid but was not transformed (reason in the message).
    REFUSED = 4
    #: Reading or writing a file failed.
    IO = 5
    #: A file could not be handled safely (not a regular file, a symlink, hard links
    #: outside the tree, swapped while hugify worked: docs/security.md); nothing
    #: was written and nothing outside the target was touched.
    UNSAFE = 6
    #: ``hugify try``: the command behaved differently on the hugified files.
    DIFFERS = 7
    #: ``hugify try``: the command cannot be measured (too short, its runs unseen, or
    #: the A/A control shows a difference).
    UNMEASURED = 8
    #: A bug in hugify; nothing was written.
    INTERNAL = 70

    @classmethod
    def for_kind(cls, kind: str) -> Exit:
        known = {
            "invalid": cls.INVALID,
            "refused": cls.REFUSED,
            "io": cls.IO,
            "unsafe": cls.UNSAFE,
            "differs": cls.DIFFERS,
            "unmeasured": cls.UNMEASURED,
            "info": cls.OK,
        }
        return known.get(kind, cls.INTERNAL)


def worst(codes: list[Exit]) -> Exit:
    """The status of a multi-file run: the most serious of its files."""
    order = [Exit.OK, Exit.REFUSED, Exit.INVALID, Exit.IO, Exit.UNSAFE, Exit.FAILED, Exit.DIFFERS, Exit.UNMEASURED,
             Exit.INTERNAL]  # fmt: skip
    return max(codes, key=order.index, default=Exit.OK)
