"""A file whose program header table leaves e_phoff says so in every report.

libelf-based tools (dwz, eu-strip) zero a program header table that lies in a gap
between sections, so a distribution must be able to find the files it happened to:
`hugify tree --report`, the manifest's report entry and the signed statement carry
`phdr_table_displaced` as they carry exposure.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from testkit.cli import hugify
from testkit.recipes import BY_NAME, build

SHT_PROGBITS = 1
SHT_NOTE = 7


def _note_after_table_made_progbits(data: bytearray) -> None:
    """Make the note right after the program header table an ordinary section.

    bfd with -z noseparate-code puts the build-id/property notes right after the table,
    and hugify moves such a note to make room for the table; a section that is no loader
    metadata cannot move, so the table has to go elsewhere (core/src/plan.rs,
    a_table_without_room_after_it_is_displaced_and_says_so). No linker the suite has
    puts a PROGBITS section there by itself, so one note's type is changed.
    """
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    table_end = phoff + phentsize * phnum
    headers = [shoff + i * shentsize for i in range(shnum)]
    first = min(
        (h for h in headers if struct.unpack_from("<Q", data, h + 24)[0] >= table_end),
        key=lambda h: struct.unpack_from("<Q", data, h + 24)[0],
    )
    assert struct.unpack_from("<I", data, first + 4)[0] == SHT_NOTE
    struct.pack_into("<I", data, first + 4, SHT_PROGBITS)


def test_a_displaced_table_is_in_the_report_and_the_statement(tmp_path: Path) -> None:
    lib = build(BY_NAME["gcc-bfd-noseparate-code"]) / "libhug.so"
    pol = tmp_path / "policy.toml"
    pol.write_text("threshold = 0\n")
    env = {**os.environ, "HUGIFY_POLICY_PATH": str(pol)}
    seen = {}
    for name, displaced in (("plain", False), ("displaced", True)):
        root = tmp_path / name / "root"
        (root / "usr/lib").mkdir(parents=True)
        data = bytearray(lib.read_bytes())
        if displaced:
            _note_after_table_made_progbits(data)
        (root / "usr/lib/libhug.so").write_bytes(bytes(data))
        report_path = tmp_path / name / "report.json"
        hugify("tree", root, "--package", name, "--report", report_path, "--no-progress", env=env)
        report = json.loads(report_path.read_text())
        (entry,) = report["files"]
        assert entry["status"] == "transformed", entry
        # The manifest's report entry is this one: it also has the manifest span.
        assert entry["manifest_size"] > 0, entry
        hugify("sign", root, "--report", report_path, "--package", name, env=env)
        statement = json.loads((root / f"usr/share/hugify/attestations/{name}.intoto.json").read_text())
        (f,) = statement["predicate"]["files"]
        seen[name] = (entry.get("phdr_table_displaced"), f["transformed"].get("phdr_table_displaced"))
    assert seen == {"plain": (False, False), "displaced": (True, True)}


def test_a_report_from_before_the_field_still_signs_and_says_nothing(tmp_path: Path) -> None:
    lib = build(BY_NAME["gcc-bfd-noseparate-code"]) / "libhug.so"
    pol = tmp_path / "policy.toml"
    pol.write_text("threshold = 0\n")
    env = {**os.environ, "HUGIFY_POLICY_PATH": str(pol)}
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libhug.so").write_bytes(lib.read_bytes())
    report_path = tmp_path / "report.json"
    hugify("tree", root, "--package", "old", "--report", report_path, "--no-progress", env=env)
    report = json.loads(report_path.read_text())
    del report["files"][0]["phdr_table_displaced"]
    report_path.write_text(json.dumps(report))
    hugify("sign", root, "--report", report_path, "--package", "old", env=env)
    statement = json.loads((root / "usr/share/hugify/attestations/old.intoto.json").read_text())
    (f,) = statement["predicate"]["files"]
    assert "phdr_table_displaced" not in f["transformed"] and f["transformed"]["exposed"]["bytes"] == 0, f
