"""Runs inside a guest of bench/boot_cost_vm.py, as the unit hugify-boot-cost.service
(Type=exec after multi-user.target, so that the boot counts as finished for
systemd-analyze), with the guest's own python3 (standard library only). Writes one JSON
document to the second serial port between the kernel matrix's markers
(testkit/vm/boot.py reads it) and powers off, as the matrix's guest driver does.

What it records:
- the boot: systemd-analyze's total, the manager's timestamps, hugify-prefetch.service's
  start and exit (monotonic), result, and the bytes its cgroup read (systemd's
  io.stat of the unit's cgroup, printed by ExecStopPost: IOAccounting is on for
  the service in this image), when basic.target (which waits for it) was reached, the
  page cache the hugified files hold (mincore) and `hugify status --json`;
- then ROUNDS rounds, each case once per round in a shuffled order, each from dropped
  caches and an empty /run/hugify (so that the run is the boot's first, as at boot):
  `cat` of the hugified files (the peer), and the service started again by systemctl
  with /etc/hugify/policy.toml's [runtime] boot_budget set to each of BUDGETS; per run
  its time (the unit's ExecMain timestamps; cat's wall time), bytes read (the unit's
  cgroup; for both, the disk's sectors read in /sys/block/vda/stat), the
  page cache the files hold afterwards (mincore) and the windows `hugify status` finds
  huge.

The kernel's command line gives hugify.rounds=N and hugify.budgets=B,... (bytes; -1:
no bound).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import mmap
import os
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

SERVICE = "hugify-prefetch.service"
MANIFESTS = Path("/usr/lib/hugify/manifest.d")
RUNTIME_DIR = Path("/run/hugify")
ADMIN_POLICY = Path("/etc/hugify/policy.toml")
DISK_STAT = Path("/sys/block/vda/stat")
UNBOUNDED = -1
#: What "no bound" is written as in the policy (a size cannot be negative there).
UNBOUNDED_BYTES = 1 << 50
TIMESTAMPS = "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic,InvocationID,Result,ExecMainStatus"

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def run(*argv: str, timeout: int = 900) -> dict[str, Any]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return {"argv": list(argv), "rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}


def cmdline_arg(name: str, default: str) -> str:
    for arg in Path("/proc/cmdline").read_text().split():
        if arg.startswith(f"hugify.{name}="):
            return arg.split("=", 1)[1]
    return default


def hugified_files() -> list[str]:
    """The files the installed manifests list (what the service loads)."""
    paths: list[str] = []
    for m in sorted(MANIFESTS.glob("*.list")):
        for line in m.read_text().splitlines():
            if line and not line.startswith("#"):
                paths.append(line.split("\t", 1)[0])
    return sorted(set(paths))


def cached_bytes(paths: list[str]) -> int:
    """Bytes of the files in the page cache (mincore of a mapping of each)."""
    total = 0
    for p in paths:
        size = os.stat(p).st_size
        if not size:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {p}")
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            try:
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {p}")
                total += sum(b & 1 for b in vec.raw)
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total * PAGE


def disk_read_bytes() -> int:
    return int(DISK_STAT.read_text().split()[2]) * 512  # sectors read (field 3), 512 bytes each


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def show(unit: str, props: str) -> dict[str, str]:
    out = run("systemctl", "show", "-p", props, unit)["stdout"]
    return dict(line.split("=", 1) for line in str(out).splitlines() if "=" in line)


def manager_times() -> dict[str, str]:
    props = "KernelTimestampMonotonic,UserspaceTimestampMonotonic,FinishTimestampMonotonic"
    out = run("systemctl", "show", "-p", props)
    return dict(line.split("=", 1) for line in str(out["stdout"]).splitlines() if "=" in line)


def io_accounting() -> dict[str, str]:
    """Why a unit's read bytes are (not) known: the controllers and systemd's settings."""
    cg = Path("/sys/fs/cgroup")
    out = {
        name: (cg / name).read_text().strip() if (cg / name).exists() else "-"
        for name in ("cgroup.controllers", "cgroup.subtree_control", "system.slice/cgroup.subtree_control")
    }
    out["unit"] = str(run("systemctl", "show", "-p", "IOAccounting,IOReadBytes", SERVICE)["stdout"]).strip()
    out["manager"] = str(run("systemctl", "show", "-p", "DefaultIOAccounting")["stdout"]).strip()
    return out


def unit_read_bytes(invocation: str) -> int | None:
    """rbytes of the service's cgroup for this run: its io.stat, which the image's
    drop-in prints to the journal from ExecStopPost (systemd 252 removes the cgroup
    before it logs the run's resources, so its "Consumed" entry has no bytes)."""
    for _ in range(25 if invocation else 0):  # journald may not have stored it yet
        out = run("journalctl", "-b", "--no-pager", "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}")
        lines = [line for line in str(out["stdout"]).splitlines() if "rbytes=" in line]
        if lines:
            return sum(int(f.split("=")[1]) for line in lines for f in line.split() if f.startswith("rbytes="))
        time.sleep(0.2)
    return None


def service_run() -> dict[str, Any]:
    """The last run of the service: its duration (s), bytes read, result."""
    p = show(SERVICE, TIMESTAMPS)
    start, end = int(p.get("ExecMainStartTimestampMonotonic") or 0), int(p.get("ExecMainExitTimestampMonotonic") or 0)
    return {
        "seconds": (end - start) / 1e6 if start and end >= start else None,
        "start_s": start / 1e6,
        "read_bytes": unit_read_bytes(p.get("InvocationID", "")),
        "props": p,
    }


def windows(status: Any) -> dict[str, int]:
    """State -> number of windows, from `hugify status --json`."""
    out: dict[str, int] = {}
    for f in status.get("files", []) if isinstance(status, dict) else []:
        for w in f.get("windows", []):
            out[w["state"]] = out.get(w["state"], 0) + 1
    return out


def status() -> Any:
    res = run("hugify", "status", "--json")
    try:
        return json.loads(str(res["stdout"]))
    except ValueError:
        return {"error": res}


def reset_runtime_dir() -> None:
    """No record of this boot: the next prefetch is the boot's first (budgeted) run and
    probes the kernel again, as at boot."""
    for p in RUNTIME_DIR.iterdir() if RUNTIME_DIR.is_dir() else []:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def one_case(budget: int | None, files: list[str]) -> dict[str, Any]:
    """budget None: `cat` of the files; else the service with that boot_budget."""
    if budget is not None:
        ADMIN_POLICY.parent.mkdir(exist_ok=True)
        ADMIN_POLICY.write_text(f"[runtime]\nboot_budget = {UNBOUNDED_BYTES if budget == UNBOUNDED else budget}\n")
        reset_runtime_dir()
    drop_caches()
    disk0 = disk_read_bytes()
    t0 = time.monotonic()
    if budget is None:
        with open(os.devnull, "wb") as null:
            subprocess.run(["cat", *files], stdout=null, check=True)
        out: dict[str, Any] = {"seconds": time.monotonic() - t0}
    else:
        started = run("systemctl", "start", SERVICE)
        out = service_run() | {"systemctl_seconds": time.monotonic() - t0, "systemctl_rc": started["rc"]}
    out["disk_read_bytes"] = disk_read_bytes() - disk0
    out["cached_bytes"] = cached_bytes(files)
    if budget is not None:
        out["windows"] = windows(status())
    return out


def main() -> dict[str, Any]:
    run("systemctl", "is-system-running", "--wait", timeout=1800)  # until the boot is finished
    files = hugified_files()
    boot_cached = cached_bytes(files)  # before anything else reads: what the boot left in the page cache
    boot_status = status()
    results: dict[str, Any] = {
        "uname": os.uname().release,
        "root_fs": run("findmnt", "-no", "FSTYPE", "/")["stdout"].strip(),
        "thp": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip(),
        "files": len(files),
        "file_bytes": sum(os.stat(f).st_size for f in files),
        "boot": {
            "cached_bytes": boot_cached,
            "service": service_run(),
            "journal": run("journalctl", "-b", "--no-pager", "-o", "short-monotonic", "-u", SERVICE)["stdout"],
            "manager": manager_times(),
            "basic_target_s": int(
                show("basic.target", "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"]
            )
            / 1e6,
            "analyze": run("systemd-analyze", "time")["stdout"].strip(),
            "disk_read_bytes": disk_read_bytes(),
            "windows": windows(boot_status),
            "system": boot_status.get("system") if isinstance(boot_status, dict) else None,
            "io_accounting": io_accounting(),
        },
        "system_state": run("systemctl", "is-system-running")["stdout"].strip(),
        "failed_units": run("systemctl", "list-units", "--failed", "--plain", "--no-legend")["stdout"],
    }
    rounds = int(cmdline_arg("rounds", "2"))
    budgets = [int(b) for b in cmdline_arg("budgets", "0,67108864,268435456,536870912,-1").split(",")]
    cases: list[int | None] = [None, *budgets]
    rng = random.Random(12)
    results["rounds"] = []
    for _ in range(rounds):
        order = list(range(len(cases)))
        rng.shuffle(order)
        results["rounds"].append(
            {("cat" if cases[i] is None else str(cases[i])): one_case(cases[i], files) for i in order}
        )
    return results


def matrix_driver() -> Any:
    """The matrix's guest driver (testkit/vm/guest/guest_driver.py), which reports the
    results and powers off: every image made from the matrix's root holds it at
    /hugify-matrix. Loaded by its path there, so that the host (the tests import this
    file for its readers) never needs it."""
    spec = importlib.util.spec_from_file_location("guest_driver", "/hugify-matrix/guest_driver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    matrix_driver().drive(main)
