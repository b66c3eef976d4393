"""The real-Debian-binaries corpus in one table (the packages, policy and summary of
testkit/corpus.py): ELF files, the share transformed, refusals by reason,
total growth, median predicted coverage, and transform throughput.

Throughput is `hugify tree` over a fresh copy of the unpacked packages (copying not
timed), in MB of transformed input per second, and as a ratio to `cp` copying the
same files in the same run, alternating. The packages are fetched once into the test
cache (apt-get download).

usage: tools/bench corpus [--jobs N] [--repeat N]
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from testkit.bench import parser, run
from testkit.corpus import PACKAGES, copy_tree, corpus, summarize, transform_tree


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="hugify tree --jobs (default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each (default 3)")
    args = ap.parse_args()
    original = corpus()
    tree_times: list[float] = []
    cp_times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="hugify-corpus-bench-") as tmp:
        root, copies = Path(tmp) / "root", Path(tmp) / "copies"
        for _ in range(args.repeat):
            shutil.rmtree(root, ignore_errors=True)
            copy_tree(original, root)
            report, seconds = transform_tree(root, jobs=args.jobs)
            tree_times.append(seconds)
            done = [original / f["path"].lstrip("/") for f in report["files"] if f["status"] == "transformed"]
            shutil.rmtree(copies, ignore_errors=True)
            copies.mkdir()
            cp_times.append(run(["cp", "--reflink=never", "--parents", "-t", str(copies), "--", *map(str, done)]).wall)
        summary = summarize(report, root)
    tree, cp = statistics.median(tree_times), statistics.median(cp_times)
    print(f"Debian 12 corpus: {', '.join(PACKAGES)}")
    print("\n".join(summary.lines()))
    print(
        f"throughput         {summary.input_bytes / 1e6 / tree:.0f} MB/s with --jobs {args.jobs}"
        f" ({tree:.2f} s for {summary.input_bytes / 1e6:.0f} MB; median of {args.repeat})"
    )
    print(f"hugify tree / cp   {tree / cp:.2f}x the time of copying the same files ({cp:.2f} s)")


if __name__ == "__main__":
    main()
