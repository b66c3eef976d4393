"""Writing hugify's own small files (manifests, reports, the discovered list, the
kernel verdict, signed statements): whole or not at all, under a name no other run
uses, and with the time stamp reproducible builds ask for."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

_counter = itertools.count()
StrPath = str | os.PathLike[str]


def temporary_name(target: StrPath) -> str:
    """A name in the target's directory that no other run uses."""
    head, tail = os.path.split(os.fspath(target))
    return os.path.join(head, f".{tail}.hugify-{os.getpid()}-{next(_counter)}")


def source_date_epoch() -> int | None:
    """$SOURCE_DATE_EPOCH (reproducible builds), or None when it is unset or not a
    number of seconds."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else None


def write_text_atomic(path: Path, text: str, epoch: int | None = None) -> None:
    """Replaces `path` with `text` (UTF-8, mode 0644, its directory made if need be) in
    one rename: a reader sees the old file or the new one, never a part; on failure the
    old one stays. `epoch`: the new file's access and modification time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(temporary_name(path))
    try:
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o644)
        if epoch is not None:
            os.utime(tmp, (epoch, epoch))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
