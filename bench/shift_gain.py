#!/usr/bin/env python3
"""How many more files a change lets shift: `hugify inspect` of this checkout and
of a baseline checkout over the same ELF files (of at least --min-size bytes, as
the layout survey counts them), and the files whose shift plan changed, with
their layout and the shares of code on huge pages each plan would give.

usage: bench/shift_gain.py --baseline CHECKOUT [--min-size BYTES] PATH...
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from benchlib import REPO, hugify_cmd

ELF_MAGIC = b"\x7fELF"
BATCH = 64


def elf_files(paths: list[Path], min_size: int) -> list[Path]:
    """Regular ELF files under `paths`, each content once (the same program installed
    and unpacked from its package counts once), in a stable order."""
    seen: set[tuple[int, bytes]] = set()
    out = []
    for root in paths:
        walk = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in walk:
            if p.is_symlink():
                continue
            size = p.stat().st_size
            if size < min_size:
                continue
            with p.open("rb") as f:
                head = f.read(1 << 20)
            key = (size, hashlib.sha256(head).digest())
            if head[:4] != ELF_MAGIC or key in seen:
                continue
            seen.add(key)
            out.append(p)
    return out


def shift_plans(checkout: Path, files: list[Path]) -> dict[Path, dict[str, Any]]:
    """Each file's `inspect` report (the shift plan and layout), or its error."""
    import subprocess

    out: dict[Path, dict[str, Any]] = {}
    for i in range(0, len(files), BATCH):
        batch = files[i : i + BATCH]
        res = subprocess.run(
            hugify_cmd("inspect", "--json", *batch), cwd=checkout, capture_output=True, text=True, check=False
        )
        for path, r in zip(batch, json.loads(res.stdout), strict=True):
            out[path] = r
    return out


def outcome(r: dict[str, Any]) -> tuple[str, str]:
    """(what happened to the shift plan, its share of code on huge pages or why not)."""
    if "error" in r:
        return f"error {r['error']['reason']}", r["error"]["detail"]
    shift = r["plans"]["shift"]
    if shift["ok"] is False:
        return f"refused {shift['reason']}", shift["detail"]
    return "ok", f"{100 * shift['covered_code'] / max(r['code_bytes'], 1):.1f}% of the code on huge pages"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, metavar="CHECKOUT")
    ap.add_argument("--min-size", type=int, default=1 << 20)
    ap.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args()
    files = elf_files(args.paths, args.min_size)
    new, old = shift_plans(REPO, files), shift_plans(args.baseline, files)
    changes: collections.Counter[tuple[str, str]] = collections.Counter()
    for p in files:
        (before, why), (after, now) = outcome(old[p]), outcome(new[p])
        if before != after:
            changes[(before, after)] += 1
            print(f"{p} ({new[p].get('layout', '?')}): {before} ({why}) -> {after} ({now})")
    ok = lambda plans: sum(outcome(plans[p])[0] == "ok" for p in files)  # noqa: E731
    print(f"files: {len(files)} ELF files of at least {args.min_size} bytes under {', '.join(map(str, args.paths))}")
    print(f"RESULT shift possible: {ok(old)} before, {ok(new)} after ({ok(new) - ok(old):+d})")
    for (before, after), n in sorted(changes.items()):
        print(f"  {before} -> {after}: {n}")
    os.sync()


if __name__ == "__main__":
    main()
