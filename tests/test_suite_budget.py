"""The suite's own time budget: the cost ledger of the test cache (testkit/cache.py)
and the projection tools/run-tests prints from it, which must warn when a run from
empty caches would pass COLD_BUDGET_MINUTES."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit import REPO
from testkit import cache as tc


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    root, used = tmp_path / "cache", tmp_path / "used.jsonl"
    monkeypatch.setenv("HUGIFY_TEST_CACHE", str(root))
    monkeypatch.setenv(tc.USED_ENV, str(used))
    return root, used


def test_a_build_records_its_own_time_and_a_run_its_entries(own_cache: tuple[Path, Path]) -> None:
    root, used = own_cache
    outer, inner = root / "g" / "outer-0123456789abcdef", root / "g" / "inner-0123456789abcdef"
    with tc.building(outer) as work:
        time.sleep(0.3)
        with tc.building(inner) as nested:
            time.sleep(0.6)
            (nested / "x").write_text("x")
        (work / "y").write_text("y")
    assert (outer / "y").read_text() == "y" and (inner / "x").read_text() == "x"
    assert not list(root.glob("g/.*.tmp"))
    # Each build counts its own time: the outer one not the nested one's.
    inner_cost, outer_cost = tc.build_cost(inner), tc.build_cost(outer)
    assert inner_cost is not None and 0.6 <= inner_cost < 1.5, inner_cost
    assert outer_cost is not None and 0.3 <= outer_cost < 0.6, outer_cost
    # A later run that finds both counts what they took; the one it builds is listed.
    used.unlink()
    tc.note_used(outer)
    tc.note_used(inner)
    fresh = tc.build_dir("g", "fresh", "fedcba9876543210")
    with tc.building(fresh):
        pass
    tc.note_used(root / "g" / "unrecorded-0000000000000000")
    costs = tc.run_costs(used)
    assert costs["found_seconds"] == pytest.approx(inner_cost + outer_cost, abs=0.11)
    assert [entry for entry, _ in costs["built"]] == [str(fresh)]  # type: ignore[union-attr]
    assert costs["found_unknown"] == 1


def test_a_failed_build_lands_nothing_and_records_nothing(own_cache: tuple[Path, Path]) -> None:
    root, used = own_cache
    final = root / "g" / "broken-0123456789abcdef"
    with pytest.raises(RuntimeError), tc.building(final) as work:
        (work / "half").write_text("half")
        raise RuntimeError("the build failed")
    assert not final.exists() and not list(root.glob("g/.*"))
    assert tc.build_cost(final) is None
    assert not used.exists()
    # An unfinished build the caller asked to keep stays in its scratch directory only.
    with tc.building(final, finished=lambda w: (w / "done").exists()) as work:
        (work / "log").write_text("it stopped")
    assert not final.exists() and (work / "log").read_text() == "it stopped"
    assert tc.build_cost(final) is None


def run_tests(cache: Path, *pytest_args: str) -> subprocess.CompletedProcess[str]:
    """tools/run-tests with make's stages made empty (MAKE=true): only pytest runs, on
    the items pytest_args select."""
    env = {**os.environ, "MAKE": "true", "HUGIFY_TEST_CACHE": str(cache)}
    env.pop(tc.USED_ENV, None)
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "run-tests"), *pytest_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def projected_seconds(summary: str) -> int:
    (line,) = [line for line in summary.splitlines() if line.strip().startswith("projected cold")]
    mins, secs = line.split()[2].split(":")
    return int(mins) * 60 + int(secs)


def test_the_summary_warns_when_a_cold_run_would_pass_the_budget(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    tc_env = {**os.environ, "HUGIFY_TEST_CACHE": str(cache)}
    select = ["tests/test_words.py", "-k", "source_date_epoch", "-p", "no:cacheprovider"]
    # A set-up that last ran cold in 65 minutes: this warm run projects beyond 60.
    subprocess.run(
        [sys.executable, "-m", "testkit.cache", "stage", "set-up", str(65 * 60)], cwd=REPO, env=tc_env, check=True
    )
    started = time.monotonic()
    res = run_tests(cache, *select)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # The set-up as it last ran cold, and the rest as it ran now.
    assert 65 * 60 <= projected_seconds(res.stdout) <= 65 * 60 + took
    assert res.stdout.splitlines()[-1].startswith("WARNING: a run from empty caches is projected at 6"), res.stdout
    # Both of pytest's workers are accounted for, however few items each had.
    assert re.search(r"^pytest's workers ended \d+ s apart \(gw[01] \d+ s before the last\)$", res.stdout, re.M), (
        res.stdout
    )
    # Within the budget: no warning, and the projection is still printed.
    subprocess.run(
        [sys.executable, "-m", "testkit.cache", "stage", "set-up", str(10 * 60)], cwd=REPO, env=tc_env, check=True
    )
    started = time.monotonic()
    res = run_tests(cache, *select)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stdout[-3000:]
    assert "WARNING" not in res.stdout
    assert 10 * 60 <= projected_seconds(res.stdout) <= 10 * 60 + took
    assert json.loads(
        subprocess.run(
            [sys.executable, "-m", "testkit.cache", "stage", "set-up"],
            cwd=REPO,
            env=tc_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    ) == pytest.approx(600)
