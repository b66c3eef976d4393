#!/usr/bin/env python3
"""Runs each fuzz target of fuzz/ (cargo-fuzz, libFuzzer) for a bounded time.

    bench/fuzz.py [--seconds N] [TARGET…]      (default: 60 s each, every target)

Seeds are small programs and libraries built here with gcc, clang and the aarch64 and
i686 cross compilers, with and without DWARF 4/5 (for `dwarf`, their debug sections in
the target's input format). Corpora grow across runs under the test cache
(/var/cache/hugify-tests/fuzz). Prints executions per second and the corpus size per
target; exits 1 if a target crashed, naming the input libFuzzer saved: minimise it
with `cargo fuzz tmin`, add it to fuzz/regressions/TARGET/, and fix the bug.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import REPO  # first: runs this benchmark with the project's .venv
from elftools.elf.elffile import ELFFile

FUZZ = REPO / "fuzz"
TARGETS = ["inspect", "transform", "dwarf"]
CACHE = Path(os.environ.get("HUGIFY_TEST_CACHE", "/var/cache/hugify-tests")) / "fuzz"
CARGO_FUZZ_ROOT = Path("/var/cache/hugify-tests/cargo-fuzz")
CARGO_FUZZ_VERSION = "0.13.2"

SEED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
static long add(long x) { return x + 1; }
static long mul(long x) { return x * 3; }
long (*const table[])(long) = { add, mul };
__thread long per_thread = 5;
long pick(long x) {
    switch (x % 6) {
    case 0: return table[0](x); case 1: return table[1](x); case 2: return x ^ 7;
    case 3: return x << 2; case 4: return per_thread + x; default: return -x;
    }
}
int main(int argc, char **argv) {
    long acc = 0;
    for (long i = 0; i < 100; i++) acc += pick(i + argc);
    printf("%ld %s\n", acc, argv[0]);
    return 0;
}
"""
COMPILERS = [["gcc"], ["clang"], ["aarch64-linux-gnu-gcc"], ["i686-linux-gnu-gcc"]]
VARIANTS = [["-O2"], ["-O2", "-g", "-gdwarf-4"], ["-O0", "-g", "-gdwarf-5"], ["-O2", "-g", "-shared", "-fPIC"]]


def dwarf_names() -> list[str]:
    """The section list of the `dwarf` input format, read from its one definition."""
    text = (REPO / "core" / "src" / "fuzzing.rs").read_text()
    block = text[text.index("pub const NAMES") :]
    return re.findall(r'"(\.[a-z_]+)"', block[: block.index("];")])


def cargo_fuzz() -> list[str]:
    """cargo-fuzz, installed once into the test cache (from crates.io)."""
    installed = CARGO_FUZZ_ROOT / "bin" / "cargo-fuzz"
    if not installed.exists():
        cmd = ["cargo", "install", "--locked", "--root", str(CARGO_FUZZ_ROOT), "cargo-fuzz"]
        subprocess.run([*cmd, "--version", CARGO_FUZZ_VERSION], check=True)
    return [str(installed), "fuzz"]


def build_seeds(out: Path) -> dict[str, Path]:
    """Seed directories for each target (rebuilt every run: a few seconds)."""
    dirs = {t: out / t for t in TARGETS}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    src = out / "seed.c"
    src.write_text(SEED_SOURCE)
    names = dwarf_names()
    for cc in COMPILERS:
        if not shutil.which(cc[0]):
            raise SystemExit(f"fuzz: {cc[0]} is missing (tools/setup-dev-env installs it)")
        for i, flags in enumerate(VARIANTS):
            binary = out / f"{cc[0]}-{i}"
            pie = [] if "-shared" in flags else ["-fPIE", "-pie"]
            subprocess.run([*cc, *flags, *pie, "-o", str(binary), str(src)], check=True)
            for t in ("inspect", "transform"):
                shutil.copy(binary, dirs[t] / binary.name)
            with binary.open("rb") as f:
                record = b""
                for s in ELFFile(f).iter_sections():
                    if s.name in names and s.data_size < 0x10000:
                        record += bytes([names.index(s.name)]) + len(s.data()).to_bytes(2, "little") + s.data()
            if record:
                (dirs["dwarf"] / binary.name).write_bytes(record)
    return dirs


def run_target(fuzz: list[str], target: str, seconds: int, seeds: Path) -> tuple[bool, str]:
    corpus = CACHE / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts = CACHE / "artifacts" / target
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    cmd = [
        *fuzz,
        "run",
        "--sanitizer",
        "none",
        target,
        str(corpus),
        str(seeds),
        "--",
        f"-max_total_time={seconds}",
        f"-artifact_prefix={artifacts}/",
        "-rss_limit_mb=4096",
        "-max_len=1048576",
        "-timeout=20",
        "-print_final_stats=1",
    ]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    new = sorted(set(artifacts.iterdir()) - before)
    stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", res.stderr))
    line = f"{target}: {stats.get('number_of_executed_units', '?')} runs, {stats.get('average_exec_per_sec', '?')}/s"
    line += f", corpus {len(list(corpus.iterdir()))} inputs"
    if res.returncode != 0 or new:
        tail = "\n".join(res.stderr.splitlines()[-30:])
        return False, f"{line}: CRASHED (exit {res.returncode}); saved: {' '.join(map(str, new))}\n{tail}"
    return True, line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="time per target (default 60)")
    ap.add_argument("targets", nargs="*", default=TARGETS, metavar="TARGET", help=", ".join(TARGETS))
    args = ap.parse_args()
    if unknown := set(args.targets) - set(TARGETS):
        ap.error(f"unknown target(s): {', '.join(sorted(unknown))}")
    fuzz = cargo_fuzz()
    # The nightly toolchain builds the targets (libFuzzer's coverage instrumentation).
    os.environ.setdefault("RUSTUP_TOOLCHAIN", "nightly")
    # Release builds with debug assertions and overflow checks (cargo-fuzz's default).
    cmd = [*fuzz, "build", "--sanitizer", "none"]
    built = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise SystemExit(f"fuzz: building the targets failed:\n{built.stderr[-5000:]}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="hugify-fuzz-seeds-") as tmp:
        seeds = build_seeds(Path(tmp))
        for target in args.targets:
            passed, line = run_target(fuzz, target, args.seconds, seeds[target])
            print(line, flush=True)
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
