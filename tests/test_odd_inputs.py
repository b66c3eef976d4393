"""Odd but valid inputs, and hostile surroundings: each is transformed correctly or
refused with a reason and a distinct exit status, and a refused file stays
byte-identical with nothing left beside it."""

from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from testkit import HP
from testkit.cli import hugify, run_program, transform
from testkit.elf import readelf_loads, readelf_probes, sections
from testkit.recipes import BY_NAME, build

INVALID, REFUSED, IO_ERROR = 3, 4, 5


@pytest.fixture(scope="module")
def original() -> Path:
    """A PIE with its library beside it (found through $ORIGIN), probes and debug-free."""
    return build(BY_NAME["gcc-bfd"])


def _copy(original: Path, dst: Path, name: str = "prog") -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(original / "libhug.so", dst / "libhug.so")
    shutil.copy(original / "prog", dst / name)
    return dst / name


def _refused(res: subprocess.CompletedProcess[str], status: int, reason: str, path: Path, before: bytes) -> None:
    assert res.returncode == status, (res.returncode, res.stderr)
    assert f"({reason})" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(["libhug.so", path.name]), "left behind"


def _edited(src: Path, dst: Path, edit: object) -> Path:
    data = bytearray(src.read_bytes())
    with src.open("rb") as f:
        edit(data, ELFFile(f))  # type: ignore[operator]
    dst.write_bytes(data)
    dst.chmod(0o755)
    return dst


def test_already_hugified_file_is_left_byte_identical(original: Path, tmp_path: Path) -> None:
    prog = _copy(original, tmp_path)
    hugify("transform", "--in-place", prog)
    once = prog.read_bytes()
    res = hugify("transform", "--in-place", prog, check=False)
    _refused(res, REFUSED, "already-aligned", prog, once)


def test_second_run_with_a_larger_huge_page_size(original: Path, tmp_path: Path) -> None:
    prog = _copy(original, tmp_path)
    hugify("transform", "--in-place", prog)
    hugify("transform", "--in-place", "--huge-page-size", "32M", prog)
    (x,) = [s for s in readelf_loads(prog) if "E" in s.flags]
    assert x.vaddr % (32 << 20) == 0 and x.offset % (32 << 20) == 0, x
    assert run_program(prog) == run_program(original / "prog")


def test_file_without_section_headers_is_refused(original: Path, tmp_path: Path) -> None:
    def drop_section_headers(d: bytearray, elf: ELFFile) -> None:
        struct.pack_into("<Q", d, 0x28, 0)  # e_shoff
        struct.pack_into("<HHH", d, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx

    prog = _copy(original, tmp_path)
    _edited(prog, prog, drop_section_headers)
    before = prog.read_bytes()
    _refused(hugify("transform", "--in-place", prog, check=False), REFUSED, "no-section-headers", prog, before)


def _swap_entries(d: bytearray, table: int, size: int, a: int, b: int) -> None:
    ea, eb = d[table + a * size : table + (a + 1) * size], d[table + b * size : table + (b + 1) * size]
    d[table + a * size : table + (a + 1) * size], d[table + b * size : table + (b + 1) * size] = eb, ea


def test_load_segments_out_of_order_are_refused(original: Path, tmp_path: Path) -> None:
    def swap_loads(d: bytearray, elf: ELFFile) -> None:
        loads = [i for i, s in enumerate(elf.iter_segments()) if s["p_type"] == "PT_LOAD"]
        _swap_entries(d, elf["e_phoff"], elf["e_phentsize"], loads[0], loads[1])

    prog = _edited(original / "prog", _copy(original, tmp_path), swap_loads)
    before = prog.read_bytes()
    _refused(hugify("transform", "--in-place", prog, check=False), REFUSED, "unsupported-layout", prog, before)


def test_section_headers_out_of_address_order(original: Path, tmp_path: Path) -> None:
    def swap_init_and_fini(d: bytearray, elf: ELFFile) -> None:
        idx = [i for i, s in enumerate(elf.iter_sections()) if s.name in (".init", ".fini")]
        _swap_entries(d, elf["e_shoff"], elf["e_shentsize"], *idx)

    prog = _edited(original / "prog", _copy(original, tmp_path), swap_init_and_fini)
    report = transform(prog, tmp_path / "new")
    assert report["result"]["mode"] == "shift"
    dv = report["result"]["dv"]
    old, new = sections(prog), sections(tmp_path / "new")
    assert new[".init"]["addr"] == old[".init"]["addr"] + dv and new[".fini"]["addr"] == old[".fini"]["addr"] + dv
    assert run_program(tmp_path / "new") == run_program(original / "prog")


def test_missing_dynamic_segment_still_gets_its_dynamic_section_repaired(original: Path, tmp_path: Path) -> None:
    def drop_pt_dynamic(d: bytearray, elf: ELFFile) -> None:
        (i,) = [i for i, s in enumerate(elf.iter_segments()) if s["p_type"] == "PT_DYNAMIC"]
        struct.pack_into("<I", d, elf["e_phoff"] + i * elf["e_phentsize"], 0)  # PT_NULL

    prog = _edited(original / "prog", _copy(original, tmp_path), drop_pt_dynamic)
    dv = transform(prog, tmp_path / "new")["result"]["dv"]
    with (tmp_path / "new").open("rb") as f:
        elf = ELFFile(f)
        (init,) = [t["d_val"] for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_INIT"]
        assert init == elf.get_section_by_name(".init")["sh_addr"]
    assert init == sections(prog)[".init"]["addr"] + dv


def test_probe_notes_without_stapsdt_base_move(original: Path, tmp_path: Path) -> None:
    def rename_stapsdt_base(d: bytearray, elf: ELFFile) -> None:
        names = elf.get_section_by_name(".shstrtab")
        at = names["sh_offset"] + names.data().index(b".stapsdt.base\0")
        d[at : at + 13] = b".stapsdt.nope"

    prog = _edited(original / "prog", _copy(original, tmp_path), rename_stapsdt_base)
    dv = transform(prog, tmp_path / "new")["result"]["dv"]
    before, after = readelf_probes(prog), readelf_probes(tmp_path / "new")
    assert before and len(after) == len(before)
    for (name, pc, base, sem), (name2, pc2, base2, sem2) in zip(before, after, strict=True):
        assert (name2, pc2, base2, sem2) == (name, pc + dv, base + dv, sem + dv if sem else 0)


@pytest.mark.parametrize("mode", [0o444, 0o4755, 0o2711])
def test_in_place_keeps_read_only_setuid_and_setgid_modes(original: Path, tmp_path: Path, mode: int) -> None:
    prog = _copy(original, tmp_path)
    prog.chmod(mode)
    hugify("transform", "--in-place", prog)
    assert stat.S_IMODE(prog.stat().st_mode) == mode
    assert next(s for s in readelf_loads(prog) if "E" in s.flags).vaddr % HP == 0


def test_file_in_a_read_only_directory_is_refused_and_untouched(original: Path, tmp_path: Path) -> None:
    """Root ignores directory modes, so the directory is a read-only bind mount in a
    private mount namespace."""
    prog = _copy(original, tmp_path / "ro")
    before = prog.read_bytes()
    read_only = f'mount --bind {prog.parent} {prog.parent} && mount -o remount,bind,ro {prog.parent} && exec "$@"'
    in_namespace = ["unshare", "--mount", "sh", "-c", read_only, "sh"]
    res = hugify("transform", "--in-place", prog, runner=in_namespace, check=False)
    _refused(res, IO_ERROR, "io-error", prog, before)


def test_bytes_after_everything_described_are_refused(original: Path, tmp_path: Path) -> None:
    """An appended payload (a self-extracting archive, an appended signature) is found
    from the end of the file by code hugify cannot see: such files are refused."""
    prog = _copy(original, tmp_path)
    with prog.open("ab") as f:
        f.write(bytes(range(256)) * 400)
    before = prog.read_bytes()
    _refused(hugify("transform", "--in-place", prog, check=False), REFUSED, "trailing-data", prog, before)


def test_file_larger_than_2_gib(original: Path, tmp_path: Path) -> None:
    """A sparse file of 2.2 GiB (a program followed by a hole: zeros, which carry
    nothing and are dropped) is transformed; its input is read once (peak memory
    about the file size, not twice)."""
    prog = _copy(original, tmp_path)
    size = 2200 << 20
    os.truncate(prog, size)
    out = tmp_path / "new"
    res = hugify("transform", prog, "-o", out, runner=["/usr/bin/time", "-f", "%M"], check=False)
    assert res.returncode == 0, res.stderr
    peak_kib = int(res.stderr.strip().splitlines()[-1])
    assert peak_kib * 1024 < 1.3 * size, peak_kib
    assert out.stat().st_size < 16 << 20
    assert run_program(out) == run_program(original / "prog")
    out.unlink()


def test_transform_of_a_stripped_file_says_the_policy_is_not_applied(original: Path, tmp_path: Path) -> None:
    """transform applies no policy; on a file without a symbol table, which the default
    policy's refuse_stripped would keep a package build from rewriting, it says so (the
    old code said nothing) and still transforms it as asked."""
    prog = _copy(original, tmp_path)
    subprocess.run(["strip", str(prog)], check=True)
    res = hugify("transform", "--threshold", "0", prog, "-o", tmp_path / "out")
    assert res.stderr.strip().splitlines() == [
        f"hugify: note: {prog} has no symbol table; transform applies no policy, so refuse_stripped (which "
        "hugify tree, dh_hugify and brp-hugify apply) did not skip it: references to the ELF header were ruled "
        "out by the byte probe only, not by name"
    ]
    assert "transformed" in res.stdout
    unstripped = hugify("transform", "--threshold", "0", original / "prog", "-o", tmp_path / "out2")
    assert unstripped.stderr == ""
