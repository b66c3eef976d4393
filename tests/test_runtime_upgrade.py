"""Reliability under real package upgrades: a hugified program and its
hugified library started in a loop through the audit library and through hugify-run,
while real dpkg upgrades and downgrades the library's package between two versions whose
code and output differ, with `hugify prefetch` runs between the upgrades.

The two versions of the library's package (and the program's package, installed once)
are built with dpkg-deb and installed with `dpkg --root` into a throwaway root with its
own package database: never into this machine's. dpkg installs a file by writing it
beside its path and renaming it over the installed one, so a start can find either
version, and a start whose ld.so opened one version may find the other at the path by
the time the audit library opens it; and each version comes in written by dpkg, in small
folios, so the audit library repairs. Asserted over at least STARTS starts during at
least UPGRADES upgrades (the figure and its wall time are printed): no start crashes,
every start prints exactly one version's output, and nothing is left behind in the
runtime directory (a private one) or in /tmp, where the audit library writes a perf map
only in the anonymous mode (not used here).

The deterministic case (the rename between ld.so's mapping and la_objopen, every time)
is tests/test_runtime_identity.py; this one says the race as it happens changes
nothing."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

from testkit.cli import hugify
from testkit.debian import build_deb, dpkg_root
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    LLD_LAYOUTS,
    build_programs,
    build_runtime,
    run_checked,
    starts_during,
)

STARTS = 2000
UPGRADES = 100
LIBDIR = "usr/lib/hugify-upgrade-test"
MAIN = r"""
#include <stdio.h>
long lib_all(long);
int main(void) { printf("result %ld\n", exe_all(1) + lib_all(2)); return 0; }
"""


def test_starts_during_upgrades_run_one_version_each(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the runtime tests need root (CI runs as root)"
    build_runtime()
    layout = LLD_LAYOUTS[0]
    one = build_programs(tmp_path / "one", layout, main=MAIN)
    two = build_programs(tmp_path / "two", layout, main=MAIN, factor=5)
    debs = tmp_path / "debs"
    debs.mkdir()
    prog_deb = build_deb(debs, "hugify-upgrade-prog", "1.0", {f"{LIBDIR}/prog": one.prog})
    lib_debs = [
        build_deb(debs, "hugify-upgrade-lib", v, {f"{LIBDIR}/libbig.so": p.lib}) for v, p in (("1", one), ("2", two))
    ]

    root, rundir = tmp_path / "root", tmp_path / "run"
    rundir.mkdir()
    dpkg = dpkg_root(root)
    for deb in (lib_debs[0], prog_deb):
        run_checked([*dpkg, "-i", str(deb)])
    prog, lib = root / LIBDIR / "prog", root / LIBDIR / "libbig.so"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    env |= {"HUGIFY_RUNTIME_DIR": str(rundir), "HUGIFY_PERF_MAP": "0", "HUGIFY_DEBUG": "1"}
    # What each version prints, run plainly.
    outputs = {}
    for i, deb in enumerate(lib_debs):
        run_checked([*dpkg, "-i", str(deb)])
        outputs[subprocess.run([prog], capture_output=True, text=True, env=env, check=True).stdout] = f"version {i + 1}"
    assert len(outputs) == 2, outputs
    host_run = set(os.listdir("/run/hugify")) if Path("/run/hugify").is_dir() else set()
    began = time.time()

    upgrades = prefetches = 0
    prefetch_failures: list[str] = []

    def upgrade(i: int) -> None:
        nonlocal upgrades, prefetches
        run_checked([*dpkg, "-i", str(lib_debs[i % 2])])
        upgrades += 1
        res = hugify("prefetch", "--quiet", "--runtime-dir", rundir, prog, lib, check=False)
        prefetches += 1
        # 1: a window failed (fragmented memory); 4: the filesystem gives no large folios
        if res.returncode not in (0, 1, 4) or "Traceback" in res.stderr:
            prefetch_failures.append(res.stderr)

    ways = {
        "audit": ([str(prog)], env | {"LD_AUDIT": str(AUDIT_LIB)}),
        "hugify-run": ([str(HUGIFY_RUN), str(prog)], env | {"HUGIFY_AUDIT_LIB": str(AUDIT_LIB)}),
    }
    seen: Counter[str] = Counter()
    wrong: list[str] = []
    replaced = repaired = 0
    pids = []

    def start(i: int) -> None:
        nonlocal replaced, repaired
        argv, way_env = ways["audit" if i % 2 else "hugify-run"]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=way_env)
        out, err = p.communicate(timeout=120)
        pids.append(p.pid)
        if p.returncode != 0 or out not in outputs:
            wrong.append(f"start {i + 1} ({argv[0]}): exit {p.returncode}, output {out!r}\n{err[-2000:]}")
        seen[outputs.get(out, "neither")] += 1
        replaced += sum(int(n) for n in re.findall(r"(\d+) replaced", err))
        repaired += sum(int(n) for n in re.findall(r"^hugify-audit: .* (\d+) repaired\)", err, re.M))

    started = time.monotonic()
    starts = starts_during(start, STARTS, upgrade, UPGRADES)
    wall = time.monotonic() - started

    print(
        f"\nreliability: {starts} starts ({seen['version 1']} printed version 1, {seen['version 2']} version 2, "
        f"{seen['neither']} neither) during {upgrades} upgrades and downgrades with dpkg and {prefetches} "
        f"hugify prefetch runs, in {wall:.0f} s; {len(wrong)} failed starts; the audit library repaired "
        f"{repaired} windows (a version dpkg had just written) and left {replaced} as mapped because another "
        "version was at the path (replaced)"
    )
    assert not wrong, "\n".join(wrong[:5])
    assert not prefetch_failures, prefetch_failures[0]
    assert starts >= STARTS and upgrades >= UPGRADES and seen["version 1"] and seen["version 2"]
    # Nothing left behind: the runtime directory holds the per-boot records only (a
    # filesystem's or a file's; no half-written record), /tmp no perf map of a start,
    # and the host's /run/hugify nothing new (every component was pointed at the
    # private directory).
    left = os.listdir(rundir)
    assert all(re.fullmatch(r"kernel-exec-pmd|no-large-folios-\d+:\d+(-\d+)?", f) for f in left), left
    maps = [Path(f"/tmp/perf-{pid}.map") for pid in pids]
    assert not [m for m in maps if m.exists() and m.stat().st_mtime >= began], "perf maps left in /tmp"
    assert (set(os.listdir("/run/hugify")) if Path("/run/hugify").is_dir() else set()) <= host_run
