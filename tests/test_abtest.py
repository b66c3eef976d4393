"""hugify.abtest: the one ordering of A/B runs and the one statistics module that
`hugify try` and the benchmarks share."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

from hugify import abtest

#: Ten per-pair ratios and what testkit/bench.py's bootstrap gave for them before it
#: moved into the product (commit 5e7ab4b): the benchmarks' figures keep their meaning.
RATIOS = [0.97, 0.99, 0.95, 1.01, 0.96, 0.98, 0.94, 0.99, 0.97, 1.0]
BEFORE = {"median": 0.975, "ci95": [0.96, 0.995], "half_width": 0.0179, "min": 0.94, "max": 1.01}


def test_the_interval_is_the_one_the_benchmarks_reported() -> None:
    assert abtest.ratio_summary(RATIOS) == BEFORE
    assert abtest.bootstrap(RATIOS) == (0.96, 0.995)
    assert abtest.bootstrap(RATIOS[:1]) is None
    assert abtest.ratio_summary(RATIOS[:1])["ci95"] is None


def test_every_order_of_a_round_in_turn() -> None:
    """Six rounds run each side once in each position, and each side before each other
    side as often as after it."""
    rounds = [abtest.order(k) for k in range(6)]
    assert sorted(rounds) == sorted(set(rounds)) and len(rounds) == 6
    for position in range(3):
        assert Counter(r[position] for r in rounds) == {"A": 2, "A2": 2, "B": 2}
    for x, y in (("A", "B"), ("A2", "B"), ("A", "A2")):
        before = sum(r.index(x) < r.index(y) for r in rounds)
        assert before == 3, (x, y)
    assert abtest.order(6) == abtest.order(0)


def test_limits_stop_at_the_target_the_budget_or_the_most_rounds() -> None:
    limits = abtest.Limits(min_rounds=6, max_rounds=20, budget=60, target=0.02)
    tight = [0.95 + 0.001 * (k % 3) for k in range(6)]
    assert limits.stop(tight[:5], elapsed=1) is None  # fewer than min_rounds
    assert limits.stop(tight, elapsed=1) == "95 % interval within +-2.0%"
    wide = [0.8, 1.2] * 4
    ci = abtest.bootstrap(wide)
    assert ci and (ci[1] - ci[0]) / 2 / statistics.median(wide) > 0.02
    assert limits.stop(wide, elapsed=1) is None
    assert limits.stop(wide, elapsed=61) == "time budget of 60 s spent"
    assert limits.stop([0.8, 1.2] * 10, elapsed=1) == "20 rounds (the most allowed)"


def test_percentages() -> None:
    assert abtest.percent(0.959) == "-4.1 %"
    assert abtest.percent(1.0) == "+0.0 %"
    summary = {"median": 0.959, "ci95": [0.95, 0.968]}
    assert abtest.percent_interval(summary) == "-4.1 % [-5.0, -3.2]"


def test_any_number_of_ways_in_a_balanced_order() -> None:
    """bench/speedup.py's ways: over a cycle of rounds (n, or 2n for an odd n), every
    label runs in every position equally often and directly after every other label
    equally often; for three labels, the cycle is the six permutations of `order`."""
    for n in range(2, 11):
        labels = [f"w{k}" for k in range(n)]
        cycle = n if n % 2 == 0 else 2 * n
        rounds = [abtest.balanced_order(labels, k) for k in range(cycle)]
        assert all(sorted(r) == sorted(labels) for r in rounds)
        positions = Counter((label, i) for r in rounds for i, label in enumerate(r))
        assert set(positions.values()) == {cycle // n} and len(positions) == n * n, n
        follows = Counter(pair for r in rounds for pair in itertools.pairwise(r))
        assert set(follows.values()) == {cycle // n} and len(follows) == n * (n - 1), n
        assert abtest.balanced_order(labels, cycle) == rounds[0]
    three = {abtest.balanced_order(["A", "A2", "B"], k) for k in range(6)}
    assert three == set(abtest.ORDERS)
