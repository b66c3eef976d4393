"""Reproducible under variation, the whole matrix (issue 40, item 2): real Debian source
packages of three kinds turned on the documented way (one Build-Depends,
dh-sequence-hugify; the test distribution's policy package, threshold 4 KiB), each
with an ELF file hugify transforms, each

* built twice by reprotest (Debian's) with every variation it has and the experiment
  under THP "never" (testkit/debian_repro.py: reprotest): every .deb, dbgsym
  included, must be byte-identical between the two builds;
* built by sbuild in a clean chroot and rebuilt from its .buildinfo alone in a fresh
  chroot, as debrebuild does (rebuild): every .deb must have the checksum the
  .buildinfo lists.

Prints per package the variations, the .debs compared with their digests, identical or
not, and the durations (each build's own time from the test cache's ledger: built by
this run, or by the run that put it in the cache). Builds go through the test cache
(testkit.cache), shared with the suite: hello's are the suite's (tests/test_repro_*.py).
One heavy build at a time, niced.

usage: tools/bench repro [--only NAME ...] [--json OUT]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testkit.bench import parser
from testkit.cache import USED_ENV, build_cost
from testkit.debian_repro import (
    deb_digests,
    hugified_build,
    hugified_source,
    hugify_debs,
    listed_debs,
    parse_buildinfo,
    rebuild,
    reprotest,
    reprotest_outcome,
    reprotest_root,
)

#: Source package -> (kind, the file of it hugify transforms under the test policy).
PACKAGES = {
    "hello": ("C, autotools", "/usr/bin/hello"),
    "tinyxml2": ("C++, CMake", "/usr/lib/x86_64-linux-gnu/libtinyxml2.so.9.0.0"),
    "rust-exa": ("Rust, dh-cargo (18 crates, libgit2 through git2)", "/usr/bin/exa"),
}


@dataclass
class Step:
    entry: str
    seconds: float | None  # the build's own time, from the ledger
    built_now: bool


@dataclass
class Result:
    source: str
    kind: str
    transformed: list[str] = field(default_factory=list)
    varied: list[str] = field(default_factory=list)
    variations: list[str] = field(default_factory=list)
    builds: list[str] = field(default_factory=list)
    control: dict[str, str] = field(default_factory=dict)
    experiment: dict[str, str] = field(default_factory=dict)
    reprotest_identical: bool = False
    listed: dict[str, str] = field(default_factory=dict)
    rebuilt: dict[str, str] = field(default_factory=dict)
    rebuild_identical: bool = False
    rebuild_transformed: bool = False
    steps: dict[str, Step] = field(default_factory=dict)


class UsedEntries:
    """Which cache entries this run built (testkit.cache's note of each entry used)."""

    def __init__(self) -> None:
        if not os.environ.get(USED_ENV):
            fd, path = tempfile.mkstemp(prefix="repro-bench-used-")
            os.close(fd)
            os.environ[USED_ENV] = path
        self.path = Path(os.environ[USED_ENV])

    def built(self) -> set[str]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return {json.loads(x)["entry"] for x in lines if json.loads(x)["built"]}

    def step(self, entry: Path) -> Step:
        return Step(entry.name, build_cost(entry), str(entry) in self.built())


def measure(source: str, used: UsedEntries) -> Result:
    kind, program = PACKAGES[source]
    res = Result(source, kind)
    dsc, debs = hugified_source(source), hugify_debs()
    root = reprotest_root(dsc, debs)
    res.steps["reprotest chroot"] = used.step(root.parent)
    r = reprotest(dsc, debs)
    res.steps["reprotest (2 builds)"] = used.step(r.dir)
    out = reprotest_outcome(r)
    res.transformed = out.transformed
    res.varied, res.variations, res.builds = out.varied, out.variations, out.builds
    res.control, res.experiment = out.outputs["control"], out.outputs["experiment"]
    res.reprotest_identical = out.reproduced and bool(res.control) and res.control == res.experiment
    first = hugified_build(source)
    res.steps["sbuild"] = used.step(first.dir)
    if first.rc == 0:
        (buildinfo,) = (first.dir / "debs").glob("*.buildinfo")
        res.listed = listed_debs(parse_buildinfo(buildinfo))
        again = rebuild(first, dsc, debs)
        res.steps["rebuild from .buildinfo"] = used.step(again.dir)
        res.rebuilt = deb_digests(again) if again.rc == 0 else {}
        res.rebuild_identical = bool(res.listed) and res.rebuilt == res.listed
        res.rebuild_transformed = f"hugify: {program}: transformed (" in again.log
    return res


def report(res: Result) -> None:
    print(f"== {res.source} ({res.kind})")
    print(f"   hugify transformed, per build: {', '.join(res.transformed) or 'nothing'}")
    print(f"   reprotest, the experiment varied: {', '.join(res.varied)}; THP never (prctl)")
    for v in res.variations:
        print(f"     {v}")
    for b, line in zip(("control", "experiment"), res.builds, strict=False):
        print(f"     {b}: {line}")
    print("   .debs compared, control / experiment:")
    for name in sorted(set(res.control) | set(res.experiment)):
        a, b = res.control.get(name, "-"), res.experiment.get(name, "-")
        print(f"     {name}  {a[:16]} / {b[:16]}  {'identical' if a == b else 'DIFFERENT'}")
    print(f"   reprotest: {'identical' if res.reprotest_identical else 'NOT identical'}")
    print("   rebuild from the .buildinfo in a fresh chroot, listed / rebuilt:")
    for name in sorted(set(res.listed) | set(res.rebuilt)):
        a, b = res.listed.get(name, "-"), res.rebuilt.get(name, "-")
        print(f"     {name}  {a[:16]} / {b[:16]}  {'identical' if a == b else 'DIFFERENT'}")
    verdict = "identical" if res.rebuild_identical else "NOT identical"
    print(f"   rebuild: {verdict}; hugify ran in it: {'yes' if res.rebuild_transformed else 'no'}")
    print("   durations (each build's own time):")
    for name, s in res.steps.items():
        when = "built by this run" if s.built_now else "from the cache, built earlier"
        took = f"{s.seconds:.0f} s" if s.seconds is not None else "unknown (before the ledger)"
        print(f"     {name:<26} {took:>8}  ({when})")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=list(PACKAGES), help="these packages only")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    os.nice(10)
    used = UsedEntries()
    results = []
    started = time.monotonic()
    for source in args.only or list(PACKAGES):
        t = time.monotonic()
        res = measure(source, used)
        report(res)
        print(f"   wall time of this package in this run: {time.monotonic() - t:.0f} s\n", flush=True)
        results.append(res)
    ok = all(r.reprotest_identical and r.rebuild_identical and r.transformed for r in results)
    print(f"all identical: {'yes' if ok else 'NO'}; {time.monotonic() - started:.0f} s in all")
    if args.json:
        doc: dict[str, Any] = {"results": [asdict(r) for r in results], "all_identical": ok}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
