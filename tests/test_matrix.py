"""The generated test matrix: programs and libraries built with gcc and clang, GNU ld,
gold and lld, in C, C++ and Rust, transformed, then checked by running them and by
reading the results with tools hugify did not write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from testkit import HP
from testkit.cli import run_program, transform
from testkit.elf import (
    PAGE,
    TRAPS,
    bits_differing,
    dynamic_tags,
    elflint,
    machine,
    newly_executable,
    readelf_build_id,
    readelf_loads,
    readelf_probes,
    readelf_windows,
    relocations,
    section_bytes,
    sections,
    symbols,
    word_at,
)
from testkit.recipes import BY_NAME, CROSS_RECIPES, PROGRAMS, RECIPES, Case, Recipe, build, case_for, generate_code

# d_ptr tags whose values are addresses (pyelftools names).
POINTER_TAGS = {
    "DT_PLTGOT",
    "DT_HASH",
    "DT_STRTAB",
    "DT_SYMTAB",
    "DT_RELA",
    "DT_INIT",
    "DT_FINI",
    "DT_REL",
    "DT_JMPREL",
    "DT_INIT_ARRAY",
    "DT_FINI_ARRAY",
    "DT_PREINIT_ARRAY",
    "DT_GNU_HASH",
    "DT_VERSYM",
    "DT_VERDEF",
    "DT_VERNEED",
    "DT_RELR",
    "DT_TLSDESC_PLT",
    "DT_TLSDESC_GOT",
}
# Relocation types whose addend (or, for REL, the word in place) is an address of
# the image: RELATIVE and IRELATIVE.
ADDRESS_RELOCS = {"EM_X86_64": {8, 37}, "EM_AARCH64": {1027, 1032}, "EM_386": {8, 42}}
MATRIX = RECIPES + CROSS_RECIPES


@pytest.fixture(params=MATRIX, ids=lambda r: r.name)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    return case_for(request.param, tmp_path_factory)


def test_chosen_mode_and_reason(case: Case) -> None:
    for name, r in case.reports.items():
        assert r["result"]["mode"] == case.recipe.expect_mode, name
        if case.recipe.expect_mode == "align":
            reason = r["plans"]["shift"]["reason"]
            expected = "ehdr-reference" if case.recipe.static_pie else "unsupported-layout"
            assert reason == expected, (name, r["plans"]["shift"])


@pytest.mark.parametrize("env", [{}, {"LD_BIND_NOW": "1"}], ids=["lazy", "bindnow"])
def test_program_behaves_identically(case: Case, env: dict[str, str]) -> None:
    expected = run_program(case.orig / "prog", env, runner=case.recipe.runner)
    assert expected[0] == 0, expected
    assert run_program(case.new / "prog", env, runner=case.recipe.runner) == expected


@pytest.mark.parametrize("recipe", [r for r in MATRIX if r.has_lib], ids=lambda r: r.name)
def test_transformed_library_under_original_program(
    recipe: Recipe, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A rewritten library is a drop-in replacement for the original."""
    case = case_for(recipe, tmp_path_factory)
    shutil.copy(case.orig / "prog", tmp_path / "prog")
    shutil.copy(case.new / "libhug.so", tmp_path / "libhug.so")
    runner = case.recipe.runner
    assert run_program(tmp_path / "prog", runner=runner) == run_program(case.orig / "prog", runner=runner)


#: Native recipes whose first segment holds .rodata (lld's default), so it splits.
RODATA_FIRST = [BY_NAME[n] for n in ("clang-lld", "clang-lld-now", "cxx-clang-lld", "rust-default")]


def _headers(path: Path) -> tuple[dict[str, int], list[Any]]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        return {k: elf[k] for k in ("e_phoff", "e_phnum", "e_entry")}, [s.header for s in elf.iter_segments()]


@pytest.mark.parametrize("recipe", RODATA_FIRST, ids=lambda r: r.name)
def test_grown_program_headers_reach_the_program(recipe: Recipe, tmp_path_factory: pytest.TempPathFactory) -> None:
    """lld's first segment splits and its program header table gets one header more
    where the split adds a load: it grows where it was, at e_phoff in front of every section (dwz and eu-strip zero a
    table in a gap between sections: tests/test_dwz_lld.py), and the loader metadata
    after it moves behind what stays. The kernel's AT_PHDR points at it (and AT_PHNUM
    counts its headers), and ld.so run as a program, which maps the file by e_phoff
    itself, runs it the same."""
    case = case_for(recipe, tmp_path_factory)
    prog = case.new / "prog"
    ehdr, segments = _headers(prog)
    old_ehdr, old_segments = _headers(case.orig / "prog")
    (phdr,) = [s for s in segments if s["p_type"] == "PT_PHDR"]
    assert phdr["p_offset"] == ehdr["e_phoff"] == old_ehdr["e_phoff"]
    # One header more for each load more (the split's), all in the table's own bytes.
    loads = [sum(s["p_type"] == "PT_LOAD" for s in segs) for segs in (old_segments, segments)]
    assert ehdr["e_phnum"] - old_ehdr["e_phnum"] == loads[1] - loads[0] >= 0
    assert phdr["p_filesz"] == ehdr["e_phnum"] * 56
    res = subprocess.run([prog], env={"LD_SHOW_AUXV": "1"}, capture_output=True, text=True, check=True)
    auxv = dict(line.split(":", 1) for line in res.stdout.splitlines() if line.startswith("AT_"))
    base = int(auxv["AT_ENTRY"], 16) - ehdr["e_entry"]
    assert (int(auxv["AT_PHDR"], 16) - base, int(auxv["AT_PHNUM"])) == (phdr["p_vaddr"], ehdr["e_phnum"])
    assert base % HP == 0
    (interp,) = [s for s in old_segments if s["p_type"] == "PT_INTERP"]
    with (case.orig / "prog").open("rb") as f:
        f.seek(interp["p_offset"])
        loader = f.read(interp["p_filesz"]).rstrip(b"\0").decode()
    assert run_program(prog, runner=[loader]) == run_program(case.orig / "prog")


def test_elflint_reports_nothing_new(case: Case) -> None:
    for name in case.files:
        assert elflint(case.new / name) - elflint(case.orig / name) == set(), name


def test_executable_segment_alignment(case: Case) -> None:
    for name in case.files:
        (x,) = [seg for seg in readelf_loads(case.new / name) if "E" in seg.flags]
        assert x.align == HP
        assert x.offset % HP == x.vaddr % HP
        if case.recipe.expect_mode == "shift":
            assert x.filesz == x.memsz and x.vaddr % PAGE == 0 and x.memsz % PAGE == 0
            starts, ends = x.vaddr % HP == 0, (x.vaddr + x.memsz) % HP == 0
            # Whole windows; but where read-only data lies below the code (lld), the
            # code's window at one end stays partial unless the recipe opts in.
            r = case.reports[name]
            assert (starts and ends) or ((starts or ends) and r["layout"] == "rodata-first"), (name, x)
            assert readelf_windows(case.new / name, fixed=False), (name, x)


def test_nothing_becomes_executable_but_what_the_opt_in_allows(case: Case) -> None:
    """What each output maps executable that the input did not, by readelf of both, is
    what the report says (core/src/exposure.rs): nothing without the opt-in."""
    for name in case.files:
        res = case.reports[name]["result"]
        assert newly_executable(case.orig / name, case.new / name) == res["exposed_sections"], name
        if "--exposure-limit" not in case.recipe.transform_args:
            assert res["exposed_read_only"] == 0, name


def test_build_id_differs_in_one_bit(case: Case) -> None:
    for name in case.files:
        assert bits_differing(readelf_build_id(case.orig / name), readelf_build_id(case.new / name)) == 1


def test_transformation_is_deterministic(case: Case, tmp_path: Path) -> None:
    for name in case.files:
        transform(case.orig / name, tmp_path / name, *case.recipe.transform_args)
        assert (tmp_path / name).read_bytes() == (case.new / name).read_bytes()


#: Section types of the loader metadata that may make room for a grown program header
#: table (besides .interp), as the ELF gABI and GNU extensions name them.
METADATA_TYPES = {
    "SHT_NOTE",
    "SHT_HASH",
    "SHT_GNU_HASH",
    "SHT_DYNSYM",
    "SHT_STRTAB",
    "SHT_GNU_verdef",
    "SHT_GNU_verneed",
    "SHT_GNU_versym",
    "SHT_REL",
    "SHT_RELA",
    "SHT_RELR",
}


class Moves:
    """The address map as seen through pyelftools: dv is how far .text moved, and
    everything from the lowest section moved by dv to the end of the image moved. Where
    the first load splits, the loader metadata right after the program header table may
    move by a delta of its own, behind the metadata that stays (`relocated`), so that
    the grown table stays at e_phoff."""

    def __init__(self, old: Path, new: Path) -> None:
        self.old_secs, self.new_secs = sections(old), sections(new)
        self.dv = self.new_secs[".text"]["addr"] - self.old_secs[".text"]["addr"]
        alloc = [k for k, s in self.old_secs.items() if s["flags"] & 2 and s["size"] and k in self.new_secs]
        delta = {k: self.new_secs[k]["addr"] - self.old_secs[k]["addr"] for k in alloc}
        moved = [self.old_secs[k]["addr"] for k in alloc if delta[k] == self.dv and self.dv]
        self.start = min(moved) if moved else None
        #: (old start, old end, delta) of the sections that moved by another delta.
        self.relocated = [
            (self.old_secs[k]["addr"], self.old_secs[k]["addr"] + self.old_secs[k]["size"], delta[k])
            for k in alloc
            if delta[k] not in (0, self.dv)
        ]
        self.relocated_names = [k for k in alloc if delta[k] not in (0, self.dv)]
        loads = readelf_loads(old)
        self.end = max(seg.vaddr + seg.memsz for seg in loads)
        self.by_index = {s["index"]: self.new_secs[k]["addr"] - s["addr"] for k, s in self.old_secs.items()}
        self.moved_ranges = [
            (s["addr"], s["addr"] + s["size"])
            for k, s in self.old_secs.items()
            if s["flags"] & 2 and self.new_secs[k]["addr"] != s["addr"]
        ]

    def f(self, a: int) -> int:
        for lo, hi, d in self.relocated:
            if lo <= a < hi:
                return a + d
        return a + self.dv if self.start is not None and self.start <= a <= self.end else a


def test_sections_move_as_one_block(case: Case) -> None:
    for name in case.files:
        m = Moves(case.orig / name, case.new / name)
        for k, s in m.old_secs.items():
            if not s["flags"] & 2 or k.startswith(".hugify.pad"):
                continue
            assert m.new_secs[k]["addr"] == m.f(s["addr"]) or (s["size"] == 0), (name, k)
        for code in [k for k, s in m.old_secs.items() if s["flags"] & 4 and s["type"] != "SHT_NOBITS"]:
            assert section_bytes(case.new / name, code) == section_bytes(case.orig / name, code), (name, code)
        for data in (".rodata", ".eh_frame", ".eh_frame_hdr", ".gcc_except_table"):
            assert section_bytes(case.new / name, data) == section_bytes(case.orig / name, data), (name, data)
        if not m.relocated:
            continue
        # Metadata that made room for a grown table: one block, loader metadata only,
        # below the split point, behind every section that stayed, inside the first
        # load, each keeping its alignment; the table grew where it was.
        (new_ehdr, _), (old_ehdr, _) = _headers(case.new / name), _headers(case.orig / name)
        assert new_ehdr["e_phoff"] == old_ehdr["e_phoff"] and new_ehdr["e_phnum"] > old_ehdr["e_phnum"], name
        assert len({d for _, _, d in m.relocated}) == 1, (name, m.relocated)
        for k in m.relocated_names:
            o, n = m.old_secs[k], m.new_secs[k]
            assert o["type"] in METADATA_TYPES or k == ".interp", (name, k)
            assert m.start is not None and o["addr"] < m.start, (name, k)
            assert (n["addr"] - o["addr"]) % max(o["addralign"], 1) == 0, (name, k)
            stayed = [
                s
                for j, s in m.old_secs.items()
                if s["flags"] & 2 and s["size"] and s["addr"] < m.start and m.new_secs[j]["addr"] == s["addr"]
            ]
            assert all(n["addr"] >= s["addr"] + s["size"] for s in stayed), (name, k)
            first = readelf_loads(case.new / name)[0]
            assert first.vaddr <= n["addr"] and n["addr"] + n["size"] <= first.vaddr + first.memsz, (name, k)
            if o["type"] in ("SHT_NOTE", "SHT_PROGBITS") and k != ".note.gnu.build-id":
                assert section_bytes(case.new / name, k) == section_bytes(case.orig / name, k), (name, k)


def test_symbols_move_with_their_sections(case: Case) -> None:
    for name in case.files:
        m = Moves(case.orig / name, case.new / name)
        old, new = symbols(case.orig / name), symbols(case.new / name)
        assert old.keys() == new.keys()
        for table in old:
            assert len(old[table]) == len(new[table])
            for (n, v, t, shndx), (n2, v2, _, _) in zip(old[table], new[table], strict=True):
                assert n == n2
                if n in ("_DYNAMIC", "_GLOBAL_OFFSET_TABLE_") and shndx == "SHN_ABS" and table == ".symtab":
                    # aarch64 GNU ld's absolute markers: they move with the section they point into.
                    want = v + m.dv if any(lo <= v < hi for lo, hi in m.moved_ranges) else v
                elif t == "STT_TLS" or shndx in ("SHN_ABS", "SHN_COMMON"):
                    want = v
                elif shndx == "SHN_UNDEF":
                    want = m.f(v) if v else 0
                else:
                    want = v + m.by_index[shndx]
                assert v2 == want, (name, table, n, hex(v), hex(v2), hex(want))


def test_relocations_and_dynamic_entries_move(case: Case) -> None:
    for name in case.files:
        m = Moves(case.orig / name, case.new / name)
        old, new = relocations(case.orig / name), relocations(case.new / name)
        address_types = ADDRESS_RELOCS[machine(case.orig / name)]
        assert len(old) == len(new)
        for i, ((sec, off, typ, add), (sec2, off2, typ2, add2)) in enumerate(zip(old, new, strict=True)):
            assert (sec, typ) == (sec2, typ2)
            assert off2 == m.f(off), (name, sec, hex(off))
            if typ in address_types and add is not None:
                assert add2 == m.f(add), (name, hex(add))
            else:
                assert add2 == add
            # The word in place: the addend for REL and RELR, a copy GNU ld writes for RELA.
            if i % 97 == 0 and (typ == -1 or typ in address_types):
                before = word_at(case.orig / name, off)
                if typ == -1 or add is None or before == add:
                    assert word_at(case.new / name, off2) == m.f(before), (name, hex(off))
        for (tag, v), (tag2, v2) in zip(dynamic_tags(case.orig / name), dynamic_tags(case.new / name), strict=True):
            assert tag == tag2
            assert v2 == (m.f(v) if tag in POINTER_TAGS else v), (name, tag)


def test_probe_notes_move(case: Case) -> None:
    for name in case.files:
        m = Moves(case.orig / name, case.new / name)
        old, new = readelf_probes(case.orig / name), readelf_probes(case.new / name)
        assert len(old) == len(new)
        for (n, pc, base, sem), (n2, pc2, base2, sem2) in zip(old, new, strict=True):
            assert (n2, pc2, base2, sem2) == (n, m.f(pc), m.f(base), m.f(sem) if sem else 0)


@pytest.mark.parametrize("recipe", [r for r in MATRIX if r.expect_mode == "shift"], ids=lambda r: r.name)
def test_padding_is_traps_and_described_by_sections(recipe: Recipe, tmp_path_factory: pytest.TempPathFactory) -> None:
    case = case_for(recipe, tmp_path_factory)
    for name in case.files:
        pads = [k for k in sections(case.new / name) if k.startswith(".hugify.pad")]
        assert pads, name
        data = (case.new / name).read_bytes()
        secs = sections(case.new / name)
        trap = TRAPS[machine(case.new / name)]
        (x,) = [seg for seg in readelf_loads(case.new / name) if "E" in seg.flags]
        for k in pads:
            s = secs[k]
            off = x.offset + s["addr"] - x.vaddr
            assert s["addr"] % len(trap) == 0 and s["size"] % len(trap) == 0
            assert data[off : off + s["size"]] == trap * (s["size"] // len(trap))


def test_default_threshold_refuses_small_files(tmp_path: Path) -> None:
    from testkit.cli import hugify

    small = build(next(r for r in RECIPES if r.name == "gcc-bfd-small")) / "prog"
    before = small.read_bytes()
    res = hugify("transform", small, "-o", tmp_path / "out", check=False)
    assert res.returncode == 4, res
    assert "below-threshold" in res.stderr
    assert not (tmp_path / "out").exists()
    assert small.read_bytes() == before
    assert os.listdir(tmp_path) == []


def test_aarch64_32m_huge_pages_for_16k_kernels(tmp_path: Path) -> None:
    """--huge-page-size 32M (the PMD size of 16 KiB-page aarch64 kernels): the code gets
    whole 32 MiB windows, and the program still runs."""
    recipe = next(r for r in CROSS_RECIPES if r.name == "a64-gcc-bfd")
    orig = build(recipe)
    shutil.copy(orig / "libhug.so", tmp_path / "libhug.so")
    report = transform(orig / "prog", tmp_path / "prog", "--huge-page-size", "32M")
    assert report["result"]["mode"] == "shift", report
    big = 32 << 20
    (x,) = [seg for seg in readelf_loads(tmp_path / "prog") if "E" in seg.flags]
    assert x.align == big and x.vaddr % big == 0 and x.offset % big == 0 and x.memsz % big == 0, x
    assert x.vaddr % (64 << 10) == 0  # still a multiple of the 64 KiB max-page-size
    assert run_program(tmp_path / "prog", runner=recipe.runner) == run_program(orig / "prog", runner=recipe.runner)


@pytest.mark.parametrize("compiler", [["gcc"], ["clang"], ["aarch64-linux-gnu-gcc"]], ids=lambda c: c[0])
def test_padded_code_keeps_the_size_of_switch_functions(compiler: list[str], tmp_path: Path) -> None:
    """The recipes' generated code (testkit.recipes.generate_code) has one switch function
    in eight, the others padded to the size measured on the compiler: compiled both ways,
    the same functions come to within 3 % in code and in read-only data, so the recipes'
    function counts still give the layouts and windows they were chosen for."""
    sizes = []
    for padded in (False, True):
        work = tmp_path / ("padded" if padded else "full")
        work.mkdir()
        if padded:
            units = generate_code("exe", 384, 1, work, compiler=compiler, flags=["-O2", "-fPIE"])
        else:
            subprocess.run([sys.executable, PROGRAMS / "gen_code.py", "exe", "384", "1", work], check=True)
            units = ["exe_gen0.c", "exe_table.c"]
        total = {".text": 0, ".rodata": 0}
        for unit in units:
            subprocess.run([*compiler, "-O2", "-fPIE", "-c", unit, "-o", f"{unit}.o"], cwd=work, check=True)
            for name, s in sections(work / f"{unit}.o").items():
                for kind in total:
                    if name == kind or name.startswith(kind + "."):
                        total[kind] += s["size"]
        sizes.append(total)
    full, padded_code = sizes
    for kind, size in full.items():
        assert abs(padded_code[kind] - size) <= 0.03 * size, (kind, full, padded_code)
