"""The python workload of bench/speedup.py: four small pure-Python kernels, each a
few hundred milliseconds at scale 1 on a 2-core VM. Prints one checksum line per
kernel, so that the original and the hugified interpreter can be checked to agree.

usage: python3.11 pyperf_kernels.py [SCALE]   (SCALE: float, default 1)
"""

import json
import re
import sys

WORDS = ["huge", "page", "folio", "cache", "window", "segment", "loader", "kernel", "TLB", "code"]


def text(lines: int) -> str:
    return "\n".join(
        f"{n:05d} {WORDS[n % 10]}-{WORDS[n * 7 % 10]} size={n * 37 % 4096} addr=0x{n * 2654435761 % 2**32:08x}"
        for n in range(lines)
    )


def regex(scale: float) -> int:
    """Named groups, alternation and backtracking over generated log lines."""
    pattern = re.compile(
        r"(?P<n>\d+) (?P<a>[a-zA-Z]+)-(?P<b>page|cache|code|\w+) size=(?P<s>\d+) addr=0x(?P<x>[0-9a-f]+)"
    )
    data = text(int(6000 * scale))
    total = 0
    for _ in range(24):
        for m in pattern.finditer(data):
            total += int(m["s"]) + len(m["b"]) + int(m["x"][-2:], 16)
        total += len(re.findall(r"\b(?:huge|TLB)\w*", data))
    return total


def json_round_trip(scale: float) -> int:
    """Nested dicts and lists encoded and decoded again."""
    doc = {
        "files": [
            {"path": f"/usr/lib/lib{i}.so", "windows": [{"offset": w << 21, "state": "huge"} for w in range(i % 9)]}
            for i in range(int(800 * scale))
        ],
        "summary": {"count": 800, "ratio": 0.97, "ok": True, "note": None},
    }
    total = 0
    for _ in range(60):
        s = json.dumps(doc, sort_keys=True)
        back = json.loads(s)
        total += len(s) + len(back["files"])
    return total


def recursion(scale: float) -> int:
    """Plain recursive calls: naive Fibonacci and a tree walk."""

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def depth(t: tuple[object, ...] | None) -> int:
        return 0 if t is None else 1 + max(depth(t[0]), depth(t[1]))  # type: ignore[arg-type]

    def build(n: int) -> tuple[object, ...] | None:
        return None if n == 0 else (build(n - 1), build(n // 2), n)

    return sum(fib(25) for _ in range(max(1, int(20 * scale)))) + depth(build(int(16 * scale) + 4))


def dicts(scale: float) -> int:
    """Insertion, lookup, update and deletion in dicts keyed by strings and tuples."""
    counts: dict[str, int] = {}
    pairs: dict[tuple[int, int], int] = {}
    for i in range(int(300_000 * scale)):
        k = WORDS[i % 10] + str(i % 997)
        counts[k] = counts.get(k, 0) + 1
        pairs[(i % 512, i % 31)] = pairs.get((i % 512, i % 31), 0) ^ i
        if i % 5 == 0:
            pairs.pop((i % 97, i % 31), None)
    return sum(counts.values()) + sum(pairs.values()) % 1_000_003 + len(pairs)


def main() -> None:
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    for kernel in (regex, json_round_trip, recursion, dicts):
        print(kernel.__name__, kernel(scale))


if __name__ == "__main__":
    main()
