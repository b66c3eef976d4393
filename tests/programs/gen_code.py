#!/usr/bin/env python3
"""Generates deterministic C code of a chosen size for the test programs.

Each function has a large switch (a jump table in .rodata, reached pc-relatively),
string literals (.rodata), and calls through a table of function pointers (absolute
addresses in .data.rel.ro, covered by RELATIVE relocations). A dispatcher sums the
results so that any misplaced byte changes the program's output.

usage: gen_code.py PREFIX COUNT FILES OUTDIR
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


def main() -> None:
    prefix, count, files, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    outdir.mkdir(parents=True, exist_ok=True)
    decl = "\n".join(f"long {prefix}_f{i}(long);" for i in range(count))
    strings = "\n".join(f"extern const char {prefix}_s{j}[];" for j in range(64))
    header = f"typedef long (*{prefix}_fn)(long);\nextern {prefix}_fn const {prefix}_table[];\n{decl}\n{strings}\n"
    (outdir / f"{prefix}_gen.h").write_text(header)
    per = (count + files - 1) // files
    for f in range(files):
        body = [f'#include "{prefix}_gen.h"']
        for i in range(f * per, min(count, (f + 1) * per)):
            body.append(function(prefix, i, count))
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
    (outdir / f"{prefix}_table.c").write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
