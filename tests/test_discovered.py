"""`hugify manifest record|forget`, the discovered list the rpm file triggers keep
(docs/manifest.md), and `hugify prefetch --all` / `hugify status` reading it beside
the shipped manifests. The end-to-end run with rpm's triggers is in
test_packages.py (rpm --root)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hugify import manifest
from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_build_id, readelf_loads
from testkit.recipes import BY_NAME, build
from testkit.runtime import file_backed_only, gives_large_folios, locked


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hugified program (and a hardlink and a symlink to it), the same program not
    hugified, a small one and a text file."""
    big, small = build(BY_NAME["gcc-bfd"]), build(BY_NAME["gcc-bfd-small"])
    d = tmp_path_factory.mktemp("installed")
    hugify("transform", big / "prog", "-o", d / "hug")
    os.link(d / "hug", d / "hug-link")
    (d / "hug-symlink").symlink_to("hug")
    shutil.copy(big / "prog", d / "plain")
    shutil.copy(small / "prog", d / "small")
    (d / "notes.txt").write_text("not ELF\n" * 500_000)
    return d


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "HUGIFY_STATE_DIR": str(tmp_path / "state"), **extra}


def record(tmp_path: Path, action: str, paths: list[Path]) -> str:
    """`hugify manifest ACTION --from-stdin`, the paths on stdin as rpm gives them."""
    return hugify("manifest", action, "--from-stdin", stdin="".join(f"{p}\n" for p in paths), env=env(tmp_path)).stdout


def test_record_lists_only_hugified_regular_files(files: Path, tmp_path: Path) -> None:
    names = ["hug", "hug-link", "hug-symlink", "plain", "small", "notes.txt", "missing"]
    out = record(tmp_path, "record", [files / n for n in names] + [files])
    assert out.splitlines() == [
        f"hugify: {files / n}: recorded in {tmp_path / 'state' / 'discovered.list'}" for n in ("hug", "hug-link")
    ]
    text = (tmp_path / "state" / "discovered.list").read_text()
    assert text.startswith(manifest.MARKER + "\n")
    entries = manifest.parse(text)
    assert [e.path for e in entries] == [str(files / "hug"), str(files / "hug-link")]
    (x,) = [s for s in readelf_loads(files / "hug") if "E" in s.flags]  # readelf, not hugify's reader
    for e in entries:
        assert e.build_id == readelf_build_id(files / "hug").hex()
        assert (e.offset, e.size, e.huge_page) == (x.offset, x.filesz, HP)
    # Again: nothing new, nothing changed.
    assert record(tmp_path, "record", [files / "hug"]) == ""
    assert (tmp_path / "state" / "discovered.list").read_text() == text


def test_forget_drops_paths_and_record_drops_files_no_longer_hugified(files: Path, tmp_path: Path) -> None:
    record(tmp_path, "record", [files / "hug", files / "hug-link"])
    out = record(tmp_path, "forget", [files / "hug-link", files / "plain"])
    assert out.splitlines() == [
        f"hugify: {files / 'hug-link'}: forgotten from {tmp_path / 'state' / 'discovered.list'}"
    ]
    assert [e.path for e in manifest.parse((tmp_path / "state" / "discovered.list").read_text())] == [
        str(files / "hug")
    ]
    # An upgrade replaced it with a file that is not hugified: recording it drops it.
    replaced = tmp_path / "hug"
    shutil.copy(files / "hug", replaced)
    record(tmp_path, "record", [replaced])
    shutil.copy(files / "plain", replaced)
    record(tmp_path, "record", [replaced])
    assert str(replaced) not in {e.path for e in manifest.parse((tmp_path / "state" / "discovered.list").read_text())}


def test_prefetch_all_and_status_read_the_discovered_list(files: Path, tmp_path: Path) -> None:
    mdir = tmp_path / "manifest.d"
    mdir.mkdir()
    shipped = manifest.parse(manifest.render([manifest.Entry(str(files / "hug-link"), "-", 0x200000, 0x400000, HP)]))
    (mdir / "pkg.list").write_text(manifest.render(shipped))
    record(tmp_path, "record", [files / "hug", files / "hug-link"])
    e = env(tmp_path, HUGIFY_MANIFEST_DIR=str(mdir), HUGIFY_RUNTIME_DIR=str(tmp_path / "run"))
    with locked():  # the page cache is shared with the runtime tests
        large = gives_large_folios(files / "hug")
        no_copies = file_backed_only(tmp_path)  # the file-backed way: no shared copies
        res = hugify("prefetch", "--all", "--json", "--policy", str(no_copies), check=False, env=e)
    # The files are on the filesystem of the tests' temporary directory: where it gives
    # 2 MiB folios (measured just before), every window ends up huge (or left to the
    # kernel); where it does not, every window is unsupported, said with exit status 4.
    assert res.returncode == (0 if large else 4), res.stderr
    report = json.loads(res.stdout)
    by_path = {f["path"]: f for f in report["files"]}
    assert set(by_path) == {str(files / "hug"), str(files / "hug-link")}
    windows = by_path[str(files / "hug-link")]["windows"]  # the inode's entry; "hug" is its hardlink
    states = {w["state"] for w in windows}
    assert windows and states <= ({"huge", "loaded", "repaired", "kernel"} if large else {"unsupported"}), states
    # A path in both counts once, from the shipped manifest.
    assert by_path[str(files / "hug-link")]["manifest"] == str(mdir / "pkg.list")
    assert by_path[str(files / "hug")]["manifest"] == str(tmp_path / "state" / "discovered.list")
    status = json.loads(hugify("status", "--json", env=e).stdout)
    assert {f["path"] for f in status["files"]} == {str(files / "hug"), str(files / "hug-link")}
