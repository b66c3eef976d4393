"""hugify transform vs cp on the same large file, in one run.

The file is a PIE of 50+ MiB without debug info: ~3 MiB of generated code plus a
48 MiB read-only blob (linked with .incbin). Targets (issue #2): transform under 3x
cp's time plus a fixed start-up under 100 ms; peak memory under 2x the file size.
hugify runs as installed, from compiled bytecode (the warm-up run writes it).
With --baseline, hugify from another checkout runs in the same rounds, for a
no-slowdown check of a change (this/baseline per round, median and interval).
With --debian, the same comparison (and the ratio to cp) runs instead on the
biggest code of the running Debian release: its libLLVM and chromium (apt-get
download, cached with the test fixtures).

usage: tools/bench transform_bench [--repeat N] [--baseline CHECKOUT] [--debian]
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from testkit import REPO
from testkit.bench import (
    Sample,
    add_baseline_option,
    installed_env,
    interleaved,
    median_wall,
    parser,
    report,
    run,
    with_baseline,
)
from testkit.cli import command
from testkit.corpus import RELEASE
from testkit.recipes import BY_NAME, build, debian_packages


def debian_large() -> list[Path]:
    """libLLVM (GNU ld or gold: a shift is planned, so the hazard check runs) and
    chromium (lld), unpacked from the running release's packages."""
    root = debian_packages("bench-large", [f"libllvm{RELEASE.llvm}", "chromium"])
    return [root / "usr/lib/x86_64-linux-gnu" / RELEASE.llvm_lib, root / "usr/lib/chromium/chromium"]


def compare(path: Path, out: Path, repeat: int, baseline: Path | None) -> dict[str, list[Sample]]:
    """hugify transform of `path` against cp (and the baseline checkout), interleaved."""

    def clean() -> None:
        out.unlink(missing_ok=True)

    env = installed_env()
    contenders = {
        "cp": lambda: run(["cp", path, out]),
        "hugify transform": lambda: run(command("transform", path, "-o", out), env=env),
    }
    return with_baseline(
        f"transform of {path.name} ({path.stat().st_size / 2**20:.0f} MiB)",
        contenders,
        "cp",
        repeat=repeat,
        prepare=clean,
        baseline=baseline,
        ours="hugify transform",
        run_from=lambda checkout: run(command("transform", path, "-o", out), env=env, cwd=checkout),
    )


def big_pie(work: Path) -> Path:
    blob = work / "blob.bin"
    blob.write_bytes(random.Random(0).randbytes(48 << 20))
    (work / "blob.S").write_text(f'.section .rodata\n.globl blob\nblob:\n.incbin "{blob}"\n')
    gen = REPO / "tests" / "programs" / "gen_code.py"
    subprocess.run(["python3", str(gen), "exe", "3000", "3", str(work)], check=True)
    main = work / "main.c"
    main.write_text(
        "#include <stdio.h>\nextern long exe_dispatch(long);\nextern const char blob[];\n"
        'int main(int c, char **v) { printf("%ld %d\\n", exe_dispatch(c), blob[7]); return 0; }\n'
    )
    srcs = [str(p) for p in sorted(work.glob("exe_*.c"))] + [str(main), str(work / "blob.S")]
    out = work / "big"
    subprocess.run(["gcc", "-O1", "-fPIE", "-pie", "-o", str(out), *srcs], check=True)
    return out


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    add_baseline_option(ap)
    ap.add_argument("--debian", action="store_true", help="compare on libLLVM and chromium from Debian instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        work = Path(d)
        out = work / "out"
        if args.debian:
            for path in debian_large():
                compare(path, out, args.repeat, args.baseline)
                out.unlink(missing_ok=True)
            return
        big = big_pie(work)
        size = big.stat().st_size
        print(f"input: {size / 2**20:.1f} MiB PIE without debug info")
        results = compare(big, out, args.repeat, args.baseline)
        env = installed_env()

        def clean() -> None:
            out.unlink(missing_ok=True)

        tiny = build(BY_NAME["gcc-bfd-small"]) / "prog"
        startup = interleaved(
            {
                "python3 -c pass": lambda: run([sys.executable, "-c", "pass"]),
                "hugify --version": lambda: run(command("--version"), env=env),
                "hugify transform (tiny)": lambda: run(
                    command("transform", "--threshold", "0", tiny, "-o", out), env=env
                ),
            },
            args.repeat,
            prepare=clean,
        )
        report("start-up cost on a tiny file", startup, "python3 -c pass")
        fixed = median_wall(startup["hugify transform (tiny)"])
        ratio = (median_wall(results["hugify transform"]) - fixed) / median_wall(results["cp"])
        peak = max(s.maxrss_kib for s in results["hugify transform"]) * 1024 / size
        print(
            f"RESULT transform minus start-up = {ratio:.2f}x cp (target < 3); start-up {fixed * 1000:.0f} ms "
            f"(target < 100); peak memory {peak:.2f}x the file size (target < 2)"
        )
        os.sync()


if __name__ == "__main__":
    main()
