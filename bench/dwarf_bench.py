"""hugify transform vs debugedit on the same binary with 50 MiB of debug sections.

debugedit is the DWARF rewriter rpm's find-debuginfo runs on every package
(`debugedit -b $PWD -d /usr/src/debug FILE`, on a copy); it walks every DIE too, so it
is the natural peer. The binary is the test matrix's `dw-cxx-large` recipe: GNU ld,
C++ at -O2 -g, 32 heavy translation units. Targets (issue #3): hugify's whole
transform time <= 1.0x debugedit's, peak memory <= 2x the file size.

usage: tools/bench dwarf_bench [--repeat N]
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from testkit.bench import interleaved, median_wall, parser, report, run
from testkit.cli import command
from testkit.recipes import BY_NAME, build


def debug_size(path: Path) -> int:
    out = subprocess.run(["size", "-A", str(path)], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.startswith(".debug_"))


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    prog = build(BY_NAME["dw-cxx-large"]) / "prog"
    size = prog.stat().st_size
    print(f"input: {size / 2**20:.1f} MiB, of which {debug_size(prog) / 2**20:.1f} MiB debug sections")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        work = Path(d)
        copy, out = work / "copy", work / "out"

        def prepare() -> None:
            shutil.copy(prog, copy)
            out.unlink(missing_ok=True)

        results = interleaved(
            {
                "debugedit": lambda: run(["debugedit", "-b", str(work), "-d", "/usr/src/debug", str(copy)]),
                "hugify transform": lambda: run(command("transform", "--threshold", "0", copy, "-o", out)),
            },
            args.repeat,
            prepare=prepare,
        )
        report("DWARF-heavy binary", results, "debugedit")
        ratio = median_wall(results["hugify transform"]) / median_wall(results["debugedit"])
        peak = max(s.maxrss_kib for s in results["hugify transform"]) * 1024 / size
        print(
            f"RESULT hugify = {ratio:.2f}x debugedit's time (target <= 1.0); "
            f"peak memory {peak:.2f}x the file size (target <= 2)"
        )


if __name__ == "__main__":
    main()
