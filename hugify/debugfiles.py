"""Separate debug files of a repacked package (``hugify repack``, hugify.repack).

A debug package holds, per stripped file, the part strip removed: DWARF, the
symbol table, and the section and program headers with the loaded contents left
out (NOBITS). To move that part by the plan of the shipped file, the two halves
are joined again (eu-unstrip), the whole file is transformed by the core with
the mode the shipped file got, the plan is checked to be the same one (same
displacement, same new build-id), and the debug half is split off again
(objcopy --only-keep-debug). So the one tested path that repairs a whole
unstripped file repairs the debug file too; there is no second rewriter of DWARF
that could drift from the first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from hugify import _core, files
from hugify.repack_package import Package, RepackError, replace_debug_file, tool
from hugify.rewrite import Settings, rewrite
from hugify.tree import FileReport

#: The debug file of a build-id in a package (Debian -dbgsym and Fedora -debuginfo
#: both install one under this name; in an rpm it is a symbolic link).
BUILD_ID_DIR = "usr/lib/debug/.build-id"


def by_build_id(root: Path, build_id: str) -> Path:
    return root / BUILD_ID_DIR / build_id[:2] / f"{build_id[2:]}.debug"


def moved_debug_file(original: Path, debug: Path, shipped: FileReport, work: Path) -> Path:
    """The debug file of the transformed file: `debug` (the debug half of
    `original`) moved by the plan `shipped` (the tree report's entry of the
    transformed file). Written in `work`; its path."""
    merged, moved, out = work / "whole", work / "whole.hugified", work / "moved.debug"
    for f in (merged, moved, out):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    try:
        tool(["eu-unstrip", "--output", str(merged), str(original), str(debug)])
    except RepackError as e:
        raise RepackError("debug-mismatch", f"{debug.name} does not match {shipped['path']}: {e.detail}") from None
    try:
        # The limit the shipped file's plan needed: the debug half gets the same plan.
        limit, page_size = shipped.get("exposed_bytes", 0), shipped.get("page_size", 0)
        settings = Settings(shipped["huge_page"], 0, shipped["mode"], limit, page_size)
        report = rewrite(merged, moved, settings, durable=False)
    except _core.HugifyError as e:
        raise RepackError("debug-mismatch", f"{shipped['path']} with its debug file: {e.detail} ({e.reason})") from e
    res = report["result"]
    got = (res["mode"], res["dv"], res["df"], res["build_id"])
    want = (shipped["mode"], shipped["dv"], shipped["df"], shipped["build_id_after"])
    if got != want:
        raise RepackError("debug-mismatch", f"{shipped['path']} with its debug file got another plan: {got} != {want}")
    tool(["objcopy", "--only-keep-debug", str(moved), str(out)])
    return out


def repack(dbg: Package, main: Package) -> None:
    """Moves every debug file in `dbg` that describes a file transformed in `main`
    and renames it after the new build-id."""
    assert main.report is not None
    scratch = dbg.root.parent / "debug"  # beside its root: names may repeat across architectures
    scratch.mkdir(parents=True, exist_ok=True)
    for f in main.report["files"]:
        old, new = f.get("build_id_before"), f.get("build_id_after")
        if f["status"] != "transformed" or not old or not new:
            continue
        link = by_build_id(dbg.root, old)
        if not link.is_file():
            continue
        try:
            # rpm's build-id name is a link to the file named after the package, which
            # keeps its name (rpmbuild makes the new link); one leading out of the
            # package is refused, never read or replaced.
            path = files.resolve_within(dbg.root, link)
        except files.UnsafeFile as e:
            raise RepackError(e.reason, f"{e.filename}: {e.detail}") from None
        moved = moved_debug_file(main.originals[f["path"]], path, f, scratch)
        replace_debug_file(dbg.root, path, path if link.is_symlink() else by_build_id(dbg.root, new), moved)
        dbg.renamed_ids.append((old, new))
        dbg.log.append(f"hugify: {dbg.name}: debug file of {f['path']} moved ({old} -> {new})")
