#!/usr/bin/env -S sh -c 'd=$(realpath "$0"); PYTHONPATH=${d%/*/*} exec python3 -m "bench.$(basename "$0" .py)" "$@"'
"""Does hugify make programs faster? Real workloads, each measured by `hugify try`.

Each workload is one `hugify try --json` comparison of a command on the original
files and on hugified copies of the files it loads from its packages (a policy whose
include glob is the workload's tree: the system's own libraries stay as they are, so
each row measures the objects it names). `hugify try` orders the runs, prepares the
page cache, watches which copies each run mapped and what it got on huge pages, and
computes the figures (hugify.abtest): the median of per-round ratios of CPU time (user
+ system of the command's process tree) and of wall time, with bootstrap intervals,
and the A/A noise floor. This script prepares the inputs, runs the comparisons and
prints one table. Method and measured figures: bench/README.md.

Inputs come from the Debian archive (apt-get download, cached under the test cache
like the corpus tests' packages). The variants NAME-anon (itlb, clang) run the
hugified side with the runtime's anonymous copies (`hugify try --way anonymous`), the
variants NAME-shared (itlb, clang) with root's shared copies (`hugify try --way shared`:
the copies on a tmpfs without huge pages, where file-backed huge pages are unsupported
as on ext4 before Linux 6.16 or btrfs, and their code mapped from one copy each on a
huge-page tmpfs; root only);
`python`, whose interpreter has no whole window of code, is the A/A control
(`hugify try --control`).

usage: bench/speedup.py [--quick] [--only W[,W...]] [--json OUT] [--min-rounds N]
                        [--max-rounds N] [--budget SECONDS] [--target PERCENT]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.workloads.sources import cxx_unit
from hugify.abtest import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from hugify.trial.report import interval, mib
from testkit.bench import REPO
from testkit.cache import cache_root
from testkit.cli import command
from testkit.recipes import ITLB_CFLAGS, build_itlb, debian_packages

MIB = 1 << 20
LIB = "usr/lib/x86_64-linux-gnu"
WORKLOADS_DIR = REPO / "bench" / "workloads"


class Unavailable(Exception):
    """The workload cannot be prepared on this machine; the message says why."""


@dataclass
class Size:
    """How big each workload's input is: the full run, or --quick."""

    cxx_units: int
    pg_scale: int
    pg_transactions: int
    py_scale: float
    itlb_rounds: int


FULL = Size(cxx_units=3, pg_scale=4, pg_transactions=40_000, py_scale=1.0, itlb_rounds=1500)
QUICK = Size(cxx_units=1, pg_scale=1, pg_transactions=3000, py_scale=0.2, itlb_rounds=400)


@dataclass
class Setup:
    """A prepared workload: one `hugify try` comparison."""

    argv: list[str]
    tree: Path  # the files that may be hugified: the policy's include glob
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    compare_files: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)  # --way anonymous, --control
    what: str = ""  # the command, for the report (TREE for the tree)
    close: Callable[[], None] = lambda: None


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_", "PYTHON"))}
    return {**base, "LC_ALL": "C", **extra}


def tree_of(name: str, packages: list[str]) -> Path:
    try:
        return debian_packages(f"speedup-{name}", packages)
    except subprocess.CalledProcessError as e:
        why = (e.stderr or "").strip().splitlines()
        raise Unavailable(f"apt-get download {' '.join(packages)}: {why[-1] if why else e}") from e


# --- the workloads ---------------------------------------------------------------------


def clang(size: Size, work: Path) -> Setup:
    tree = tree_of("clang", ["clang-14", "libllvm14", "libclang-cpp14", "libclang-common-14-dev"])
    (work / "unit.cc").write_text(cxx_unit(size.cxx_units))
    # LD_LIBRARY_PATH comes before ld.so.cache (clang has no RUNPATH): the tree's libraries.
    env = clean_env(LD_LIBRARY_PATH=f"{tree}/{LIB}:{tree}/usr/lib/llvm-14/lib")
    argv = [str(tree / "usr/lib/llvm-14/bin/clang++"), "-std=c++17", "-O2", "-c", "unit.cc", "-o", "unit.o"]
    return Setup(
        argv, tree, work, env, ["unit.o"],
        what=f"clang++ -std=c++17 -O2 -c (generated unit, {size.cxx_units} blocks), "
        "LD_LIBRARY_PATH=TREE/usr/lib/x86_64-linux-gnu:TREE/usr/lib/llvm-14/lib",
    )  # fmt: skip


def gcc(size: Size, work: Path) -> Setup:
    driver = shutil.which("g++-12")
    if not driver:
        raise Unavailable("g++-12 is not installed (its driver runs the unpacked cc1plus through -B)")
    tree = tree_of("gcc", ["cpp-12", "g++-12"])
    libexec = "usr/lib/gcc/x86_64-linux-gnu/12"
    (work / "unit.cc").write_text(cxx_unit(size.cxx_units))
    # -B makes the system's driver run the tree's cc1plus (and as, ld from PATH).
    argv = [driver, "-B", f"{tree}/{libexec}/", "-std=c++17", "-O2", "-c", "unit.cc", "-o", "unit.o"]
    what = f"g++-12 -B TREE/{libexec}/ -std=c++17 -O2 -c (generated unit, {size.cxx_units} blocks)"
    return Setup(argv, tree, work, clean_env(), ["unit.o"], what=what)


def python(size: Size, work: Path) -> Setup:
    """python3.11 has no whole window of code (bench/README.md): the A/A control."""
    tree = tree_of("python", ["python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib"])
    script = WORKLOADS_DIR / "pyperf_kernels.py"
    # Bytecode is cached in the scratch directory, never in the tree.
    argv = [str(tree / "usr/bin/python3.11"), "-I", "-X", f"pycache_prefix={work}/pycache", str(script)]
    argv.append(str(size.py_scale))
    what = f"TREE/usr/bin/python3.11 -I bench/workloads/pyperf_kernels.py {size.py_scale} (A/A: --control)"
    return Setup(argv, tree, work, clean_env(), options=["--control"], what=what)


#: The postgres run: the server of the tree (as nobody: it refuses root) on a private
#: data and socket directory, no TCP; pgbench -S against it; a fast shutdown. The
#: shell waits for the server, so the CPU time counts the server's processes too.
#: Only pgbench's line of processed transactions is printed (its rates vary).
PG_SCRIPT = """\
set -e
setpriv --reuid=nobody --regid={gid} --clear-groups env LD_LIBRARY_PATH={tree}/{lib} \\
    {bin}/postgres -D {home}/data -k {home} -c listen_addresses= -c fsync=off >>{home}/server.log 2>&1 &
server=$!
tries=0
until grep -qs ready {home}/data/postmaster.pid; do
    tries=$((tries + 1)); [ $tries -lt 3000 ] || {{ echo "postgres did not start" >&2; exit 1; }}; sleep 0.02
done
LD_LIBRARY_PATH={tree}/{lib} {bin}/pgbench -h {home} -U bench -S -n -t {tx} postgres | grep 'actually processed'
kill -INT $server
wait $server
"""


def postgres(size: Size, work: Path) -> Setup:
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError as e:
        raise Unavailable("no user 'nobody' to run the server as (postgres refuses to run as root)") from e
    tree = tree_of("postgres", ["postgresql-15", "postgresql-client-15", "libpq5"])
    bindir = tree / "usr/lib/postgresql/15/bin"
    # One cluster in a private directory (the system's server, if any, is never touched).
    home = Path(tempfile.mkdtemp(prefix="hugify-speedup-pg-"))
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    as_nobody: dict[str, Any] = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    client = clean_env(LD_LIBRARY_PATH=f"{tree}/{LIB}")
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(home / "data"), "-A", "trust", "-U", "bench", "--no-sync"],
            env=client, cwd=home, check=True, capture_output=True, **as_nobody,
        )  # fmt: skip
        init = PG_SCRIPT.replace("-S -n -t {tx} postgres | grep 'actually processed'", "-i -q -s {scale} postgres")
        fill = init.format(gid=nobody.pw_gid, tree=tree, lib=LIB, bin=bindir, home=home, scale=size.pg_scale)
        subprocess.run(["sh", "-c", fill], env=client, check=True, capture_output=True)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    script = PG_SCRIPT.format(gid=nobody.pw_gid, tree=tree, lib=LIB, bin=bindir, home=home, tx=size.pg_transactions)
    return Setup(
        ["sh", "-c", script], tree, work, clean_env(),
        what=f"postgres -D DATA -k DIR (TREE/usr/lib/postgresql/15/bin, as nobody); pgbench -S -n -t "
        f"{size.pg_transactions} (scale {size.pg_scale}, Unix socket); CPU of server and client",
        close=lambda: shutil.rmtree(home, ignore_errors=True),
    )  # fmt: skip


def itlb(size: Size, work: Path) -> Setup:
    """The upper bound: 8192 functions 4 KiB apart (32 MiB of code) called in a
    shuffled order (testkit/recipes.py's itlb_program), built with gcc as a PIE."""
    if not shutil.which("gcc"):
        raise Unavailable("gcc is not installed")
    tree = build_itlb(8192)
    argv = [str(tree / "itlb"), str(size.itlb_rounds)]
    return Setup(argv, tree, work, clean_env(), what=f"itlb {size.itlb_rounds} (gcc {' '.join(ITLB_CFLAGS)})")


def anonymous(workload: Callable[[Size, Path], Setup]) -> Callable[[Size, Path], Setup]:
    """The workload with the hugified side in the runtime's anonymous-copy mode."""

    def setup(size: Size, work: Path) -> Setup:
        s = workload(size, work)
        s.options.append("--way=anonymous")
        s.what += "; hugified side: LD_AUDIT=libhugify-audit.so HUGIFY_ANONYMOUS=always"
        return s

    return setup


def shared(workload: Callable[[Size, Path], Setup]) -> Callable[[Size, Path], Setup]:
    """The workload with the hugified side's code mapped from root's shared copies."""

    def setup(size: Size, work: Path) -> Setup:
        if os.geteuid() != 0:
            raise Unavailable("the shared copies are root's to make (run as root)")
        s = workload(size, work)
        s.options.append("--way=shared")
        s.what += (
            "; hugified side: files on a tmpfs without huge pages, LD_AUDIT=libhugify-audit.so, root's shared copies"
        )
        return s

    return setup


WORKLOADS: dict[str, Callable[[Size, Path], Setup]] = {
    "clang": clang,
    "clang-anon": anonymous(clang),
    "clang-shared": shared(clang),
    "gcc": gcc,
    "postgres": postgres,
    "python": python,
    "itlb": itlb,
    "itlb-anon": anonymous(itlb),
    "itlb-shared": shared(itlb),
}


# --- measuring one workload ---------------------------------------------------------------


@dataclass
class Options:
    quick: bool
    min_rounds: int
    max_rounds: int
    budget: float
    target: float  # percent


def measure(setup: Setup, opts: Options, work: Path) -> dict[str, Any]:
    """One `hugify try` comparison: its JSON, with the workload's description."""
    policy = work / "policy.toml"
    # The shipped policy, stripped files allowed (hugify try's default: the archive's
    # binaries are stripped, a package build runs hugify before dh_strip), and only
    # the workload's own tree hugified.
    policy.write_text(f'include = ["{setup.tree}/**"]\n')
    rounds = ["--min-rounds", "1", "--max-rounds", "1"] if opts.quick else [
        "--min-rounds", str(opts.min_rounds), "--max-rounds", str(opts.max_rounds),
        "--budget", str(opts.budget), "--target", str(opts.target),
    ]  # fmt: skip
    compare = ["--compare-files", *setup.compare_files] if setup.compare_files else []
    cmd = command(
        "try", "--json", "--cache-dir", cache_root() / "speedup-try", "--policy", policy,
        *rounds, *setup.options, *compare, "--", *setup.argv,
    )  # fmt: skip
    env = {**setup.env, "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=setup.cwd, env=env, capture_output=True, text=True, check=False)
    try:
        doc: dict[str, Any] = json.loads(res.stdout)
    except ValueError:
        return {"status": "failed", "reason": f"hugify try exited with {res.returncode}: {res.stderr.strip()[-500:]}"}
    doc["command"] = setup.what
    if "error" in doc:
        return {**doc, "status": "failed", "reason": f"{doc['error']['detail']} ({doc['error']['reason']})"}
    doc["status"] = "measured"
    return doc


# --- report ------------------------------------------------------------------------------


def totals(r: dict[str, Any]) -> dict[str, int]:
    """Sums over the workload's objects: windows predicted (whole windows of the
    copies), 2 MiB folios prefetched, PMD-mapped code seen, the originals' resident
    code, growth on disk."""
    used = [o for o in r["objects"] if o.get("copy")]
    prefetched = r.get("prefetched", {})
    return {
        "predicted": sum(p["windows"] for p in prefetched.values()) * (2 << 20),
        "folios": sum(p["huge"] for p in prefetched.values()) * (2 << 20),
        "seen": sum(o.get("seen", {}).get("hugified", {}).get("pmd_mapped", 0) for o in used),
        "original_code": sum(o.get("seen", {}).get("original", {}).get("resident_code", 0) for o in used),
        "growth": sum(o.get("growth") or 0 for o in used),
    }


def copies_held(r: dict[str, Any]) -> str:
    """What the runtime's copies held: the anonymous ones (the most in one process at one
    time), or root's shared ones (once, whatever the number of processes)."""
    cov = r["coverage"]
    if r.get("way") == "anonymous":
        return f"{mib(cov['anonymous_held'])} anon"
    if r.get("way") == "shared" and cov.get("shared_held") is not None:
        return f"{mib(cov['shared_held'])} shared"
    return "-"


def print_report(results: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'workload':10} {'rounds':>6}  {'CPU hug/orig [95 % CI]':24} {'wall hug/orig [95 % CI]':24} "
        f"{'A/A CPU [95 % CI]':24} {'orig CPU':>8}  {'seen/predicted huge':>20}  {'orig code':>10}  {'growth':>9}"
        f"  {'copies held':>11}"
    )
    for name, r in results.items():
        if r["status"] != "measured":
            print(f"{name:10} {r['status']}: {r['reason']}")
            continue
        t = totals(r)
        held = copies_held(r)
        print(
            f"{name:10} {r['rounds']:6}  {interval(r['cpu']):24} {interval(r['wall']):24} "
            f"{interval(r['noise_floor']['cpu']):24} {r['original_cpu_s']:7.2f}s  "
            f"{mib(t['seen']) + ' / ' + mib(t['predicted']):>20}  {mib(t['original_code']):>10}  "
            f"{mib(t['growth']):>9}  {held:>11}"
        )
    for name, r in results.items():
        if r["status"] != "measured":
            continue
        print(f"\n{name}: {r['command']}; stopped: {r['stopped']}")
        print(f"  answer: {r['answer']}")
        for o in r["objects"]:
            seen = o.get("seen", {})
            h, a = seen.get("hugified", {}), seen.get("original", {})
            how = f"{o['status']} ({o.get('mode')})" if o.get("mode") else o["status"]
            if not o.get("copy"):
                print(f"  {o['path']}: {how}: {o.get('reason')}: {o.get('detail')}")
                continue
            print(
                f"  {o['path']}: {how}; {h.get('windows', 0)} windows, seen {mib(h.get('pmd_mapped'))} PMD-mapped in "
                f"one process ({h.get('windows_huge', 0)} huge, {h.get('windows_small', 0)} on small pages); "
                f"original: {mib(a.get('pmd_mapped'))} PMD-mapped"
            )
        for p in r.get("problems", []):
            print(f"  problem: {p}")
        for n in r.get("notes", []):
            print(f"  note: {n}")


def machine() -> dict[str, Any]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), "unknown",
    )  # fmt: skip
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    git = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git.stdout.strip() or None,
        "kernel": os.uname().release,
        "cpu": model,
        "cpus": os.cpu_count(),
        "thp_enabled": thp.read_text().strip() if thp.exists() else None,
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round per workload, smallest inputs (the test)")
    ap.add_argument("--only", metavar="W[,W...]", help=f"workloads to run, of: {', '.join(WORKLOADS)}")
    ap.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON here")
    ap.add_argument("--min-rounds", type=int, default=10, help="rounds before the interval may stop a workload (10)")
    ap.add_argument("--max-rounds", type=int, default=40, help="most rounds per workload (40)")
    ap.add_argument("--budget", type=float, default=900, help="seconds of rounds per workload (900)")
    ap.add_argument("--target", type=float, default=2, help="stop at this half-width of the interval, percent (2)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    opts = Options(args.quick, args.min_rounds, args.max_rounds, args.budget, args.target)
    size = QUICK if args.quick else FULL
    results: dict[str, dict[str, Any]] = {}
    host = machine()
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        work = Path(tempfile.mkdtemp(prefix=f"hugify-speedup-{name}-"))
        setup = None
        try:
            setup = WORKLOADS[name](size, work)
            print(f"   {shlex.join(setup.argv)[:200]}", file=sys.stderr, flush=True)
            results[name] = measure(setup, opts, work)
        except Unavailable as e:
            results[name] = {"status": "unavailable", "reason": str(e)}
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            results[name] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        finally:
            if setup:
                setup.close()
            shutil.rmtree(work, ignore_errors=True)
    host["loadavg_end"] = os.getloadavg()
    print_report(results)
    if args.json:
        doc = {
            "hugify_speedup": 2,
            "machine": host,
            "options": {"quick": args.quick, "min_rounds": args.min_rounds, "max_rounds": args.max_rounds,
                        "budget_s": args.budget, "target_percent": args.target,
                        "bootstrap_resamples": BOOTSTRAP_RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED},
            "workloads": results,
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
