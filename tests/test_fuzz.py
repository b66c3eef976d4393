"""A short bounded run of every fuzz target (bench/fuzz.py): the core's (cargo-fuzz +
libFuzzer on the nightly toolchain) and the C runtime's ELF readers (libFuzzer + ASan,
clang): 20 s each on a corpus that grows across runs, the runtime's saved regressions
first. A crash fails the test and names the saved input (see bench/fuzz.py for what to
do with it)."""

from __future__ import annotations

import subprocess

from testkit import REPO


def test_fuzz_targets_survive_a_bounded_run() -> None:
    res = subprocess.run(
        [REPO / "tools" / "bench", "fuzz", "--seconds", "20"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    lines = res.stdout.splitlines()
    targets = ["inspect", "transform", "dwarf", "audit-phdrs", "run-reader"]
    assert [line.split(":")[0] for line in lines] == targets, res.stdout
    for line in lines:
        runs = int(line.split(": ")[1].split(" runs")[0])
        assert runs > 100, line  # the target really ran
