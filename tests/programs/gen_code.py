#!/usr/bin/env python3
"""Generates deterministic C code of a chosen size for the test programs.

Each function has a large switch (a jump table in .rodata, reached pc-relatively),
string literals (.rodata), and calls through a table of function pointers (absolute
addresses in .data.rel.ro, covered by RELATIVE relocations). A dispatcher sums the
results so that any misplaced byte changes the program's output.

Such a function takes a compiler about 10 ms at -O2 (gcc; clang about half), which
made the test programs' builds the suite's largest cost from an empty cache. With
--padded EVERY:TEXT:RODATA only every EVERY-th function (f0, fEVERY, ...) is such a
switch; each other one computes a line of arithmetic around TEXT bytes of no-ops
(about 1 ms to compile), and the table unit holds RODATA bytes of read-only data per
padded function. The caller measures TEXT and RODATA on the same compiler and flags
(a switch function's code and jump table less a padded one's own code), so the
program's code and read-only data keep their sizes, and with them the layout and
huge-page windows the tests expect; every function, symbol, table entry and
relocation is still there.

--padded-for "COMPILER FLAGS..." measures TEXT and RODATA itself: it compiles a probe
of PROBE_FUNCS switch and PROBE_FUNCS padded functions with that command (the code's
flags: -O2, -fPIC, ...; debug information changes no code) and reads the object's
symbols and sections (ELF, little-endian, 32 or 64 bits: the host's and the cross
compilers'), one function in FULL_EVERY then a switch function. --padding-for prints
that --padded argument only. So a build measures on its own compiler, a package's
build (tests/deb/hugify-deb-test/Makefile) as much as the suite's fixtures
(testkit/recipes.py).

usage: gen_code.py [--padded EVERY:TEXT:RODATA | --padded-for CMD] PREFIX COUNT FILES OUTDIR
       gen_code.py --padding-for CMD
"""

import shlex
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = 24
#: One generated function in this many is a switch function (--padded-for).
FULL_EVERY = 8
#: Functions of each kind in the probe that measures what a padded function lacks.
PROBE_FUNCS = 64


def function(prefix: str, i: int, count: int) -> str:
    lines = [f"long {prefix}_f{i}(long x) {{", f"  switch ((unsigned long)(x ^ {i}) % {CASES}) {{"]
    for c in range(CASES):
        k = (i * 31 + c * 17) % 97 + 1
        op = c % 6
        if op == 0:
            body = f"x = x * {k} + {i};"
        elif op == 1:
            body = f"x = (x >> {c % 7 + 1}) ^ {k * 1009};"
        elif op == 2:
            body = f"x += (long)__builtin_strlen({prefix}_s{i % 64}) * {k};"
        elif op == 3:
            callee = (i * 7 + c) % max(i, 1)
            body = f"if (x & 3) x += {prefix}_table[{callee}](x >> 8) & 0xff; else x -= {k};"
        elif op == 4:
            body = f"x = x * x % {k * 7919 + 13};"
        else:
            body = f"x = ~x + {k} * {c};"
        lines.append(f"    case {c}: {body} break;")
    lines += ["  }", f"  return x + {i};", "}"]
    return "\n".join(lines)


def padded(prefix: str, i: int) -> str:
    """A function of about the switch function's size that is cheap to compile."""
    k = (i * 31) % 97 + 1
    body = f"  __asm__ volatile({prefix.upper()}_PAD);\n  return (x ^ {k}) * {i % 13 + 2} + {i};"
    return f"long {prefix}_f{i}(long x) {{\n{body}\n}}"


def pad_macro(prefix: str, text: int) -> str:
    """The assembler directive of TEXT bytes of no-ops (aarch64's are 4 bytes)."""
    return (
        "#if defined(__aarch64__)\n"
        f'#define {prefix.upper()}_PAD ".fill {text // 4}, 4, 0xd503201f"\n'
        "#else\n"
        f'#define {prefix.upper()}_PAD ".fill {text}, 1, 0x90"\n'
        "#endif\n"
    )


def generate(
    prefix: str, count: int, files: int, outdir: Path, *, every: int = 1, text: int = 0, rodata: int = 0
) -> None:
    """The units PREFIX_gen0.c ... and PREFIX_table.c of `count` functions in `outdir`:
    one function in `every` a switch function, the others padded by TEXT bytes, the
    table unit holding RODATA bytes of read-only data for each padded function."""
    outdir.mkdir(parents=True, exist_ok=True)
    decl = "\n".join(f"long {prefix}_f{i}(long);" for i in range(count))
    strings = "\n".join(f"extern const char {prefix}_s{j}[];" for j in range(64))
    header = f"typedef long (*{prefix}_fn)(long);\nextern {prefix}_fn const {prefix}_table[];\n{decl}\n{strings}\n"
    if every > 1:
        header += pad_macro(prefix, text)
    (outdir / f"{prefix}_gen.h").write_text(header)
    per = (count + files - 1) // files
    for f in range(files):
        body = [f'#include "{prefix}_gen.h"']
        for i in range(f * per, min(count, (f + 1) * per)):
            body.append(function(prefix, i, count) if i % every == 0 else padded(prefix, i))
        (outdir / f"{prefix}_gen{f}.c").write_text("\n\n".join(body) + "\n")
    table = [f'#include "{prefix}_gen.h"']
    table += [f'const char {prefix}_s{j}[] = "{prefix}-string-{j}-' + "x" * (j % 13) + '";' for j in range(64)]
    table.append(f"{prefix}_fn const {prefix}_table[] = {{")
    table += [f"  {prefix}_f{i}," for i in range(count)]
    table.append("};")
    table.append(
        f"long {prefix}_dispatch(long seed) {{\n  long acc = seed;\n"
        f"  for (long i = 0; i < {count}; i += 1) acc = acc * 31 + {prefix}_table[i](acc + i);\n"
        "  return acc;\n}"
    )
    padded_count = count - (count + every - 1) // every
    if rodata and padded_count:
        # The padded functions' share of read-only data: the jump tables they lack.
        table.append(
            f'__asm__(".section .rodata\\n.globl {prefix}_rodata_pad\\n{prefix}_rodata_pad:\\n'
            f'.fill {rodata * padded_count}, 1, 0x5a\\n.previous");'
        )
    (outdir / f"{prefix}_table.c").write_text("\n".join(table) + "\n")


def object_layout(obj: bytes, prefix: str) -> tuple[list[tuple[int, int]], int, int]:
    """Of a relocatable ELF object (little-endian, 32 or 64 bits): (offset in .text,
    N) of each function PREFIX_fN there, sorted; .text's size; the size of .rodata and
    its .rodata.* sections."""
    if obj[:4] != b"\x7fELF" or obj[5] != 1:
        raise SystemExit("gen_code.py: the probe is not a little-endian ELF object")
    wide = obj[4] == 2
    shoff, shentsize, shnum, shstrndx = (
        struct.unpack_from("<Q10xHHH", obj, 0x28) if wide else struct.unpack_from("<I10xHHH", obj, 0x20)
    )
    header = "<IIQQQQIIQQ" if wide else "<IIIIIIIIII"
    sections = [struct.unpack_from(header, obj, shoff + k * shentsize) for k in range(shnum)]

    def name(table: int, at: int) -> str:
        start = sections[table][4] + at
        return obj[start : obj.index(b"\0", start)].decode()

    names = [name(shstrndx, sec[0]) for sec in sections]
    text = names.index(".text")
    rodata = sum(sec[5] for n, sec in zip(names, sections, strict=True) if n == ".rodata" or n.startswith(".rodata."))
    symtab = sections[names.index(".symtab")]
    starts = []
    entry = "<IBBHQQ" if wide else "<IIIBBH"
    for off in range(symtab[4], symtab[4] + symtab[5], symtab[9]):
        if wide:
            st_name, info, _, shndx, value, _ = struct.unpack_from(entry, obj, off)
        else:
            st_name, value, _, info, _, shndx = struct.unpack_from(entry, obj, off)
        sym = name(symtab[6], st_name)
        n = sym.removeprefix(f"{prefix}_f")
        if info & 0xF == 2 and shndx == text and sym != n and n.isdigit():  # STT_FUNC in .text
            starts.append((value, int(n)))
    return sorted(starts), sections[text][5], rodata


def padding_for(command: list[str]) -> str:
    """The --padded argument for `command` (a compiler and the code's flags): one
    function in FULL_EVERY a switch function, the others padded by the room a switch
    function takes beyond a padded one, the table unit holding a jump table's read-only
    data for each. Both measured on a probe of switch and padded functions in turn,
    compiled by `command`: from each function's offset to the next one's, alignment
    included; the jump tables' sections over the switch functions. Whole 16 bytes, so
    that a padded function stays as aligned as it was."""
    with tempfile.TemporaryDirectory(prefix="gen-code-probe-") as tmp:
        work = Path(tmp)
        # Its last unit: functions 128 and on, whose constants take as many bytes as most.
        generate("probe", 3 * PROBE_FUNCS, 3, work, every=2)
        cmd = [*command, "-c", "-o", "probe.o", "probe_gen2.c"]
        res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"gen_code.py: the probe did not compile: {shlex.join(cmd)}\n{res.stderr}")
        starts, text_size, rodata = object_layout((work / "probe.o").read_bytes(), "probe")
    ends = [a for a, _ in starts[1:]] + [text_size]
    room: tuple[list[int], list[int]] = ([], [])
    for (start, n), end in zip(starts, ends, strict=True):
        room[n % 2].append(end - start)
    if not room[0] or not room[1]:
        raise SystemExit("gen_code.py: the probe's functions are not in its .text")
    full, plain = (sum(r) / len(r) for r in room)
    return f"{FULL_EVERY}:{max(0, round((full - plain) / 16) * 16)}:{rodata // len(room[0])}"


def main() -> None:
    args = sys.argv[1:]
    every, text, rodata = 1, 0, 0
    if args[0] == "--padding-for":
        print(padding_for(shlex.split(args[1])))
        return
    if args[0] in ("--padded", "--padded-for"):
        spec = args[1] if args[0] == "--padded" else padding_for(shlex.split(args[1]))
        every, text, rodata = (int(n) for n in spec.split(":"))
        args = args[2:]
    generate(args[0], int(args[1]), int(args[2]), Path(args[3]), every=every, text=text, rodata=rodata)


if __name__ == "__main__":
    main()
