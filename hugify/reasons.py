"""Reason ids: every one hugify prints is defined once, in the core's table
(core/src/error.rs), with its kind and summary; `hugify explain` reads the same
table. Commands pass what they print through `printed`, so that the test suite
can check that every id it ever saw is explainable (tests/conftest.py sets
HUGIFY_REASON_LOG for the whole run)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from hugify import files
from hugify.exitcodes import Exit

LOG_ENV = "HUGIFY_REASON_LOG"


class ReasonError(Exception):
    """A refusal with a reason id of the table and a one-line detail; its exit
    status follows the reason's kind."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail

    @property
    def exit(self) -> Exit:
        return Exit.for_kind(table()[self.reason][0])


def table() -> dict[str, tuple[str, str]]:
    """id -> (kind, summary)."""
    from hugify import _core

    return {rid: (kind, summary) for rid, kind, summary in _core.reasons()}


def printed(ids: Iterable[str | None]) -> None:
    """Notes reason ids a command printed (see the module's docstring)."""
    log = os.environ.get(LOG_ENV)
    seen = sorted({i for i in ids if i})
    if log and seen:
        with open(log, "a", encoding="utf-8") as f:  # O_APPEND: one write per call
            f.write("".join(f"{i}\n" for i in seen))


def io_detail(e: OSError, *, with_file: bool = True) -> str:
    """The detail an io-error (or an unsafe file's refusal) is reported with: the
    file, if the error names one, and the system's message (the error's own text when
    it carries none, as an OSError raised with a message alone). `with_file=False`
    where the caller's line already names the file, or names it another way."""
    why = str(e.strerror or e)
    return f"{e.filename}: {why}" if with_file and e.filename else why


def say_error(e: OSError, what: str = "") -> Exit:
    """Says in one line on stderr ("hugify: error: WHAT...") why a command's own
    output failed: an unsafe file's refusal (with its reason id, exit status 6) or the
    I/O error (io-error, 5)."""
    return _say_os_error(e, f"hugify: error: {what}")


def report(e: ReasonError | OSError) -> Exit:
    """Says why a run stopped, in one line with its reason id on stderr; its exit status."""
    if isinstance(e, ReasonError):
        printed([e.reason])
        print(f"hugify: {e.detail} ({e.reason})", file=sys.stderr)
        return e.exit
    return _say_os_error(e, "hugify: ")


def _say_os_error(e: OSError, lead: str) -> Exit:
    """Says, after `lead`, an unsafe file's refusal or an I/O error; its exit status."""
    if isinstance(e, files.UnsafeFile):
        printed([e.reason])
        print(f"{lead}{e}", file=sys.stderr)
        return Exit.UNSAFE
    printed(["io-error"])
    print(f"{lead}{io_detail(e)} (io-error)", file=sys.stderr)
    return Exit.IO
