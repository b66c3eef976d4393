"""What the boot service costs at distribution scale, and what `runtime.boot_budget`
bounds (issue 20, item 6).

The hugified files are real Debian packages' programs and libraries (the test corpus:
libLLVM, libz3, libicu, x265, docker, gdb, git, …, transformed by `hugify tree` as a
distribution build would, stripped files allowed). Each round starts from a cold page
cache and a runtime directory without a record of this boot, so every `hugify prefetch
--boot` is the boot's first run, as the service's is. Measured per run: wall time,
bytes read from storage (the child's I/O accounting), page cache the files hold
afterwards (mincore), and windows made huge. The peer, in the same rounds: reading the
same files whole with read(2) (`cat`): what reading them at all costs.

usage: tools/bench boot_prefetch [--rounds N] [--budgets 0,256M,512M,1G]
       (0: no bound; the policy's default is the shipped policy/policy.toml's)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit import REPO
from testkit.bench import parser, round_orders
from testkit.cache import cache_root
from testkit.cli import command, hugify
from testkit.corpus import hugified_tree, parse_size
from testkit.runtime import cached_pages


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def cached_bytes(files: list[Path]) -> int:
    return sum(cached_pages(f) for f in files) * 4096


def timed(cmd: list[str], env: dict[str, str], capture: bool = True) -> tuple[float, int, str]:
    """Wall time, bytes read by the child (its I/O accounting), stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock
    start = time.perf_counter()
    res = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
    )
    wall = time.perf_counter() - start
    read = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock - before) * 512
    if res.returncode not in (0, 1, 4):
        raise SystemExit(f"{cmd[:4]}… exited {res.returncode}:\n{res.stderr[-2000:]}")
    return wall, read, res.stdout or ""


def main() -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budgets", default="0,256M,512M,1G")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("root needed: the page cache is dropped between runs")
    budgets = [parse_size(b) for b in args.budgets.split(",")]
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        work = Path(tmp)
        files = hugified_tree(work)
        code = 0
        for f in files:
            probe = json.loads(hugify("inspect", "--json", f).stdout)
            probe = probe[0] if isinstance(probe, list) else probe
            code += probe["exec_segment_size"]
        print(f"{len(files)} hugified files, {code / 2**20:.0f} MiB of executable segments")
        cases: dict[str, list[tuple[float, int, int, int]]] = {}
        names = ["read(2)", *[f"budget {b >> 20} MiB" if b else "unbounded" for b in budgets]]
        for order in round_orders(names, args.rounds):
            for i in map(names.index, order):
                drop_caches()
                rdir = work / "run"
                shutil.rmtree(rdir, ignore_errors=True)
                env = {**os.environ, "HUGIFY_RUNTIME_DIR": str(rdir)}
                if i == 0:
                    wall, read, _ = timed(["cat", *map(str, files)], env | {"PATH": "/usr/bin:/bin"}, capture=False)
                    huge = 0
                else:
                    policy = work / "budget.toml"
                    b = budgets[i - 1]
                    policy.write_text(f"[runtime]\nboot_budget = {b or 1 << 50}\n")
                    cmd = command("prefetch", "--boot", "--policy", policy)
                    wall, read, out = timed([*cmd, "--json", *map(str, files)], env)
                    states = [w["state"] for f in json.loads(out)["files"] for w in f.get("windows", [])]
                    huge = sum(s in ("huge", "loaded", "repaired") for s in states)
                held = cached_bytes(files)
                cases.setdefault(names[i], []).append((wall, read, held, huge))
        base = statistics.median(w for w, *_ in cases["read(2)"])
        print(f"{'case':<18} {'wall s':>8} {'/read(2)':>9} {'read MiB':>9} {'cache MiB':>10} {'huge windows':>13}")
        figures: dict[str, dict[str, float]] = {}
        for name in names:
            rows = cases[name]
            wall = statistics.median(r[0] for r in rows)
            read_mib = statistics.median(r[1] for r in rows) / 2**20
            held_mib = statistics.median(r[2] for r in rows) / 2**20
            huge = float(statistics.median(r[3] for r in rows))
            ratios = sorted(r[0] / b[0] for r, b in zip(rows, cases["read(2)"], strict=True))
            lo, hi = ratios[0], ratios[-1]
            print(
                f"{name:<18} {wall:8.2f} {wall / base:9.2f} {read_mib:9.0f} {held_mib:10.0f} {huge:13.0f}  "
                f"[{lo:.2f}, {hi:.2f}] (per-round range)"
            )
            figures[name] = {"wall_s": wall, "read_mib": read_mib, "cache_mib": held_mib, "huge_windows": huge}
        if args.json:
            args.json.write_text(
                json.dumps({"files": len(files), "code_mib": code / 2**20, "cases": figures}, indent=2)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
