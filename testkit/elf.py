"""The ELF oracles: reading ELF files through tools hugify did not write (readelf,
eu-elflint, pyelftools), independent of hugify._core on purpose, so that a test
checks the core against someone else's reading: PT_LOADs, section headers, the
windows and build IDs readelf sees, symbols, relocations."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from testkit import HP

# --- readelf -----------------------------------------------------------------------


def readelf(path: Path, *options: str) -> str:
    """What `readelf OPTIONS FILE` prints."""
    return subprocess.run(["readelf", *options, str(path)], capture_output=True, text=True, check=True).stdout


@dataclass
class Load:
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: str
    align: int


def readelf_loads(path: Path) -> list[Load]:
    out = readelf(path, "-lW")
    loads = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            # LOAD Offset VirtAddr PhysAddr FileSiz MemSiz Flg... Align
            flags = "".join(f[6:-1])
            loads.append(Load(int(f[1], 16), int(f[2], 16), int(f[4], 16), int(f[5], 16), flags, int(f[-1], 16)))
    return loads


@dataclass
class SectionHeader:
    name: str
    addr: int
    offset: int
    size: int
    flags: str
    nobits: bool


def readelf_sections(path: Path) -> list[SectionHeader]:
    """The section headers as `readelf -SW` prints them (the null section left out)."""
    out = readelf(path, "-SW")
    secs = []
    for line in out.splitlines():
        # "  [Nr] Name Type Address Off Size ES Flg Lk Inf Al", Flg empty for some.
        if not re.match(r"\s*\[\s*\d+\]", line):
            continue
        f = line.split("]", 1)[1].split()
        if len(f) >= 9 and f[1] != "NULL":
            flags = f[6] if len(f) == 10 else ""
            secs.append(SectionHeader(f[0], int(f[2], 16), int(f[3], 16), int(f[4], 16), flags, f[1] == "NOBITS"))
    return secs


#: Trap instructions hugify pads code with, by e_machine (pyelftools names).
TRAPS = {"EM_X86_64": b"\xcc", "EM_386": b"\xcc", "EM_AARCH64": b"\x00\x00\x20\xd4"}
PAGE = 4096


def executable_ranges(loads: list[Load], rounded: bool) -> list[tuple[int, int]]:
    """The file ranges of the `R E` loads: exact, or as the loader maps them (whole pages)."""
    out = []
    for ld in loads:
        if "E" in ld.flags:
            a, b = ld.offset, ld.offset + ld.filesz
            out.append((a // PAGE * PAGE, -(-b // PAGE) * PAGE) if rounded else (a, b))
    return out


def overlap(a: int, b: int, ranges: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, y) - max(a, x)) for x, y in ranges)


def unsectioned(mapped: list[tuple[int, int]], secs: list[SectionHeader]) -> list[tuple[int, int]]:
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


def newly_executable(old: Path, new: Path) -> dict[str, int]:
    """What `new` maps executable that `old` did not, found with readelf alone: bytes
    of `new`'s R E loads (whole pages, as the loader maps them) per section, where the
    section of that name in `old` did not lie in an R E load or a code section there;
    trap padding (.hugify.pad) that is not all traps; and bytes between sections
    ("(bytes outside sections)") that are neither traps nor the bytes at the same
    distance from the section before them in `old`'s code."""
    old_secs, secs = readelf_sections(old), readelf_sections(new)
    by_name = {s.name: s for s in reversed(old_secs)}
    was: list[tuple[int, int]] = []
    code = [(s.offset, s.offset + s.size) for s in old_secs if "X" in s.flags and not s.nobits]
    for a, b in sorted(executable_ranges(readelf_loads(old), rounded=False) + code):
        if was and a <= was[-1][1]:
            was[-1] = (was[-1][0], max(was[-1][1], b))
        else:
            was.append((a, b))
    mapped = executable_ranges(readelf_loads(new), rounded=True)
    data, old_data = new.read_bytes(), old.read_bytes()
    trap = TRAPS[machine(new)]

    def is_trap(at: int) -> bool:
        unit = at - at % len(trap)
        return data[unit : unit + len(trap)] == trap

    out: dict[str, int] = {}
    for s in secs:
        if s.nobits or not s.size or not overlap(s.offset, s.offset + s.size, mapped):
            continue
        a, b = s.offset, s.offset + s.size
        inside = [(max(a, x), min(b, y)) for x, y in mapped if min(b, y) > max(a, x)]
        o = by_name.get(s.name)
        if s.name == ".hugify.pad":
            n = sum(not is_trap(i) for x, y in inside for i in range(x, y))
        elif o is None:
            n = sum(y - x for x, y in inside)
        else:
            n = sum((y - x) - overlap(o.offset + x - a, o.offset + y - a, was) for x, y in inside)
        if n:
            out[s.name] = out.get(s.name, 0) + n
    for a, b in unsectioned(mapped, secs):
        before = max((s for s in secs if not s.nobits and s.size and s.offset + s.size <= a), key=lambda s: s.offset)
        at = by_name[before.name].offset + (a - before.offset)
        n = 0
        for i in range(a, b):
            j = at + i - a
            copied = j < len(old_data) and old_data[j] == data[i] and overlap(j, j + 1, was) == 1
            n += not is_trap(i) and not copied
        if n:
            out["(bytes outside sections)"] = out.get("(bytes outside sections)", 0) + n
    return out


def readelf_windows(path: Path, fixed: bool, hp: int = HP) -> list[tuple[int, int]]:
    """(file offset, size) of each executable load's whole windows of huge pages of `hp`
    bytes at a congruent offset, from readelf's program headers: the oracle for the
    core's windows. A fixed-address file (`fixed`, ET_EXEC) counts at any p_align."""
    out = []
    for ld in readelf_loads(path):
        if "E" not in ld.flags or (ld.vaddr - ld.offset) % hp or (not fixed and ld.align < hp):
            continue
        start, end = -(-ld.vaddr // hp) * hp, (ld.vaddr + ld.filesz) // hp * hp
        if end > start:
            out.append((ld.offset + start - ld.vaddr, end - start))
    return out


def window_offsets(runs: Iterable[tuple[int, int]]) -> list[int]:
    """The file offset of each whole huge-page window of (file offset, size) runs: those
    of readelf_windows, of a manifest entry, of `hugify inspect --json`."""
    return [offset + i for offset, size in runs for i in range(0, size, HP)]


def exec_load(path: Path) -> Load:
    """The one executable PT_LOAD, as readelf shows it."""
    loads = [seg for seg in readelf_loads(path) if "E" in seg.flags]
    assert len(loads) == 1, loads
    return loads[0]


def on_whole_windows(x: Load) -> bool:
    """Whether an executable load covers whole huge-page windows (hugify's shift output)."""
    return x.offset % HP == 0 and x.vaddr % HP == 0 and x.filesz % HP == 0 and x.align == HP


def hugified(path: Path) -> bool:
    """Whether the file's executable load covers whole huge-page windows."""
    return on_whole_windows(exec_load(path))


def readelf_build_id(path: Path) -> bytes:
    out = readelf(path, "-n")
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    assert m, f"no build-id in {path}"
    return bytes.fromhex(m.group(1))


def readelf_probes(path: Path) -> list[tuple[str, int, int, int]]:
    """(name, pc, base, semaphore) for every SystemTap probe note."""
    out = readelf(path, "-n")
    probes = []
    for m in re.finditer(r"Name: (\S+)\s+Location: (0x[0-9a-f]+), Base: (0x[0-9a-f]+), Semaphore: (0x[0-9a-f]+)", out):
        probes.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16)))
    return probes


def elflint(path: Path) -> set[str]:
    """eu-elflint --gnu-ld complaints, with numbers masked so that the same complaint
    about moved addresses compares equal."""
    res = subprocess.run(["eu-elflint", "--gnu-ld", str(path)], capture_output=True, text=True, check=False)
    lines = (res.stdout + res.stderr).splitlines()
    masked = {re.sub(r"0x[0-9a-f]+|\b\d+\b", "N", line.replace(str(path), "FILE")) for line in lines}
    return {m for m in masked if m.strip() and m.strip() != "No errors"}


def bits_differing(a: bytes, b: bytes) -> int:
    assert len(a) == len(b)
    return sum(bin(x ^ y).count("1") for x, y in zip(a, b, strict=True))


# --- pyelftools --------------------------------------------------------------------


def sections(path: Path) -> dict[str, dict[str, int]]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        out = {}
        for i, s in enumerate(elf.iter_sections()):
            key = s.name if s.name not in out else f"{s.name}#{i}"
            out[key] = {
                "index": i,
                "addr": s["sh_addr"],
                "size": s["sh_size"],
                "flags": s["sh_flags"],
                "type": s["sh_type"],
                "addralign": s["sh_addralign"],
            }
        return out


def symbols(path: Path) -> dict[str, list[tuple[str, int, str, Any]]]:
    """(name, value, type, shndx) per symbol table."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        out = {}
        for s in elf.iter_sections():
            if isinstance(s, SymbolTableSection):
                out[s.name] = [(y.name, y["st_value"], y["st_info"]["type"], y["st_shndx"]) for y in s.iter_symbols()]
        return out


def dynamic_tags(path: Path) -> list[tuple[str, int]]:
    with path.open("rb") as f:
        elf = ELFFile(f)
        dyn = elf.get_section_by_name(".dynamic")
        return [(t.entry.d_tag, t.entry.d_val) for t in dyn.iter_tags()] if dyn else []


def relocations(path: Path) -> list[tuple[str, int, int, int | None]]:
    """(section, r_offset, type, addend) of every dynamic relocation, RELR expanded
    into its places (type -1, addend None)."""
    out = []
    with path.open("rb") as f:
        elf = ELFFile(f)
        for s in elf.iter_sections():
            if s["sh_type"] in ("SHT_RELA", "SHT_REL") and s["sh_flags"] & 2:
                for r in s.iter_relocations():
                    out.append((s.name, r["r_offset"], r["r_info_type"], r["r_addend"] if r.is_RELA() else None))
            elif s["sh_type"] == "SHT_RELR":
                out.extend((s.name, r["r_offset"], -1, None) for r in s.iter_relocations())
    return out


def word_at(path: Path, vaddr: int) -> int:
    """The address-sized word at a virtual address, found through the program headers."""
    with path.open("rb") as f:
        elf = ELFFile(f)
        size = elf.elfclass // 8
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
                f.seek(seg["p_offset"] + vaddr - seg["p_vaddr"])
                return int.from_bytes(f.read(size), "little")
    raise AssertionError(f"{vaddr:#x} is not in the file")


def machine(path: Path) -> str:
    with path.open("rb") as f:
        return str(ELFFile(f)["e_machine"])


def section_bytes(path: Path, name: str) -> bytes:
    with path.open("rb") as f:
        s = ELFFile(f).get_section_by_name(name)
        return s.data() if s else b""
