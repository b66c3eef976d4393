"""hugify repack vs dpkg-deb unpack + dpkg-deb --build of the same package, in one run.

The package is a real Debian 12 one of about 100 MiB installed, fetched with
`apt-get download` and cached: libllvm14 by default (libLLVM-14.so.1 alone is
~100 MiB, with ~40 MiB of code, so hugify transforms it). The peer is what
rebuilding the package costs without hugify: `dpkg-deb --raw-extract` (the data
tree, as -x, and the control files) and `dpkg-deb --build` with the input's
compression. Both are interleaved (a new order each round), each repetition writing into a fresh directory.
Printed: the median wall times, the ratio of the medians and the range of the
per-repetition ratios. Target (issue 15): repack at most 2x the peer.

usage: tools/bench repack_bench [--repeat N] [--package NAME]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from testkit import REPO
from testkit.bench import Sample, interleaved, median_wall, parser, report, run
from testkit.cli import command
from testkit.recipes import debian_packages

COMPRESSION = {"data.tar.xz": "xz", "data.tar.zst": "zstd", "data.tar.gz": "gzip", "data.tar": "none"}


def fetch(name: str) -> Path:
    cache = debian_packages(f"repack-bench-{name}", [name]).parent
    (deb,) = sorted(cache.glob(f"{name}_*.deb"))
    return deb


def main() -> None:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--package", default="libllvm14")
    args = ap.parse_args()
    deb = fetch(args.package)
    members = subprocess.run(["ar", "t", str(deb)], capture_output=True, text=True, check=True).stdout.split()
    z = next(COMPRESSION[m] for m in members if m in COMPRESSION)
    with tempfile.TemporaryDirectory(prefix="repack-bench-") as tmp:
        work = Path(tmp)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "size")], check=True)
        installed = sum(p.stat().st_size for p in (work / "size").rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(work / "size")
        print(
            f"package: {deb.name}, {deb.stat().st_size / 2**20:.1f} MiB, {installed / 2**20:.1f} MiB installed, "
            f"data.tar compression {z}",
            flush=True,
        )
        env = {**os.environ, "HUGIFY_POLICY_PATH": str(REPO / "policy" / "policy.toml")}
        env.pop("SOURCE_DATE_EPOCH", None)
        peer = work / "peer"
        peer_script = (
            f'rm -rf "{peer}" && mkdir "{peer}" && dpkg-deb --raw-extract "{deb}" "{peer}/tree" '
            f'&& dpkg-deb --build -Z{z} "{peer}/tree" "{peer}/out.deb" >/dev/null'
        )
        out = work / "repack"

        def prepare() -> None:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(peer, ignore_errors=True)

        def repack() -> Sample:
            return run(command("repack", deb, "-o", out), env=env)

        results = interleaved(
            {"dpkg-deb -R + --build": lambda: run(["sh", "-c", peer_script]), "hugify repack": repack},
            args.repeat,
            prepare,
        )
        report(f"repack of {deb.name}", results, "dpkg-deb -R + --build")
        pairs = [
            r.wall / p.wall for r, p in zip(results["hugify repack"], results["dpkg-deb -R + --build"], strict=True)
        ]
        ratio = median_wall(results["hugify repack"]) / median_wall(results["dpkg-deb -R + --build"])
        spread = f"per-repetition ratios {min(pairs):.2f}x-{max(pairs):.2f}x (median {statistics.median(pairs):.2f}x)"
        verdict = "met" if ratio <= 2 else "NOT met"
        print(f"RESULT hugify repack = {ratio:.2f}x dpkg-deb -R + --build ({spread}; target <= 2x): {verdict}")


if __name__ == "__main__":
    main()
