"""bench/speedup.py --quick: every workload of the speedup benchmark prepares and runs
(one pair each, smallest inputs; none may be unavailable), so that the benchmark cannot rot. The figures of a
single pair mean nothing; what is checked is that each workload gives numbers or says
why it could not, that each run mapped the copies it was meant to (and no other), and
that the hugified iTLB program really ran on huge pages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import REPO, Programs, copy_programs, gives_large_folios, locked

WORKLOADS = {"clang", "clang-anon", "gcc", "postgres", "python", "itlb", "itlb-anon"}


def test_the_benchmark_runs_by_its_shebang():
    """`bench/speedup.py`, started by its python3 shebang with the system's interpreter
    (no development packages), runs itself with the project's .venv."""
    res = subprocess.run(
        ["bench/speedup.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: speedup.py") and res.stderr == ""


@pytest.mark.slow
def test_quick_run_of_every_workload(built: Programs, tmp_path: Path):
    """The benchmark works in a scratch directory under /tmp: whether its file-backed
    windows can be huge is the filesystem's and the kernel's answer, measured first on a
    hugified file there (without hugify), not assumed."""
    out = tmp_path / "speedup.json"
    with locked():  # it prefetches and measures the page cache, as the runtime tests do
        large = gives_large_folios(copy_programs(built, tmp_path / "probe").prog)  # pytest's /tmp, as the bench's
        res = subprocess.run(
            [sys.executable, "bench/speedup.py", "--quick", "--json", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    results = doc["workloads"]
    assert set(results) == WORKLOADS
    # tools/setup-dev-env installs what every workload needs (g++-12, the Debian
    # archive's packages, a user to run postgres as): each one is measured here.
    assert {name: r["status"] for name, r in results.items()} == dict.fromkeys(WORKLOADS, "measured"), {
        name: r.get("reason") for name, r in results.items() if r["status"] != "measured"
    }
    for name, r in results.items():
        assert r["pairs"] == 1
        assert r["cpu_ratio"]["median"] > 0 and r["wall_ratio"]["median"] > 0, name
        assert r["cpu_ratio"]["ci95"] is None  # one pair gives no interval, and says so
        # Each side mapped its own copies, and every window prefetched huge that a process
        # executed was PMD-mapped (windows faulted after another process dropped the page
        # cache mid-run are notes, not problems).
        assert r["problems"] == [], (name, r["problems"])
        for rel, o in r["objects"].items():
            assert o["transform"]["status"], (name, rel)
            assert o["coverage"] and o["seen"]["paths"], (name, rel)
        assert name in res.stdout
    itlb = results["itlb"]
    assert itlb["status"] == "measured", itlb
    obj = itlb["objects"]["itlb"]
    if large:
        assert obj["prefetched"]["huge_bytes"] >= 16 * (2 << 20)
        assert obj["seen"]["pmd_mapped"] > 0 and obj["seen"]["windows_huge"] > 0, obj
        assert not obj["seen"]["windows_small"], obj
    else:  # nothing file-backed can be huge there: and nothing claims it is
        assert not obj["prefetched"]["huge_bytes"] and not obj["seen"]["pmd_mapped"], obj
    # the anonymous-copy variant: its process held one anonymous huge page per window
    anon = results["itlb-anon"]
    assert anon["status"] == "measured" and anon["anonymous"], anon
    assert anon["anonymous_held"] == anon["objects"]["itlb"]["predicted"]["windows"] * (2 << 20), anon


def test_unknown_workload_is_a_usage_error():
    cmd = [sys.executable, "bench/speedup.py", "--only", "itlb,nosuch"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert "unknown workload nosuch; known: clang, clang-anon, gcc, postgres, python, itlb, itlb-anon" in res.stderr
