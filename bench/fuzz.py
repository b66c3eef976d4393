"""Runs each fuzz target of fuzz/ (libFuzzer) for a bounded time.

    tools/bench fuzz [--seconds N] [TARGET…]      (default: 60 s each, every target)

The core's targets (inspect, transform, dwarf: fuzz/fuzz_targets/, cargo-fuzz) and the C
runtime's ELF readers (audit-phdrs: the audit library's reader of a mapped object's
program headers; run-reader: hugify-run's reader of the objects it finds; fuzz/runtime/,
built with clang -fsanitize=fuzzer,address, whose libFuzzer comes with Debian's
libclang-rt-dev). Seeds are small programs and libraries built here with gcc, clang and
the aarch64 and i686 cross compilers, with and without DWARF 4/5 (for `dwarf`, their
debug sections in the target's input format); the runtime's targets get, besides, the
first 64 KiB of hugified GNU ld and lld objects (lld's shift moves the program headers
out of the first page). Corpora grow across runs under the test cache
(/var/cache/hugify-tests/fuzz). Before fuzzing, each runtime target runs the inputs of
fuzz/regressions/TARGET/ once. Prints executions per second and the corpus size per
target; exits 1 if a target crashed, naming the input libFuzzer saved: minimise it
(`cargo fuzz tmin`, or the C target's binary with -minimize_crash=1), add it to
fuzz/regressions/TARGET/, and fix the bug.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

from testkit import REPO
from testkit.bench import parser
from testkit.cache import cache_root
from testkit.cli import command

FUZZ = REPO / "fuzz"
RUNTIME = REPO / "runtime"
#: The core's targets (cargo-fuzz).
CORE_TARGETS = ["inspect", "transform", "dwarf"]
#: The C runtime's targets: fuzz/runtime/SOURCE, compiled with these runtime sources.
RUNTIME_TARGETS = {
    "audit-phdrs": ("audit_phdrs.c", ["hp_base.c", "hp_ctx.c", "hp_elf.c", "hp_map.c"]),
    "run-reader": ("run_reader.c", ["hp_base.c", "hp_ctx.c", "hp_elf.c", "hp_map.c", "hp_verdict.c", "hp_core.c"]),
}
TARGETS = [*CORE_TARGETS, *RUNTIME_TARGETS]
CACHE = cache_root() / "fuzz"
CARGO_FUZZ_ROOT = cache_root() / "cargo-fuzz"  # where tools/setup-dev-env installs it
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


#: A library with over 2 MiB of code, for hugified seeds: `hugify transform` needs a whole window.
BIG_SOURCE = "\n".join(
    f'long big{i}(long x) {{ __asm__ volatile(".fill 16384, 1, 0x90"); return x * 3 + {i}; }}' for i in range(150)
)
#: How the hugified seeds are linked: GNU ld, and lld (rodata-first and not).
BIG_LINKS = {
    "bfd": ["gcc"],
    "lld": ["clang", "-fuse-ld=lld"],
    "lld-norosegment": ["clang", "-fuse-ld=lld", "-Wl,--no-rosegment"],
}
#: What the runtime targets' seeds keep of a hugified object: its first load and more.
HEAD_BYTES = 64 << 10


def hugified_seeds(out: Path) -> list[Path]:
    """The first HEAD_BYTES of hugified libraries and programs of each linker."""
    out.mkdir()
    src = out / "big.c"
    src.write_text(BIG_SOURCE + "\nint main(void) { return (int)big0(1); }\n")
    seeds = []
    for name, cc in BIG_LINKS.items():
        for kind, flags in (("lib", ["-shared", "-fPIC"]), ("pie", ["-fPIE", "-pie"])):
            linked, rewritten = out / f"big-{name}-{kind}", out / f"big-{name}-{kind}.hugified"
            subprocess.run([*cc, "-O1", *flags, "-o", str(linked), str(src)], check=True)
            cmd = command("transform", "--threshold", "0", linked, "-o", rewritten)
            subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
            seed = out / f"{rewritten.name}.head"
            seed.write_bytes(rewritten.read_bytes()[:HEAD_BYTES])
            seeds.append(seed)
    return seeds


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
            for t in ("inspect", "transform", *RUNTIME_TARGETS):
                shutil.copy(binary, dirs[t] / binary.name)
            with binary.open("rb") as f:
                record = b""
                for s in ELFFile(f).iter_sections():
                    if s.name in names and s.data_size < 0x10000:
                        record += bytes([names.index(s.name)]) + len(s.data()).to_bytes(2, "little") + s.data()
            if record:
                (dirs["dwarf"] / binary.name).write_bytes(record)
    for seed in hugified_seeds(out / "hugified"):
        for t in RUNTIME_TARGETS:
            shutil.copy(seed, dirs[t] / seed.name)
    return dirs


def build_runtime_targets(out: Path) -> dict[str, list[str]]:
    """The runtime's fuzz targets, compiled into `out`: target -> its command."""
    if not shutil.which("clang"):
        raise SystemExit("fuzz: clang is missing (tools/setup-dev-env installs it)")
    # hugify-run.c includes the build configuration the Makefile writes.
    subprocess.run(["make", "-s", "-C", str(RUNTIME), "build-config.h"], check=True)
    cmds = {}
    for target, (source, extra) in RUNTIME_TARGETS.items():
        binary = out / target
        cmd = ["clang", "-g", "-O1", "-fsanitize=fuzzer,address", "-D_FILE_OFFSET_BITS=64", f"-I{RUNTIME}"]
        cmd += ["-o", str(binary), str(FUZZ / "runtime" / source), *(str(RUNTIME / f) for f in extra)]
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            hint = " (libFuzzer: libclang-rt-dev, tools/setup-dev-env)" if "libclang_rt" in built.stderr else ""
            raise SystemExit(f"fuzz: building {target} failed{hint}:\n{built.stderr[-3000:]}")
        cmds[target] = [str(binary)]
    return cmds


def run_regressions(cmd: list[str], target: str) -> tuple[bool, str]:
    """The saved inputs of fuzz/regressions/TARGET, each run once."""
    inputs = sorted((FUZZ / "regressions" / target).glob("*"))
    if not inputs:
        return True, ""
    res = subprocess.run([*cmd, *map(str, inputs)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return False, f"{target}: a regression input fails again:\n" + "\n".join(res.stderr.splitlines()[-30:])
    return True, ""


def run_target(fuzz: list[str], target: str, seconds: int, seeds: Path) -> tuple[bool, str]:
    """`fuzz`: cargo-fuzz (a core target), or the runtime target's own binary."""
    corpus = CACHE / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts = CACHE / "artifacts" / target
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    cargo = [*fuzz, "run", "--sanitizer", "none", target, str(corpus), str(seeds), "--"]
    cmd = [
        *(cargo if target in CORE_TARGETS else [*fuzz, str(corpus), str(seeds)]),
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
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="time per target (default 60)")
    ap.add_argument("targets", nargs="*", default=TARGETS, metavar="TARGET", help=", ".join(TARGETS))
    args = ap.parse_args()
    if unknown := set(args.targets) - set(TARGETS):
        ap.error(f"unknown target(s): {', '.join(sorted(unknown))}")
    commands: dict[str, list[str]] = {}
    if set(args.targets) & set(CORE_TARGETS):
        fuzz = cargo_fuzz()
        # The nightly toolchain builds the targets (libFuzzer's coverage instrumentation).
        os.environ.setdefault("RUSTUP_TOOLCHAIN", "nightly")
        # Release builds with debug assertions and overflow checks (cargo-fuzz's default).
        cmd = [*fuzz, "build", "--sanitizer", "none"]
        built = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise SystemExit(f"fuzz: building the targets failed:\n{built.stderr[-5000:]}")
        commands |= dict.fromkeys(CORE_TARGETS, fuzz)
    ok = True
    with tempfile.TemporaryDirectory(prefix="hugify-fuzz-seeds-") as tmp:
        if set(args.targets) & set(RUNTIME_TARGETS):
            (Path(tmp) / "bin").mkdir()
            commands |= build_runtime_targets(Path(tmp) / "bin")
        seeds = build_seeds(Path(tmp))
        for target in args.targets:
            passed, line = True, ""
            if target in RUNTIME_TARGETS:
                passed, line = run_regressions(commands[target], target)
            if passed:
                passed, line = run_target(commands[target], target, args.seconds, seeds[target])
            print(line, flush=True)
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
