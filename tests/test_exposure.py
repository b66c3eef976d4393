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
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures import BY_NAME, PROGRAMS, build, cached_dir
from helpers import HP, hugify, readelf_windows, transform

PAGE = 4096
TABLE = 3 << 20
FUNCS = 3450  # about 2.2 MiB of code from clang -O2
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
    subprocess.run([sys.executable, str(PROGRAMS / "gen_code.py"), "lib", str(FUNCS), "4", str(work)], check=True)
    (work / "table.c").write_text(TABLE_C)
    (work / "main.c").write_text(MAIN_C)
    (work / "table.bin").write_bytes(_table())
    sources = [f"lib_gen{i}.c" for i in range(4)] + ["lib_table.c", "table.c"]
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
    key = "\n".join([TABLE_C, MAIN_C, str(FUNCS), (PROGRAMS / "gen_code.py").read_text()])
    return cached_dir("exposure-lld", key, _make)


# --- readelf ------------------------------------------------------------------------------


@dataclass
class Section:
    name: str
    addr: int
    offset: int
    size: int
    flags: str
    nobits: bool


@dataclass
class Load:
    offset: int
    vaddr: int
    filesz: int
    flags: str


def readelf(path: Path) -> tuple[list[Load], list[Section]]:
    """PT_LOADs and sections, as `readelf -lSW` prints them."""
    out = subprocess.run(["readelf", "-lSW", str(path)], capture_output=True, text=True, check=True).stdout
    loads, secs = [], []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            loads.append(Load(int(f[1], 16), int(f[2], 16), int(f[4], 16), "".join(f[6:-1])))
        # "  [Nr] Name Type Address Off Size ES Flg Lk Inf Al"
        if line.strip().startswith("[") and "]" in line and not line.strip().startswith("[Nr]"):
            g = line.split("]", 1)[1].split()
            if len(g) >= 9 and g[0] != "NULL":
                name, typ, addr, off, size = g[0], g[1], int(g[2], 16), int(g[3], 16), int(g[4], 16)
                flags = g[6] if len(g) == 10 else ""
                secs.append(Section(name, addr, off, size, flags, typ == "NOBITS"))
    return loads, secs


def executable_file_ranges(loads: list[Load], rounded: bool) -> list[tuple[int, int]]:
    """The file ranges of the `R E` loads: exact, or as the loader maps them (whole pages)."""
    out = []
    for ld in loads:
        if "E" in ld.flags:
            a, b = ld.offset, ld.offset + ld.filesz
            out.append((a // PAGE * PAGE, -(-b // PAGE) * PAGE) if rounded else (a, b))
    return out


def overlap(a: int, b: int, ranges: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, y) - max(a, x)) for x, y in ranges)


def unsectioned(mapped: list[tuple[int, int]], secs: list[Section]) -> list[tuple[int, int]]:
    """The parts of the `mapped` file ranges that no section with file bytes covers."""
    spans = sorted((s.offset, s.offset + s.size) for s in secs if not s.nobits and s.size)
    out = []
    for a, b in mapped:
        at = a
        for x, y in spans:
            if y > at and x < b:
                if x > at:
                    out.append((at, x))
                at = max(at, y)
        if b > at:
            out.append((at, b))
    return out


def new_between(old: Path, new: Path, mapped: list[tuple[int, int]]) -> int:
    """Bytes between the output's sections that it maps executable and that are neither
    traps nor what lay at the same distance from the section before them in the
    input's R E load (lld leaves such gaps between code sections)."""
    old_loads, old_secs = readelf(old)
    _, secs = readelf(new)
    old_x = executable_file_ranges(old_loads, rounded=False)
    by_name = {s.name: s for s in old_secs}
    data, old_data = new.read_bytes(), old.read_bytes()
    count = 0
    for a, b in unsectioned(mapped, secs):
        before = max((s for s in secs if not s.nobits and s.size and s.offset + s.size <= a), key=lambda s: s.offset)
        at = by_name[before.name].offset + (a - before.offset)
        for i in range(b - a):
            copied = old_data[at + i] == data[a + i] and overlap(at + i, at + i + 1, old_x) == 1
            count += data[a + i] != 0xCC and not copied
    return count


def test_lld_library_keeps_its_read_only_data_out_of_the_executable_load(lld_library: Path, tmp_path: Path) -> None:
    lib = lld_library / "libtable.so"
    old_loads, old_secs = readelf(lib)
    by_name = {s.name: s for s in old_secs}
    # The input as the issue describes it: lld's rodata-first layout, the table and
    # .eh_frame in an R load below the R E load of the code.
    code = sum(s.size for s in old_secs if "X" in s.flags)
    assert 2.05 * (1 << 20) < code < 2.5 * (1 << 20), code
    assert by_name[".rodata"].size >= TABLE
    old_x = executable_file_ranges(old_loads, rounded=False)
    for name in (".rodata", ".eh_frame_hdr", ".eh_frame"):
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

    # readelf of the output, on its own: what the loader maps executable (whole pages)
    # holds code sections, trap padding and gaps of traps, nothing else; no R E load
    # spans the address of a read-only section.
    loads, secs = readelf(out)
    mapped = executable_file_ranges(loads, rounded=True)
    data = out.read_bytes()
    for s in secs:
        if s.nobits or s.size == 0:
            continue
        inside = overlap(s.offset, s.offset + s.size, mapped)
        if "X" not in s.flags:
            assert inside == 0, f"{s.name} lies in an executable load"
        elif s.name == ".hugify.pad":
            assert data[s.offset : s.offset + s.size] == b"\xcc" * s.size
        else:
            # A code section of the output was a code section of the input, in its R E load.
            o = by_name[s.name]
            assert "X" in o.flags and overlap(o.offset, o.offset + o.size, old_x) == o.size, s.name
    # Bytes between sections: traps, or what lay at the same distance from the section
    # before them in the input's R E load (lld's gaps between code sections).
    assert new_between(lib, out, mapped) == 0
    x_loads = [ld for ld in loads if "E" in ld.flags]
    for name in (".rodata", ".eh_frame_hdr", ".eh_frame"):
        s = next(s for s in secs if s.name == name)
        for ld in x_loads:
            lo, hi = ld.vaddr // PAGE * PAGE, -(-(ld.vaddr + ld.filesz) // PAGE) * PAGE
            assert s.addr + s.size <= lo or s.addr >= hi, f"an R E load maps {name}"

    # Coverage counts whole windows only: code bytes (by readelf) inside the windows.
    windows = readelf_windows(out, fixed=False)
    assert windows, loads
    in_windows = sum(
        overlap(s.offset, s.offset + s.size, [(o, o + n) for o, n in windows])
        for s in secs
        if "X" in s.flags and s.name != ".hugify.pad"
    )
    assert in_windows == res["covered_code"] and 0 < in_windows < code
    assert HP - PAGE < in_windows <= HP

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

    # readelf agrees: what the output maps executable that is neither a code section
    # (nor trap padding) nor a trap byte between sections.
    out = root / "usr/lib/libhug.so"
    loads, secs = readelf(out)
    mapped = executable_file_ranges(loads, rounded=True)
    in_data = sum(overlap(s.offset, s.offset + s.size, mapped) for s in secs if "X" not in s.flags and not s.nobits)
    assert in_data + new_between(lib, out, mapped) == entry["exposed_bytes"], (in_data, sections)
    for name, n in sections.items():
        s = next((s for s in secs if s.name == name), None)
        if s:
            assert overlap(s.offset, s.offset + s.size, mapped) == n, name

    statement_path = root / "usr/share/hugify/attestations/trusted.intoto.json"
    hugify("sign", root, "--report", tmp_path / "trusted/report.json", "--package", "trusted", env=env)
    statement = json.loads(statement_path.read_text())
    (f,) = statement["predicate"]["files"]
    assert f["transformed"]["exposed"] == {"bytes": entry["exposed_bytes"], "sections": sections}
