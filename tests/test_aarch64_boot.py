"""Issue 32 item 4, proven on arm64 for real: Debian 13's arm64 kernel booted under
qemu-system-aarch64 (TCG, `-cpu max`: BTI enforced), on XFS, with the test package
cross-built for arm64 with Debian 13's branch protection (testkit/vm/aarch64.py says how
each piece is built and cached). In the guest, every window the runtime replaces keeps
PROT_BTI (VmFlags `bt`) exactly where ld.so gave its object PROT_BTI: after `hugify
prefetch`, after the audit library's repair (the window's mapping made afresh) and in
its anonymous copies; an equivalent library built without branch protection never gets
it, and the program, which calls through function pointers into both, runs with the
same output every way. The verdicts hold as on x86: windows loaded and repaired as
2 MiB folios (FilePmdMapped), copies as anonymous PMDs (AnonHugePages).

On the runtime before PROT_BTI was kept (5e7ab4b) the repaired and copied windows of the
BTI-marked program and library come without `bt`: the assertions on "repair" and
"anonymous" fail there."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit import HP
from testkit.vm.aarch64 import boot, cross_built_package, hugify_stage
from testkit.vm.boot import BootResult

PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/aarch64-linux-gnu/libhugdebtest.so.1"
NOBTI = "/opt/nobti/libhugdebtest.so.1"


@dataclass(frozen=True)
class Window:
    """One 2 MiB window of an object's executable mapping in a process."""

    start: int
    bt: bool  # VmFlags "bt": PROT_BTI
    anonymous: bool  # the runtime's anonymous copy in place of the file mapping
    pmd: bool  # FilePmdMapped (file) or AnonHugePages (copy) covers it


def windows(step: dict[str, Any], path: str) -> list[Window]:
    """The executable windows of `path` in the (last) process of a probed step: its
    file mappings, and the anonymous executable mappings that replaced some of them (an
    anonymous mapping belongs to the object whose file mapping precedes it)."""
    assert step["processes"], f"no process reported: rc {step['rc']}, {step['stderr'][-2000:]}"
    out, owner = [], ""
    for v in step["processes"][-1]["vmas"]:
        if v["path"].startswith("/"):
            owner = v["path"]
        anonymous = v["path"] == "" or v["path"].startswith("[anon:")
        if "x" not in v["perms"] or owner != path or not (v["path"] == path or anonymous):
            continue
        size = v["end"] - v["start"]
        pmd = v.get("anon_huge" if anonymous else "file_pmd", 0) >= size
        bt = "bt" in v.get("flags", "").split()
        out += [Window(a, bt, anonymous, pmd) for a in range(v["start"], v["end"], HP) if a % HP == 0]
    return out


def case(booted: BootResult, name: str) -> dict[str, Any]:
    return dict(booted.results["cases"][name])


def ran(booted: BootResult, name: str) -> dict[str, Any]:
    """The case's probed run (its one step that ran a program)."""
    return next(s for s in case(booted, name)["steps"] if "processes" in s)


def prefetch_states(booted: BootResult, name: str, path: str) -> list[str]:
    report = next(s["prefetch"] for s in case(booted, name)["steps"] if "prefetch" in s)
    return [w["state"] for f in report["files"] if f["path"] == path for w in f["windows"]]


def status_states(booted: BootResult, name: str, path: str) -> list[str]:
    report = next(s["status"] for s in case(booted, name)["steps"] if "status" in s)
    return [w["state"] for f in report.get("files", []) if f["path"] == path for w in f.get("windows", [])]


def copy_counts(step: dict[str, Any], path: str) -> tuple[int, int] | None:
    """(copied, windows) of the audit library's anonymous-mode line for `path` (by file
    name: ld.so names the library by the path it found, /lib/… on a merged-/usr root)."""
    for line in step["debug"]:
        m = re.match(rf"hugify-audit: anonymous \S*/{re.escape(Path(path).name)}: (\d+)/(\d+) windows copied", line)
        if m:
            return int(m[1]), int(m[2])
    return None


def _properties(path: Path) -> str:
    return subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def booted() -> BootResult:
    return boot()


def test_arm64_windows_keep_bti_where_their_object_has_it(booted: BootResult) -> None:
    package = cross_built_package().ok()
    # What was built: the program and library marked BTI by Debian 13's flags, the
    # library built without branch protection not, the audit library marked too (ld.so
    # maps it with PROT_BTI: its own entry points need landing pads).
    root = package.dir / "root"
    for marked in (root / PROG.lstrip("/"), root / LIB.lstrip("/")):
        assert "AArch64 feature: BTI, PAC" in _properties(marked), marked
    assert "BTI" not in _properties(package.dir / "nobti" / "hugified.so")
    assert "AArch64 feature: BTI, PAC" in _properties(hugify_stage() / "usr/lib/hugify/libhugify-audit.so")

    m = booted.results["machine"]
    assert m["hwcap2_bti"] and "bti" in m["cpu_features"] and m["root_fs"] == "xfs", m
    # BTI is enforced in this guest: a call to code without a landing pad traps in a
    # PROT_BTI page, and returns in a plain one; so `bt` is what decides.
    check = booted.results["bti_check"]
    assert check["bti_page"] == f"signal {check['sigill']}" and check["plain_page"] == "exit 42", check

    wrong: list[str] = []
    outputs: dict[str, set[str]] = {}
    for name in case_names(booted):
        step = ran(booted, name)
        if step["rc"] != 0:
            wrong.append(f"{name}: exit {step['rc']}: {step['stderr'][-1500:]}")
            continue
        nobti = "nobti" in name
        outputs.setdefault("dlopen" if name == "dlopen" else "nobti" if nobti else "bti", set()).add(step["stdout"])
        paths = [LIB] if name == "dlopen" else [PROG, NOBTI if nobti else LIB]
        for path in paths:
            ws = windows(step, path)
            if not ws:
                wrong.append(f"{name}: no executable window of {path}")
            expect_bt = path != NOBTI
            for w in ws:
                if w.bt != expect_bt:
                    wrong.append(f"{name}: {path} window at {w.start:#x}: bt {w.bt}, its object's is {expect_bt}")
            how = expected_way(name)
            if how == "small" and any(w.pmd for w in ws):
                wrong.append(f"{name}: {path} PMD-mapped from small folios without hugify: {ws}")
            if how in ("file", "anonymous") and not all(w.pmd and w.anonymous == (how == "anonymous") for w in ws):
                wrong.append(f"{name}: {path} not all {how} PMDs: {ws}")
            if how == "anonymous" and copy_counts(step, path) != (len(ws), len(ws)):
                wrong.append(f"{name}: {path}: {step['debug']}")
    # The program calls through function pointers into every window: one output every
    # way, with either library (the same source), so the landing pads are where BTI looks.
    if outputs.get("bti") != outputs.get("nobti") or len(outputs.get("bti", ())) != 1:
        wrong.append(f"outputs differ: {outputs}")
    if not all(out.startswith("hugify-deb-test: ") for out in outputs.get("bti", ())):
        wrong.append(f"unexpected output: {outputs}")
    if [out.split(":")[0] for out in outputs.get("dlopen", ())] != ["lib_entry"]:
        wrong.append(f"dlopen-lib's output: {outputs.get('dlopen')}")
    # The verdicts: cold windows loaded by prefetch (the kernel reads none as a PMD at
    # the fault on 6.12), every window huge afterwards, repaired ones too.
    for name, path in (("prefetch", PROG), ("prefetch", LIB), ("prefetch-nobti", NOBTI)):
        if set(prefetch_states(booted, name, path)) != {"loaded"}:
            wrong.append(f"{name}: prefetch of {path}: {prefetch_states(booted, name, path)}")
    for name, path in (("prefetch", PROG), ("prefetch", LIB), ("repair", PROG), ("repair", LIB)):
        if set(status_states(booted, name, path)) != {"huge"}:
            wrong.append(f"{name}: status of {path}: {status_states(booted, name, path)}")
    for name in ("prefetch-nobti", "repair-nobti"):
        if set(status_states(booted, name, NOBTI)) != {"huge"}:
            wrong.append(f"{name}: status of {NOBTI}: {status_states(booted, name, NOBTI)}")
    hugify_run = ran(booted, "hugify-run")["debug"]
    for path in (PROG, LIB):
        verdict = rf"/{re.escape(Path(path).name)}: (\d+) windows: \1 huge \(.*\), 0 busy, 0 failed, 0 unsupported"
        if not any(re.search(verdict, line) for line in hugify_run):
            wrong.append(f"hugify-run's verdict on {path}: {hugify_run}")
    assert not wrong, "\n".join(wrong)


def case_names(booted: BootResult) -> list[str]:
    names = list(booted.results["cases"])
    assert {"plain", "plain-small", "repair", "repair-nobti", "anonymous", "anonymous-nobti", "dlopen"} <= set(names)
    return names


def expected_way(name: str) -> str:
    """How the case's windows must be held: "small" (small folios, the plain run from a
    cache read plainly), "file" (2 MiB folios, PMD-mapped), "anonymous" (the runtime's
    copies, anonymous PMDs), or "" (the plain cold run: left to the kernel)."""
    if name == "plain-small":
        return "small"
    if name.startswith("anonymous"):
        return "anonymous"
    if name.startswith(("prefetch", "repair", "hugify-run", "dlopen")):
        return "file"
    return ""
