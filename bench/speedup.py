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

With --ways, each workload (the Hugifier paper's: node, postgres, apache; clang and
itlb) is instead one interleaved run of hugify try's engine with every way of getting
its code onto huge pages a side of its own (hugify.trial.ways): hugify's file-backed
and shared ways, the peers hugifyr and iodlr, glibc 2.44's own advice over hugified
and original files, and for itlb a relink (bench/peers.py). --bundle DIR carries that
measurement to another machine (bench/bundle.py).

usage: tools/bench speedup [--quick] [--only W[,W...]] [--json OUT] [--min-rounds N]
                        [--max-rounds N] [--budget SECONDS] [--target PERCENT]
                        [--ways W[,W...]|all] [--bundle DIR] [--in-bundle MANIFEST]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peers
from bench.workloads.sources import cxx_unit
from hugify.abtest import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from hugify.trial.report import interval, mib
from hugify.trial.ways import WayUnavailable
from testkit import REPO
from testkit import peers as peer_builds
from testkit.bench import parser
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
    node_scale: float
    http_requests: int


FULL = Size(
    cxx_units=3, pg_scale=4, pg_transactions=40_000, py_scale=1.0, itlb_rounds=1500, node_scale=1.0,
    http_requests=20_000,
)  # fmt: skip
QUICK = Size(
    cxx_units=1, pg_scale=1, pg_transactions=3000, py_scale=0.2, itlb_rounds=400, node_scale=0.1, http_requests=1000
)


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
    #: Policy lines besides the include glob (a workload whose objects are all below
    #: the shipped threshold).
    policy: str = ""
    #: original -> the same program relinked with 2 MiB segment alignment (--ways relink),
    #: made when a way asks
    relinked: Callable[[], dict[str, Path]] = dict


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_", "PYTHON"))}
    return {**base, "LC_ALL": "C", **extra}


def fixture(name: str, make: Callable[[], Path]) -> Path:
    """A prepared input (bench/peers.py's Fixtures); Unavailable where a bundle lacks it."""
    try:
        return peers.FIXTURES.get(name, make)
    except LookupError as e:
        raise Unavailable(str(e)) from None


def tree_of(name: str, packages: list[str] | Callable[[], list[str]]) -> Path:
    """The workload's packages from the Debian archive, unpacked (the archive's
    current versions; `packages` may be a function that asks apt which)."""

    def unpack() -> Path:
        names = packages() if callable(packages) else packages
        try:
            return debian_packages(f"speedup-{name}", names)
        except subprocess.CalledProcessError as e:
            why = (e.stderr or "").strip().splitlines()
            raise Unavailable(f"apt-get download {' '.join(names)}: {why[-1] if why else e}") from e

    return fixture(f"tree:{name}", unpack)


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


#: The end of a server workload's script: the server stopped (signalled before) within
#: 60 s, else killed, so that a server that hangs makes a failed round, not a hang; its
#: exit status is the script's.
STOP_SERVER = """\
tries=0
while kill -0 $server 2>/dev/null && [ $tries -lt 3000 ]; do tries=$((tries + 1)); sleep 0.02; done
kill -KILL $server 2>/dev/null || true
wait $server
"""


#: The postgres run: the server of the tree (as nobody: it refuses root) on a private
#: data and socket directory, no TCP; pgbench -S against it; a fast shutdown. The
#: shell waits for the server, so the CPU time counts the server's processes too.
#: Only pgbench's line of processed transactions is printed (its rates vary).
PG_SCRIPT = (
    """\
set -e
setpriv --reuid=nobody --regid={gid} --clear-groups env LD_LIBRARY_PATH={tree}/{lib} \\
    {bin}/postgres -D {home}/data -k {home} -c listen_addresses= -c fsync=off >>{home}/server.log 2>&1 &
server=$!
tries=0
until grep -qs ready {home}/data/postmaster.pid; do
    tries=$((tries + 1)); [ $tries -lt 3000 ] || {{ echo "postgres did not start" >&2; exit 1; }}; sleep 0.02
done
LD_LIBRARY_PATH={tree}/{lib} timeout 600 {bin}/pgbench -h {home} -U bench \\
    -S -n -t {tx} postgres | grep 'actually processed'
kill -INT $server
"""
    + STOP_SERVER
)


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

    def build() -> Path:
        if not shutil.which("gcc"):
            raise Unavailable("gcc is not installed")
        return build_itlb(8192)

    tree = fixture("itlb", build)
    argv = [str(tree / "itlb"), str(size.itlb_rounds)]
    what = f"itlb {size.itlb_rounds} (gcc {' '.join(ITLB_CFLAGS)})"

    def relinked() -> dict[str, Path]:
        try:
            return {argv[0]: fixture("itlb-relink", lambda: peer_builds.relinked_itlb(8192))}
        except (Unavailable, subprocess.CalledProcessError) as e:
            raise WayUnavailable(f"no relinked program: {e}") from None

    return Setup(argv, tree, work, clean_env(), what=what, relinked=relinked)


def node(size: Size, work: Path) -> Setup:
    """Debian's node 18 (nodejs, libnode108 and the libraries the system may lack)
    running bench/workloads/node_kernels.js: V8's compilers, runtime and collector,
    all in libnode's code; the builtins it loads from /usr/share/nodejs are the
    system's (tools/setup-dev-env installs them)."""

    def packages() -> list[str]:
        """Debian's node of libnode's version (another nodejs may be installed)."""
        policy = subprocess.run(["apt-cache", "policy", "libnode108"], capture_output=True, text=True, check=False)
        version = policy.stdout.partition("Candidate: ")[2].split()[:1]
        if not version or version[0] == "(none)":
            raise Unavailable("libnode108 is not in the archive")
        return [f"nodejs={version[0]}", "libnode108", "libc-ares2", "libuv1"]

    tree = tree_of("node", packages)
    env = clean_env(LD_LIBRARY_PATH=f"{tree}/{LIB}")
    script = WORKLOADS_DIR / "node_kernels.js"
    argv = [str(tree / "usr/bin/node"), str(script), str(size.node_scale)]
    what = f"TREE/usr/bin/node bench/workloads/node_kernels.js {size.node_scale}, LD_LIBRARY_PATH=TREE/{LIB}"
    return Setup(argv, tree, work, env, what=what)


#: The web server of the apache workload: Debian's apache2 with the event MPM, on one
#: loopback port, serving one static page; no access log.
APACHE_CONF = """\
ServerRoot {home}
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile {home}/httpd.pid
ErrorLog {home}/error.log
LogLevel warn
Mutex file:{home}
LoadModule mpm_event_module {modules}/mod_mpm_event.so
LoadModule authz_core_module {modules}/mod_authz_core.so
LoadModule mime_module {modules}/mod_mime.so
TypesConfig /dev/null
AddType text/html .html
DocumentRoot {home}/htdocs
<Directory {home}/htdocs>
    Require all granted
</Directory>
StartServers 2
ServerLimit 2
ThreadsPerChild 8
MaxRequestWorkers 16
KeepAlive Off
"""

#: The apache run: the server of the tree started as nobody, ab of the tree against it
#: (4 concurrent clients), only ab's lines of counts printed and compared, the server
#: stopped. The shell waits for the server: the CPU time counts its processes too.
APACHE_SCRIPT = (
    """\
set -e
rm -f {home}/httpd.pid
setpriv --reuid=nobody --regid={gid} --clear-groups env LD_LIBRARY_PATH={tree}/{lib} \\
    {tree}/usr/sbin/apache2 -f {home}/httpd.conf -DFOREGROUND &
server=$!
tries=0
until [ -s {home}/httpd.pid ]; do
    tries=$((tries + 1)); [ $tries -lt 3000 ] || {{ echo "apache2 did not start" >&2; exit 1; }}; sleep 0.02
done
LD_LIBRARY_PATH={tree}/{lib} timeout 600 {tree}/usr/bin/ab -q -s 60 -n {requests} -c 4 \\
    http://127.0.0.1:{port}/index.html | grep -E '^(Complete requests|Failed requests|Non-2xx|HTML transferred)'
kill -TERM $server
"""
    + STOP_SERVER
)


def _loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apache(size: Size, work: Path) -> Setup:
    """Debian's apache2 (apache2-bin, libapr1, libaprutil1) serving a static page on a
    loopback port to Debian's ab (apache2-utils). Its largest object, apache2 itself,
    has 313 KiB of code: the policy's threshold is 256K for this workload."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError as e:
        raise Unavailable("no user 'nobody' to run the server as") from e
    tree = tree_of("apache", ["apache2-bin", "apache2-utils", "libapr1", "libaprutil1"])
    home = Path(tempfile.mkdtemp(prefix="hugify-speedup-apache-"))
    os.chmod(home, 0o755)
    (home / "htdocs").mkdir()
    page = "".join(f"<p>{n}: {'huge pages for code ' * (n % 7 + 1)}</p>\n" for n in range(400))
    (home / "htdocs" / "index.html").write_text(f"<html><body>\n{page}</body></html>\n")
    port = _loopback_port()
    conf = APACHE_CONF.format(home=home, port=port, modules=tree / "usr/lib/apache2/modules")
    (home / "httpd.conf").write_text(conf)
    os.chown(home, nobody.pw_uid, nobody.pw_gid)  # its pid file and log
    script = APACHE_SCRIPT.format(
        gid=nobody.pw_gid, tree=tree, lib=LIB, home=home, port=port, requests=size.http_requests
    )
    return Setup(
        ["sh", "-c", script], tree, work, clean_env(),
        what=f"apache2 -f CONF -DFOREGROUND (TREE/usr/sbin, as nobody, event MPM, 127.0.0.1:{port}); ab -n "
        f"{size.http_requests} -c 4 of a {len(page) // 1024 + 1} KiB page; CPU of server and client",
        close=lambda: shutil.rmtree(home, ignore_errors=True),
        policy='threshold = "256K"\n',
    )  # fmt: skip


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
    "node": node,
    "apache": apache,
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
    policy.write_text(f'include = ["{setup.tree}/**"]\n{setup.policy}')
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


# --- the ways, side by side -----------------------------------------------------------------

#: The workloads of the ways' table (--ways): the paper's, clang and the upper bound.
WAYS_WORKLOADS = ("node", "postgres", "apache", "clang", "itlb")
#: The workloads a ways run may have: all but the A/A control and the variants of one
#: hugify way, which are columns here.
WAYS_ALLOWED = (*WAYS_WORKLOADS, "gcc")


def measure_ways(setup: Setup, opts: Options, work: Path, names: list[str]) -> dict[str, Any]:
    """One run of hugify try's engine with every way of `names` a side of its own
    (hugify.trial.ways; the peers' ways: bench/peers.py): its JSON, with the
    workload's description."""
    from hugify import abtest
    from hugify.policy import PolicyError
    from hugify.trial import session, ways

    policy = work / "policy.toml"
    policy.write_text(f'include = ["{setup.tree}/**"]\n{setup.policy}')
    if opts.quick:
        limits = abtest.Limits(min_rounds=1, max_rounds=1, budget=opts.budget, target=opts.target / 100)
    else:
        limits = abtest.Limits(opts.min_rounds, opts.max_rounds, opts.budget, opts.target / 100)
    try:
        pol = session.try_policy(policy)
    except PolicyError as e:
        return {"status": "failed", "reason": f"the policy is not usable: {e}"}
    trial = session.Options(
        argv=setup.argv, env=setup.env, cwd=str(setup.cwd), policy=pol, limits=limits,
        compare_files=setup.compare_files, cache_dir=cache_root() / "speedup-try",
        progress=lambda text: print(f"   {text}", file=sys.stderr, flush=True),
    )  # fmt: skip
    try:
        doc = ways.run(trial, peers.ways(names, setup.relinked))
    except session.TryError as e:
        return {**e.found, "status": "failed", "reason": f"{e.detail} ({e.reason})", "command": setup.what}
    return {**doc, "status": "measured", "command": setup.what}


def cell(w: dict[str, Any]) -> str:
    """A way's cell of the table: its CPU time over the originals' with the interval,
    or why there is none."""
    if w["status"] == "measured":
        return interval(w["cpu"])
    return f"{w['status']}: {w['reason']}"


def ways_table(doc: dict[str, Any]) -> str:
    """The Markdown table of bench/README.md from a --ways run's JSON: per workload,
    the A/A floor and each way's CPU time over the originals' (bold: a gain clear of 1
    and of the floor), with the code it had on huge pages; or why it has no figure."""
    names = doc["options"]["ways"]
    out = [
        "| workload | rounds | original CPU | A/A | " + " | ".join(names) + " |",
        "|---" * (4 + len(names)) + "|",
    ]
    for name, r in doc["workloads"].items():
        if r["status"] != "measured":
            out.append(f"| {name} | {r['status']}: {r['reason']} |" + " |" * (2 + len(names)))
            continue
        cells = []
        for way in names:
            w = r["ways"][way]
            if w["status"] != "measured":
                cells.append(f"{w['status']}: {w['reason']}")
                continue
            figure = interval(w["cpu"])
            if w.get("verdict") == "gain":
                head, _, rest = figure.partition(" ")
                figure = f"**{head}** {rest}"
            cells.append(f"{figure}, {w['huge'] / MIB:.0f} MiB huge")
        cpu = f"{r['original_cpu_s']:.2f} s" if r["original_cpu_s"] else "-"
        out.append(f"| {name} | {r['rounds']} | {cpu} | {interval(r['noise_floor']['cpu'])} | {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def print_ways_report(results: dict[str, dict[str, Any]], names: list[str]) -> None:
    print("CPU time of each way / the originals' (median of rounds, 95 % interval); A/A: the originals again")
    for name, r in results.items():
        print(f"\n{name}: {r.get('command', '')}")
        if r["status"] != "measured":
            print(f"  {r['status']}: {r['reason']}")
            continue
        print(f"  {r['rounds']} rounds (stopped: {r['stopped']}); original {r['original_cpu_s'] or 0:.2f} s CPU")
        print(f"  {'A/A':16} {interval(r['noise_floor']['cpu'])}")
        for way in names:
            w = r["ways"][way]
            print(f"  {way:16} {cell(w)}; code on huge pages {mib(w['huge'])}")
            for path, o in w["objects"].items():
                print(f"    {path}: {o['runs']}; huge {mib(o['huge'])} (file {mib(o['file_pmd_mapped'])}, "
                      f"shmem {mib(o['shmem_pmd_mapped'])}, anon {mib(o['anon_huge_pages'])})")  # fmt: skip
            for n in w["notes"]:
                print(f"    note: {n}")
        for n in r.get("notes", []):
            print(f"  note: {n}")


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
    try:
        git = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:  # no git (a bundle)
        git = ""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git or None,
        "kernel": os.uname().release,
        "cpu": model,
        "cpus": os.cpu_count(),
        "thp_enabled": thp.read_text().strip() if thp.exists() else None,
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    ap = parser(__file__, description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round per workload, smallest inputs (the test)")
    ap.add_argument("--only", metavar="W[,W...]", help=f"workloads to run, of: {', '.join(WORKLOADS)}")
    ap.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON here")
    ap.add_argument("--min-rounds", type=int, default=10, help="rounds before the interval may stop a workload (10)")
    ap.add_argument("--max-rounds", type=int, default=40, help="most rounds per workload (40)")
    ap.add_argument("--budget", type=float, default=900, help="seconds of rounds per workload (900)")
    ap.add_argument("--target", type=float, default=2, help="stop at this half-width of the interval, percent (2)")
    ap.add_argument(
        "--ways",
        metavar="W[,W...]",
        help=f"each workload as one interleaved run of these ways beside the originals, or all: {', '.join(peers.ALL)} "
        f"(workloads: {', '.join(WAYS_WORKLOADS)} by default, or any of {', '.join(WAYS_ALLOWED)})",
    )
    ap.add_argument(
        "--bundle",
        metavar="DIR",
        type=Path,
        help="instead of measuring, make DIR a bundle that runs this measurement (--only, --ways) on another x86-64 "
        "machine without network or package manager: DIR/run.sh (bench/README.md)",
    )
    ap.add_argument("--in-bundle", metavar="MANIFEST", type=Path, help="run from a bundle (its run.sh gives this)")
    ap.add_argument("--fixtures-out", type=Path, help=argparse.SUPPRESS)  # where the inputs are: for --bundle
    ap.add_argument("--table", metavar="JSON", type=Path, help="print bench/README.md's table of a --ways run's JSON")
    args = ap.parse_args()
    if args.table:
        sys.stdout.write(ways_table(json.loads(args.table.read_text())))
        return 0
    if args.in_bundle:
        bundled = json.loads(args.in_bundle.read_text())
        peers.FIXTURES = peers.Fixtures(bundled["fixtures"])
    ways = (list(peers.ALL) if args.ways == "all" else args.ways.split(",")) if args.ways else []
    known = WAYS_ALLOWED if ways else tuple(WORKLOADS)
    names = args.only.split(",") if args.only else list(WAYS_WORKLOADS if ways else WORKLOADS)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown workload {', '.join(unknown)}; known: {', '.join(known)}")
    bad = [w for w in ways if w not in peers.ALL]
    if bad:
        ap.error(f"unknown way {', '.join(bad)}; known: {', '.join(peers.ALL)}")
    if args.bundle:
        if not ways:
            ap.error("--bundle carries a --ways measurement: give --ways")
        from bench import bundle

        try:
            made = bundle.prepare(args.bundle, names, ways)
        except bundle.BundleError as e:
            print(f"speedup.py: no bundle: {e}", file=sys.stderr)
            return 1
        gib = made["prepared"]["bytes"] / (1 << 30)
        print(f"{args.bundle}: {made['prepared']['files']} files, {gib:.1f} GiB; run {args.bundle}/run.sh as root")
        return 0
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
            results[name] = measure_ways(setup, opts, work, ways) if ways else measure(setup, opts, work)
        except Unavailable as e:
            results[name] = {"status": "unavailable", "reason": str(e)}
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            results[name] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        finally:
            if setup:
                setup.close()
            shutil.rmtree(work, ignore_errors=True)
    host["loadavg_end"] = os.getloadavg()
    if ways:
        print_ways_report(results, ways)
    else:
        print_report(results)
    if args.fixtures_out:
        args.fixtures_out.write_text(json.dumps(peers.FIXTURES.paths, indent=2, sort_keys=True) + "\n")
    if args.json:
        doc = {
            "hugify_speedup": 2,
            "machine": host,
            "bundle": bundled["prepared"] if args.in_bundle else None,
            "options": {"quick": args.quick, "min_rounds": args.min_rounds, "max_rounds": args.max_rounds,
                        "budget_s": args.budget, "target_percent": args.target, "ways": ways,
                        "bootstrap_resamples": BOOTSTRAP_RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED},
            "workloads": results,
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
