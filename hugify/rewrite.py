"""Replacing an ELF file with its transformed self. The file is opened once and
read (content, owner, mode, extended attributes, capabilities) through that
descriptor; the core writes and self-checks a new file created beside the target;
only then is that file given the original's metadata through its own descriptor
and renamed over the target, if the target is still the file that was read
(hugify/files.py holds the rules). On any failure the temporary file is removed
and the original is untouched."""

from __future__ import annotations

import os
import stat
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


def unsafe_error(e: files.UnsafeFile, about: str | None = None) -> _core.HugifyError:
    """The refusal of an unsafe file; `about`: what it concerns ("the output OUT"),
    named in the detail, where it is not the file the message is said of."""
    return hugify_error(e.reason, f"{about}: {e.detail}" if about else e.detail)


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


def _output_failed(e: OSError, what: str) -> OSError:
    """An I/O error met while writing the output, said of the output (`what`: "the
    output OUT", or "a new file beside it" in place), never of hugify's temporary name."""
    why = str(e.strerror or e)
    return OSError(e.errno, f"cannot write {what}: {why}")


def _source_failed(e: OSError, src: str) -> OSError:
    """An I/O error met while opening the input, named by the path the caller gave
    (not the name inside its directory)."""
    return OSError(e.errno, str(e.strerror or e), src)


def _no_device_over(d: files.Directory, name: str) -> None:
    """Refuses an output name that is a directory, device node, FIFO or socket: the
    rename would replace it (root renaming over /dev/null). A symbolic link there is
    replaced, never followed."""
    try:
        st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        what = f"{files.describe(st.st_mode)}, not a regular file"
        raise files.UnsafeFile("not-regular", d.join(name), f"{what}: hugify writes over a regular file only")


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
    device), and `dst`'s directory is opened like an in-place one; `dst` itself must
    be a regular file, a symlink (replaced, not followed) or a new name.
    Returns the core's report. Raises ``_core.HugifyError`` for refused, invalid,
    unsafe or internal failures and ``OSError`` for I/O failures: one about the input
    names `src`, one about the output says "cannot write the output DST" (or "a new
    file beside it" in place), never hugify's temporary name. In every failure case
    the target is unchanged and no temporary file remains. A file carrying an
    IMA/EVM signature is refused (signed-file) once the core would rewrite it, unless
    `drop_signatures`: then the result has every attribute but those, and the report
    lists them under ``dropped_signatures``. `durable`: fsync before and after the
    rename (a crash leaves the old file or the new one, never an empty one).
    """
    src_text = os.fspath(src)
    dst_text = None if dst is None else os.fspath(dst)
    what = "a new file beside it" if dst_text is None else f"the output {dst_text}"
    try:
        if dst is None:
            d, name = files.Directory.containing(src)
        else:
            head, name = os.path.split(src_text)
            d = files.Directory.open(head or ".", follow=True)
        try:
            source = files.open_source(d, name, follow=dst is not None)
        except BaseException:
            d.close()
            raise
    except files.UnsafeFile as e:
        if e.reason == "not-regular":  # the path the caller named: not a file to read at all
            raise hugify_error("wrong-file-type", e.detail) from None
        raise unsafe_error(e) from None
    except IsADirectoryError as e:
        raise hugify_error("wrong-file-type", str(e.strerror)) from None
    except OSError as e:
        raise _source_failed(e, src_text) from None
    with d, source:
        try:
            out, out_name = d, name
            if dst_text is not None:
                out, out_name = files.Directory.containing(dst_text)
        except files.UnsafeFile as e:
            raise unsafe_error(e, about=what) from None
        except IsADirectoryError as e:
            raise unsafe_error(files.UnsafeFile("not-regular", dst_text or src_text, str(e.strerror)), what) from None
        except OSError as e:
            raise _output_failed(e, what) from None
        try:
            if dst_text is not None:
                _no_device_over(out, out_name)
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
        except files.UnsafeFile as e:
            raise unsafe_error(e, about=what if dst_text is not None else None) from None
        except _core.HugifyError as e:
            if dst_text is not None and e.kind == "unsafe":  # replace() said it of the output
                raise hugify_error(e.reason, f"{what}: {e.detail}") from None
            raise
        except OSError as e:
            if e.filename == source.path:  # the core reading the input
                raise _source_failed(e, src_text) from None
            raise _output_failed(e, what) from None
        finally:
            if out is not d:
                out.close()
