"""Runs inside a kernel-matrix guest (tests/vm_boot.py), as the oneshot unit
hugify-matrix.service after multi-user.target, with the guest's own python3 (standard
library only). Writes one JSON document to the second serial port and powers off.

What it records (every process reports from its own /proc/self/smaps through the
preloaded probe, tests/vm/probe.c):
- the boot: uname, the root's filesystem, THP mode, how hugify-prefetch.service ended
  and its journal, `hugify status --json`;
- for THP as booted and then the other mode (set through sysfs, the service run again),
  and for two page-cache states — "cold" (caches dropped) and "small" (the files read
  plainly with read(), so the cache holds them in small folios) — the hugified program
  (which links the hugified library) run:
    plain          the kernel alone (and a second plain run: the kernel's own readahead),
    prefetch       after `hugify prefetch --all --json`, then plainly,
    hugify-run     through hugify-run with HUGIFY_DEBUG=1,
    audit          through the audit library (LD_AUDIT), and the library loaded with
                   dlopen() by a small program, also under the audit library,
    anonymous      through the audit library in the opt-in anonymous-copy mode
                   (HUGIFY_ANONYMOUS=1: windows the filesystem cannot give huge are
                   copied into anonymous huge pages),
    held           (cold only) the program run plainly, its code held mapped for HOLD
                   seconds before the probe reads smaps: what khugepaged makes of it;
  each followed by `hugify status --json`; each run records how many pages khugepaged
  collapsed meanwhile (its pages_collapsed counter, any process's);
- pgpgin (/proc/vmstat, KiB read from disk) for 20 plain starts and 20 starts through
  the audit library, each series starting from the files cached in
  small folios (in the THP mode the guest booted with only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORK = Path("/hugify-matrix")
PROBE = WORK / "probe.so"
DLOPEN = WORK / "dlopen-lib"
PROBE_OUT = Path("/run/hugify-matrix-probe.jsonl")
RESULTS_PORT = "/dev/ttyS1"
PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"
AUDIT_LIB = "/usr/lib/hugify/libhugify-audit.so"
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
STARTS = 20
#: khugepaged's counter of collapsed huge pages (file and anonymous, every process's).
COLLAPSED = Path("/sys/kernel/mm/transparent_hugepage/khugepaged/pages_collapsed")
#: Seconds the "held" run keeps its code mapped: khugepaged wakes every 10 s
#: (scan_sleep_millisecs) and collapsed a held window within 25 s on 7.2 and 7.3.
HOLD = 30


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


def thp_mode() -> str:
    text = THP.read_text()
    return text[text.index("[") + 1 : text.index("]")]


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_plainly() -> None:
    """The files in small folios: read() in 64 KiB pieces after a drop."""
    drop_caches()
    for path in (PROG, LIB):
        with open(path, "rb", buffering=0) as f:
            while f.read(65536):
                pass


def set_cache(state: str) -> None:
    if state == "cold":
        drop_caches()
    else:
        read_plainly()


def pgpgin() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgpgin "):
            return int(line.split()[1])
    raise RuntimeError("no pgpgin in /proc/vmstat")


def probed(*argv: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs argv with the probe preloaded: its result and the smaps report of every
    process that exited (path -> size, FilePmdMapped of its executable mappings)."""
    PROBE_OUT.unlink(missing_ok=True)
    collapsed = int(COLLAPSED.read_text())
    res = run(*argv, env={"LD_PRELOAD": str(PROBE), "HUGIFY_PROBE_OUT": str(PROBE_OUT), **(env or {})})
    reports = [json.loads(line) for line in PROBE_OUT.read_text().splitlines()] if PROBE_OUT.exists() else []
    maps: dict[str, dict[str, int]] = {}
    anon = {"vmas": 0, "size": 0, "pmd": 0}
    for report in reports:
        for m in report["maps"]:
            if "anon" in m:
                anon["vmas"] += 1
                anon["size"] += m["size"]
                anon["pmd"] += m["pmd"]
            elif m["path"] in (PROG, LIB):
                cur = maps.setdefault(m["path"], {"size": 0, "pmd": 0})
                cur["size"] += m["size"]
                cur["pmd"] += m["pmd"]
    res["maps"] = maps
    res["collapsed"] = int(COLLAPSED.read_text()) - collapsed
    res["anon_exec"] = anon
    res["debug"] = [line for line in str(res["stderr"]).splitlines() if "hugify" in line]
    return res


def ways() -> dict[str, list[dict[str, Any]]]:
    """How the program and the library can be run: name -> the steps after setting
    the cache state (the last step's smaps is the verdict of the row)."""
    audit = {"LD_AUDIT": AUDIT_LIB, "HUGIFY_DEBUG": "1"}
    return {
        "plain": [{"run": [PROG]}, {"run": [PROG]}],
        "prefetch": [{"prefetch": True}, {"run": [PROG]}],
        "hugify-run": [{"run": ["hugify-run", PROG], "env": {"HUGIFY_DEBUG": "1"}}],
        "audit": [{"run": [PROG], "env": audit}],
        "audit-dlopen": [{"run": [str(DLOPEN), LIB], "env": audit}],
        "anonymous": [{"run": [PROG], "env": {**audit, "HUGIFY_ANONYMOUS": "1", "HUGIFY_PERF_MAP": "0"}}],
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


def io_check() -> dict[str, int]:
    """KiB read from disk by STARTS starts of the program, each series from the files
    cached in small folios."""
    series = {
        "plain": ([PROG], {}),
        "audit": ([PROG], {"LD_AUDIT": AUDIT_LIB}),
    }
    out = {}
    for name, (argv, env) in series.items():
        read_plainly()
        before = pgpgin()
        for _ in range(STARTS):
            run(*argv, env=env)
        out[name] = pgpgin() - before
    return out


def main() -> None:
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
    for mode in (boot_mode, "madvise" if boot_mode != "madvise" else "always"):
        entry: dict[str, Any] = {}
        if mode != thp_mode():
            THP.write_text(mode + "\n")
            entry["service"] = rerun_prefetch_service()
        entry["cases"] = {
            cache: {name: one_case(cache, steps) for name, steps in ways().items()} for cache in ("cold", "small")
        }
        entry["cases"]["cold"]["held"] = one_case("cold", [{"run": [PROG], "env": {"HUGIFY_PROBE_HOLD": str(HOLD)}}])
        if mode == boot_mode:  # the I/O check does not depend on the THP mode: measured once per boot
            entry["pgpgin_kib"] = io_check()
        results["thp"][mode] = entry
    results["driver_seconds"] = round(time.monotonic() - started, 1)
    with open(RESULTS_PORT, "w") as port:
        port.write("HUGIFY-MATRIX-BEGIN\n" + json.dumps(results, sort_keys=True) + "\nHUGIFY-MATRIX-END\n")
        port.flush()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the host must see why, not only that nothing came
        with open(RESULTS_PORT, "w") as port:
            port.write("HUGIFY-MATRIX-BEGIN\n" + json.dumps({"driver_error": repr(e)}) + "\nHUGIFY-MATRIX-END\n")
        sys.exit(1)
    finally:
        subprocess.run(["systemctl", "--no-block", "poweroff"], check=False)
