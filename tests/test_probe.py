"""One source of truth: the core's probe against tools hugify did not write, and the
bugs that came from deriving the same facts in several places (an align-mode file's
manifest entry, growth reported for compressed debug info, reason ids `explain`
did not know)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from hugify import _core, manifest, signing
from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_build_id, readelf_windows
from testkit.recipes import BY_NAME, build


def _system_elf_files(limit: int) -> list[Path]:
    found = []
    for d in (Path("/usr/bin"), Path("/usr/lib/x86_64-linux-gnu")):
        for p in sorted(d.iterdir()):
            if p.is_file() and not p.is_symlink() and p.stat().st_size > 4096:
                with p.open("rb") as f:
                    if f.read(4) == b"\x7fELF":
                        found.append(p)
            if len(found) >= limit:
                return found
    return found


def test_probe_agrees_with_readelf_and_pyelftools() -> None:
    files = [*_system_elf_files(60), build(BY_NAME["gcc-bfd"]) / "prog", build(BY_NAME["clang-lld"]) / "prog"]
    for path in files:
        p = _core.probe(path)
        assert p is not None and p["problem"] is None, (path, p)
        with path.open("rb") as f:
            elf = ELFFile(f)
            e_type = elf["e_type"]
            assert p["arch"] == {"EM_X86_64": "x86_64"}[elf["e_machine"]]
            assert p["has_symtab"] == (elf.get_section_by_name(".symtab") is not None), path
            interp = any(s["p_type"] == "PT_INTERP" for s in elf.iter_segments())
        assert (p["kind"] == "executable") == (e_type == "ET_EXEC"), path
        if e_type == "ET_DYN" and interp:
            assert p["kind"] == "pie"
        assert p["build_id"] == (readelf_build_id(path).hex() or None), path
        want = readelf_windows(path, e_type == "ET_EXEC")
        assert [(w["offset"], w["len"]) for w in _core.windows(p, HP)["runs"]] == want, path
    assert _core.probe("/etc/passwd") is None


def test_every_page_sizes_windows_come_from_one_probe(tmp_path: Path) -> None:
    """A probe has no huge-page size; `windows` (Probe::windows) gives, from its loads,
    the windows at any size, which are readelf's at that size, with the span and state
    they make."""
    files = [*_system_elf_files(30), build(BY_NAME["gcc-bfd"]) / "prog", build(BY_NAME["clang-lld"]) / "prog"]
    aligned = tmp_path / "prog"
    hugify("transform", files[-2], "-o", aligned)
    states = []
    for path in [*files, aligned]:
        once = _core.probe(path)
        assert once is not None, path
        with path.open("rb") as f:
            fixed = ELFFile(f)["e_type"] == "ET_EXEC"
        for hp in (64 << 10, 1 << 20, 4 << 20, HP):
            w = _core.windows(once, hp)
            runs = [(r["offset"], r["len"]) for r in w["runs"]]
            assert (w["huge_page"], runs) == (hp, readelf_windows(path, fixed, hp)), (path, hp)
            span = (runs[0][0], runs[-1][0] + runs[-1][1] - runs[0][0]) if runs else None
            assert w["manifest_span"] == span and w["huge_bytes"] == sum(n for _, n in runs), (path, hp)
            states.append(w["state"])
    assert states[-4:] == ["whole", "whole", "none", "whole"], "the 2 MiB-aligned output at 64K, 1M, 4M, 2M"


def _tree(root: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HUGIFY_POLICY_PATH": ""}
    return hugify("tree", root, "--no-progress", *args, env=env, check=False)


def test_align_mode_manifest_entry_is_the_whole_windows(tmp_path: Path) -> None:
    """An align-mode file's entry was the segment's offset, not a window's, and the
    prefetcher flagged it as differing from the manifest."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    prog = root / "usr/bin/prog"
    shutil.copy2(build(BY_NAME["gcc-static-pie"]) / "prog", prog)
    res = _tree(root, "--manifest", tmp_path / "m.list", "--report", tmp_path / "r.json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["mode"] == "align"
    (entry,) = manifest.parse((tmp_path / "m.list").read_text())
    want = readelf_windows(prog, fixed=False)
    assert len(want) == 1 and (entry.offset, entry.size) == want[0]
    assert entry.offset % HP == 0 and entry.size % HP == 0
    listed = tmp_path / "listed.list"
    listed.write_text(manifest.render([manifest.Entry(str(prog), *(entry.build_id, entry.offset, entry.size, HP))]))
    res = hugify("prefetch", "--json", "--manifests", listed, check=False)
    (f,) = json.loads(res.stdout)["files"]
    assert "notes" not in f, f


@pytest.mark.parametrize("recipe", ["dw-gcc-gz-zlib", "dw-gcc-O2-dwarf5"])
def test_reported_growth_is_the_size_difference_of_the_file_written(tmp_path: Path, recipe: str) -> None:
    src = build(BY_NAME[recipe]) / "prog"
    size = src.stat().st_size
    out = tmp_path / "out"
    report = json.loads(hugify("transform", "--json", "--threshold", "0", src, "-o", out).stdout)
    assert report["result"]["growth"] == out.stat().st_size - size
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy2(src, root / "usr/bin/prog")
    res = _tree(root, "--report", tmp_path / "r.json")
    assert res.returncode == 0, res.stdout + res.stderr
    tree_report = json.loads((tmp_path / "r.json").read_text())
    (f,) = tree_report["files"]
    assert f["growth"] == (root / "usr/bin/prog").stat().st_size - size
    statement = signing.build_statement(tree_report, root, "demo")
    assert statement is not None
    (entry,) = json.loads(statement.text)["predicate"]["files"]
    assert entry["transformed"]["growth"] == (root / "usr/bin/prog").stat().st_size - size


def test_explain_knows_the_ids_the_tools_print() -> None:
    ids = ["stripped", "excluded", "io-error", "foreign-arch", "unsupported-arch", "not-aligned"]
    ids += ["missing", "not-hugified", "hardlink", "huge-page-mismatch", "internal"]
    res = hugify("explain", *ids, check=False)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == len(ids)
    assert "io-error (io, exit status 5)" in res.stdout
    assert "hardlink (info, exit status 0)" in res.stdout


def test_architecture_names_are_one_table() -> None:
    assert _core.canonical_arch("amd64") == _core.canonical_arch("x86_64") == "x86_64"
    assert _core.canonical_arch("arm64") == "aarch64" and _core.canonical_arch("i686") == "i386"
    assert _core.canonical_arch("sparc") is None
    report = json.loads(hugify("inspect", "--json", build(BY_NAME["gcc-bfd"]) / "prog").stdout)
    assert report[0]["arch"] == "x86_64"
