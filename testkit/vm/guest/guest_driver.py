"""Runs inside a kernel-matrix guest (testkit/vm/boot.py), as the oneshot unit
hugify-matrix.service after multi-user.target, with the guest's own python3 (standard
library only). Writes one JSON document to the second serial port and powers off.

What it records (every process reports from its own /proc/self/smaps through the
preloaded probe, testkit/vm/guest/probe.c):
- the boot: uname, the root's filesystem, THP mode, how hugify-prefetch.service ended
  and its journal, `hugify status --json`;
- for THP as booted and then the other mode (set through sysfs, the service run again),
  and for two page-cache states — "cold" (caches dropped) and "small" (the files read
  plainly with read(), so the cache holds them in small folios) — the hugified program
  (which links the hugified library) run:
    plain          the kernel alone, twice (the second finds the first one's page cache),
    prefetch       after `hugify prefetch --all --json`, then plainly,
    hugify-run     through hugify-run with HUGIFY_DEBUG=1,
    audit          through the audit library (LD_AUDIT), and the library loaded with
                   dlopen() by a small program, also under the audit library,
    anonymous      through the audit library in the opt-in anonymous-copy mode
                   (HUGIFY_ANONYMOUS=1: windows the filesystem cannot give huge are
                   copied into anonymous huge pages),
    anonymous-root-norun
                   `hugify-run --anonymous` as root with no runtime directory to be had
                   (NO_RUN: a chroot or container without /run),
    shared-*       hugify-run and the audit library (DT_NEEDED, dlopen) with root's
                   shared copies (issue 31: where the filesystem gives no large folios,
                   the boot service copied the files to a huge-page tmpfs, and the
                   processes map the code from it); every other way runs with
                   HUGIFY_SHARED=0, so that it says what the file-backed way (or the
                   anonymous mode) gives,
    held           (cold only) the program run plainly, its code held mapped for HOLD
                   seconds before the probe reads smaps, khugepaged scanning every
                   100 ms meanwhile: what khugepaged makes of it;
  each followed by `hugify status --json`; each run records how many pages khugepaged
  collapsed meanwhile (its pages_collapsed counter, any process's);
- the same for the non-PIE program listed as-is (as_is_ways: plain, prefetch,
  hugify-run, audit), whose whole windows alone can be PMD-mapped;
- in the THP mode the guest booted with, cold and small, the lld package's program with
  its library and its dlopen'ed plugin (lld_ways: prefetch, hugify-run, audit,
  anonymous, each with HUGIFY_SHARED=0 as the ways above; shared: through the audit
  library with the boot service's shared copies);
- pgpgin (/proc/vmstat, KiB read from disk) for STARTS starts of the program each way:
  plainly; through the audit library as root, with the records the boot's service kept, without
  the shared copies and with them;
  through the audit library and through hugify-run as a user who is not root, with no
  runtime directory (moved away for the series: what a boot without the service, a
  container or a chroot gives), and as root with none to be had (NO_RUN); each series
  from the program's files cached in small folios and from them cold, the tools cached
  (in the THP mode the guest booted with only); and after each cold series of a user's
  or of root's without a runtime directory, the program's code as a plain run maps it;
- a file unlike its filesystem: two copies of the library, one with data journalling
  (chattr +j, which ext4 from 6.16 gives no large folios), each measured without hugify
  (a cold window read through MADV_HUGEPAGE) and prefetched, with the records written;
- the anonymous-copy mode under the debuggers (issue 21; in the THP mode booted, mode on
  and off): PERF_RUNS runs of the program under Debian 12's `perf record -e cpu-clock`
  with `perf report`'s samples by object and symbol, and gdb stopped at a function of
  the program and one of its library, with backtraces, $pc and the mappings;
- the anonymous-copy mode with no free 2 MiB block (fragmented memory, provoked: every
  free block taken as a hugetlb page, compaction off) and the settings restored after.

`hugify.only=anonymous` on the kernel command line runs only the last two (for trying
them quickly by hand). `hugify.second_caches=cold` runs the THP mode not booted from
those cache states only (the suite's boots: testkit.vm.matrix.planned_caches).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

WORK = Path("/hugify-matrix")
PROBE = WORK / "probe.so"
DLOPEN = WORK / "dlopen-lib"
PROBE_OUT = Path("/run/hugify-matrix-probe.jsonl")
RESULTS_PORT = "/dev/ttyS1"
PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"
#: The non-PIE program (ET_EXEC) that dh_hugify listed as-is, without a rewrite.
EXEC = "/usr/libexec/hugify-deb-exec"
#: Package hugify-deb-test-lld, linked by lld: program and library shifted (their program
#: header table grown in place at e_phoff), the plugin the program opens with dlopen as-is.
LLD_DIR = "/usr/lib/hugify-deb-test-lld"
LLD_PROG, LLD_LIB, LLD_PLUGIN = (
    f"{LLD_DIR}/{n}" for n in ("hugify-deb-test-lld", "libhugdebtest-lld.so", "hugtest-lld-plugin.so")
)
#: The hugified files whose mappings the probe's reports are kept of.
OBJECTS = (PROG, LIB, EXEC, LLD_PROG, LLD_LIB, LLD_PLUGIN)
AUDIT_LIB = "/usr/lib/hugify/libhugify-audit.so"
#: Where the boot service keeps its shared copies (run-hugify-shared.mount); a copy is
#: named as its original is.
SHARED_DIR = "/run/hugify/shared/"
#: The audit library without the shared copies: the file-backed way (and the anonymous
#: mode) as they are by themselves.
NO_SHARED = {"HUGIFY_SHARED": "0"}
#: What root has in a chroot or a container without /run (issue 38 item 4): a runtime
#: directory that cannot be made, so nothing is kept between starts.
NO_RUN = {"HUGIFY_RUNTIME_DIR": "/nonexistent/run/hugify", **NO_SHARED}
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: Starts per series of the I/O check: ten tell "the windows read once" (their size,
#: within noise) from "read at every start" (ten times it), as twenty did, in half the
#: guest's time.
STARTS = 10
#: Runs of the program under one `perf record`: it computes for milliseconds only (under
#: TCG about 2000 samples of its code per run at PERF_PERIOD_NS), and the samples in its
#: code have to be enough to tell named from unnamed.
PERF_RUNS = 8
#: perf's cpu-clock sampling period (ns): 20 kHz, 5x perf's default rate.
PERF_PERIOD_NS = 50000
#: Functions of the copied code gdb stops in: the program's and its library's generated
#: dispatchers (tests/programs/gen_code.py), which run once per start.
GDB_BREAKS = ("exe_dispatch", "lib_dispatch")
HUGE_ORDER = 9  # a 2 MiB block is 2^9 pages of 4 KiB
HP = 2 << 20
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
FRAGMENT_SETTINGS = {
    # No compaction in a THP fault, none in the background, none for the hugetlb pages
    # (a fragmentation index never above the threshold): what is fragmented stays so.
    "defrag": (Path("/sys/kernel/mm/transparent_hugepage/defrag"), "never"),
    "compaction_proactiveness": (Path("/proc/sys/vm/compaction_proactiveness"), "0"),
    "extfrag_threshold": (Path("/proc/sys/vm/extfrag_threshold"), "1000"),
}
#: Free memory left out of the fragmenting allocation (its free 2 MiB blocks become
#: hugetlb pages), so that the system never runs short while the blocks are held.
FRAGMENT_MARGIN = 128 << 20
#: khugepaged's counter of collapsed huge pages (file and anonymous, every process's).
COLLAPSED = Path("/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed")
#: Seconds the "held" run keeps its code mapped: khugepaged wakes every 10 s by default
#: (scan_sleep_millisecs) and collapsed a held window within 25 s on 7.2 and 7.3; during
#: the run it wakes every 100 ms (KHUGEPAGED_FAST), so that whether it collapses the
#: code does not hang on when its pass reaches the process on a slow guest: 15 s are
#: 150 of its passes. Recorded with the case (the support table says it).
HOLD = 15
KHUGEPAGED = Path("/sys/kernel/mm/transparent_hugepage/khugepaged")
KHUGEPAGED_FAST = {
    "scan_sleep_millisecs": (KHUGEPAGED / "scan_sleep_millisecs", "100"),
    "alloc_sleep_millisecs": (KHUGEPAGED / "alloc_sleep_millisecs", "100"),
}


def run(*argv: str, env: dict[str, str] | None = None, timeout: int = 600) -> dict[str, Any]:
    res = subprocess.run(
        list(argv), capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout, check=False
    )
    return {"argv": list(argv), "rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}


def json_of(*argv: str) -> Any:
    res = run(*argv)
    try:
        return json.loads(str(res["stdout"]))
    except ValueError:
        return {"error": res}


def chosen(path: Path) -> str:
    """A setting's value; of sysfs's "always defer [madvise] never", the one chosen."""
    text = path.read_text().strip()
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else text


def thp_mode() -> str:
    return chosen(THP)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_plainly() -> None:
    """The files in small folios: read() in 64 KiB pieces after a drop."""
    drop_caches()
    for path in OBJECTS:
        with open(path, "rb", buffering=0) as f:
            while f.read(65536):
                pass


def set_cache(state: str) -> None:
    if state == "cold":
        drop_caches()
    else:
        read_plainly()


def vmstat(name: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/vmstat")


def pgpgin() -> int:
    return vmstat("pgpgin")


def probed(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs argv with the probe preloaded: its result and the smaps report of every
    process that exited (path -> size, FilePmdMapped of its executable mappings)."""
    PROBE_OUT.unlink(missing_ok=True)
    collapsed = int(COLLAPSED.read_text())
    res = run(*argv, env={"LD_PRELOAD": str(PROBE), "HUGIFY_PROBE_OUT": str(PROBE_OUT), **(env or {})})
    reports = [json.loads(line) for line in PROBE_OUT.read_text().splitlines()] if PROBE_OUT.exists() else []
    maps: dict[str, dict[str, int]] = {}
    anon = {"vmas": 0, "size": 0, "pmd": 0}
    originals = {Path(p).name: p for p in OBJECTS}
    for report in reports:
        for m in report["maps"]:
            if "anon" in m:
                anon["vmas"] += 1
                anon["size"] += m["size"]
                anon["pmd"] += m["pmd"]
            elif m["path"] in OBJECTS:
                cur = maps.setdefault(m["path"], {"size": 0, "pmd": 0, "shared": 0})
                cur["size"] += m["size"]
                cur["pmd"] += m["pmd"]
            elif m["path"].startswith(SHARED_DIR) and Path(m["path"]).name in originals:
                # A window mapped from the shared copy of one of them: its code, in
                # shared-memory huge pages (ShmemPmdMapped).
                cur = maps.setdefault(originals[Path(m["path"]).name], {"size": 0, "pmd": 0, "shared": 0})
                cur["size"] += m["size"]
                cur["pmd"] += m.get("shmem", 0)
                cur["shared"] += m["size"]
    res["maps"] = maps
    res["collapsed"] = int(COLLAPSED.read_text()) - collapsed
    res["anon_exec"] = anon
    res["debug"] = [line for line in str(res["stderr"]).splitlines() if "hugify" in line]
    return res


def ways() -> dict[str, list[dict[str, Any]]]:
    """How the program and the library can be run: name -> the steps after setting
    the cache state (the last step's smaps is the verdict of the row)."""
    shared = {"LD_AUDIT": AUDIT_LIB, "HUGIFY_DEBUG": "1"}
    audit = {**shared, **NO_SHARED}
    return {
        "plain": [{"run": [PROG]}, {"run": [PROG]}],
        "prefetch": [{"prefetch": True}, {"run": [PROG]}],
        "hugify-run": [{"run": ["hugify-run", PROG], "env": {"HUGIFY_DEBUG": "1", **NO_SHARED}}],
        "audit": [{"run": [PROG], "env": audit}],
        "audit-dlopen": [{"run": [str(DLOPEN), LIB], "env": audit}],
        "anonymous": [{"run": [PROG], "env": {**audit, "HUGIFY_ANONYMOUS": "1", "HUGIFY_PERF_MAP": "0"}}],
        "anonymous-root-norun": [
            {"run": ["hugify-run", "--anonymous", PROG], "env": {**NO_RUN, "HUGIFY_DEBUG": "1", "HUGIFY_PERF_MAP": "0"}}
        ],
        "shared-hugify-run": [{"run": ["hugify-run", PROG], "env": {"HUGIFY_DEBUG": "1"}}],
        "shared-audit": [{"run": [PROG], "env": shared}],
        "shared-audit-dlopen": [{"run": [str(DLOPEN), LIB], "env": shared}],
    }


#: The ways of ways() that run the program, run again for the program listed as-is.
AS_IS_WAYS = ("plain", "prefetch", "hugify-run", "audit")


def as_is_ways() -> dict[str, list[dict[str, Any]]]:
    """The ways named "as-is-" + each of AS_IS_WAYS: the same steps with the program
    listed as-is in the place of the hugified one (it links no hugified library)."""
    return {
        f"as-is-{name}": [
            {**step, "run": [EXEC if arg == PROG else arg for arg in step["run"]]} if "run" in step else step
            for step in steps
        ]
        for name, steps in ways().items()
        if name in AS_IS_WAYS
    }


def lld_ways() -> dict[str, list[dict[str, Any]]]:
    """The lld package's program, with its library (DT_NEEDED) and its plugin (dlopen),
    run the ways the program of ways() is (issue 32: lld's hugified objects were invisible
    to the audit library); every way but lld-shared without the shared copies, as in
    ways(), so that each says what the file-backed way (or the anonymous mode) gives."""
    argv = [LLD_PROG, LLD_PLUGIN]
    shared = {"LD_AUDIT": AUDIT_LIB, "HUGIFY_DEBUG": "1"}
    audit = {**shared, **NO_SHARED}
    return {
        "lld-prefetch": [{"prefetch": True}, {"run": argv}],
        "lld-hugify-run": [{"run": ["hugify-run", *argv], "env": {"HUGIFY_DEBUG": "1", **NO_SHARED}}],
        "lld-audit": [{"run": argv, "env": audit}],
        "lld-anonymous": [{"run": argv, "env": {**audit, "HUGIFY_ANONYMOUS": "1", "HUGIFY_PERF_MAP": "0"}}],
        "lld-shared": [{"run": argv, "env": shared}],
    }


def one_case(cache: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    started = time.monotonic()
    set_cache(cache)
    done: list[dict[str, Any]] = []
    for step in steps:
        if step.get("prefetch"):
            done.append({"prefetch": json_of("hugify", "prefetch", "--all", "--json")})
        else:
            argv = [str(a) for a in step["run"]]
            done.append(probed(*argv, env=step.get("env")))
    status = json_of("hugify", "status", "--json")
    return {"steps": done, "status": status, "seconds": round(time.monotonic() - started, 1)}


def service(name: str) -> dict[str, Any]:
    props = run("systemctl", "show", "-p", "ActiveState,Result,ExecMainCode,ExecMainStatus,InvocationID", name)
    return {
        "props": dict(line.split("=", 1) for line in str(props["stdout"]).splitlines() if "=" in line),
        "journal": run("journalctl", "-b", "--no-pager", "-o", "short-monotonic", "-u", name)["stdout"],
    }


def rerun_prefetch_service() -> dict[str, Any]:
    run("systemctl", "restart", "hugify-prefetch.service")
    return service("hugify-prefetch.service")


#: Runs argv as the user nobody: a process that may not keep records, and to which the
#: kernel does not tell which pages of root's files are cached.
AS_USER = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
RUNTIME_DIR = Path("/run/hugify")


def evict(paths: tuple[str, ...]) -> None:
    """The files dropped from the page cache (nothing maps them), every other file kept.
    Each is read whole first: eviction passes by pages still being read (a process's
    readahead in flight after it exited), and a read waits for them (as
    testkit.runtime.evict)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        while os.read(fd, 1 << 20):
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def small_folios(paths: tuple[str, ...]) -> None:
    """The files evicted and read again with read(), no readahead (POSIX_FADV_RANDOM):
    small folios also where the filesystem has large ones (its readahead grows them)."""
    evict(paths)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            while f.read(65536):
                pass


@contextlib.contextmanager
def no_runtime_dir() -> Iterator[None]:
    """No runtime directory for the block: what the runtime sees where no service ran."""
    away = RUNTIME_DIR.with_name("hugify.away")
    RUNTIME_DIR.rename(away)
    try:
        yield
    finally:
        away.rename(RUNTIME_DIR)


def io_check() -> dict[str, Any]:
    """KiB read from disk by STARTS starts of the program each way, each series from the
    program's files cached in small folios or cold, after one start of the same command
    line on /bin/true (the tools cached: hugify-run, the audit library, libc)."""
    series: dict[str, tuple[list[str], dict[str, str], bool]] = {
        "plain": ([PROG], {}, False),
        "audit": ([PROG], {"LD_AUDIT": AUDIT_LIB, **NO_SHARED}, False),
        "shared": ([PROG], {"LD_AUDIT": AUDIT_LIB}, False),
        "audit-user": ([*AS_USER, PROG], {"LD_AUDIT": AUDIT_LIB}, True),
        "hugify-run-user": ([*AS_USER, "hugify-run", PROG], {}, True),
        "audit-root-norun": ([PROG], {"LD_AUDIT": AUDIT_LIB, **NO_RUN}, False),
        "hugify-run-root-norun": (["hugify-run", PROG], NO_RUN, False),
    }
    files = (PROG, LIB)
    out: dict[str, Any] = {}
    for cache in ("small", "cold"):
        got: dict[str, Any] = {}
        for name, (argv, env, user) in series.items():
            with no_runtime_dir() if user else contextlib.nullcontext():
                run(*["/bin/true" if a == PROG else a for a in argv], env=env)
                if cache == "small":
                    small_folios(files)
                else:
                    evict(files)
                before = pgpgin()
                for _ in range(STARTS):
                    run(*argv, env=env)
                got[name] = pgpgin() - before
            if (user or name.endswith("-norun")) and cache == "cold":  # what the page cache holds afterwards
                got[f"{name}-maps"] = probed(PROG)["maps"]
        out[cache] = got
    return out


def elf_windows(path: str) -> list[int]:
    """File offsets of the whole 2 MiB windows of the executable PT_LOADs at offsets
    congruent to their addresses (ELF64, little-endian): read here, not by hugify."""
    import struct

    data = Path(path).read_bytes()
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    out = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_flags & 1 and (p_vaddr - p_offset) % HP == 0:
            start = (p_offset + HP - 1) // HP * HP
            out += list(range(start, (p_offset + p_filesz) // HP * HP, HP))
    return out


def cold_window_pmd_kib(path: str, offset: int) -> int:
    """FilePmdMapped (KiB) of a window of the file read from a cold cache through a
    MADV_HUGEPAGE mapping (2 MiB-aligned, PROT_READ): what the filesystem gives, seen
    without hugify."""
    import ctypes
    import re

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    evict((path,))
    res = libc.mmap(None, 2 * HP, 0, 0x22 | 0x4000, -1, 0)  # PROT_NONE, PRIVATE|ANONYMOUS|NORESERVE
    at = (res + HP - 1) & ~(HP - 1)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.mmap(at, HP, 1, 0x12, fd, offset) != at:  # PROT_READ, MAP_PRIVATE|MAP_FIXED
            return -1
        libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(HP), 14)  # MADV_HUGEPAGE
        ctypes.string_at(at, 1)
        block = Path("/proc/self/smaps").read_text().split(f"{at:x}-", 1)[1]
        found = re.search(r"FilePmdMapped:\s+(\d+)", block)
        return int(found.group(1)) if found else -1
    finally:
        libc.munmap(ctypes.c_void_p(res), ctypes.c_size_t(2 * HP))
        os.close(fd)


def file_verdict_check() -> dict[str, Any]:
    """Two copies of the library on the root's filesystem, the second with its data
    journalled (chattr +j: ext4 from 6.16 gives such a file no large folios, and refuses
    the flag on other filesystems); what each gets, measured without hugify, and what
    `hugify prefetch` of both reports and records in a runtime directory of its own."""
    d = Path("/var/lib/hugify-matrix-files")
    d.mkdir(exist_ok=True)
    plain, journalled = str(d / "plain.so"), str(d / "journalled.so")
    for path in (plain, journalled):
        Path(path).write_bytes(Path(LIB).read_bytes())
    chattr = run("chattr", "+j", journalled) if shutil.which("chattr") else {"rc": 127, "stderr": "no chattr"}
    os.sync()
    (window,) = elf_windows(LIB)[:1]
    measured = {path: cold_window_pmd_kib(path, window) for path in (plain, journalled)}
    rdir = Path("/run/hugify-matrix-files")
    subprocess.run(["rm", "-rf", str(rdir)], check=False)
    evict((plain, journalled))
    report = json_of("hugify", "prefetch", "--json", "--runtime-dir", str(rdir), plain, journalled)
    return {
        "chattr": chattr,
        "lsattr": run("lsattr", journalled)["stdout"] if shutil.which("lsattr") else "",
        "measured_pmd_kib": measured,
        "prefetch": report,
        "records": sorted(p.name for p in rdir.iterdir()) if rdir.is_dir() else [],
        "inodes": {path: os.stat(path).st_ino for path in (plain, journalled)},
        "device": f"{os.major(os.stat(plain).st_dev)}:{os.minor(os.stat(plain).st_dev)}",
    }


# --- the anonymous-copy mode under perf and gdb, and with fragmented memory --------------


def anonymous_env(mode: str) -> dict[str, str]:
    """The audit library's environment with the anonymous-copy mode `mode` ("" off)."""
    env = {"LD_AUDIT": AUDIT_LIB, "HUGIFY_DEBUG": "1", "HUGIFY_PERF_MAP": "0", **NO_SHARED}
    return {**env, "HUGIFY_ANONYMOUS": mode} if mode else env


def perf_binary() -> str:
    """Debian 12's perf: /usr/bin/perf in today's linux-perf; where the package has
    versioned ones (perf_6.1), /usr/bin/perf is a wrapper that wants the one of the
    running kernel's major.minor, which bookworm has only for its own 6.1."""
    versioned = sorted(Path("/usr/bin").glob("perf_[0-9]*"))
    return str(versioned[-1]) if versioned else "/usr/bin/perf"


def perf_case(mode: str) -> dict[str, Any]:
    """PERF_RUNS runs of the program under `perf record -e cpu-clock` (launched by it):
    the runs' output and debug lines, and perf report's rows (samples, object, symbol)."""
    perf = perf_binary()
    data = "/run/hugify-matrix-perf.data"
    env = " ".join(f"{k}={v}" for k, v in anonymous_env(mode).items())
    loop = f"for i in $(seq {PERF_RUNS}); do env {env} {PROG}; done"
    rec = run(perf, "record", "-q", "-e", "cpu-clock", "-c", str(PERF_PERIOD_NS), "-o", data, "--", "sh", "-c", loop)
    rep = run(perf, "report", "-i", data, "--stdio", "-q", "-n", "--sort", "dso,sym")
    Path(data).unlink(missing_ok=True)
    rows = []
    for line in str(rep["stdout"]).splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].endswith("%") and f[1].isdigit():
            rows.append({"samples": int(f[1]), "dso": f[2], "sym": " ".join(f[4:])})
    return {
        "perf": perf,
        "rc": rec["rc"],
        "planned": PERF_RUNS,
        "outputs": sorted(set(str(rec["stdout"]).splitlines())),
        "runs": len(str(rec["stdout"]).splitlines()),
        "debug": [line for line in str(rec["stderr"]).splitlines() if "hugify" in line],
        "report_rc": rep["rc"],
        "report_stderr": str(rep["stderr"])[-2000:],
        "rows": rows,
    }


def gdb_case(mode: str) -> dict[str, Any]:
    """The program under gdb -batch with the audit library (and the mode): stops at
    GDB_BREAKS in turn with a backtrace and $pc each; the mappings at the first stop,
    the shared libraries at the second."""
    cmds = ["set breakpoint pending on", *(f"set environment {k}={v}" for k, v in anonymous_env(mode).items())]
    cmds += [f"break {f}" for f in GDB_BREAKS]
    cmds += ["run", "bt", "p/x $pc", "info proc mappings", "continue", "bt", "p/x $pc", "info sharedlibrary", "kill"]
    res = run("gdb", "-nx", "-batch", *(x for c in cmds for x in ("-ex", c)), PROG)
    return {"rc": res["rc"], "output": str(res["stdout"]) + str(res["stderr"])}


def free_huge_blocks() -> dict[str, int]:
    """Free blocks of 2 MiB or more per zone (/proc/buddyinfo), counted in 2 MiB blocks."""
    out = {}
    for line in Path("/proc/buddyinfo").read_text().splitlines():
        f = line.split()
        zone, counts = f[3], [int(n) for n in f[4:]]
        out[zone] = out.get(zone, 0) + sum(n << (o - HUGE_ORDER) for o, n in enumerate(counts) if o >= HUGE_ORDER)
    return out


def meminfo(name: str) -> int:
    """A /proc/meminfo value in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) << 10
    raise RuntimeError(f"no {name} in /proc/meminfo")


def fragment_memory() -> mmap.mmap:
    """Most of the free memory in small pages (MADV_NOHUGEPAGE), every other page of it
    given back: half of it stays free, in blocks of one page that cannot merge. Held
    until the mapping is closed."""
    page = mmap.PAGESIZE
    size = max(meminfo("MemFree") - FRAGMENT_MARGIN, 0) // page * page
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_NOHUGEPAGE)
    for off in range(0, size, page):
        m[off] = 1
    for off in range(0, size, 2 * page):
        m.madvise(mmap.MADV_DONTNEED, off, page)
    return m


def take_free_huge_blocks() -> list[dict[str, int]]:
    """Takes the free 2 MiB blocks as hugetlb pages: asks for as many more as buddyinfo
    shows (no more: the kernel would reclaim to make them), again while blocks come back
    (freed pages merging) and the kernel gives them. Blocks left in ZONE_DMA are what its
    reserve for the zones above keeps from any huge page (runtime/hp_verdict.c
    hp_buddy_block does not count them either). What buddyinfo said at each round."""
    rounds = []
    for _ in range(20):
        free = free_huge_blocks()
        rounds.append(free)
        before = int(NR_HUGEPAGES.read_text())
        if not sum(free.values()):
            break
        NR_HUGEPAGES.write_text(f"{before + sum(free.values())}\n")
        if int(NR_HUGEPAGES.read_text()) == before:
            break
    return rounds


def current(values: dict[str, tuple[Path, str]]) -> dict[str, str]:
    """What the kernel settings (name -> (sysfs/procfs file, value)) are now."""
    return {name: chosen(path) for name, (path, _) in values.items()}


@contextlib.contextmanager
def settings(values: dict[str, tuple[Path, str]]) -> Iterator[dict[str, str]]:
    """The kernel settings (name -> (sysfs/procfs file, value)) for the block, and what
    they were afterwards; yields what they were."""
    saved = current(values)
    try:
        for path, value in values.values():
            path.write_text(value + "\n")
        yield saved
    finally:
        for name, (path, _) in values.items():
            path.write_text(saved[name] + "\n")


def held_case() -> dict[str, Any]:
    """The program run plainly from a cold cache, its code held mapped for HOLD seconds
    while khugepaged scans often: what the kernel makes of code that stays mapped."""
    with settings(KHUGEPAGED_FAST):
        return one_case("cold", [{"run": [PROG], "env": {"HUGIFY_PROBE_HOLD": str(HOLD)}}]) | {"hold_seconds": HOLD}


def fragmented_case() -> dict[str, Any]:
    """The program in the anonymous-copy mode (always: every window tried, on any
    filesystem) with no free 2 MiB block; then everything as it was."""
    with settings(FRAGMENT_SETTINGS) as saved:
        out = {"saved": saved, **fragmented_run()}
    out["free_after"] = free_huge_blocks()
    out["restored"] = current(FRAGMENT_SETTINGS)
    out["hugetlb_pages_after"] = int(NR_HUGEPAGES.read_text())
    return out


def fragmented_run() -> dict[str, Any]:
    out: dict[str, Any] = {"free_before": free_huge_blocks()}
    held = None
    try:
        drop_caches()
        held = fragment_memory()
        out["fragmenter_bytes"] = len(held)
        out["rounds"] = take_free_huge_blocks()
        out["hugetlb_pages"] = int(NR_HUGEPAGES.read_text())
        out["mem_free"] = meminfo("MemFree")
        fallback = vmstat("thp_fault_fallback")
        out["run"] = probed(PROG, env=anonymous_env("always"))
        out["thp_fault_fallback"] = vmstat("thp_fault_fallback") - fallback
        out["free_during"] = free_huge_blocks()
    finally:
        NR_HUGEPAGES.write_text("0\n")
        if held is not None:
            held.close()
    return out


def anonymous_checks() -> dict[str, Any]:
    started = time.monotonic()
    out: dict[str, Any] = {
        "plain": probed(PROG),
        "perf": {"on": perf_case("1"), "off": perf_case("")},
        "gdb": {"on": gdb_case("always"), "off": gdb_case("")},
        "fragmented": fragmented_case(),
    }
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def second_caches() -> tuple[str, ...]:
    """The cache states the THP mode not booted runs from: all, unless the kernel's
    command line names them (hugify.second_caches=cold,small)."""
    for arg in Path("/proc/cmdline").read_text().split():
        if arg.startswith("hugify.second_caches="):
            return tuple(arg.split("=", 1)[1].split(","))
    return ("cold", "small")


def main() -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "uname": os.uname().release,
        "root_fs": run("findmnt", "-no", "FSTYPE", "/")["stdout"].strip(),
        "boot_thp": thp_mode(),
        "system_state": run("systemctl", "is-system-running")["stdout"].strip(),
        "failed_units": run("systemctl", "list-units", "--failed", "--plain", "--no-legend")["stdout"],
        "boot_service": service("hugify-prefetch.service"),
        "boot_status": json_of("hugify", "status", "--json"),
        "thp": {},
    }
    boot_mode = thp_mode()
    modes: tuple[str, ...] = (boot_mode, "madvise" if boot_mode != "madvise" else "always")
    if "hugify.only=anonymous" in Path("/proc/cmdline").read_text().split():
        modes = ()
        results["anonymous_checks"] = anonymous_checks()
    for mode in modes:
        entry: dict[str, Any] = {}
        if mode != thp_mode():
            THP.write_text(mode + "\n")
            entry["service"] = rerun_prefetch_service()
        caches = ("cold", "small") if mode == boot_mode else second_caches()
        entry["cases"] = {
            cache: {name: one_case(cache, steps) for name, steps in {**ways(), **as_is_ways()}.items()}
            for cache in caches
        }
        entry["cases"]["cold"]["held"] = held_case()
        if mode == boot_mode:  # the I/O check does not depend on the THP mode: measured once per boot
            entry["pgpgin_kib"] = io_check()
            results["io_starts"] = STARTS
            entry["lld"] = {
                cache: {name: one_case(cache, steps) for name, steps in lld_ways().items()}
                for cache in ("cold", "small")
            }
            results["anonymous_checks"] = anonymous_checks()
            results["file_verdicts"] = file_verdict_check()
        results["thp"][mode] = entry
    results["driver_seconds"] = round(time.monotonic() - started, 1)
    return results


def report(results: dict[str, Any]) -> None:
    """The results to the host, which reads them from the second serial port."""
    with open(RESULTS_PORT, "w") as port:
        port.write("HUGIFY-MATRIX-BEGIN\n" + json.dumps(results, sort_keys=True) + "\nHUGIFY-MATRIX-END\n")
        port.flush()


def drive(measure: Callable[[], dict[str, Any]]) -> None:
    """Runs a guest's measurement, reports its results (or its error: the host must see
    why, not only that nothing came) and powers the guest off; testkit/vm/guest/boot_cost_guest.py
    drives its guest with it too."""
    try:
        report(measure())
    except Exception as e:
        report({"driver_error": repr(e)})
        sys.exit(1)
    finally:
        subprocess.run(["systemctl", "--no-block", "poweroff"], check=False)


if __name__ == "__main__":
    drive(main)
