"""Bad input never costs data: malformed, truncated or unsupported files get a
one-line reason and a distinct exit status, the original stays byte-identical, and
nothing half-written is left behind. No input may crash the rewriter."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from hugify import _core
from testkit.cli import hugify
from testkit.recipes import BY_NAME, build

INVALID, REFUSED = 3, 4


@pytest.fixture(scope="module")
def sample() -> bytes:
    return (build(BY_NAME["gcc-bfd-small"]) / "prog").read_bytes()


def _run_in_place(tmp_path: Path, data: bytes) -> tuple[int, str]:
    """Runs `transform --in-place` on a file holding `data`; checks the guarantees."""
    d = tmp_path / "d"
    d.mkdir(exist_ok=True)
    victim = d / "victim"
    victim.write_bytes(data)
    res = hugify("transform", "--in-place", "--threshold", "0", victim, check=False)
    assert victim.read_bytes() == data, "the original changed"
    assert os.listdir(d) == ["victim"], "a temporary file was left behind"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    victim.unlink()
    return res.returncode, lines[0]


def _offsets(data: bytes) -> list[int]:
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    marks = [0, 1, 4, 5, 15, 16, 17, 52, 63, 64, phoff + 56, shoff, shoff + 64, len(data) - 1]
    rng = random.Random(1)
    marks += rng.sample(range(64, len(data)), 24)
    return sorted(set(m for m in marks if 0 <= m < len(data)))


def test_truncated_files_are_refused_cleanly(tmp_path: Path, sample: bytes) -> None:
    for cut in _offsets(sample):
        code, line = _run_in_place(tmp_path, sample[:cut])
        assert code in (INVALID, REFUSED), (cut, line)


FIELD_CORRUPTIONS = {
    "class": (4, 1, 7),
    "big-endian": (5, 1, 2),
    "version": (6, 1, 9),
    "e_phoff": (32, 8, 0xFFFF_FFFF_FFFF),
    "e_shoff": (40, 8, 0xFFFF_FFFF_0000),
    "e_phentsize": (54, 2, 40),
    "e_phnum": (56, 2, 0xFFF0),
    "e_shentsize": (58, 2, 12),
    "e_shnum": (60, 2, 0xFEFF),
    "e_shstrndx": (62, 2, 0x7FFF),
}


@pytest.mark.parametrize("field", FIELD_CORRUPTIONS)
def test_corrupted_header_fields(tmp_path: Path, sample: bytes, field: str) -> None:
    at, size, value = FIELD_CORRUPTIONS[field]
    data = bytearray(sample)
    data[at : at + size] = value.to_bytes(size, "little")
    code, line = _run_in_place(tmp_path, bytes(data))
    assert code == (REFUSED if field == "big-endian" else INVALID), line


def _phdr_and_shdr_corruptions(sample: bytes) -> list[tuple[str, int, int, int]]:
    phoff, shoff = struct.unpack_from("<QQ", sample, 32)
    phnum, shnum = struct.unpack_from("<H", sample, 56)[0], struct.unpack_from("<H", sample, 60)[0]
    out = []
    for i in range(phnum):
        base = phoff + 56 * i
        out += [(f"phdr{i}.p_offset", base + 8, 8, 1 << 40), (f"phdr{i}.p_filesz", base + 32, 8, 1 << 40)]
        out.append((f"phdr{i}.p_memsz", base + 40, 8, 0))
    for i in range(1, shnum):
        base = shoff + 64 * i
        out += [(f"shdr{i}.sh_offset", base + 24, 8, 1 << 40), (f"shdr{i}.sh_size", base + 32, 8, 1 << 41)]
        out += [(f"shdr{i}.sh_name", base, 4, 0xFFFF_FFF0), (f"shdr{i}.sh_addr", base + 16, 8, 0x7FFF_0000)]
    return out


def test_corrupted_program_and_section_headers(tmp_path: Path, sample: bytes) -> None:
    for name, at, size, value in _phdr_and_shdr_corruptions(sample):
        data = bytearray(sample)
        data[at : at + size] = value.to_bytes(size, "little")
        if bytes(data) == sample:
            continue
        d = tmp_path / name
        d.mkdir()
        # In-process first: no internal errors, no panics.
        try:
            _core.transform_bytes(bytes(data), 2 << 20, 0)
        except _core.HugifyError as e:
            assert e.kind in ("invalid", "refused"), (name, str(e))


def test_random_bytes_and_bit_flips_never_crash(sample: bytes) -> None:
    rng = random.Random(7)
    inputs = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (0, 1, 63, 64, 4096)]
    inputs.append(b"\x7fELF" + bytes(rng.getrandbits(8) for _ in range(4092)))
    for _ in range(300):
        data = bytearray(sample)
        for _ in range(rng.randint(1, 8)):
            # Flips concentrated in the headers and the metadata the rewriter parses.
            pos = rng.randrange(0, 0x1000) if rng.random() < 0.8 else rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        inputs.append(bytes(data))
    internal = []
    for data in inputs:
        try:
            _core.transform_bytes(data, 2 << 20, 0)
        except _core.HugifyError as e:
            if e.kind == "internal":
                internal.append(str(e))
    assert internal == []


def test_non_elf_and_missing_files_via_cli(tmp_path: Path) -> None:
    text = tmp_path / "script.sh"
    text.write_text("#!/bin/sh\necho hi\n")
    res = hugify("transform", "--in-place", text, check=False)
    assert res.returncode == INVALID and "not-elf" in res.stderr
    res = hugify("transform", "--in-place", tmp_path / "missing", check=False)
    assert res.returncode == 5 and "No such file" in res.stderr
