"""Runs inside a kernel-matrix guest whose root carries glibc 2.44 (testkit/vm/glibc_thp.py),
as the oneshot unit hugify-glibc-thp.service after multi-user.target, with the guest's
own python3. Writes one JSON document to the second serial port and powers off
(guest_driver.drive).

What it records, in the THP mode booted: the glibc the guest runs, the default
read_ahead_kb of its virtio disk, and for each read_ahead_kb of READ_AHEAD (the default
first) and each way the tunable glibc.elf.thp can be set — "off" (not set), "env"
(GLIBC_TUNABLES=glibc.elf.thp=1 in the program's environment) and "system"
(glibc.elf.thp=1 in /etc/tunables.conf, then ldconfig) — a cold start (caches dropped)
of the hugified program (its library a DT_NEEDED), of a small program that dlopen()s the
library, and of the program listed as-is, each with the matrix's probe preloaded
(FilePmdMapped of every executable mapping at exit) and LD_DEBUG=files (ld.so's own
"madvise (...) returns N" lines); then `hugify status --json`, whose windows say how
the page cache holds each file, and in the "system" case also `hugify status`'s text
(its glibc.elf.thp hint).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from guest_driver import DLOPEN, EXEC, LIB, PROG, drive, drop_caches, json_of, probed, run, thp_mode

DISK = Path("/sys/block/vda/queue/read_ahead_kb")
TUNABLES_CONF = Path("/etc/tunables.conf")
#: read_ahead_kb values measured besides the disk's default: the kernel's own default
#: (VM_READAHEAD_PAGES) and what a disk reporting a 4 MiB optimal I/O size gets (a
#: cloud VM's virtio disk, the hugify development VM's among them).
READ_AHEAD = (128, 8192)
SETTINGS = ("off", "env", "system")
PROGRAMS = {"program": [PROG], "dlopen": [str(DLOPEN), LIB], "as-is": [EXEC]}
MADVISE_LINE = re.compile(r"madvise \((0x[0-9a-f]+), (0x[0-9a-f]+), MADV_HUGEPAGE\) returns (-?\d+)")


def ldconfig() -> dict[str, Any]:
    return run("/usr/sbin/ldconfig")


def set_system_wide(on: bool) -> dict[str, Any]:
    if on:
        TUNABLES_CONF.write_text("glibc.elf.thp=1\n")
    else:
        TUNABLES_CONF.unlink(missing_ok=True)
    return ldconfig()


def list_tunable() -> str:
    out = str(run("/lib64/ld-linux-x86-64.so.2", "--list-tunables")["stdout"])
    return next((line for line in out.splitlines() if line.startswith("glibc.elf.thp:")), "")


def cold_start(argv: list[str], setting: str) -> dict[str, Any]:
    drop_caches()
    env = {"LD_DEBUG": "files"}
    if setting == "env":
        env["GLIBC_TUNABLES"] = "glibc.elf.thp=1"
    res = probed(*argv, env=env)
    stderr = str(res.pop("stderr"))
    res["madvise"] = [list(m) for m in MADVISE_LINE.findall(stderr)]
    res["stderr_tail"] = stderr[-1500:] if res["rc"] else ""
    status = json_of("hugify", "status", "--json", PROG, LIB, EXEC)
    res["windows"] = {f["path"]: [w["state"] for w in f.get("windows", [])] for f in status.get("files", [])}
    return res


def measure() -> dict[str, Any]:
    started = time.monotonic()
    default = int(DISK.read_text())
    out: dict[str, Any] = {
        "uname": os.uname().release,
        "root_fs": run("findmnt", "-no", "FSTYPE", "/")["stdout"].strip(),
        "thp": thp_mode(),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
        "read_ahead_default": default,
        "tunable_before": list_tunable(),
        "runs": {},
    }
    try:
        for ra in dict.fromkeys((default, *READ_AHEAD)):
            DISK.write_text(f"{ra}\n")
            per_ra: dict[str, Any] = {}
            for setting in SETTINGS:
                if setting == "system":
                    out["ldconfig"] = set_system_wide(True)
                per_ra[setting] = {name: cold_start(argv, setting) for name, argv in PROGRAMS.items()}
                if setting == "system":
                    per_ra[setting]["tunable"] = list_tunable()
                    per_ra[setting]["status"] = json_of("hugify", "status", "--json")
                    per_ra[setting]["status_text"] = run("hugify", "status")["stdout"]
                    set_system_wide(False)
            out["runs"][str(ra)] = per_ra
    finally:
        DISK.write_text(f"{default}\n")
        set_system_wide(False)
    out["tunable_after"] = list_tunable()
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


if __name__ == "__main__":
    drive(measure)
