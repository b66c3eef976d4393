"""Shared helpers for the benchmarks: timing child processes (wall time and peak
RSS from wait4), interleaved repetitions, and printing ratios. Machines here are
noisy, so every figure is a ratio against a peer measured in the same run."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


@dataclass
class Sample:
    wall: float
    maxrss_kib: int


def run(cmd: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> Sample:
    """Runs a command to completion: wall time, and its peak RSS as GNU time reports
    it (a direct child's rusage would also count this process, which forked it)."""
    start = time.perf_counter()
    res = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *map(str, cmd)], capture_output=True, text=True, env=env, cwd=REPO, check=False
    )
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {res.stderr}")
    return Sample(wall, int(res.stderr.strip().splitlines()[-1]))


def interleaved(
    contenders: dict[str, Callable[[], Sample]], repeat: int, prepare: Callable[[], None] | None = None
) -> dict[str, list[Sample]]:
    """Runs each contender `repeat` times, alternating, after an untimed warm-up."""
    results: dict[str, list[Sample]] = {name: [] for name in contenders}
    for f in contenders.values():
        if prepare:
            prepare()
        f()
    for _ in range(repeat):
        for name, f in contenders.items():
            if prepare:
                prepare()
            results[name].append(f())
    return results


def median_wall(samples: list[Sample]) -> float:
    return statistics.median(s.wall for s in samples)


def report(title: str, results: dict[str, list[Sample]], base: str) -> None:
    print(f"== {title}")
    ref = median_wall(results[base])
    for name, samples in results.items():
        wall = median_wall(samples)
        rss = max(s.maxrss_kib for s in samples)
        ratio = "" if name == base else f"  = {wall / ref:.2f}x {base}"
        print(f"  {name:<28} median {wall * 1000:8.1f} ms  peak RSS {rss / 1024:7.1f} MiB{ratio}")


def hugify_cmd(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "hugify.cli", *map(str, args)]
