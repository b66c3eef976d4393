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

usage: gen_code.py [--padded EVERY:TEXT:RODATA] PREFIX COUNT FILES OUTDIR
"""

import sys
from pathlib import Path

CASES = 24


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


def main() -> None:
    args = sys.argv[1:]
    every, text, rodata = 1, 0, 0
    if args[0] == "--padded":
        every, text, rodata = (int(n) for n in args[1].split(":"))
        args = args[2:]
    prefix, count, files, outdir = args[0], int(args[1]), int(args[2]), Path(args[3])
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


if __name__ == "__main__":
    main()
