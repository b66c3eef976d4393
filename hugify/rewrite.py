"""Replacing a file safely: the core writes and self-checks a new temporary file
beside the target; only then is it given the original's metadata and renamed over
the target in one atomic step. On any failure the temporary is removed and the
original is untouched."""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, NamedTuple, cast

from hugify import _core
from hugify.files import StrPath, temporary_name

if TYPE_CHECKING:

    class Rewritten(_core.Transformed, total=False):
        """The core's report, and the signature attributes the rewrite dropped."""

        dropped_signatures: list[str]


#: Extended attributes that sign the file's bytes: IMA appraisal rejects a file
#: whose bytes no longer match them, so they never follow a rewrite silently.
SIGNATURE_XATTRS = ("security.evm", "security.ima")


class Settings(NamedTuple):
    """What the core needs to plan a file."""

    huge_page: int = _core.DEFAULT_HUGE_PAGE
    threshold: int = _core.DEFAULT_THRESHOLD
    mode: str = "auto"
    #: Bytes per file that may become executable that were not (policy exposure_limit).
    exposure_limit: int = 0


def hugify_error(reason: str, detail: str) -> _core.HugifyError:
    """A failure decided outside the core, with a reason id of the core's table
    (so `hugify explain` knows it) and that reason's kind."""
    kind = next(k for rid, k, _ in _core.reasons() if rid == reason)
    e = _core.HugifyError(f"{detail} ({reason})")
    e.reason, e.kind, e.detail = reason, kind, detail
    return e


def signature_xattrs(path: StrPath) -> list[str]:
    """The IMA/EVM signature attributes `path` carries."""
    try:
        return sorted(set(os.listxattr(path)).intersection(SIGNATURE_XATTRS))
    except OSError:  # no xattr support on this filesystem: nothing signed
        return []


def copy_metadata(
    src_stat: os.stat_result, src: StrPath, dst: StrPath, *, times: bool, skip: tuple[str, ...] = ()
) -> None:
    """Gives `dst` the owner, mode bits (setuid/setgid too), extended attributes but
    `skip` and, if `times`, the timestamps of `src`. Order matters: chown clears
    setuid bits and file capabilities, so it comes first."""
    if os.geteuid() == 0 or src_stat.st_uid == os.geteuid():
        with contextlib.suppress(PermissionError):
            os.chown(dst, src_stat.st_uid, src_stat.st_gid)
    os.chmod(dst, stat.S_IMODE(src_stat.st_mode))
    try:
        names = os.listxattr(src)
    except OSError:
        names = []
    for name in names:
        if name in skip:
            continue
        os.setxattr(dst, name, os.getxattr(src, name))
    if times:
        os.utime(dst, ns=(src_stat.st_atime_ns, src_stat.st_mtime_ns))


def rewrite(
    src: StrPath,
    dst: StrPath | None,
    settings: Settings,
    *,
    keep_times: bool = False,
    drop_signatures: bool = False,
) -> Rewritten:
    """Transforms `src` into `dst` (or in place when `dst` is None) atomically.

    Returns the core's report. Raises ``_core.HugifyError`` for refused, invalid or
    internal failures and ``OSError`` for I/O failures; in every failure case the
    target is unchanged and no temporary file remains. A file carrying an IMA/EVM
    signature is refused (signed-file) once the core would rewrite it, unless
    `drop_signatures`: then the result has every attribute but those, and the
    report lists them under ``dropped_signatures``.
    """
    target = dst if dst is not None else src
    tmp = temporary_name(target)
    st = os.stat(src)
    try:
        report = cast(
            "Rewritten",
            _core.transform(src, tmp, settings.huge_page, settings.threshold, settings.mode, settings.exposure_limit),
        )
        signed = signature_xattrs(src)
        if signed and not drop_signatures:
            names = ", ".join(signed)
            raise hugify_error(
                "signed-file",
                f"signed with {names}, which rewriting would leave stale (IMA appraisal would refuse to run it); "
                '--drop-stale-signatures or ima_signatures = "drop" rewrites it without them',
            )
        copy_metadata(st, src, tmp, times=keep_times, skip=tuple(signed))
        if signed:
            report["dropped_signatures"] = signed
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return report
