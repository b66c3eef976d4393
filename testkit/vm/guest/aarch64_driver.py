#!/usr/bin/python3
"""PID 1 of the arm64 guest (testkit/vm/aarch64.py, tests/test_aarch64_boot.py): Debian 13's
python3 on a root that holds the test package built for arm64 with branch protection,
an equivalent library built without it (/opt/nobti), hugify built for arm64, and the
tools beside this file. Mounts what a program needs, runs the cases, writes one JSON
document to the results disk (the virtio disk of RESULTS_SIZE bytes) and powers off.

What it records, every program run with bti_probe.so preloaded (each process reports
every mapping of its own smaps at exit: VmFlags, FilePmdMapped, AnonHugePages):
- the machine: uname, the CPU's features, HWCAP2's BTI bit, THP, the root's filesystem;
- bti-check: whether a call through a function pointer to code without a landing pad
  traps in a PROT_BTI page and not in a plain one (BTI enforced here);
- the hugified program with its library, and with the library built without branch
  protection (LD_LIBRARY_PATH=/opt/nobti), run: plainly (cold, and cached in small
  folios), after `hugify prefetch` (cold), through the audit library with the files
  cached in small folios (its repair replaces the windows' mappings), in the
  anonymous-copy mode (HUGIFY_ANONYMOUS=always: each window replaced by an anonymous
  copy), through hugify-run, and the library loaded with dlopen() under the audit
  library; `hugify prefetch --json` and `hugify status --json` where they ran.
The host judges; this only records.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# The kernel matrix's guest driver, beside this file: how programs are run and caches dropped.
from guest_driver import drop_caches, json_of, run

WORK = Path("/hugify-bti")
PROBE = WORK / "bti_probe.so"
CHECK = WORK / "bti-check"
DLOPEN = WORK / "dlopen-lib"
PROBE_OUT = Path("/run/hugify-bti-probe.jsonl")
PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/aarch64-linux-gnu/libhugdebtest.so.1"
NOBTI_DIR = "/opt/nobti"
NOBTI = f"{NOBTI_DIR}/libhugdebtest.so.1"
AUDIT_LIB = "/usr/lib/hugify/libhugify-audit.so"
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: The size of the disk the results go to (testkit/vm/aarch64.py makes it).
RESULTS_SIZE = 4 << 20
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/root"}
AT_HWCAP2, HWCAP2_BTI = 26, 1 << 17

libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str) -> None:
    Path(target).mkdir(parents=True, exist_ok=True)
    if libc.mount(source.encode(), target.encode(), fstype.encode(), 0, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {fstype} on {target}")


def probed(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """argv run with the probe preloaded: its result and every exiting process's mappings."""
    PROBE_OUT.unlink(missing_ok=True)
    res = run(*argv, env={"LD_PRELOAD": str(PROBE), "HUGIFY_PROBE_OUT": str(PROBE_OUT), **(env or {})})
    res["processes"] = [json.loads(line) for line in PROBE_OUT.read_text().splitlines()] if PROBE_OUT.exists() else []
    res["debug"] = [line for line in str(res["stderr"]).splitlines() if "hugify" in line]
    return res


def set_cache(state: str) -> None:
    """ "cold": nothing cached; "small": the files read plainly with read(), in small folios."""
    drop_caches()
    if state == "small":
        for path in (PROG, LIB, NOBTI):
            with open(path, "rb", buffering=0) as f:
                while f.read(65536):
                    pass


def hwcap2() -> int:
    aux = Path("/proc/self/auxv").read_bytes()
    for i in range(0, len(aux) - 15, 16):
        key, value = int.from_bytes(aux[i : i + 8], "little"), int.from_bytes(aux[i + 8 : i + 16], "little")
        if key == AT_HWCAP2:
            return value
    return 0


def machine() -> dict[str, Any]:
    cpu = Path("/proc/cpuinfo").read_text()
    features = next((line.split(":", 1)[1].split() for line in cpu.splitlines() if line.startswith("Features")), [])
    root = next(line.split() for line in Path("/proc/mounts").read_text().splitlines() if line.split()[1] == "/")
    return {
        "uname": os.uname().release,
        "cmdline": Path("/proc/cmdline").read_text().strip(),
        "cpu_features": features,
        "hwcap2_bti": bool(hwcap2() & HWCAP2_BTI),
        "thp": THP.read_text().strip(),
        "root_fs": root[2],
        "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
    }


def cases() -> dict[str, Any]:
    audit = {"LD_AUDIT": AUDIT_LIB, "HUGIFY_DEBUG": "1"}
    anonymous = {**audit, "HUGIFY_ANONYMOUS": "always", "HUGIFY_PERF_MAP": "0"}
    nobti = {"LD_LIBRARY_PATH": NOBTI_DIR}
    plan: dict[str, tuple[str, list[dict[str, Any]]]] = {
        "plain": ("cold", [{"run": [PROG]}]),
        "plain-nobti": ("cold", [{"run": [PROG], "env": nobti}]),
        "plain-small": ("small", [{"run": [PROG]}]),
        "prefetch": ("cold", [{"prefetch": ["--all"]}, {"run": [PROG]}, {"status": []}]),
        "prefetch-nobti": ("cold", [{"prefetch": [PROG, NOBTI]}, {"run": [PROG], "env": nobti}, {"status": [NOBTI]}]),
        "repair": ("small", [{"run": [PROG], "env": audit}, {"status": []}]),
        "repair-nobti": ("small", [{"run": [PROG], "env": {**audit, **nobti}}, {"status": [NOBTI]}]),
        "anonymous": ("cold", [{"run": [PROG], "env": anonymous}]),
        "anonymous-nobti": ("cold", [{"run": [PROG], "env": {**anonymous, **nobti}}]),
        "hugify-run": ("small", [{"run": ["hugify-run", PROG], "env": {"HUGIFY_DEBUG": "1"}}]),
        "dlopen": ("small", [{"run": [str(DLOPEN), LIB], "env": audit}]),
    }
    out = {}
    for name, (cache, steps) in plan.items():
        started = time.monotonic()
        set_cache(cache)
        done = []
        for step in steps:
            if "prefetch" in step:
                done.append({"prefetch": json_of("hugify", "prefetch", "--json", *step["prefetch"])})
            elif "status" in step:
                done.append({"status": json_of("hugify", "status", "--json", *step["status"])})
            else:
                done.append(probed(*step["run"], env=step.get("env")))
        out[name] = {"cache": cache, "steps": done, "seconds": round(time.monotonic() - started, 1)}
    return out


def main() -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {"machine": machine(), "bti_check": json.loads(str(run(str(CHECK))["stdout"]))}
    results["cases"] = cases()
    results["driver_seconds"] = round(time.monotonic() - started, 1)
    return results


def results_disk() -> str:
    for dev in sorted(Path("/sys/block").glob("vd*")):
        if int((dev / "size").read_text()) * 512 == RESULTS_SIZE:
            return f"/dev/{dev.name}"
    raise RuntimeError("no results disk")


def report(results: dict[str, Any]) -> None:
    data = ("HUGIFY-MATRIX-BEGIN\n" + json.dumps(results, sort_keys=True) + "\nHUGIFY-MATRIX-END\n").encode()
    if len(data) > RESULTS_SIZE:
        data = ("HUGIFY-MATRIX-BEGIN\n" + json.dumps({"driver_error": f"results of {len(data)} bytes"})).encode()
        data += b"\nHUGIFY-MATRIX-END\n"
    fd = os.open(results_disk(), os.O_WRONLY)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def boot() -> None:
    """As PID 1: the filesystems a program expects, the cases, the report, power off
    (whatever happens: PID 1 must not exit)."""
    os.environ.update(ENV)  # the kernel gives PID 1 next to no environment
    try:
        mount("proc", "/proc", "proc")
        mount("sysfs", "/sys", "sysfs")
        mount("tmpfs", "/run", "tmpfs")
        mount("tmpfs", "/tmp", "tmpfs")
        Path("/run/hugify").mkdir()
        try:
            report(main())
        except Exception:
            report({"driver_error": traceback.format_exc()})
    except Exception:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os.sync()
        libc.reboot(0x4321FEDC)  # LINUX_REBOOT_CMD_POWER_OFF


if __name__ == "__main__":
    boot()
