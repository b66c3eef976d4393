"""A/B comparisons on a noisy machine: the order of the runs, when to stop, and the
figures. One copy for `hugify try` and the benchmarks (bench/speedup.py through
`hugify try`; transform_bench.py and tree_bench.py through benchlib).

Runs go in rounds of three: the original side twice (A and A2) and the changed side
once (B), in an order that goes through all six permutations in turn, so that none of
them runs first, or after the other, more often than the others. Each round gives
two ratios: B/A, the effect, and A2/A, the same comparison where nothing differs (the
A/A noise floor). The labels A and A2 are interchangeable, so without an effect B/A
and A2/A have the same distribution: the floor's interval shows what the effect's
looks like at this noise, and an order or a drift that favoured one position would
move both.

A figure is the median of the per-round ratios with a 95 % interval by bootstrap: the
rounds resampled with replacement BOOTSTRAP_RESAMPLES times (fixed seed, so the same
ratios give the same interval), the 2.5th and 97.5th percentiles of the resamples'
medians. It is what bench/speedup.py has always reported for its pairs (bench/README.md).
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 12

ORIGINAL, ORIGINAL_AGAIN, CHANGED = "A", "A2", "B"
#: The order of the runs in round k is ORDERS[k % 6].
ORDERS: tuple[tuple[str, ...], ...] = tuple(itertools.permutations((ORIGINAL, CHANGED, ORIGINAL_AGAIN)))


def order(round_index: int) -> tuple[str, ...]:
    return ORDERS[round_index % len(ORDERS)]


def balanced_order(labels: Sequence[str], round_index: int) -> tuple[str, ...]:
    """The order of round `round_index` for any number of runs per round (the ways of
    bench/speedup.py, hugify.trial.ways): a balanced Latin square (Williams design).
    Over each cycle of n rounds (2n for an odd n), every label runs in every position
    equally often and directly after every other label equally often, so that neither
    a position nor a predecessor's traces favour one label. For the three labels of
    `order` a cycle is the same six permutations in another sequence."""
    n = len(labels)
    base = [0]
    for k in range(1, n):
        base.append((k + 1) // 2 if k % 2 else n - k // 2)
    cycle = n if n % 2 == 0 else 2 * n
    r = round_index % cycle
    row = [labels[(x + r) % n] for x in base]
    return tuple(reversed(row)) if r >= n else tuple(row)


def bootstrap(ratios: Sequence[float]) -> tuple[float, float] | None:
    """95 % interval of the median ratio (see the module's docstring); None with fewer
    than two ratios."""
    if len(ratios) < 2:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    n = len(ratios)
    meds = sorted(statistics.median(rng.choices(ratios, k=n)) for _ in range(BOOTSTRAP_RESAMPLES))
    return meds[BOOTSTRAP_RESAMPLES * 25 // 1000], meds[BOOTSTRAP_RESAMPLES * 975 // 1000 - 1]


def ratio_summary(ratios: Sequence[float]) -> dict[str, Any]:
    """The median ratio, its interval (`ci95`, None for one ratio), the interval's
    half-width relative to the median, and the range."""
    med = statistics.median(ratios)
    ci = bootstrap(ratios)
    return {
        "median": round(med, 4),
        "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None,
        "half_width": round((ci[1] - ci[0]) / 2 / med, 4) if ci else None,
        "min": round(min(ratios), 4),
        "max": round(max(ratios), 4),
    }


@dataclass(frozen=True)
class Limits:
    """When a comparison stops: once the interval of the watched ratio has a relative
    half-width below `target` (after `min_rounds`), at `max_rounds`, or when `budget`
    seconds of rounds have passed, whichever comes first."""

    min_rounds: int = 6
    max_rounds: int = 200
    budget: float = 300.0
    target: float = 0.01

    def stop(self, ratios: Sequence[float], elapsed: float) -> str | None:
        """Why to stop after these rounds (their ratios of the watched figure), or None."""
        n = len(ratios)
        ci = bootstrap(ratios) if n >= self.min_rounds else None
        if ci and (ci[1] - ci[0]) / 2 / statistics.median(ratios) < self.target:
            return f"95 % interval within +-{self.target:.1%}"
        if n >= self.max_rounds:
            return f"{self.max_rounds} rounds (the most allowed)"
        if elapsed > self.budget:
            return f"time budget of {self.budget:.0f} s spent"
        return None

    def as_json(self) -> dict[str, Any]:
        """The limits and the bootstrap's constants, as a report gives them."""
        return {
            "min_rounds": self.min_rounds,
            "max_rounds": self.max_rounds,
            "budget_s": self.budget,
            "target": self.target,
            "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
            "bootstrap_seed": BOOTSTRAP_SEED,
        }


def change(ratio: float) -> str:
    """A ratio as a signed change in percent, without the sign: 0.959 -> "-4.1"."""
    return f"{(ratio - 1) * 100:+.1f}"


def percent(ratio: float) -> str:
    """A ratio as a signed change in percent: 0.959 -> "-4.1 %"."""
    return f"{change(ratio)} %"


def percent_interval(summary: dict[str, Any]) -> str:
    """A ratio_summary as a change with its interval: "-4.1 % [-5.0, -3.2]"."""
    lo, hi = summary["ci95"]
    return f"{percent(summary['median'])} [{change(lo)}, {change(hi)}]"
