"""Fedora/RHEL-built files carry annobin build notes (`.gnu.build.attributes`) whose
descriptions hold address ranges: a shift moves the ranges at or above the split point
by dv, alignment only leaves them alone, and a malformed note is refused with the
note's offset named and the original untouched.

The inputs are generated (testkit/annobin_notes.py adds the notes to every unit, for
ELF64 and ELF32); the results are read with readelf, which decodes these notes, and
with a note walker written here."""

from __future__ import annotations

import os
import re
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from testkit.cli import hugify, run_program, transform
from testkit.elf import elflint, readelf_loads, section_bytes
from testkit.recipes import ANNOBIN_RECIPES, BY_NAME, Recipe, build

SECTION = ".gnu.build.attributes"
INVALID = 3


class Shifted:
    """A recipe's program and library, transformed with a shift."""

    def __init__(self, recipe: Recipe, orig: Path, new: Path) -> None:
        self.recipe, self.orig, self.new = recipe, orig, new
        self.reports: dict[str, dict[str, Any]] = {
            n: transform(orig / n, new / n, "--mode", "shift") for n in ("prog", "libhug.so")
        }

    def mapping(self, name: str) -> Mapping:
        """The shift as the two files show it, not as hugify reports it: the sections
        whose address changed all moved by the same dv, and the lowest of them is the
        split point (sections are read with pyelftools)."""
        old, new = section_addresses(self.orig / name), section_addresses(self.new / name)
        # The shift adds only its padding sections; every original one is kept.
        assert [n for n, _ in new if not n.startswith(".hugify")] == [n for n, _ in old]
        pairs = list(zip(old, [s for s in new if not s[0].startswith(".hugify")], strict=True))
        moved = [(a, b - a) for (_, a), (_, b) in pairs if a != b]
        assert moved and len({dv for _, dv in moved}) == 1, moved
        split, dv = min(moved)
        assert all(a < split for (_, a), (_, b) in pairs if a == b and a), "a section above the split did not move"
        image_end = max(seg.vaddr + seg.memsz for seg in readelf_loads(self.orig / name))
        r = self.reports[name]
        assert (r["split"], r["result"]["dv"]) == (split, dv)  # and the report says the same
        return Mapping(split, image_end, dv)


def section_addresses(path: Path) -> list[tuple[str, int]]:
    """(name, address) of each section that is loaded (SHF_ALLOC), in header order."""
    with path.open("rb") as f:
        return [(s.name, s["sh_addr"]) for s in ELFFile(f).iter_sections() if s["sh_flags"] & 2]


class Mapping:
    """What a shift does to an address: from the split point to one past the end of
    the image, everything moves by dv."""

    def __init__(self, split: int, image_end: int, dv: int) -> None:
        self.split, self.image_end, self.dv = split, image_end, dv

    def start(self, a: int) -> int:
        return a + self.dv if self.split <= a <= self.image_end else a

    def end(self, start: int, end: int) -> int:
        """A range's end is one past its last byte and moves with that byte."""
        return self.start(end - 1) + 1 if end > start else self.start(end)


_cases: dict[str, Shifted] = {}


@pytest.fixture(params=ANNOBIN_RECIPES, ids=lambda r: r.name)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Shifted:
    r: Recipe = request.param
    if r.name not in _cases:
        _cases[r.name] = Shifted(r, build(r), tmp_path_factory.mktemp(r.name))
    return _cases[r.name]


def readelf_ranges(path: Path) -> list[tuple[str, int, int | None]]:
    """(OPEN|func, start, end or None) of every build attribute note, as readelf
    decodes them (an empty description shows the previous note's range)."""
    out = subprocess.run(["readelf", "--notes", "--wide", str(path)], capture_output=True, text=True, check=True)
    assert not out.stderr, out.stderr
    found = re.findall(r"\t(OPEN|func)\s+Applies to region from (0x[0-9a-f]+)(?: to (0x[0-9a-f]+))?", out.stdout)
    return [(kind, int(s, 16), int(e, 16) if e else None) for kind, s, e in found]


def walk_notes(data: bytes, elf32: bool) -> list[tuple[int, int, bytes, tuple[int, ...]]]:
    """(offset, type, owner, addresses) of each note: 12-byte header, owner and
    description each padded to 4 bytes; a description of one or two words."""
    words = {0: "", 4: "<I", 8: "<II" if elf32 else "<Q", 16: "<QQ"}
    notes, pos = [], 0
    while pos < len(data):
        namesz, descsz, kind = struct.unpack_from("<III", data, pos)
        desc = pos + 12 + (namesz + 3) // 4 * 4
        name = data[pos + 12 : pos + 12 + namesz]
        notes.append((pos, kind, name, struct.unpack_from(words[descsz], data, desc)))
        pos = desc + (descsz + 3) // 4 * 4
    assert pos == len(data)
    return notes


def is_elf32(path: Path) -> bool:
    with path.open("rb") as f:
        return ELFFile(f).elfclass == 32


@pytest.mark.parametrize("name", ["prog", "libhug.so"])
def test_readelf_sees_ranges_moved_by_dv(case: Shifted, name: str) -> None:
    m = case.mapping(name)
    old, new = readelf_ranges(case.orig / name), readelf_ranges(case.new / name)
    assert len(old) == len(new) > 100
    for (kind, s, e), got in zip(old, new, strict=True):
        assert got == (kind, m.start(s), None if e is None else m.end(s, e))
    assert any(s >= m.split for _, s, _ in old), "nothing at or above the split point"


@pytest.mark.parametrize("name", ["prog", "libhug.so"])
def test_own_walker_sees_ranges_moved_by_dv(case: Shifted, name: str) -> None:
    m = case.mapping(name)
    elf32 = is_elf32(case.orig / name)
    old = walk_notes(section_bytes(case.orig / name, SECTION), elf32)
    new = walk_notes(section_bytes(case.new / name, SECTION), elf32)
    assert [n[:3] for n in old] == [n[:3] for n in new]
    assert {n[1] for n in old} == {0x100, 0x101}
    assert {len(n[3]) for n in old} == {0, 1, 2}
    for (_, _, _, a), (_, _, _, b) in zip(old, new, strict=True):
        if len(a) == 2:
            assert b == (m.start(a[0]), m.end(a[0], a[1]))
        else:
            assert b == tuple(m.start(x) for x in a)
    ranges = [n[3] for n in old if len(n[3]) == 2]
    # The edges: a range ending at the split point (at _init) stays; one ending at
    # the end of the image (at _end) moves, as its last byte does.
    at_split = [(s, e) for s, e in ranges if e == m.split and s < m.split]
    at_end = [(s, e) for s, e in ranges if e == m.image_end]
    assert at_split and at_end
    assert all(m.end(s, e) == e for s, e in at_split)
    assert all(m.end(s, e) == e + m.dv for s, e in at_end)


def test_programs_still_run(case: Shifted, tmp_path: Path) -> None:
    runner = case.recipe.runner
    expected = run_program(case.orig / "prog", runner=runner)
    assert expected[0] == 0, expected
    assert run_program(case.new / "prog", runner=runner) == expected
    # The rewritten library under the original program.
    for name in ("prog", "libhug.so"):
        (tmp_path / name).write_bytes(((case.orig if name == "prog" else case.new) / name).read_bytes())
    os.chmod(tmp_path / "prog", 0o755)
    assert run_program(tmp_path / "prog", runner=runner) == expected


def test_elflint_reports_nothing_new(case: Shifted) -> None:
    for name in ("prog", "libhug.so"):
        assert elflint(case.new / name) - elflint(case.orig / name) == set(), name


def test_align_mode_leaves_notes_unchanged(case: Shifted, tmp_path: Path) -> None:
    # 64 KiB pages: the code then spans whole windows that alignment alone can cover.
    for name in ("prog", "libhug.so"):
        report = transform(case.orig / name, tmp_path / name, "--mode", "align", "--huge-page-size", "64K")
        assert report["result"]["mode"] == "align"
        assert section_bytes(tmp_path / name, SECTION) == section_bytes(case.orig / name, SECTION)
        assert readelf_ranges(tmp_path / name) == readelf_ranges(case.orig / name)


def _corrupt(path: Path, how: str) -> tuple[bytes, int]:
    """The file's bytes with one note broken, and the broken note's offset."""
    data = bytearray(path.read_bytes())
    with path.open("rb") as f:
        elf = ELFFile(f)
        sec = elf.get_section_by_name(SECTION)
        base, elf32, notes = sec["sh_offset"], elf.elfclass == 32, walk_notes(sec.data(), elf.elfclass == 32)
    pos, *_ = next(n for n in notes if len(n[3]) == 2)
    if how == "name-past-section":
        pos = 0
        struct.pack_into("<I", data, base, 1 << 20)
    elif how == "truncated-description":
        pos = notes[-1][0]
        struct.pack_into("<I", data, base + pos + 4, 0x1000)
    elif how == "description-size":
        struct.pack_into("<I", data, base + pos + 4, 12)
    elif how == "description-size-elf64-in-elf32":
        assert elf32
        struct.pack_into("<I", data, base + pos + 4, 16)
    else:
        assert how == "address-outside-segments"
        namesz = struct.unpack_from("<I", data, base + pos)[0]
        struct.pack_into("<I", data, base + pos + 12 + (namesz + 3) // 4 * 4, 0x7FFF_0000)
    return bytes(data), pos


@pytest.mark.parametrize(
    ("recipe", "how"),
    [
        ("annobin-gcc-bfd", "name-past-section"),
        ("annobin-gcc-bfd", "truncated-description"),
        ("annobin-gcc-bfd", "description-size"),
        ("annobin-gcc-bfd", "address-outside-segments"),
        ("annobin-i686-gcc-bfd", "description-size-elf64-in-elf32"),
        ("annobin-i686-gcc-bfd", "address-outside-segments"),
    ],
)
def test_malformed_notes_are_refused_untouched(recipe: str, how: str, tmp_path: Path) -> None:
    data, pos = _corrupt(build(BY_NAME[recipe]) / "libhug.so", how)
    victim = tmp_path / "libhug.so"
    victim.write_bytes(data)
    res = hugify("transform", "--in-place", "--threshold", "0", "--mode", "shift", victim, check=False)
    assert res.returncode == INVALID, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "(bad-notes)" in line and f"{SECTION}: note at offset {pos:#x} " in line, line
    assert victim.read_bytes() == data
    assert os.listdir(tmp_path) == ["libhug.so"]
