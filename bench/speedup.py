#!/usr/bin/env python3
"""Does hugify make programs faster? Real workloads on original vs hugified files.

Each workload runs on the original files (A) and on the hugified ones (B) in
interleaved pairs (AB, BA, AB, ...) until the 95 % interval of the median CPU-time
ratio is narrower than +-2 % (or a budget runs out). For each workload it reports the
median B/A ratio of CPU time (user + system of the workload's process tree) and of
wall time with bootstrap intervals, the huge-page coverage seen in /proc/PID/smaps
of the workload's processes against what `hugify inspect` predicts, window by window,
and the page-cache cost. Method and measured figures: bench/README.md.

Inputs come from the Debian archive (apt-get download, cached under the test cache
like the corpus tests' packages) and are transformed as a package build would:
`hugify tree` over the unpacked packages under POLICY below.

The variants NAME-anon (itlb, clang) run side B with the runtime's anonymous-copy mode
forced (docs/runtime.md, "Anonymous copies": LD_AUDIT with HUGIFY_ANONYMOUS=always, as
this host's filesystem gives file-backed 2 MiB folios), and report the memory the copies
held (AnonHugePages of the copied ranges, most in one process at one time).

The variants NAME-shared (itlb, clang) put side B's files on a tmpfs without huge pages
(where file-backed huge pages are unsupported, as on ext4 before Linux 6.16 or btrfs),
let root's `hugify prefetch` make their shared copies (docs/runtime.md, "Shared copies")
and run side B with the audit library, which maps the code from the copies; they report
the memory the copies hold (once, whatever the number of processes). Root only.

usage: bench/speedup.py [--quick] [--only W[,W...]] [--json OUT] [--max-pairs N]
                        [--min-pairs N] [--budget SECONDS] [--target FRACTION]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchlib import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, REPO, bootstrap, hugify_cmd, ratio_summary

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench" / "workloads"))

from corpus_support import copy_tree
from fixtures import cache_root, debian_packages, locked
from sources import ITLB_CFLAGS, cxx_unit, itlb_program

from hugify import anoncopies, manifest
from hugify.prefetch import GOOD_STATES, Engine, NotHugified, read_windows

#: The policy the trees are transformed under: the shipped default, except that
#: stripped files are transformed. The archive's binaries are stripped; a package
#: build runs hugify before dh_strip, when they still have their symbol table.
POLICY = "refuse_stripped = false\n"
HP = 2 << 20
MIB = 1 << 20
LIB = "usr/lib/x86_64-linux-gnu"
WORKLOADS_DIR = REPO / "bench" / "workloads"
#: Seconds between two looks at the workload's processes.
SAMPLE_INTERVAL = 0.025
AUDIT_LIB = REPO / "runtime" / "libhugify-audit.so"
#: Set for the runs of a side that uses the anonymous-copy mode (clean_env adds it).
side_env: dict[str, str] = {}


class Unavailable(Exception):
    """The workload cannot be prepared on this machine; the message says why."""


# --- running one side ------------------------------------------------------------------


@dataclass
class Run:
    cpu: float  # user + system seconds of the process tree
    wall: float
    check: str  # what both sides must agree on (output, digest of the object file)


def reap(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Waits for a child: exit status, and user + system time of it and of the
    descendants it waited for."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru.ru_utime + ru.ru_stime


def run_timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, bytes]:
    """Runs a command to completion: CPU time, wall time, stdout."""
    out = cwd / "stdout"
    with out.open("wb") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=f, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        with proc.stderr:
            err = proc.stderr.read()
        code, cpu = reap(proc)
        wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}: {err.decode(errors='replace').strip()[-500:]}")
    return cpu, wall, out.read_bytes()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_", "PYTHON"))}
    return {**base, "LC_ALL": "C", **extra, **side_env}


# --- watching the workload's processes --------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (through /proc/PID/task/TID/children)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                    out += kids
                    todo += kids
    return out


@dataclass
class Vma:
    start: int
    end: int
    offset: int
    path: str
    exec: bool
    rss: int = 0
    pmd: int = 0


def read_smaps(pid: int, names: set[str]) -> list[Vma]:
    """The mappings of files whose base name is in `names`, with Rss and FilePmdMapped
    (ShmemPmdMapped for a shared copy, on tmpfs)."""
    out: list[Vma] = []
    cur: Vma | None = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if "-" in line[:17] and line[0] in "0123456789abcdef":
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else ""
                cur = None
                if path.rsplit("/", 1)[-1] in names:
                    lo, hi = parts[0].split("-")
                    cur = Vma(int(lo, 16), int(hi, 16), int(parts[2], 16), path, "x" in parts[1])
                    out.append(cur)
            elif cur is not None:
                if line.startswith("Rss:"):
                    cur.rss = int(line.split()[1]) * 1024
                elif line.startswith(("FilePmdMapped:", "ShmemPmdMapped:")):
                    cur.pmd += int(line.split()[1]) * 1024
    return out


@dataclass
class Seen:
    """What the processes of one side's runs mapped of one object."""

    paths: set[str] = field(default_factory=set)  # the copies mapped (by path)
    pmd: int = 0  # most FilePmdMapped of its code in one process at one time
    rss: int = 0  # most resident code in one process at one time
    huge: set[int] = field(default_factory=set)  # window offsets seen PMD-mapped
    small: set[int] = field(default_factory=set)  # window offsets seen executed on small pages
    small_in: dict[int, str] = field(default_factory=dict)  # window -> a process that mapped it small
    #: Windows seen on small pages only in runs during which the page cache was dropped.
    small_after_drop: set[int] = field(default_factory=set)

    def as_json(self) -> dict[str, Any]:
        return {"paths": sorted(self.paths), "pmd_mapped": self.pmd, "resident_code": self.rss}


class Sampler(threading.Thread):
    """Polls the smaps of every process below this one while a run lasts, for the
    objects of interest: which copy is mapped, FilePmdMapped and Rss of its code,
    and (PAGEMAP_SCAN) which of its huge-page windows are PMD-mapped or executed on
    small pages."""

    def __init__(self, objects: dict[str, Path], windows: dict[str, list[int]], kernel: Engine | None) -> None:
        super().__init__(daemon=True)
        self.names = {p.name for p in objects.values()}
        self.key = {str(p): rel for rel, p in objects.items()}  # the expected copy -> object
        self.by_name = {p.name: rel for rel, p in objects.items()}
        self.windows = windows
        self.kernel = kernel
        self.seen: dict[str, Seen] = {rel: Seen() for rel in objects}
        self.stop = threading.Event()
        self.samples = 0
        #: Where root's shared copies are (the NAME-shared variants): a mapping of a copy
        #: there is the object's code, mapped from its copy.
        self.store = ""
        #: Most AnonHugePages of anonymous copies of code in one process at one time.
        self.anon_held = 0
        self.copied_in: set[int] = set()  # processes seen with copies

    def run(self) -> None:
        me = os.getpid()
        own = os.readlink("/proc/self/exe")
        while True:
            for pid in descendants(me):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/exe") != own:  # not a child between fork and exec
                        self.look(pid)
                        if side_env:
                            self.look_copies(pid)
            self.samples += 1
            if self.stop.wait(SAMPLE_INTERVAL):
                return

    def look(self, pid: int) -> None:
        vmas = read_smaps(pid, self.names)
        per: dict[str, tuple[int, int]] = {}
        for v in vmas:
            rel = self.key.get(v.path) or self.by_name[v.path.rsplit("/", 1)[-1]]
            copied = bool(self.store) and v.path.startswith(self.store)
            if not copied:
                self.seen[rel].paths.add(v.path.removesuffix(" (deleted)"))
            if (v.path not in self.key and not copied) or not v.exec:
                continue
            pmd, rss = per.get(rel, (0, 0))
            per[rel] = (pmd + v.pmd, rss + v.rss)
            if self.kernel and self.windows.get(rel):
                self.scan(pid, rel, v)
        for rel, (pmd, rss) in per.items():
            s = self.seen[rel]
            s.pmd, s.rss = max(s.pmd, pmd), max(s.rss, rss)

    def look_copies(self, pid: int) -> None:
        """The anonymous copies the runtime made in this process, and what they hold."""
        held = sum(c.anon_huge for c in anoncopies.running_copies(HP, pids=[pid]) if Path(c.path).name in self.names)
        self.anon_held = max(self.anon_held, held)
        if held:
            self.copied_in.add(pid)

    def scan(self, pid: int, rel: str, v: Vma) -> None:
        """Classifies the windows inside this mapping: PMD-mapped, or some page of it
        present on small pages (executed; the kernel maps a 2 MiB folio at a 2 MiB
        -aligned address with one PMD), or not executed yet."""
        assert self.kernel is not None
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            regions = self.kernel.page_regions(
                fd,
                v.start,
                v.end,
                Engine.PAGE_IS_PRESENT | Engine.PAGE_IS_HUGE,
                Engine.PAGE_IS_PRESENT | Engine.PAGE_IS_HUGE,
            )
        finally:
            os.close(fd)
        s = self.seen[rel]
        for w in self.windows[rel]:
            lo = v.start + w - v.offset
            if w < v.offset or lo + HP > v.end:
                continue
            hit = [(a, b, c) for a, b, c in regions if a < lo + HP and b > lo]
            if any(c & Engine.PAGE_IS_HUGE and a <= lo and b >= lo + HP for a, b, c in hit):
                s.huge.add(w)
            elif hit:
                s.small.add(w)
                s.small_in.setdefault(w, f"pid {pid}")


@contextlib.contextmanager
def sampling(sampler: Sampler) -> Iterator[None]:
    sampler.start()
    try:
        yield
    finally:
        sampler.stop.set()
        sampler.join()


# --- the workloads ---------------------------------------------------------------------


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
class Trees:
    """The original files and the transformed copy."""

    original: Path
    hugified: Path
    files: dict[str, dict[str, Any]]  # rel path -> what the transform step said (tree report entry)
    manifest: set[str]  # rel paths the manifest lists


@dataclass
class Setup:
    """A prepared workload: the trees, the objects whose copies the runs must map,
    and how one run goes."""

    command: str
    trees: Trees
    uses: list[str]  # files (relative to the trees) the runs must map from their own tree
    run: Callable[[Path, Path], Run]  # (tree, scratch dir) -> one run
    close: Callable[[], None] = lambda: None
    #: Side B runs with the runtime's anonymous copies (the NAME-anon variants).
    anonymous: bool = False
    #: Side B's files are on a tmpfs without huge pages, with root's shared copies (NAME-shared).
    shared: bool = False


def code_key() -> str:
    """Changes whenever hugify's code does: transformed trees are cached under it."""
    h = hashlib.sha256(POLICY.encode())
    for f in sorted((REPO / "hugify").rglob("*")):
        if f.suffix in (".py", ".so"):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def hugify(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(hugify_cmd(*args), capture_output=True, text=True, cwd=REPO, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"hugify {' '.join(map(str, args))} -> {res.returncode}: {res.stderr.strip()[-500:]}")
    return res


@contextlib.contextmanager
def cached_dir(name: str, key: str) -> Iterator[tuple[Path, bool]]:
    """cache_root()/speedup/NAME-KEY, locked; (the directory, whether it is complete).
    Other versions of NAME are removed; an incomplete one is started afresh."""
    base = cache_root() / "speedup"
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"{name}-{key}"
    with locked(base / f"{name}.lock"):
        for stale in base.glob(f"{name}-*"):
            if stale != final and stale.is_dir():
                shutil.rmtree(stale)
        done = (final / ".complete").is_file()
        if not done:
            shutil.rmtree(final, ignore_errors=True)
            final.mkdir()
        yield final, done
        (final / ".complete").touch()


def debian_trees(name: str, packages: list[str]) -> Trees:
    """The unpacked packages, and a copy transformed by `hugify tree` under POLICY."""
    try:
        original = debian_packages(f"speedup-{name}", packages)
    except subprocess.CalledProcessError as e:
        why = (e.stderr or "").strip().splitlines()
        raise Unavailable(f"apt-get download {' '.join(packages)}: {why[-1] if why else e}") from e
    with cached_dir(name, f"{original.name.removeprefix('root-')}-{code_key()}") as (d, done):
        if not done:
            copy_tree(original, d / "root")
            (d / "policy.toml").write_text(POLICY)
            hugify(
                "tree", "--policy", d / "policy.toml", "--no-progress", "--manifest", d / "manifest.list",
                "--report", d / "report.json", d / "root",
            )  # fmt: skip
    report = json.loads((d / "report.json").read_text())
    files = {p.lstrip("/"): f for f in report["files"] for p in f["paths"]}
    listed = {e.path.lstrip("/") for e in manifest.parse((d / "manifest.list").read_text())}
    return Trees(original, d / "root", files, listed)


def clang(size: Size) -> Setup:
    trees = debian_trees("clang", ["clang-14", "libllvm14", "libclang-cpp14", "libclang-common-14-dev"])

    def run(tree: Path, scratch: Path) -> Run:
        # LD_LIBRARY_PATH comes before ld.so.cache (clang has no RUNPATH): the tree's
        # libraries, not the system's, which the sampler checks.
        env = clean_env(LD_LIBRARY_PATH=f"{tree}/{LIB}:{tree}/usr/lib/llvm-14/lib")
        return compile_unit([str(tree / "usr/lib/llvm-14/bin/clang++")], env, scratch, size.cxx_units)

    return Setup(
        command=f"clang++ -std=c++17 -O2 -c (generated unit, {size.cxx_units} blocks), "
        "LD_LIBRARY_PATH=TREE/usr/lib/x86_64-linux-gnu:TREE/usr/lib/llvm-14/lib",
        trees=trees,
        uses=[f"{LIB}/libLLVM-14.so.1", "usr/lib/llvm-14/lib/libclang-cpp.so.14"],
        run=run,
    )


def compile_unit(compiler: list[str], env: dict[str, str], scratch: Path, units: int) -> Run:
    """Compiles the generated C++ unit; both trees must give the same object file."""
    src = scratch / "unit.cc"
    if not src.exists():
        src.write_text(cxx_unit(units))
    cpu, wall, _ = run_timed([*compiler, "-std=c++17", "-O2", "-c", "unit.cc", "-o", "unit.o"], env, scratch)
    return Run(cpu, wall, digest(scratch / "unit.o"))


def gcc(size: Size) -> Setup:
    driver = shutil.which("g++-12")
    if not driver:
        raise Unavailable("g++-12 is not installed (its driver runs the unpacked cc1plus through -B)")
    trees = debian_trees("gcc", ["cpp-12", "g++-12"])
    libexec = "usr/lib/gcc/x86_64-linux-gnu/12"

    def run(tree: Path, scratch: Path) -> Run:
        # -B makes the system's driver run the tree's cc1plus (and as, ld from PATH).
        return compile_unit([driver, "-B", f"{tree}/{libexec}/"], clean_env(), scratch, size.cxx_units)

    return Setup(
        command=f"g++-12 -B TREE/{libexec}/ -std=c++17 -O2 -c (generated unit, {size.cxx_units} blocks)",
        trees=trees,
        uses=[f"{libexec}/cc1plus"],
        run=run,
    )


def python(size: Size) -> Setup:
    trees = debian_trees("python", ["python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib"])
    script = WORKLOADS_DIR / "pyperf_kernels.py"

    def run(tree: Path, scratch: Path) -> Run:
        # Bytecode is cached in the side's scratch directory, never in the trees.
        cache = scratch / "pycache"
        argv = [str(tree / "usr/bin/python3.11"), "-I", "-X", f"pycache_prefix={cache}", str(script)]
        cpu, wall, out = run_timed([*argv, str(size.py_scale)], clean_env(), scratch)
        return Run(cpu, wall, out.decode())

    return Setup(
        command=f"TREE/usr/bin/python3.11 -I bench/workloads/pyperf_kernels.py {size.py_scale}",
        trees=trees,
        uses=["usr/bin/python3.11"],
        run=run,
    )


def postgres(size: Size) -> Setup:
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError as e:
        raise Unavailable("no user 'nobody' to run the server as (postgres refuses to run as root)") from e
    trees = debian_trees("postgres", ["postgresql-15", "postgresql-client-15", "libpq5"])
    bindir = "usr/lib/postgresql/15/bin"
    # One cluster in a private directory (the system's server, if any, is never touched):
    # a Unix socket there, no TCP. The server runs as nobody.
    home = Path(tempfile.mkdtemp(prefix="hugify-speedup-pg-"))
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    as_nobody: dict[str, Any] = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    original = trees.original
    client = clean_env(LD_LIBRARY_PATH=f"{original}/{LIB}")
    pgbench = [str(original / bindir / "pgbench"), "-h", str(home), "-U", "bench"]

    @contextlib.contextmanager
    def serving(tree: Path) -> Iterator[list[float]]:
        """The server of `tree` while the block runs; then, after a fast shutdown, the
        CPU time of the server and every process it forked, in the list it yields."""
        argv = [str(tree / bindir / "postgres"), "-D", str(home / "data"), "-k", str(home)]
        argv += ["-c", "listen_addresses=", "-c", "fsync=off"]
        with (home / "server.log").open("ab") as log:
            p = subprocess.Popen(
                argv, env=clean_env(LD_LIBRARY_PATH=f"{tree}/{LIB}"), cwd=home, stdout=log, stderr=log, **as_nobody
            )
        cpu: list[float] = []
        try:
            deadline = time.monotonic() + 60
            pid_file = home / "data" / "postmaster.pid"
            while not (pid_file.exists() and "ready" in pid_file.read_text()):
                if p.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start: {(home / 'server.log').read_text()[-500:]}")
                time.sleep(0.02)
            yield cpu
        except BaseException:
            p.kill()
            reap(p)
            raise
        p.send_signal(signal.SIGINT)
        code, used = reap(p)
        if code != 0:
            raise RuntimeError(f"postgres exited with {code}")
        cpu.append(used)

    try:
        subprocess.run(
            [str(original / bindir / "initdb"), "-D", str(home / "data"), "-A", "trust", "-U", "bench", "--no-sync"],
            env=client, cwd=home, check=True, capture_output=True, **as_nobody,
        )  # fmt: skip
        with serving(original):
            init = [*pgbench, "-i", "-q", "-s", str(size.pg_scale), "postgres"]
            subprocess.run(init, env=client, check=True, capture_output=True)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise

    def run(tree: Path, scratch: Path) -> Run:
        with serving(tree) as server_cpu:
            cpu, wall, out = run_timed(
                [*pgbench, "-S", "-n", "-t", str(size.pg_transactions), "postgres"], client, scratch
            )
        done = next((line for line in out.decode().splitlines() if "actually processed" in line), "")
        return Run(cpu + server_cpu[0], wall, done)

    return Setup(
        command=f"postgres -D DATA -k DIR (TREE/{bindir}); pgbench -S -n -t {size.pg_transactions} "
        f"(scale {size.pg_scale}, Unix socket); CPU of server and client",
        trees=trees,
        uses=[f"{bindir}/postgres"],
        run=run,
        close=lambda: shutil.rmtree(home, ignore_errors=True),
    )


def itlb(size: Size) -> Setup:
    """The upper bound: 8192 functions 4 KiB apart (32 MiB of code) called in a
    shuffled order, built with gcc as a PIE and transformed with `hugify transform`."""
    if not shutil.which("gcc"):
        raise Unavailable("gcc is not installed")
    source = itlb_program(8192)
    cc = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    key = hashlib.sha256(f"{source}{ITLB_CFLAGS}{cc}{code_key()}".encode()).hexdigest()[:16]
    with cached_dir("itlb", key) as (d, done):
        if not done:
            for side in ("original", "hugified"):
                (d / side).mkdir()
            (d / "itlb.c").write_text(source)
            subprocess.run(["gcc", *ITLB_CFLAGS, "-o", d / "original/itlb", d / "itlb.c"], check=True)
            out = hugify("transform", "--json", d / "original/itlb", "-o", d / "hugified/itlb").stdout
            (d / "transform.json").write_text(out)
    res = json.loads((d / "transform.json").read_text())["result"]

    def run(tree: Path, scratch: Path) -> Run:
        cpu, wall, out = run_timed([str(tree / "itlb"), str(size.itlb_rounds)], clean_env(), scratch)
        return Run(cpu, wall, out.decode())

    return Setup(
        command=f"itlb {size.itlb_rounds} (gcc {' '.join(ITLB_CFLAGS)}; hugify transform)",
        trees=Trees(
            d / "original",
            d / "hugified",
            {"itlb": {"status": "transformed", "reason": None, "detail": "", "growth": res["growth"]}},
            {"itlb"},
        ),
        uses=["itlb"],
        run=run,
    )


def anonymous(workload: Callable[[Size], Setup]) -> Callable[[Size], Setup]:
    """The workload with side B in the anonymous-copy mode."""

    def setup(size: Size) -> Setup:
        if not AUDIT_LIB.is_file():
            raise Unavailable(f"{AUDIT_LIB} is not built (make -C runtime)")
        s = workload(size)
        s.anonymous = True
        s.command += "; hugified side: LD_AUDIT=libhugify-audit.so HUGIFY_ANONYMOUS=always"
        return s

    return setup


def shared(workload: Callable[[Size], Setup]) -> Callable[[Size], Setup]:
    """The workload with side B's files on a tmpfs without huge pages and the code mapped
    from root's shared copies (measure() puts them there and makes the copies)."""

    def setup(size: Size) -> Setup:
        if not AUDIT_LIB.is_file():
            raise Unavailable(f"{AUDIT_LIB} is not built (make -C runtime)")
        if os.geteuid() != 0:
            raise Unavailable("the shared copies are root's to make (run as root)")
        s = workload(size)
        s.shared = True
        s.command += "; hugified side: on a tmpfs without huge pages, LD_AUDIT=libhugify-audit.so, root's shared copies"
        return s

    return setup


def files_on_tmpfs(tree: Path, scratch: Path) -> Path:
    """A copy of the tree on a tmpfs without huge pages (unmounted by unmount_under)."""
    size = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink())
    where = scratch / "files"
    where.mkdir()
    opts = f"size={size + (64 << 20)},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "speedup-files", str(where)], check=True)
    shutil.copytree(tree, where / "tree", symlinks=True)
    return where / "tree"


def unmount_under(scratch: Path) -> None:
    """Unmounts what a run mounted below its scratch directory (deepest first)."""
    real = os.path.realpath(scratch)
    points = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(real)
    ]
    for where in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", where], check=False, capture_output=True)


WORKLOADS: dict[str, Callable[[Size], Setup]] = {
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
    size: Size
    quick: bool
    min_pairs: int
    max_pairs: int
    budget: float
    target: float


def mib(n: int | float) -> str:
    return f"{n / MIB:.1f} MiB"


def advise(paths: list[Path], advice: int) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, advice)
        finally:
            os.close(fd)


def windows_of(path: Path) -> tuple[list[int], str]:
    """The whole huge-page windows the runtime would load (hugify's prefetch engine),
    or why there are none."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return list(read_windows(fd, HP).offsets), ""
    except NotHugified as e:
        return [], str(e)
    finally:
        os.close(fd)


def cache_drops() -> int:
    """How often anyone wrote to /proc/sys/vm/drop_caches since boot."""
    with open("/proc/vmstat") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("drop_pagecache ")), 0)


def merge(into: dict[str, Seen], sampler: Sampler, dropped: bool) -> None:
    """Adds what one run's sampler saw; `dropped`: the page cache was dropped while
    the run lasted (a window faulted after that is read in small folios)."""
    for rel, s in sampler.seen.items():
        t = into[rel]
        t.paths |= s.paths
        t.pmd, t.rss = max(t.pmd, s.pmd), max(t.rss, s.rss)
        t.huge |= s.huge
        if dropped:
            t.small_after_drop |= s.small
        else:
            t.small |= s.small
        for w, who in s.small_in.items():
            t.small_in.setdefault(w, who)


def run_pairs(one: Callable[[str], Run], opts: Options) -> tuple[list[dict[str, Any]], str]:
    """Pairs of runs, AB then BA, until the interval of the CPU ratio is narrow enough
    or a limit is reached; the pairs, and what stopped them. Both sides must agree on
    every run's check."""
    if not opts.quick:  # warm-up: bytecode caches, shared libraries, server data files
        one("A")
        one("B")
    pairs: list[dict[str, Any]] = []
    checks: set[str] = set()
    start = time.monotonic()
    while True:
        order = "AB" if len(pairs) % 2 == 0 else "BA"
        runs = {side: one(side) for side in order}
        checks |= {runs["A"].check, runs["B"].check}
        pairs.append(
            {
                "order": order,
                "original_cpu": round(runs["A"].cpu, 4),
                "hugified_cpu": round(runs["B"].cpu, 4),
                "original_wall": round(runs["A"].wall, 4),
                "hugified_wall": round(runs["B"].wall, 4),
            }
        )
        cpu = [p["hugified_cpu"] / p["original_cpu"] for p in pairs]
        if len(checks) > 1:
            raise RuntimeError(f"the original and the hugified runs disagree: {sorted(checks)}")
        if opts.quick:
            return pairs, "--quick: one pair"
        ci = bootstrap(cpu)
        if len(pairs) >= opts.min_pairs and ci and (ci[1] - ci[0]) / 2 / statistics.median(cpu) < opts.target:
            return pairs, f"95 % interval of the CPU ratio within +-{opts.target:.0%}"
        if len(pairs) >= opts.max_pairs:
            return pairs, f"--max-pairs {opts.max_pairs} reached"
        if time.monotonic() - start > opts.budget:
            return pairs, f"--budget {opts.budget:.0f} s spent"


def measure(setup: Setup, opts: Options, scratch: Path) -> dict[str, Any]:
    if setup.shared:
        setup.trees = replace(setup.trees, hugified=files_on_tmpfs(setup.trees.hugified, scratch))
    real = {
        side: {rel: Path(os.path.realpath(root / rel)) for rel in setup.uses}
        for side, root in (("A", setup.trees.original), ("B", setup.trees.hugified))
    }
    for rel, p in real["B"].items():
        if not p.is_file() or not real["A"][rel].is_file():
            raise Unavailable(f"the unpacked packages have no {rel}")
    hug = real["B"]
    listed = [rel for rel in setup.uses if rel in setup.trees.manifest]
    rundir = scratch / "run"  # hugify prefetch records its kernel verdict here, not in /run
    rundir.mkdir()

    # What the files should give: inspect's plan of the hugified copy, and the windows.
    inspected = {
        Path(r["path"]).resolve(): r for r in json.loads(hugify("inspect", "--json", *hug.values(), check=False).stdout)
    }
    windows = {rel: windows_of(p) for rel, p in hug.items()}

    # The page cache before every run (untimed): every file a side uses is cached, the
    # original ones in small folios, as the kernel's own faults leave them here (not by
    # read(), which gives large folios on this kernel: the original libLLVM, mapped at a
    # 2 MiB-aligned address at offset 0, then gets PMD mappings it would not otherwise
    # have); the manifest's files have their windows in 2 MiB folios (hugify prefetch,
    # as the runtime does at boot and in hugify-run). Refreshed before each run: other
    # processes on the machine drop caches.
    advise([*real["A"].values(), *hug.values()], os.POSIX_FADV_DONTNEED)
    first: dict[str, Any] = {}
    reloaded = [0]

    def prepare(side: str) -> None:
        if side == "B" and listed:
            res = hugify("prefetch", "--json", "--runtime-dir", rundir, *(hug[r] for r in listed), check=False)
            doc = json.loads(res.stdout)
            if doc.get("refused"):
                raise Unavailable(f"hugify prefetch: {doc['refused']}")
            if first:
                again = [w for f in doc["files"] for w in f.get("windows", []) if w["state"] in ("loaded", "repaired")]
                reloaded[0] += len(again)
            else:
                first.update(zip(listed, doc["files"], strict=True))
        advise(list(real[side].values()), os.POSIX_FADV_WILLNEED)

    prepare("B")
    prefetched = first
    engine = Engine(HP)  # hugify's engine makes the kernel calls (PAGEMAP_SCAN) for the sampler
    scan = engine if engine.has(Engine.PAGEMAP_SCAN) else None
    seen = {side: {rel: Seen() for rel in setup.uses} for side in ("A", "B")}
    samples = {"A": 0, "B": 0}
    dropped_runs = {"A": 0, "B": 0}
    window_list = {rel: w for rel, (w, _) in windows.items()}
    anon_held = [0]

    def one(side: str) -> Run:
        tree = setup.trees.original if side == "A" else setup.trees.hugified
        sampler = Sampler(real[side], window_list if side == "B" else {}, scan)
        if side == "B" and setup.shared:
            sampler.store = f"{rundir}/shared/"
        work = scratch / side
        work.mkdir(exist_ok=True)
        prepare(side)
        drops = cache_drops()
        side_env.clear()
        if side == "B" and setup.anonymous:
            side_env.update(LD_AUDIT=str(AUDIT_LIB), HUGIFY_ANONYMOUS="always")
        if side == "B" and setup.shared:
            side_env.update(LD_AUDIT=str(AUDIT_LIB), HUGIFY_RUNTIME_DIR=str(rundir))
        try:
            with sampling(sampler):
                r = setup.run(tree, work)
        finally:
            side_env.clear()
        anon_held[0] = max(anon_held[0], sampler.anon_held)
        for pid in sampler.copied_in:  # the perf maps the runtime wrote for the copies
            Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)
        dropped = cache_drops() != drops
        merge(seen[side], sampler, dropped)
        samples[side] += sampler.samples
        dropped_runs[side] += dropped
        return r

    pairs, stopped = run_pairs(one, opts)
    cpu = [p["hugified_cpu"] / p["original_cpu"] for p in pairs]
    wall = [p["hugified_wall"] / p["original_wall"] for p in pairs]

    status: dict[str, Any] = {}
    shared_held = None
    if listed:
        doc = json.loads(hugify("status", "--json", "--runtime-dir", rundir, *(hug[r] for r in listed)).stdout)
        status = {rel: f for rel, f in zip(listed, doc["files"], strict=True)}
        shared_held = doc["shared_copies"]["held_bytes"] if setup.shared else None

    objects: dict[str, Any] = {}
    problems: list[str] = []
    notes: list[str] = []
    for side, label in (("A", "original"), ("B", "hugified")):
        for rel in setup.uses:
            s = seen[side][rel]
            want = str(real[side][rel])
            if want not in s.paths:
                problems.append(f"{rel}: the {label} runs were never seen mapping {want} ({samples[side]} samples)")
            for other in sorted(s.paths - {want}):
                problems.append(f"{rel}: the {label} runs mapped another copy: {other}")
    for rel in setup.uses:
        obj, why = describe(
            rel,
            setup,
            inspected=inspected.get(hug[rel]),
            windows=windows[rel],
            prefetched=prefetched.get(rel),
            status=status.get(rel),
        )
        a, b = seen["A"][rel], seen["B"][rel]
        good = {w["offset"] for w in (prefetched.get(rel) or {}).get("windows", []) if w["state"] in GOOD_STATES}
        wins = windows[rel][0]
        obj["seen"] = b.as_json() | {
            "windows_huge": len(b.huge),
            "windows_small": [f"{w:#x}" for w in sorted(b.small)],
            "windows_small_after_cache_drop": [f"{w:#x}" for w in sorted(b.small_after_drop - b.small)],
            "windows_not_executed": len(set(wins) - b.huge - b.small - b.small_after_drop),
        }
        obj["original_seen"] = a.as_json()
        for w in sorted(b.small & good):
            problems.append(f"{rel}: window {w:#x} was prefetched huge but {b.small_in[w]} mapped it with small pages")
        for w in sorted((b.small_after_drop - b.small) & good):
            notes.append(
                f"{rel}: window {w:#x} was mapped with small pages by {b.small_in[w]}, during whose run another "
                "process dropped the page cache"
            )
        predicted = len(wins) * HP
        after_drop = len(b.small_after_drop - b.small)
        obj["coverage"] = (
            f"{why}; predicted {mib(predicted)} huge ({len(wins)} windows), seen {mib(b.pmd)} PMD-mapped in one "
            f"process ({len(b.huge)} windows huge, {len(b.small)} on small pages"
            f"{f' and {after_drop} more after a cache drop' if after_drop else ''}, "
            f"{obj['seen']['windows_not_executed']} not executed); original: {mib(a.pmd)} PMD-mapped"
        )
        objects[rel] = obj
    return {
        "status": "measured",
        "command": setup.command,
        "pairs": len(pairs),
        "stopped": stopped,
        "cpu_ratio": ratio_summary(cpu),
        "wall_ratio": ratio_summary(wall),
        "original": {"cpu_median_s": statistics.median(p["original_cpu"] for p in pairs),
                     "wall_median_s": statistics.median(p["original_wall"] for p in pairs)},
        "hugified": {"cpu_median_s": statistics.median(p["hugified_cpu"] for p in pairs),
                     "wall_median_s": statistics.median(p["hugified_wall"] for p in pairs)},
        "per_pair": pairs,
        "samples": samples,
        "windows_prefetched_again": reloaded[0],
        "anonymous": setup.anonymous,
        "anonymous_held": anon_held[0] if setup.anonymous else None,
        "shared": setup.shared,
        "shared_held": shared_held,
        "runs_with_cache_drops": dropped_runs,
        "objects": objects,
        "page_cache": {
            "hugified_2m_folios": sum(o["folio_bytes_after"] or 0 for o in objects.values()),
            "original_resident_code": sum(seen["A"][r].rss for r in setup.uses),
            "hugified_resident_code": sum(seen["B"][r].rss for r in setup.uses),
            "growth_on_disk": sum(o["growth"] or 0 for o in objects.values()),
        },
        "problems": problems,
        "notes": notes,
    }  # fmt: skip


def describe(
    rel: str,
    setup: Setup,
    *,
    inspected: dict[str, Any] | None,
    windows: tuple[list[int], str],
    prefetched: dict[str, Any] | None,
    status: dict[str, Any] | None,
) -> tuple[dict[str, Any], str]:
    """What the transform step, inspect, prefetch and status said about one object,
    and a one-line summary of it."""
    tr = setup.trees.files.get(rel, {"status": "not an ELF file hugify saw", "reason": None, "detail": ""})
    obj: dict[str, Any] = {
        "transform": {k: tr.get(k) for k in ("status", "reason", "detail")},
        "in_manifest": rel in setup.trees.manifest,
        "growth": tr.get("growth"),
        "predicted": {
            "covered_code": inspected.get("covered_before") if inspected else None,
            "code_bytes": inspected.get("code_bytes") if inspected else None,
            "windows": len(windows[0]),
            "no_windows": windows[1] or None,
        },
        "prefetched": None,
        "folio_bytes_after": status.get("huge_bytes") if status else None,
    }
    if prefetched:
        states: dict[str, int] = {}
        for w in prefetched.get("windows", []):
            states[w["state"]] = states.get(w["state"], 0) + 1
        obj["prefetched"] = {
            "huge_bytes": prefetched.get("huge_bytes"),
            "states": states,
            "error": prefetched.get("error"),
        }
    code = f"inspect: {mib(obj['predicted']['covered_code'] or 0)} of code in whole windows"
    if windows[1]:
        code += f" (to the runtime: {windows[1]})"
    if rel not in setup.trees.manifest:
        why = tr.get("reason") or tr["status"]
        return obj, f"not in manifest ({tr['status']}: {why}), not prefetched; {code}"
    huge = obj["prefetched"]["huge_bytes"] if obj["prefetched"] else 0
    return obj, f"{tr['status']}; {code}; prefetched {mib(huge or 0)} as 2 MiB folios"


# --- report ------------------------------------------------------------------------------


def interval(r: dict[str, Any]) -> str:
    ci = r["ci95"]
    return f"{r['median']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{r['median']:.3f} [no interval]"


def held(r: dict[str, Any]) -> str:
    """What the copies held: the anonymous ones (most in one process), or the shared ones
    (once for all processes)."""
    if r.get("anonymous"):
        return f"{mib(r['anonymous_held'])} anon"
    if r.get("shared") and r.get("shared_held") is not None:
        return f"{mib(r['shared_held'])} shared"
    return "-"


def print_report(results: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'workload':9} {'pairs':>5}  {'CPU hug/orig [95 % CI]':26} {'wall hug/orig [95 % CI]':26} "
        f"{'orig CPU':>9}  {'seen huge':>10}  {'2M folios':>10}  {'orig code':>10}  {'growth':>9}  {'copies held':>10}"
    )
    for name, r in results.items():
        if r["status"] != "measured":
            print(f"{name:9} {r['status']}: {r['reason']}")
            continue
        seen = sum(o["seen"]["pmd_mapped"] for o in r["objects"].values())
        pc = r["page_cache"]
        print(
            f"{name:9} {r['pairs']:5}  {interval(r['cpu_ratio']):26} {interval(r['wall_ratio']):26} "
            f"{r['original']['cpu_median_s']:8.2f}s  {mib(seen):>10}  {mib(pc['hugified_2m_folios']):>10}  "
            f"{mib(pc['original_resident_code']):>10}  {mib(pc['growth_on_disk']):>9}  "
            f"{held(r):>10}"
        )
    for name, r in results.items():
        if r["status"] != "measured":
            continue
        print(f"\n{name}: {r['command']}; stopped: {r['stopped']}")
        if r["windows_prefetched_again"]:
            print(f"  {r['windows_prefetched_again']} windows were prefetched again before a run (the cache lost them)")
        drops = r["runs_with_cache_drops"]
        if drops["A"] or drops["B"]:
            print(f"  the page cache was dropped by another process during {drops['A']} + {drops['B']} runs")
        for rel, o in r["objects"].items():
            print(f"  {rel}: {o['coverage']}")
        for p in r["problems"]:
            print(f"  problem: {p}")
        for n in r["notes"]:
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
    ap.add_argument("--quick", action="store_true", help="one pair per workload, smallest inputs (the test)")
    ap.add_argument("--only", metavar="W[,W...]", help=f"workloads to run, of: {', '.join(WORKLOADS)}")
    ap.add_argument("--json", metavar="OUT", type=Path, help="write the results as JSON here")
    ap.add_argument("--min-pairs", type=int, default=10, help="pairs before the interval may stop a workload (10)")
    ap.add_argument("--max-pairs", type=int, default=40, help="most pairs per workload (40)")
    ap.add_argument("--budget", type=float, default=900, help="seconds of pairs per workload (900)")
    ap.add_argument("--target", type=float, default=0.02, help="stop at this half-width of the interval (0.02)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    opts = Options(QUICK if args.quick else FULL, args.quick, args.min_pairs, args.max_pairs, args.budget, args.target)
    results: dict[str, dict[str, Any]] = {}
    host = machine()
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"hugify-speedup-{name}-"))
        setup = None
        try:
            setup = WORKLOADS[name](opts.size)
            results[name] = measure(setup, opts, scratch)
        except Unavailable as e:
            results[name] = {"status": "unavailable", "reason": str(e)}
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            results[name] = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
        finally:
            if setup:
                setup.close()
            unmount_under(scratch)
            shutil.rmtree(scratch, ignore_errors=True)
    host["loadavg_end"] = os.getloadavg()
    print_report(results)
    if args.json:
        doc = {
            "hugify_speedup": 1,
            "machine": host,
            "policy": POLICY,
            "options": {"quick": args.quick, "min_pairs": args.min_pairs, "max_pairs": args.max_pairs,
                        "budget_s": args.budget, "target": args.target, "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                        "bootstrap_seed": BOOTSTRAP_SEED},
            "workloads": results,
        }  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
