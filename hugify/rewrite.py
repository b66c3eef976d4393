"""Replacing an ELF file with its transformed self. The file is opened once and
read (content, owner, mode, extended attributes, capabilities) through that
descriptor; the core writes and self-checks a new file created beside the target;
only then is that file given the original's metadata through its own descriptor
and renamed over the target, if the target is still the file that was read
(hugify/files.py holds the rules). On any failure the temporary file is removed
and the original is untouched."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple, cast

from hugify import _core, files
from hugify.files import StrPath

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
    #: The largest base page size the output runs with, which exposure is measured in
    #: (policy page_size; 0: the largest the architecture's distribution kernels use).
    page_size: int = 0


def hugify_error(reason: str, detail: str) -> _core.HugifyError:
    """A failure decided outside the core, with a reason id of the core's table
    (so `hugify explain` knows it) and that reason's kind."""
    kind = next(k for rid, k, _ in _core.reasons() if rid == reason)
    e = _core.HugifyError(f"{detail} ({reason})")
    e.reason, e.kind, e.detail = reason, kind, detail
    return e


def unsafe_error(e: files.UnsafeFile) -> _core.HugifyError:
    return hugify_error(e.reason, e.detail)


class Written(NamedTuple):
    report: Rewritten
    #: The inode now at the target's name.
    identity: files.Identity


def replace(
    source: files.Source,
    directory: files.Directory,
    name: str,
    settings: Settings,
    *,
    in_place: bool,
    times: tuple[int, int] | None = None,
    drop_signatures: bool = False,
    durable: bool = False,
) -> Written:
    """Transforms the open `source` into a new file renamed over `name` in
    `directory`. `in_place`: `name` is the source's own name, which must still be the
    source's inode at the rename. `times` (ns): the new file's access and
    modification times. Raises ``_core.HugifyError`` (reason ids of the core's table,
    including the file-handling ones of kind "unsafe") and ``OSError``; the target is
    unchanged and no temporary file remains on any failure."""
    meta = source.metadata()
    try:
        with files.NewFile(directory, name) as new:
            core = _core.transform(
                source.fd,
                new.fd,
                settings.huge_page,
                settings.threshold,
                settings.mode,
                settings.exposure_limit,
                settings.page_size,
                src_name=source.path,
                out_name=new.path,
            )
            report = cast("Rewritten", core)
            new.step("written")
            signed = sorted(set(meta.xattr_names).intersection(SIGNATURE_XATTRS))
            if signed and not drop_signatures:
                names = ", ".join(signed)
                raise hugify_error(
                    "signed-file",
                    f"signed with {names}, which rewriting would leave stale (IMA appraisal would refuse to run "
                    'it); --drop-stale-signatures or ima_signatures = "drop" rewrites it without them',
                )
            new.give(meta, skip=tuple(signed), times=times)
            new.commit(replacing=source.identity if in_place else None, durable=durable)
    except files.UnsafeFile as e:
        raise unsafe_error(e) from None
    if signed:
        report["dropped_signatures"] = signed
    return Written(report, new.identity)


def rewrite(
    src: StrPath,
    dst: StrPath | None,
    settings: Settings,
    *,
    keep_times: bool = False,
    drop_signatures: bool = False,
    durable: bool = False,
) -> Rewritten:
    """Transforms `src` into `dst` (or in place when `dst` is None) atomically.

    In place, `src` is no symlink, the directory of `src` is opened without following
    a symlink and `src` is replaced there only if its name still is the file that was
    read. With `dst`, `src` is only read, so it may be a symlink or be reached through
    symlinked directories (as ``cp`` and ``readelf`` read it; still never a FIFO or a
    device), and `dst`'s directory is opened like an in-place one.
    Returns the core's report. Raises ``_core.HugifyError`` for refused, invalid,
    unsafe or internal failures and ``OSError`` for I/O failures; in every failure
    case the target is unchanged and no temporary file remains. A file carrying an
    IMA/EVM signature is refused (signed-file) once the core would rewrite it, unless
    `drop_signatures`: then the result has every attribute but those, and the report
    lists them under ``dropped_signatures``. `durable`: fsync before and after the
    rename (a crash leaves the old file or the new one, never an empty one).
    """
    try:
        if dst is None:
            d, name = files.Directory.containing(src)
            out, out_name = d, name
        else:
            head, name = os.path.split(os.fspath(src))
            d = files.Directory.open(head or ".", follow=True)
            out = None
        with d, files.open_source(d, name, follow=dst is not None) as source:
            if out is None:
                out, out_name = files.Directory.containing(cast(StrPath, dst))
            try:
                times = (source.st.st_atime_ns, source.st.st_mtime_ns) if keep_times else None
                return replace(
                    source,
                    out,
                    out_name,
                    settings,
                    in_place=dst is None,
                    times=times,
                    drop_signatures=drop_signatures,
                    durable=durable,
                ).report
            finally:
                if out is not d:
                    out.close()
    except files.UnsafeFile as e:
        raise unsafe_error(e) from None
