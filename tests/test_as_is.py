"""Files that need no rewrite get huge pages too: a non-PIE executable whose code
offset is congruent to its fixed address (as Debian builds cc1plus and python3.11)
and a library linked with 2 MiB alignment are listed in the manifest as `as-is`,
left byte-identical, and loaded as 2 MiB folios by `hugify prefetch`, `hugify-run`
and the audit library (FilePmdMapped in the program's own smaps). The windows the C
runtime finds are the core's, file by file."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from hugify import _core, manifest
from testkit import HP
from testkit.cli import hugify
from testkit.elf import readelf_windows, window_offsets
from testkit.recipes import BY_NAME, build
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    MAIN,
    RUNTIME,
    build_runtime,
    drop_caches,
    locked,
    padded_functions,
    parse_smaps,
    run_mappings,
)


def _gcc(cwd: Path, *args: str) -> None:
    subprocess.run(["gcc", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def as_is(large_folio_dir: Path) -> Path:
    """usr/bin/prog: a non-PIE executable with about 9 MiB of code; usr/lib/libplug.so:
    a library linked with 2 MiB pages (its code on whole windows as linked). On XFS
    (conftest.large_folio_dir), which gives them 2 MiB folios whatever the kernel."""
    assert os.geteuid() == 0, "the runtime part drops the page cache and needs root (CI runs as root)"
    build_runtime()
    work = large_folio_dir / "as-is"
    work.mkdir()
    (work / "main.c").write_text(padded_functions("exe", 600) + "long lib_all(long x) { return x; }\n" + MAIN)
    (work / "plug.c").write_text(padded_functions("plug", 300))
    _gcc(work, "-O1", "-no-pie", "-fno-pie", "-o", "prog", "main.c", "-ldl")
    _gcc(work, "-O1", "-fPIC", "-shared", "-Wl,-z,max-page-size=0x200000", "-o", "libplug.so", "plug.c")
    root = work / "root"
    for d, name in (("usr/bin", "prog"), ("usr/lib", "libplug.so")):
        (root / d).mkdir(parents=True)
        (work / name).rename(root / d / name)
    return root


def _expected_windows(path: Path, fixed: bool) -> list[int]:
    """The file offset of each whole window, from readelf's program headers."""
    return window_offsets(readelf_windows(path, fixed))


def test_tree_lists_files_that_need_no_rewrite_as_is(as_is: Path, tmp_path: Path) -> None:
    prog, plug = as_is / "usr/bin/prog", as_is / "usr/lib/libplug.so"
    before = {p: p.read_bytes() for p in (prog, plug)}
    env = {**os.environ, "HUGIFY_POLICY_PATH": ""}
    m, r = tmp_path / "m.list", tmp_path / "r.json"
    res = hugify("tree", as_is, "--no-progress", "--manifest", m, "--report", r, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {p: p.read_bytes() for p in (prog, plug)} == before
    report = {f["path"]: f for f in json.loads(r.read_text())["files"]}
    assert report["/usr/bin/prog"]["status"] == "as-is" and report["/usr/bin/prog"]["reason"] == "already-aligned"
    assert report["/usr/lib/libplug.so"]["status"] == "as-is"
    assert report["/usr/lib/libplug.so"]["reason"] == "already-aligned"
    assert "hugify: /usr/bin/prog: as-is (already-aligned): " in res.stdout
    assert "hugify: 0 transformed, 2 as-is, 0 skipped, 0 failed" in res.stdout
    entries = {e.path: e for e in manifest.parse(m.read_text())}
    for path, file, fixed in (("/usr/bin/prog", prog, True), ("/usr/lib/libplug.so", plug, False)):
        want = _expected_windows(file, fixed)
        assert want, f"{file}: the test file has no whole window"
        assert (entries[path].offset, entries[path].size) == (want[0], want[-1] + HP - want[0])


def test_prefetch_status_and_a_run_map_an_as_is_executable_with_pmds(as_is: Path, tmp_path: Path) -> None:
    prog = as_is / "usr/bin/prog"
    windows = _expected_windows(prog, fixed=True)
    with locked():
        drop_caches()
        res = hugify("prefetch", "--json", "--runtime-dir", tmp_path, prog, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        (f,) = json.loads(res.stdout)["files"]
        assert [w["offset"] for w in f["windows"]] == windows
        assert {w["state"] for w in f["windows"]} == {"loaded"}
        maps = run_mappings([prog])
        status = json.loads(hugify("status", "--json", prog).stdout)
    assert maps[str(prog)].pmd == len(windows) * HP, maps[str(prog)]
    (s,) = status["files"]
    assert s["huge_bytes"] == len(windows) * HP


def test_hugify_run_loads_an_as_is_executable(as_is: Path, tmp_path: Path) -> None:
    prog = as_is / "usr/bin/prog"
    env = {**os.environ, "HUGIFY_AUDIT_LIB": "", "HUGIFY_RUNTIME_DIR": str(tmp_path)}
    with locked():
        drop_caches()
        res = subprocess.run([HUGIFY_RUN, prog, "-"], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert parse_smaps(res.stdout)[str(prog)].pmd == len(_expected_windows(prog, fixed=True)) * HP


def test_audit_library_loads_an_as_is_executable_and_a_dlopened_as_is_library(as_is: Path) -> None:
    prog, plug = as_is / "usr/bin/prog", as_is / "usr/lib/libplug.so"
    with locked():
        drop_caches()
        maps = run_mappings([prog, plug], env={"LD_AUDIT": str(AUDIT_LIB)})
    assert maps[str(prog)].pmd == len(_expected_windows(prog, fixed=True)) * HP
    assert maps[str(plug)].pmd == len(_expected_windows(plug, fixed=False)) * HP > 0


def _headers_only_elf(path: Path, e_type: int, loads: list[tuple[int, int, int, int, int]]) -> None:
    """An x86-64 ELF file of just a header and PT_LOADs (flags, offset, vaddr, filesz,
    align), sparse up to the end of its last segment: the corners of the window rule."""
    ehdr = b"\x7fELF\x02\x01\x01" + bytes(9)
    ehdr += struct.pack("<HHIQQQIHHHHHH", e_type, 62, 1, 0, 64, 0, 0, 64, 56, len(loads), 64, 0, 0)
    phdrs = b"".join(struct.pack("<IIQQQQQQ", 1, f, off, va, va, size, size, al) for f, off, va, size, al in loads)
    with path.open("wb") as out:
        out.write(ehdr + phdrs)
        out.truncate(max(off + size for _, off, _, size, _ in loads))


ET_EXEC, ET_DYN, R_X, X = 2, 3, 5, 1
#: name -> (e_type, loads): where a rule that rounds the offset, caps the runs or
#: ignores p_align would part from the core's.
CORNERS = {
    "rounds-on-the-address": (ET_DYN, [(R_X, 0x1000, 0x1000, 5 * HP, HP)]),
    "six-executable-loads": (ET_DYN, [(R_X, k * 4 * HP + 0x1000, k * 4 * HP + 0x1000, 3 * HP, HP) for k in range(6)]),
    "exec-at-fixed-address-small-align": (ET_EXEC, [(R_X, 0x1000, 0x401000, 5 * HP, 0x1000)]),
    "pie-small-align": (ET_DYN, [(R_X, 0x1000, 0x401000, 5 * HP, 0x1000)]),
    "congruent-to-the-page-only": (ET_EXEC, [(R_X, 0x1000, 0x202000, 5 * HP, 0x1000)]),
    "at-the-top-of-the-address-space": (ET_EXEC, [(R_X, 0x1000, 2**64 - HP + 0x1000, 0x1000, HP)]),
    "less-than-a-window": (ET_DYN, [(R_X, 0x1000, 0x1000, HP, HP)]),
    "execute-only-and-a-second-load": (ET_DYN, [(X, 0x1000, 0x1000, 5 * HP, HP), (R_X, 6 * HP, 6 * HP, 3 * HP, HP)]),
}


def test_the_c_runtime_finds_the_windows_the_core_finds(as_is: Path, tmp_path: Path) -> None:
    """One rule in Rust and C: every 64-bit file of this machine's architecture the core
    probes without a problem gives the C runtime (hp_exec_range) exactly the core's
    windows; the C reader may reject only files the core rejects too. Over a table of
    constructed corners and real programs."""
    driver = tmp_path / "hp_windows"
    src = Path(__file__).parent / "programs/hp_windows.c"
    runtime = [str(RUNTIME / "hp_elf.c")]
    _gcc(tmp_path, "-O1", f"-I{RUNTIME}", "-o", str(driver), str(src), *runtime)
    corners = []
    for name, (e_type, loads) in CORNERS.items():
        _headers_only_elf(tmp_path / name, e_type, loads)
        corners.append(tmp_path / name)
    shifted = tmp_path / "shifted"
    hugify("transform", "--threshold", "0", build(BY_NAME["gcc-bfd"]) / "prog", "-o", shifted)
    files = [as_is / "usr/bin/prog", as_is / "usr/lib/libplug.so", shifted, build(BY_NAME["gcc-static-pie"]) / "prog"]
    aligned = tmp_path / "aligned"
    hugify("transform", "--threshold", "0", files[-1], "-o", aligned)
    files.append(aligned)
    # lld's layout shifted: the executable load starts mid-window, at the code's first page.
    partial = tmp_path / "partial"
    hugify("transform", "--threshold", "0", "--mode", "shift", build(BY_NAME["clang-lld"]) / "prog", "-o", partial)
    files.append(partial)
    files += corners
    files += sorted(p for p in Path("/usr/bin").iterdir() if p.is_file() and not p.is_symlink())[:200]
    out = subprocess.run([driver, *files], capture_output=True, text=True, check=True).stdout
    c_side: dict[str, list[tuple[int, int]]] = {}
    unreadable = set()
    for line in out.splitlines():
        path, *rest = line.rsplit(" ", 2)
        if rest == ["unreadable"]:
            unreadable.add(line.rsplit(" ", 1)[0])
        else:
            c_side.setdefault(path, []).append((int(rest[0]), int(rest[1])))
    compared, host = [], os.uname().machine
    for f in files:
        p = _core.probe(f)
        if p is None or p["problem"] or not p["is64"] or p["arch"] != host or p["kind"] is None:
            continue
        assert str(f) not in unreadable, f"the C reader rejects {f}, which the core reads"
        assert c_side.get(str(f), []) == [(w["offset"], w["len"]) for w in _core.windows(p, HP)["runs"]], f
        compared.append(f)
    assert set(corners) <= set(compared)
    assert len(compared) >= 5 + len(corners) and sum(map(len, c_side.values())) >= 5
    assert len(c_side[str(tmp_path / "six-executable-loads")]) == 6
    shifted_lld = _core.probe(partial)
    assert shifted_lld and shifted_lld["exec_load"] and shifted_lld["exec_load"]["vaddr"] % HP != 0
    assert str(partial) in c_side and len(_core.windows(shifted_lld, HP)["runs"]) == 1
