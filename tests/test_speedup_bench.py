"""bench/speedup.py --quick: every workload of the speedup benchmark prepares and runs
through `hugify try` (one round each, smallest inputs; none may be unavailable), so
that the benchmark cannot rot. The figures of a single round mean nothing; what is
checked is that each workload gives numbers or says why it could not, that each run
mapped its side's files (and no other), that the hugified iTLB program really ran on
huge pages, and that only the workload's own tree was hugified."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from testkit.cache import cache_root
from testkit.runtime import REPO, Programs, copy_programs, gives_large_folios, locked

WORKLOADS = {"clang", "clang-anon", "clang-shared", "gcc", "postgres", "python", "itlb", "itlb-anon", "itlb-shared"}


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
    """hugify try keeps the benchmark's hugified copies under the test cache: whether their
    file-backed windows can be huge is that filesystem's and the kernel's answer, measured
    first on a hugified file there (without hugify), not assumed."""
    out = tmp_path / "speedup.json"
    with locked():  # it prefetches and measures the page cache, as the runtime tests do
        cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_root()) as probe:  # the filesystem of hugify try's copies
            large = gives_large_folios(copy_programs(built, Path(probe)).prog)
        res = subprocess.run(
            [sys.executable, "-m", "bench.speedup", "--quick", "--json", str(out)],
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
        assert r["rounds"] == 1
        assert r["cpu"]["median"] > 0 and r["wall"]["median"] > 0, name
        assert r["cpu"]["ci95"] is None  # one round gives no interval, and says so
        assert r["verdict"] == "no-interval", (name, r["answer"])
        # Each side mapped only its own files (hugify try checks every run).
        assert r["problems"] == [], (name, r["problems"])
        used = [o for o in r["objects"] if o["copy"]]
        assert used, name
        for o in used:
            assert o["path"].startswith(f"{cache_root()}/"), (name, o["path"])  # the workload's tree
            assert o["seen"]["hugified"]["resident_code"] > 0, (name, o)
        assert all(o["reason"] == "excluded" for o in r["objects"] if not o["copy"]), name
        assert name in res.stdout
    itlb = results["itlb"]
    (obj,) = [o for o in itlb["objects"] if o["copy"]]
    assert obj["status"] == "transformed" and obj["mode"] == "shift"
    assert obj["seen"]["hugified"]["windows"] >= 16
    assert obj["seen"]["original"]["pmd_mapped"] == 0, obj
    if large:
        assert obj["seen"]["hugified"]["pmd_mapped"] > 0 and obj["seen"]["hugified"]["windows_huge"] > 0, obj
        assert obj["seen"]["hugified"]["windows_small"] == 0, obj
    else:  # nothing file-backed can be huge there: and nothing claims it is
        assert obj["seen"]["hugified"]["pmd_mapped"] == 0 and obj["seen"]["hugified"]["windows_huge"] == 0, obj
    # the anonymous-copy variant: its process held one anonymous huge page per window
    anon = results["itlb-anon"]
    (obj,) = [o for o in anon["objects"] if o["copy"]]
    assert anon["way"] == "anonymous" and anon["coverage"]["anonymous_held"] == obj["seen"]["hugified"]["windows"] * (
        2 << 20
    ), anon["coverage"]
    # the shared-copy variant: the copy is on a tmpfs without huge pages, so every huge
    # page its process mapped is one of root's shared copy, which holds every window once
    shared = results["itlb-shared"]
    (obj,) = [o for o in shared["objects"] if o["copy"]]
    windows = obj["seen"]["hugified"]["windows"]
    assert shared["way"] == "shared", shared["notes"]
    assert shared["coverage"]["shared_held"] >= windows * (2 << 20), shared["coverage"]
    assert obj["seen"]["hugified"]["pmd_mapped"] == windows * (2 << 20), obj
    assert obj["seen"]["hugified"]["windows_small"] == 0, obj
    # python has no whole window of code: the A/A control, plain copies
    python = results["python"]
    assert python["control"] and {o["status"] for o in python["objects"] if o["copy"]} == {"copied"}


def test_unknown_workload_is_a_usage_error():
    cmd = [sys.executable, "-m", "bench.speedup", "--only", "itlb,nosuch"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 2
    known = "clang, clang-anon, clang-shared, gcc, postgres, python, itlb, itlb-anon, itlb-shared"
    assert f"unknown workload nosuch; known: {known}" in res.stderr
