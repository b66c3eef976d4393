"""What the parts of ``hugify repack`` share: an unpacked package, the context of
a run, the error that refuses a package, and the helpers that run packaging tools
and add files. hugify.repack drives a run; the format handlers (hugify.repack_deb,
hugify.repack_rpm) and the debug files' handler (hugify.debugfiles) import this
module only, so the modules read top-down without a cycle."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hugify import _core, files, reasons, tree


class RepackError(reasons.ReasonError):
    """A package cannot be repacked: a reason id and a one-line detail."""


def tool(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Runs a packaging tool; its stdout, or RepackError with its first error line."""
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except OSError as e:
        raise RepackError("tool-failed", f"cannot run {cmd[0]}: {reasons.io_detail(e, with_file=False)}") from e
    if res.returncode != 0:
        # The last line that says something (rpmbuild ends with a heading and indented errors).
        lines = [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip() and not ln.endswith(":")]
        raise RepackError("tool-failed", f"{' '.join(cmd[:2])}: {lines[-1] if lines else f'exit {res.returncode}'}")
    return res.stdout


# --- one unpacked package ------------------------------------------------------------


@dataclass
class Package:
    """An input package unpacked into a work directory; the format handler fills
    it in and rebuilds it."""

    src: Path
    name: str
    version: str  # as the format writes it (deb: [epoch:]upstream[-revision]; rpm: the release)
    arch: str
    root: Path  # the installed files
    #: The name of the package this is the debug package of, else None.
    debug_of: str | None = None
    #: What `hugify tree` said: its JSON report (None until transformed).
    report: tree.Report | None = None
    #: Installed path -> a hard link to the file as it was before the transformation.
    originals: dict[str, Path] = field(default_factory=dict)
    #: (old build-id, new build-id) of the separate debug files renamed in a debug package.
    renamed_ids: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    #: The format handler's own state.
    extra: Any = None
    #: Installed beside the same package of other architectures (Debian's
    #: Multi-Arch: same): what hugify adds must not collide with theirs.
    coinstallable: bool = False

    @property
    def stem(self) -> str:
        """The file name (without suffix) of what hugify adds: the runtime manifest
        and the statement, NAME:ARCH for a co-installable package."""
        return f"{self.name}:{self.arch}" if self.coinstallable else self.name

    @property
    def manifest_name(self) -> str:
        """The name of the runtime manifest hugify adds (in manifest.MANIFEST_DIR)."""
        return f"{self.stem}.list"


@dataclass
class Context:
    """What the format handlers need besides the package."""

    suffix: str
    #: The new version of each repacked package, by name (debug packages' exact
    #: dependencies on their main package follow it).
    versions: dict[str, tuple[str, str]]
    epoch: int

    def note(self, pkg: Package) -> str:
        """The value of the field naming the original version and hugify's."""
        return f"original-version={pkg.version}; hugify={_core.VERSION}"


def add_file(root: Path, dest: Path, data: bytes, epoch: int, mode: int = 0o644) -> None:
    """Adds a file hugify makes (root-owned, dated `epoch`), with its directories
    (0755), none of them reached through a symlink the package holds."""
    try:
        files.write_atomic(dest, data, mode=mode, epoch=epoch, tree=root)
    except files.UnsafeFile as e:
        raise RepackError(e.reason, f"{e.filename}: {e.detail}") from None


def replace_debug_file(root: Path, path: Path, new_path: Path, data_from: Path) -> None:
    """Gives the debug file `path` (below `root`, no symlink on its way) new contents
    under the name of its new build-id `new_path`, keeping its metadata. An rpm names
    the file after the package and links the build-id to it (the caller resolved that
    link): there the file keeps its name and rpmbuild makes the new link."""
    rel = files.within(root, path)
    new_rel = files.within(root, new_path)
    assert rel is not None and new_rel is not None, (path, new_path)
    head, name = files.split_relative(rel)
    new_head, new_name = files.split_relative(new_rel)
    try:
        with (
            files.Directory.open(root, follow=True) as top,
            top.beneath(head) as d,
            files.open_source(d, name) as source,
            top.beneath(new_head, create=True) as nd,
            files.NewFile(nd, new_name) as new,
        ):
            with data_from.open("rb") as content:
                new.copy_from(content.fileno())
            new.give(source.metadata(), times=(source.st.st_atime_ns, source.st.st_mtime_ns))
            new.commit()
            if (new_head, new_name) != (head, name):
                os.unlink(name, dir_fd=d.fd)
                with contextlib.suppress(OSError), top.beneath(files.split_relative(head)[0]) as parent:
                    os.rmdir(files.split_relative(head)[1], dir_fd=parent.fd)
    except files.UnsafeFile as e:
        raise RepackError(e.reason, f"{e.filename}: {e.detail}") from None
