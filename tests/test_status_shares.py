"""`hugify status` counts the anonymous copies a forked server shares once (issue 32 item
7): the copies are private anonymous memory shared copy-on-write with the children forked
after them (code is never written), and a server with N children used to show N + 1
times what it holds. Each process's share is the copied VMAs' Pss (proportional set
size: every page divided among the processes that map it), and the total is the sum of
the shares. Checked with a hugified program that forks children after the audit library
made its copies, against what smaps' Rss says the copies are (each process maps them
whole) and the number of processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hugify.sizes import human
from testkit import HP
from testkit.cli import hugify
from testkit.runtime import HUGIFY_RUN, build_hugified, exec_segment_size, padded_functions, thp_steady

CHILDREN = 8

FORKING = (
    padded_functions("fork", 200)
    + r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int n = atoi(argv[1]), child = 0;
    for (int i = 0; i < n && !child; i++)
        child = fork() == 0;
    printf("ready %d\n", getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    if (!child)
        while (wait(NULL) > 0)
            ;
    return 0;
}
"""
)


@pytest.fixture(scope="module")
def forking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hugified(tmp_path_factory.mktemp("forking"), "forking", FORKING)


@pytest.fixture
def server(forking: Path) -> Iterator[list[int]]:
    """The program in the anonymous-copy mode (every window copied), forked into
    CHILDREN children after the copies: the pids of all of them. THP's settings are held
    steady meanwhile (the copies are anonymous huge pages: a test that sets enabled=never
    would leave them small)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "HUGIFY_ANONYMOUS")} | {"HUGIFY_PERF_MAP": "0"}
    with thp_steady():
        p = subprocess.Popen(
            [str(HUGIFY_RUN), "--anonymous=always", str(forking), str(CHILDREN)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert p.stdout is not None and p.stdin is not None
        try:
            pids = [int(p.stdout.readline().split()[1]) for _ in range(CHILDREN + 1)]
            yield pids
        finally:
            p.stdin.close()
            assert p.wait(timeout=60) == 0


def test_a_forked_servers_copies_count_once(server: list[int], forking: Path, tmp_path: Path):
    empty = tmp_path / "manifests"
    empty.mkdir()
    res = hugify("status", "--json", "--manifest-dir", empty, check=False)
    text = hugify("status", "--manifest-dir", empty, check=False).stdout
    assert res.returncode == 0, res.stderr
    mine = [c for c in json.loads(res.stdout)["anonymous_copies"] if c["pid"] in server]
    windows = exec_segment_size(forking) // HP
    assert sorted(c["pid"] for c in mine) == sorted(server), mine
    held = windows * HP
    for c in mine:  # each process maps the copies whole: its own view says so
        assert (c["windows"], c["anon_huge_bytes"], c["rss_bytes"]) == (windows, held, held), c
    # shared by CHILDREN + 1 processes: each holds its share, and they add up to one copy
    # (smaps rounds each share down to the KiB)
    shares = sum(c["pss_bytes"] for c in mine)
    assert held - len(mine) * windows * 1024 <= shares <= held, (shares, held)
    assert all(abs(c["pss_bytes"] - held // len(mine)) <= windows * 1024 for c in mine), mine
    # the text's total is the sum of the shares of every process with copies
    every = json.loads(res.stdout)["anonymous_copies"]
    (total,) = re.findall(r"^  total: (\d+) processes hold (.+?) \(", text, re.M)
    assert total == (str(len({c["pid"] for c in every})), human(sum(c["pss_bytes"] for c in every))), text
