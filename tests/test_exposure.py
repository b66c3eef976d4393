"""No byte becomes executable that was not (issue 28), checked with readelf on files
lld linked, not on files hugify's tests made by hand.

lld puts .rodata, .eh_frame_hdr and .eh_frame in a read-only load below the code. A
library with about 2.2 MiB of code and a 3 MiB constant table (many of its bytes
0xc3, `ret`): after `hugify transform` no `R E` load may map a byte of those, which
readelf's program and section headers of the input and the output show; the library
still works under a program. Exposure exists only by the policy's exposure_limit, per
package, in every mode, and is then named in the build log, the tree report,
`inspect --json` and the signed statement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.cli import hugify, transform
from testkit.elf import (
    PAGE,
    executable_ranges,
    newly_executable,
    overlap,
    readelf_loads,
    readelf_sections,
    readelf_windows,
)
from testkit.recipes import BY_NAME, GENERATOR, PROGRAMS, build, cached_dir, generate_code
from testkit.runtime import (
    HUGIFY_RUN,
    MAIN,
    build_runtime,
    drop_caches,
    locked,
    padded_functions,
    parse_smaps,
    run_mappings,
)

TABLE = 3 << 20
FUNCS = 3450  # about 2.2 MiB of code from clang -O2
READ_ONLY = (".rodata", ".eh_frame_hdr", ".eh_frame")
TABLE_C = f"""
/* A constant table of 3 MiB in .rodata; every fourth byte is 0xc3 (ret on x86). */
__asm__(".section .rodata\\n.balign 64\\n.globl big_table\\n.hidden big_table\\n"
        ".type big_table, @object\\n.size big_table, {TABLE}\\nbig_table:\\n.incbin \\"table.bin\\"\\n.previous");
extern const unsigned char big_table[{TABLE}] __attribute__((visibility("hidden")));
long table_sum(void) {{
    long s = 0;
    for (long i = 0; i < {TABLE}; i += 4093) s = s * 31 + big_table[i];
    return s;
}}
"""
MAIN_C = """
#include <stdio.h>
long lib_dispatch(long);
long table_sum(void);
int main(void) { printf("%ld %ld\\n", lib_dispatch(7), table_sum()); return 0; }
"""


def _table() -> bytes:
    return bytes(0xC3 if i % 4 == 0 else (i * 7) % 251 for i in range(TABLE))


def _make(work: Path) -> None:
    sources = [*generate_code("lib", FUNCS, 4, work, compiler=["clang"], flags=["-O2", "-fPIC"]), "table.c"]
    (work / "table.c").write_text(TABLE_C)
    (work / "main.c").write_text(MAIN_C)
    (work / "table.bin").write_bytes(_table())
    cc = ["clang", "-O2", "-fuse-ld=lld"]
    subprocess.run(
        [*cc, "-fPIC", "-shared", "-Wl,-soname,libtable.so", "-o", "libtable.so", *sources], cwd=work, check=True
    )
    subprocess.run([*cc, "-o", "prog", "main.c", "-L.", "-ltable", "-Wl,-rpath,$ORIGIN"], cwd=work, check=True)
    for f in work.iterdir():
        if f.name not in ("prog", "libtable.so"):
            f.unlink()


@pytest.fixture(scope="module")
def lld_library() -> Path:
    """The directory with libtable.so (lld, 2.2 MiB of code, a 3 MiB table) and prog."""
    key = "\n".join([TABLE_C, MAIN_C, str(FUNCS), (PROGRAMS / "gen_code.py").read_text(), GENERATOR])
    return cached_dir("exposure-lld", key, _make)


def test_lld_library_keeps_its_read_only_data_out_of_the_executable_load(lld_library: Path, tmp_path: Path) -> None:
    lib = lld_library / "libtable.so"
    old_secs = readelf_sections(lib)
    by_name = {s.name: s for s in old_secs}
    # The input as the issue describes it: lld's rodata-first layout, the table and
    # .eh_frame in an R load below the R E load of the code.
    code = sum(s.size for s in old_secs if "X" in s.flags)
    assert 2.05 * (1 << 20) < code < 2.5 * (1 << 20), code
    assert by_name[".rodata"].size >= TABLE
    old_x = executable_ranges(readelf_loads(lib), rounded=False)
    for name in READ_ONLY:
        s = by_name[name]
        assert overlap(s.offset, s.offset + s.size, old_x) == 0 and s.addr < by_name[".text"].addr, name

    out = tmp_path / "libtable.so"
    r = transform(lib, out)
    res = r["result"]
    assert (r["layout"], res["mode"], res["exposed_read_only"], res["exposed_sections"]) == (
        "rodata-first",
        "shift",
        0,
        {},
    )

    # readelf of input and output: nothing the output maps executable (its R E loads,
    # whole pages) was not executable in the input; no read-only section lies in an
    # R E load, by file offset or by address; trap padding is traps.
    assert newly_executable(lib, out) == {}
    loads, secs = readelf_loads(out), readelf_sections(out)
    mapped = executable_ranges(loads, rounded=True)
    data = out.read_bytes()
    for s in secs:
        if s.name in READ_ONLY:
            assert overlap(s.offset, s.offset + s.size, mapped) == 0, s.name
            for ld in (ld for ld in loads if "E" in ld.flags):
                lo, hi = ld.vaddr // PAGE * PAGE, -(-(ld.vaddr + ld.filesz) // PAGE) * PAGE
                assert s.addr + s.size <= lo or s.addr >= hi, f"an R E load maps {s.name}"
        if s.name == ".hugify.pad":
            assert data[s.offset : s.offset + s.size] == b"\xcc" * s.size

    # Coverage counts whole windows only: code bytes (by readelf) inside the windows.
    windows = [(o, o + n) for o, n in readelf_windows(out, fixed=False)]
    assert windows, loads
    in_windows = sum(
        overlap(s.offset, s.offset + s.size, windows) for s in secs if "X" in s.flags and s.name != ".hugify.pad"
    )
    assert in_windows == res["covered_code"] and HP - PAGE < in_windows <= HP < code

    # The library still works under its program.
    shutil.copy(lld_library / "prog", tmp_path / "prog")
    before = subprocess.run([lld_library / "prog"], capture_output=True, text=True, check=True).stdout
    after = subprocess.run([tmp_path / "prog"], capture_output=True, text=True, check=True).stdout
    assert after == before and before.strip()
    trace = subprocess.run(
        [tmp_path / "prog"], capture_output=True, text=True, check=True, env={**os.environ, "LD_DEBUG": "libs"}
    ).stderr
    assert f"calling init: {out}" in trace


# --- the opt-in: policy, modes, reports ---------------------------------------------------

#: lld, 1.8 MiB of code above 0.4 MiB of read-only data: no whole window of code
#: without that data in the code's window.
SHORT = "clang-lld-now"


def test_no_mode_exposes_without_the_opt_in(tmp_path: Path) -> None:
    lib = build(BY_NAME[SHORT]) / "libhug.so"
    before = lib.read_bytes()
    for mode in ("auto", "shift", "align"):
        res = hugify("transform", "--threshold", "0", "--mode", mode, lib, "-o", tmp_path / mode, check=False)
        assert res.returncode == 4 and "(no-gain)" in res.stderr, (mode, res.stderr)
        assert not (tmp_path / mode).exists()
    assert lib.read_bytes() == before
    r = json.loads(hugify("inspect", "--json", "--threshold", "0", lib, check=False).stdout)[0]
    assert r["exposure_limit"] == 0 and r["plans"]["shift"]["reason"] == "no-gain"
    assert "without making read-only data executable" in r["plans"]["shift"]["detail"]
    # The explicit limit: inspect names what would become executable.
    r = json.loads(hugify("inspect", "--json", "--threshold", "0", "--exposure-limit", "1M", lib).stdout)[0]
    shift = r["plans"]["shift"]
    assert r["chosen"] == "shift" and 0 < shift["exposed_read_only"] <= 1 << 20
    assert {".rodata", ".eh_frame_hdr", ".eh_frame"} <= set(shift["exposed_sections"])
    assert sum(shift["exposed_sections"].values()) == shift["exposed_read_only"]


def test_a_package_opts_in_and_every_report_names_what_became_executable(tmp_path: Path) -> None:
    lib = build(BY_NAME[SHORT]) / "libhug.so"
    pol = tmp_path / "policy.toml"
    pol.write_text('threshold = 0\n\n[packages.trusted]\nexposure_limit = "1M"\n')
    env = {**os.environ, "HUGIFY_POLICY_PATH": str(pol)}
    roots = {}
    for pkg in ("trusted", "other"):
        root = tmp_path / pkg / "root"
        (root / "usr/lib").mkdir(parents=True)
        shutil.copy(lib, root / "usr/lib/libhug.so")
        report = tmp_path / pkg / "report.json"
        log = hugify("tree", root, "--package", pkg, "--report", report, "--no-progress", env=env).stdout
        roots[pkg] = (root, json.loads(report.read_text()), log)

    # Without the package's opt-in: left alone, the reason in the log.
    root, report, log = roots["other"]
    (entry,) = report["files"]
    assert (entry["status"], entry["reason"]) == ("skipped", "no-gain"), entry
    assert (root / "usr/lib/libhug.so").read_bytes() == lib.read_bytes()
    assert "hugify: /usr/lib/libhug.so: skipped (no-gain)" in log

    # With it: transformed, and what became executable is in the log, the report and
    # the statement, the same bytes and sections everywhere.
    root, report, log = roots["trusted"]
    (entry,) = report["files"]
    assert entry["status"] == "transformed" and 0 < entry["exposed_bytes"] <= 1 << 20, entry
    sections = entry["exposed_sections"]
    assert {".rodata", ".eh_frame"} <= set(sections) and sum(sections.values()) == entry["exposed_bytes"]
    line = next(x for x in log.splitlines() if x.startswith("hugify: /usr/lib/libhug.so: transformed"))
    assert "made executable that was not: .rodata" in line and "(exposure_limit 1.0 MiB)" in line, line
    assert report["policy"]["exposure_limit"]["value"] == 1 << 20

    # readelf of input and output finds the same bytes in the same sections.
    assert newly_executable(lib, root / "usr/lib/libhug.so") == sections

    statement_path = root / "usr/share/hugify/attestations/trusted.intoto.json"
    hugify("sign", root, "--report", tmp_path / "trusted/report.json", "--package", "trusted", env=env)
    statement = json.loads(statement_path.read_text())
    (f,) = statement["predicate"]["files"]
    assert f["transformed"]["exposed"] == {"bytes": entry["exposed_bytes"], "sections": sections}


# --- the runtime on a load that does not start on a window boundary ----------------------


def test_the_runtime_maps_the_whole_windows_of_a_load_that_starts_mid_window(tmp_path: Path) -> None:
    """A shifted lld library's executable load starts at the code's own first page, its
    first window partial: hugify prefetch (the core's windows) and hugify-run (the C
    runtime's own reader of the program headers) load exactly its whole window as a
    2 MiB folio, which the program maps with a PMD. (The audit library is left out:
    tests/test_runtime_lld.py covers it.)"""
    build_runtime()
    (tmp_path / "lib.c").write_text(padded_functions("lib", 150) + TABLE_C)  # 2.4 MiB of code
    (tmp_path / "table.bin").write_bytes(_table())
    (tmp_path / "main.c").write_text(padded_functions("exe", 8) + MAIN)
    lld = ["clang", "-O1", "-fPIC", "-shared", "-fuse-ld=lld", "-Wl,-soname,libbig.so", "-o", "libbig.so", "lib.c"]
    subprocess.run(lld, cwd=tmp_path, check=True)
    prog = ["gcc", "-O1", "-fPIE", "-pie", "-o", "prog", "main.c", "-L.", "-lbig", "-Wl,-rpath,$ORIGIN", "-ldl"]
    subprocess.run(prog, cwd=tmp_path, check=True)
    out = tmp_path / "hugified"
    out.mkdir()
    r = transform(tmp_path / "libbig.so", out / "libbig.so")
    assert (r["layout"], r["result"]["mode"], r["result"]["exposed_read_only"]) == ("rodata-first", "shift", 0)
    shutil.copy(tmp_path / "prog", out / "prog")
    lib = out / "libbig.so"
    (x,) = [ld for ld in readelf_loads(lib) if "E" in ld.flags]
    windows = readelf_windows(lib, fixed=False)
    assert x.vaddr % HP != 0 and len(windows) == 1 and windows[0][0] > x.offset, (x, windows)
    huge = sum(n for _, n in windows)

    with locked():
        drop_caches()
        res = hugify("prefetch", "--json", "--runtime-dir", tmp_path / "run", lib, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        (f,) = json.loads(res.stdout)["files"]
        assert [(w["offset"], w["state"]) for w in f["windows"]] == [(windows[0][0], "loaded")], f
        plain = run_mappings([out / "prog"])
        drop_caches()
        run = subprocess.run(
            [HUGIFY_RUN, out / "prog", "-"],
            capture_output=True,
            text=True,
            env={**os.environ, "HUGIFY_AUDIT_LIB": "", "HUGIFY_RUNTIME_DIR": str(tmp_path / "run2")},
            check=False,
        )
        assert run.returncode == 0, run.stderr
    for way, maps in (("prefetch", plain), ("hugify-run", parse_smaps(run.stdout))):
        assert maps[str(lib)].pmd == huge, (way, maps[str(lib)], run.stderr)


def test_a_real_aarch64_file_is_measured_in_64k_pages(tmp_path: Path) -> None:
    """A program GNU ld linked for aarch64 (loads 64 KiB aligned): under the default
    policy it is measured in the pages of RHEL's kernel-64k and Ubuntu's -64k kernels,
    64 KiB, and every load of the output stays congruent modulo 64 KiB (readelf), so
    those kernels still map it; `--page-size 4K` (a distribution with 4 KiB kernels
    only) measures it in 4 KiB pages. On the old code every file was measured in 4 KiB
    pages and the report did not say which."""
    from testkit.recipes import CROSS_DWARF_RECIPES

    orig = build(next(r for r in CROSS_DWARF_RECIPES if r.name == "a64-dw-gcc-dwarf5")) / "prog"
    assert all(ld.offset % 0x10000 == ld.vaddr % 0x10000 for ld in readelf_loads(orig))
    report = transform(orig, tmp_path / "prog")
    assert (report["page_size"], report["page"], report["result"]["exposed_read_only"]) == (0x10000, 0x10000, 0)
    loads = readelf_loads(tmp_path / "prog")
    assert all(ld.offset % 0x10000 == ld.vaddr % 0x10000 for ld in loads), loads
    small = transform(orig, tmp_path / "prog-4k", "--page-size", "4K")
    assert (small["page_size"], small["page"]) == (0x1000, 0x1000)


def test_the_policys_page_size_is_validated_with_its_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('enabled = true\n[page_size]\nx86_64 = "4K"\narm64 = "3K"\nsparc = "8K"\n')
    res = hugify("policy", "check", policy, check=False)
    assert res.returncode != 0
    assert f"{policy}:4: page_size.arm64: 3072 bytes is not a page size" in res.stderr, res.stderr
    assert f'{policy}:5: unknown architecture "sparc" in page_size' in res.stderr, res.stderr
    policy.write_text('[page_size]\narm64 = "16K"\n[packages.big]\npage_size = { aarch64 = "4K" }\n')
    shown = hugify("policy", "show", "--policy", policy, "--package", "big").stdout
    assert 'aarch64 = "4K"' in shown and 'x86_64 = "4K"' in shown, shown
