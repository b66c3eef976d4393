"""Shared helpers for the benchmarks: timing child processes (wall time, CPU time
and peak RSS), interleaved repetitions and printing ratios. Machines here are noisy,
so every figure is a ratio against a peer measured in the same run; its interval is
the product's (hugify.abtest: the median of per-round ratios with a 95 % bootstrap
interval, as `hugify try` reports it)."""

from __future__ import annotations

import argparse
import functools
import os
import random
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hugify.abtest import ratio_summary
from testkit import REPO

#: What a contender's run gives (a Sample, or a benchmark's own figures).
T = TypeVar("T")


@functools.cache
def parser(script: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A benchmark's argument parser, its usage line naming the way the benchmark is
    started (`tools/bench NAME`, bench/README.md), not the file python -m runs; `script`
    is the benchmark's __file__."""
    return argparse.ArgumentParser(prog=f"tools/bench {Path(script).stem}", **kwargs)


def devnull() -> int:
    """A descriptor of /dev/null for the benchmarks' children's output, opened at the
    first use (importing a benchmark opens nothing)."""
    return os.open(os.devnull, os.O_WRONLY)


@dataclass
class Sample:
    wall: float
    #: user + system time of the command and the children it waited for
    cpu: float
    maxrss_kib: int


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(cmd: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None, cwd: Path = REPO) -> Sample:
    """Runs a command to completion: wall time, CPU time (this process's reaped
    children, of which the command is the only one meanwhile), and its peak RSS as
    GNU time reports it (a direct child's rusage would also count this process, which
    forked it)."""
    cpu = _children_cpu()
    start = time.perf_counter()
    res = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *map(str, cmd)], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {res.stderr}")
    return Sample(wall, _children_cpu() - cpu, int(res.stderr.strip().splitlines()[-1]))


def round_orders(names: Sequence[str], rounds: int, seed: int = 8) -> Iterator[list[str]]:
    """The order of the runs in each round: every name once, shuffled anew each round
    from a fixed seed (the same run gives the same orders), so that no contender always
    runs first, or always after the same other one, whose traces in the caches and the
    CPU's state would then count for or against it. The one ordering of the benchmarks
    (`hugify try` orders its three runs by hugify.abtest.order)."""
    rng = random.Random(seed)
    order = list(names)
    for _ in range(rounds):
        rng.shuffle(order)
        yield list(order)


def interleaved(
    contenders: dict[str, Callable[[], T]], repeat: int, prepare: Callable[[], None] | None = None, seed: int = 8
) -> dict[str, list[T]]:
    """Runs each contender `repeat` times, in rounds ordered by round_orders, after an
    untimed warm-up of each; `prepare` runs before every run (cache dropping, clean-up)."""
    results: dict[str, list[T]] = {name: [] for name in contenders}
    for f in contenders.values():
        if prepare:
            prepare()
        f()
    for order in round_orders(list(contenders), repeat, seed):
        for name in order:
            if prepare:
                prepare()
            results[name].append(contenders[name]())
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


def installed_env() -> dict[str, str]:
    """This environment, with Python writing bytecode as an installed hugify has it
    (compiled at install time): the untimed warm-up run writes it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# --- comparing with another checkout -----------------------------------------------------


def add_baseline_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also time hugify from this checkout (its extension built: `make build` there), "
        "interleaved with this one, and print this/baseline per pair",
    )


def baseline_name(checkout: Path) -> str:
    rev = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return f"hugify at {rev.stdout.strip() or checkout}"


def report_pairs(results: dict[str, list[Sample]], new: str, old: str) -> None:
    """new/old per round of `interleaved` (each round runs both, seconds apart): the
    median ratio of CPU and of wall time with its bootstrap interval."""
    for what in ("cpu", "wall"):
        ratios = [getattr(a, what) / getattr(b, what) for a, b in zip(results[new], results[old], strict=True)]
        r = ratio_summary(ratios)
        ci = f" [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" if r["ci95"] else ""
        print(f"RESULT {what} {new} / {old} = {r['median']:.3f}{ci} (median of {len(ratios)} pairs, 95 % interval)")


def with_baseline(
    title: str,
    contenders: dict[str, Callable[[], Sample]],
    reference: str,
    *,
    repeat: int,
    prepare: Callable[[], None],
    baseline: Path | None,
    ours: str,
    run_from: Callable[[Path], Sample],
) -> dict[str, list[Sample]]:
    """The contenders `interleaved` and reported against `reference`; with a baseline
    checkout, `ours` as run_from(checkout) runs it joins them, and ours/baseline is
    reported per round (report_pairs)."""
    if baseline is None:
        results = interleaved(contenders, repeat, prepare=prepare)
        report(title, results, reference)
        return results
    old = baseline_name(baseline)
    results = interleaved({**contenders, old: lambda: run_from(baseline)}, repeat, prepare=prepare)
    report(title, results, reference)
    report_pairs(results, ours, old)
    return results
