"""What perf's map of the anonymous copies costs (docs/runtime-reference.md, "perf and gdb"): N
short processes of a hugified program and its hugified library, each started through
`hugify-run --anonymous=always` (every window copied), with this checkout's runtime as
it is by default (no map) and asked for maps (HUGIFY_PERF_MAP=1), and optionally with
another build of the runtime (--baseline-runtime DIR: a hugify-run with its
libhugify-audit.so beside it, e.g. main's). Per way: the bytes and files the processes
left in /tmp (each process's /tmp/perf-PID.map, measured after it ended and then
removed) and the time from spawn to exit, the ways interleaved process by process (the
machine is shared and noisy: the time is a ratio against the default in the same run).

usage: tools/bench perfmap_bench [--processes 1000] [--baseline-runtime DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from testkit import REPO
from testkit.bench import devnull, parser, ratio_summary, round_orders
from testkit.cli import hugify
from testkit.runtime import padded_functions

HUGIFY_RUN = REPO / "runtime" / "hugify-run"

MAIN = r"""
#include <stdio.h>
long lib_all(long);
int main(void) { printf("%ld\n", prog_all(1) + lib_all(2)); return 0; }
"""


def build(work: Path) -> Path:
    """prog (4.4 MiB of code) linking libfew.so (2.5 MiB), both hugified: 5 windows."""
    (work / "lib.c").write_text(padded_functions("lib", 160))
    (work / "main.c").write_text(padded_functions("prog", 280) + MAIN)
    cc = ["gcc", "-O1", "-g"]
    subprocess.run(
        [*cc, "-fPIC", "-shared", "-Wl,-soname,libfew.so", "-o", "libfew.orig.so", "lib.c"], cwd=work, check=True
    )
    link = ["-fPIE", "-pie", "-o", "prog.orig", "main.c", "libfew.orig.so", "-Wl,-rpath,$ORIGIN"]
    subprocess.run([*cc, *link], cwd=work, check=True)
    out = work / "hugified"
    out.mkdir()
    for orig, name in (("prog.orig", "prog"), ("libfew.orig.so", "libfew.so")):
        hugify("transform", "--threshold", "0", work / orig, "-o", out / name)
    return out / "prog"


def one(hugify_run: Path, prog: Path, env: dict[str, str]) -> tuple[float, int, int]:
    """One process: seconds from spawn to exit, and the bytes and files it left in /tmp
    (its perf map, removed after it was measured)."""
    argv = [str(hugify_run), "--anonymous=always", str(prog)]
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull(), 1)])
    _, status, _ = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} exited with {os.waitstatus_to_exitcode(status)}")
    left = Path(f"/tmp/perf-{pid}.map")
    try:
        size = left.lstat().st_size
    except FileNotFoundError:
        return wall, 0, 0
    left.unlink()
    return wall, size, 1


def main() -> None:
    ap = parser(__file__, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=1000, help="processes per way (default 1000)")
    ap.add_argument(
        "--baseline-runtime", type=Path, metavar="DIR", help="also this build's hugify-run (and audit library)"
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(REPO / "runtime")], check=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    work = Path(tempfile.mkdtemp(prefix="hugify-perfmap-bench-", dir="/var/tmp"))
    try:
        rundir = work / "run"
        rundir.mkdir()
        prog = build(work)
        env = {**base, "HUGIFY_RUNTIME_DIR": str(rundir)}
        ways = {
            "no map (default)": (HUGIFY_RUN, env),
            "HUGIFY_PERF_MAP=1": (HUGIFY_RUN, {**env, "HUGIFY_PERF_MAP": "1"}),
        }
        if args.baseline_runtime:
            ways[f"runtime of {args.baseline_runtime}"] = (args.baseline_runtime / "hugify-run", env)
        results: dict[str, list[tuple[float, int, int]]] = {w: [] for w in ways}
        for run, e in ways.values():  # warm-up: the files cached, the windows prefetched
            one(run, prog, e)
        for order in round_orders(list(ways), args.processes, seed=5):
            for w in order:
                run, e = ways[w]
                results[w].append(one(run, prog, e))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = "no map (default)"
    summary = {}
    print(f"{args.processes} processes per way, `hugify-run --anonymous=always` (5 windows copied each), interleaved")
    for w, rows in results.items():
        walls = [r[0] for r in rows]
        ratio = ratio_summary([a[0] / b[0] for a, b in zip(rows, results[ref], strict=True)])
        summary[w] = {
            "bytes_left_in_tmp": sum(r[1] for r in rows),
            "files_left_in_tmp": sum(r[2] for r in rows),
            "median_ms": round(statistics.median(walls) * 1000, 3),
            "total_s": round(sum(walls), 2),
            "time_over_default": ratio,
        }
        ci = ratio["ci95"]
        print(
            f"  {w:<40} left in /tmp: {summary[w]['bytes_left_in_tmp']:>11,} bytes in "
            f"{summary[w]['files_left_in_tmp']:>5} files; median {summary[w]['median_ms']:7.2f} ms per process, "
            f"{summary[w]['total_s']:7.1f} s in all; / default {ratio['median']:.3f}"
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and w != ref else "")
        )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
