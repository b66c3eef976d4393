"""How many more files a change lets shift: `hugify inspect` of this checkout and
of a baseline checkout over the same ELF files (of at least --min-size bytes, as
the layout survey counts them), and the files whose shift plan changed, with
their layout and the shares of code on huge pages each plan would give.

Then, per file whose chosen plan covers or exposes anything in either checkout, the
plan `auto` chooses (or the refusal) before and after, the code it puts on huge
pages, and the bytes it makes executable that were not (`exposed_read_only`: read-only
data in the code's window), with the totals. With --exposure-limit SIZE, a third
pair of columns gives this checkout's choice under that opt-in (policy key
exposure_limit): what a package that accepts the exposure gets back.

usage: tools/bench shift_gain --baseline CHECKOUT [--min-size BYTES] [--threshold SIZE]
                           [--exposure-limit SIZE] PATH...
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from testkit import REPO
from testkit.bench import parser
from testkit.cli import command

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


def shown(path: Path, roots: list[Path]) -> str:
    """A file's name as the tables give it: below the PATH argument it was found under,
    prefixed by that argument's last component (firefox-esr/libxul.so, bin/rustfmt)."""
    for root in roots:
        if path == root:
            return root.name
        if path.is_relative_to(root):
            return str(root.name / path.relative_to(root))
    return str(path)


def shift_plans(checkout: Path, files: list[Path], *options: str) -> dict[Path, dict[str, Any]]:
    """Each file's `inspect` report (the shift plan and layout), or its error."""
    import subprocess

    out: dict[Path, dict[str, Any]] = {}
    for i in range(0, len(files), BATCH):
        batch = files[i : i + BATCH]
        cmd = command("inspect", "--json", *options, *batch)
        res = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
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


def chosen(r: dict[str, Any]) -> tuple[str, int, int]:
    """(the plan auto chooses or why not, code bytes it puts on huge pages, bytes it
    makes executable that were not)."""
    if "error" in r:
        return f"error {r['error']['reason']}", 0, 0
    if not r["chosen"]:
        return f"refused {r['refusal']['reason']}", 0, 0
    plan = r["plans"][r["chosen"]]
    return r["chosen"], plan["covered_code"], plan["exposed_read_only"]


def mib(n: int) -> str:
    return f"{n / (1 << 20):.2f}"


def exposure_table(files: list[Path], roots: list[Path], *runs: dict[Path, dict[str, Any]]) -> None:
    """The chosen plans before, after (and after with the opt-in): code on huge pages
    and bytes exposed, in MiB."""
    names = ["before", "after", "after, opt-in"][: len(runs)]
    print("| file | layout | code | " + " | ".join(f"{n}: plan | on huge pages | exposed" for n in names) + " |")
    print("|---|---|---|" + "---|---|---|" * len(runs))
    covered, exposed = [0] * len(runs), [0] * len(runs)
    for p in files:
        picks = [chosen(run[p]) for run in runs]
        if not any(c or e for _, c, e in picks):
            continue
        cells = []
        for i, (plan, c, e) in enumerate(picks):
            covered[i], exposed[i] = covered[i] + c, exposed[i] + e
            cells.append(f"{plan} | {mib(c)} | {mib(e)}")
        layout, code = runs[1][p].get("layout", "?"), runs[1][p].get("code_bytes", 0)
        print(f"| {shown(p, roots)} | {layout} | {mib(code)} | " + " | ".join(cells) + " |")
    totals = " | ".join(f" | {mib(c)} | {mib(e)}" for c, e in zip(covered, exposed, strict=True))
    print(f"| total | | | {totals} |")
    exposing = [sum(chosen(run[p])[2] > 0 for p in files) for run in runs]
    print("RESULT files exposing read-only data:", ", ".join(f"{k} {n}" for n, k in zip(names, exposing, strict=True)))
    print("RESULT code on huge pages (MiB): " + ", ".join(f"{mib(c)} {n}" for n, c in zip(names, covered, strict=True)))


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, metavar="CHECKOUT")
    ap.add_argument("--min-size", type=int, default=1 << 20)
    ap.add_argument("--threshold", default="1M", metavar="SIZE", help="inspect's --threshold (default 1M)")
    ap.add_argument("--exposure-limit", metavar="SIZE", help="also this checkout under this opt-in")
    ap.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args()
    files = elf_files(args.paths, args.min_size)
    threshold = ("--threshold", args.threshold)
    new, old = shift_plans(REPO, files, *threshold), shift_plans(args.baseline, files, *threshold)
    changes: collections.Counter[tuple[str, str]] = collections.Counter()
    for p in files:
        (before, why), (after, now) = outcome(old[p]), outcome(new[p])
        if before != after:
            changes[(before, after)] += 1
            print(f"{shown(p, args.paths)} ({new[p].get('layout', '?')}): {before} ({why}) -> {after} ({now})")

    def ok(plans: dict[Path, dict[str, Any]]) -> int:
        return sum(outcome(plans[p])[0] == "ok" for p in files)

    print(f"files: {len(files)} ELF files of at least {args.min_size} bytes under {', '.join(map(str, args.paths))}")
    print(f"RESULT shift possible: {ok(old)} before, {ok(new)} after ({ok(new) - ok(old):+d})")
    for (before, after), n in sorted(changes.items()):
        print(f"  {before} -> {after}: {n}")
    runs = [old, new]
    if args.exposure_limit is not None:
        runs.append(shift_plans(REPO, files, *threshold, "--exposure-limit", args.exposure_limit))
    exposure_table(files, args.paths, *runs)
    os.sync()


if __name__ == "__main__":
    main()
