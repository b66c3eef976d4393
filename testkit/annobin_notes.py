"""Adds annobin build notes to a compiler's assembly output, as Fedora's annobin gcc
plugin would (Debian has no annobin): `.gnu.build.attributes` notes in the layout of
the Watermark specification, whose descriptions hold address ranges that the linker
resolves to final addresses.

Each unit gets a version-3 OPEN note for the range of its `.text`, a tool note with an
empty description (the previous range applies), a version-2 OPEN note with a single
start address, a FUNC note per function (start and end), and two notes on the edges
of the moved range: one ending at `_init` (the first code, where the shift starts)
and one ending at `_end` (one past the image). testkit/recipes.py applies it to the
recipes with `annobin=True`.
"""

from __future__ import annotations

import re

OPEN, FUNC = 0x100, 0x101
SIZE = re.compile(r"^\s*\.size\s+([\w.$]+),\s*\.-\1\s*$")


def _note(kind: int, name: bytes, addrs: list[str], word: str, width: int) -> str:
    """One note: header, NUL-terminated owner name padded to 4, then the addresses."""
    name += b"\0"
    lines = [
        "\t.balign 4",
        f"\t.long {len(name)}, {len(addrs) * width}, {kind:#x}",
        "\t.byte " + ", ".join(str(b) for b in name),
        "\t.balign 4",
    ]
    if addrs:
        lines.append(f"\t{word} {', '.join(addrs)}")
    return "\n".join(lines)


def annotate(asm: str, bits: int) -> str:
    word, width = (".quad", 8) if bits == 64 else (".long", 4)
    out, funcs = ["\t.text", ".Lannobin_start:"], []
    for line in asm.splitlines():
        out.append(line)
        m = SIZE.match(line)
        if m:
            funcs.append(m.group(1))
            out.append(f".Lannobin_end_{m.group(1)}:")
    out += ["\t.text", ".Lannobin_end:", '\t.pushsection .gnu.build.attributes, "", %note']
    unit = [".Lannobin_start", ".Lannobin_end"]
    out.append(_note(OPEN, b"GA$\x013p3", unit, word, width))
    out.append(_note(OPEN, b"GA$\x05gcc annobin-test", [], word, width))
    out.append(_note(OPEN, b"GA$\x012p1", [".Lannobin_start"], word, width))
    out.append(_note(OPEN, b"GA*\x02\x02", ["_init - 16", "_init"], word, width))
    out.append(_note(OPEN, b"GA*\x07\x02", [".Lannobin_start", "_end"], word, width))
    for f in funcs:
        out.append(_note(FUNC, b"GA*GOW:0x452b", [f, f".Lannobin_end_{f}"], word, width))
    out.append("\t.popsection")
    return "\n".join(out) + "\n"
