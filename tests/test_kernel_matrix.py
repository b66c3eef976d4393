"""hugify's runtime on Debian's own kernels, booted for real under qemu, on a real
Debian 12 root with systemd as PID 1 (tests/vm_boot.py), one disk per filesystem.

The suite boots a subset of the matrix (vm_matrix.SUBSET: trixie's 6.12 on ext4 and
XFS, the newest kernel on ext4); bench/kernel_matrix.py boots all of it and regenerates
docs/runtime.md's "Where it works" table. A boot's results are cached by all its inputs.

What is asserted, per boot, with THP `always` (booted) and `madvise` (set through
sysfs), cold and with the files cached in small folios:
- where the kernel gives the filesystem large folios (vm_matrix.LARGE_FOLIOS_SINCE,
  from the kernel's history): after `hugify prefetch`, through hugify-run and through
  the audit library (DT_NEEDED and dlopen) the program's and the library's code is
  100 % PMD-mapped, and the engine's verdicts say what the process got (no "failed"
  window in a process that got it all huge);
- where it does not: the engine's verdict is `unsupported` and names the filesystem,
  and 20 starts through the audit library read no more from disk (pgpgin) than 20
  plain starts, within noise;
- the kernel's own part (issue 20 item 5): the engine's verdict on PMD exec readahead
  (windows left to the kernel, state `kernel`) is what a plain cold run gets, and
  khugepaged makes a held program's code huge exactly where and when it collapses
  file-backed code.
A kernel that cannot be fetched, a qemu that cannot start, a guest that panics or does
not finish in time fail the test with the reason (and the console's last lines).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from vm_boot import BootResult, VmError, boot, boot_uncached, guest_inputs, initramfs, root_image
from vm_kernels import KernelUnavailable, kernel
from vm_matrix import (
    CACHES,
    PGPGIN_NOISE_KIB,
    SUBSET,
    anonymous_copies,
    case,
    fully_huge,
    gives_large_folios,
    khugepaged_collapses_code,
    resolve,
)

MODES = ("always", "madvise")
CODE_WAYS = ("prefetch", "hugify-run", "audit", "audit-dlopen")
PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"


@pytest.fixture(scope="module", params=SUBSET, ids=[f"{s}-{fs}" for s, fs in SUBSET])
def booted(request: pytest.FixtureRequest) -> BootResult:
    suite, fs = request.param
    try:
        return boot(resolve(suite), fs)
    except (KernelUnavailable, VmError) as e:
        pytest.fail(f"{suite} on {fs}: {e}", pytrace=False)


def supported(b: BootResult) -> bool:
    return gives_large_folios(b.kernel, b.fs)


def where(b: BootResult, mode: str, cache: str, way: str) -> str:
    return f"{b.kernel.label} {b.fs}, THP {mode}, {cache}, {way}"


def maps_text(step: dict[str, Any]) -> str:
    return ", ".join(f"{p}: {m['pmd'] >> 10} of {m['size'] >> 10} KiB PMD-mapped" for p, m in step["maps"].items())


def test_guest_boots_systemd_and_the_prefetch_service_succeeds(booted: BootResult) -> None:
    r = booted.results
    assert r["uname"] == booted.kernel.release and r["root_fs"] == booted.fs, (r["uname"], r["root_fs"])
    assert r["failed_units"] == "", r["failed_units"]
    props = r["boot_service"]["props"]
    assert props["Result"] == "success" and props["ExecMainCode"] == "1", r["boot_service"]
    assert "Finished hugify-prefetch.service" in r["boot_service"]["journal"], r["boot_service"]["journal"]
    switched = r["thp"]["madvise"].get("service") or r["thp"]["always"].get("service")
    assert switched and switched["props"]["Result"] == "success", switched


@pytest.mark.parametrize("mode", MODES)
def test_every_way_runs_the_program(booted: BootResult, mode: str) -> None:
    for cache in CACHES:
        for way in ("kernel", *CODE_WAYS):
            for step in case(booted.results, mode, cache, way)["steps"]:
                if "prefetch" in step:
                    continue
                assert step["rc"] == 0, (where(booted, mode, cache, way), step["stderr"][-2000:])
                expected = {LIB} if way == "audit-dlopen" else {PROG, LIB}
                assert set(step["maps"]) == expected, (where(booted, mode, cache, way), step["maps"])


@pytest.mark.parametrize("mode", MODES)
def test_code_is_huge_where_the_kernel_gives_large_folios(booted: BootResult, mode: str) -> None:
    if not supported(booted):
        # Nothing can be huge: and nothing claims it is.
        for cache in CACHES:
            for way in CODE_WAYS:
                step = case(booted.results, mode, cache, way)["steps"][-1]
                assert not fully_huge(step), (where(booted, mode, cache, way), maps_text(step))
        return
    missing = []
    for cache in CACHES:
        for way in CODE_WAYS:
            step = case(booted.results, mode, cache, way)["steps"][-1]
            if not fully_huge(step):
                missing.append(f"{where(booted, mode, cache, way)}: {maps_text(step)}")
    assert not missing, "\n".join(missing)


def _debug_counts(lines: list[str], path: str) -> dict[str, int]:
    line = next((ln for ln in lines if Path(path).name + ":" in ln and "windows:" in ln), "")
    return {name: int(n) for n, name in re.findall(r"(\d+) (huge|failed|busy|skipped|unverified|unsupported)", line)}


@pytest.mark.parametrize("mode", MODES)
def test_hugify_run_verdict_says_what_the_process_got(booted: BootResult, mode: str) -> None:
    """Issue 20's false "failed": a window the process then maps huge is not "failed";
    where the filesystem gives no large folios, the verdict is "unsupported"."""
    wrong = []
    for cache in CACHES:
        step = case(booted.results, mode, cache, "hugify-run")["steps"][-1]
        for path in (PROG, LIB):
            counts = _debug_counts(step["debug"], path)
            got = step["maps"].get(path, {"pmd": 0, "size": 1})
            all_huge = got["pmd"] == got["size"]
            if all_huge and (counts.get("failed", 0) or not counts.get("huge")):
                wrong.append(f"{where(booted, mode, cache, 'hugify-run')}: {path} mapped huge, verdict {counts}")
            if not supported(booted) and (counts.get("failed", 0) or not counts.get("unsupported")):
                wrong.append(f"{where(booted, mode, cache, 'hugify-run')}: {path} verdict {counts}, not unsupported")
    assert not wrong, "\n".join(wrong) + "\n" + json.dumps(step["debug"], indent=1)


@pytest.mark.parametrize("mode", MODES)
def test_status_window_states_agree_with_the_processes(booted: BootResult, mode: str) -> None:
    """`hugify status --json` after each way: "huge" where the process got the window
    huge; "unsupported", naming the filesystem, where the filesystem cannot."""
    wrong = []
    for cache in CACHES:
        for way in CODE_WAYS:
            c = case(booted.results, mode, cache, way)
            files = {f["path"]: f for f in c["status"].get("files", []) if "windows" in f}
            step = c["steps"][-1]
            for path, got in step["maps"].items():
                states = [w["state"] for w in files[path]["windows"]]
                if got["pmd"] == got["size"] and set(states) != {"huge"}:
                    wrong.append(f"{where(booted, mode, cache, way)}: {path} mapped huge, status says {states}")
                if not supported(booted):
                    text = json.dumps(files[path])
                    if set(states) != {"unsupported"} or booted.fs not in text:
                        wrong.append(f"{where(booted, mode, cache, way)}: {path} status {states}, not unsupported")
    assert not wrong, "\n".join(wrong)


def test_audit_library_reads_nothing_more_where_it_cannot_work(booted: BootResult) -> None:
    """Issue 20 item 4: 20 starts through the audit library on a filesystem without large
    folios read within noise of 20 plain starts (today: every start evicts and reads
    every window again)."""
    pgpgin = next(e["pgpgin_kib"] for e in booted.results["thp"].values() if "pgpgin_kib" in e)
    if supported(booted):
        return
    assert pgpgin["audit"] <= pgpgin["plain"] + PGPGIN_NOISE_KIB, pgpgin


@pytest.mark.parametrize("mode", MODES)
def test_anonymous_copies_only_where_files_get_no_huge_pages(booted: BootResult, mode: str) -> None:
    """Issue 21 in the matrix: with the opt-in mode on (HUGIFY_ANONYMOUS=1 for the audit
    library), where the filesystem gives no large folios every window of the program and
    of its library is copied and is one anonymous PMD, the program's output unchanged;
    where it does, nothing is copied and the code is file-backed and huge."""
    wrong = []
    for cache in CACHES:
        step = case(booted.results, mode, cache, "anonymous")["steps"][-1]
        plain = case(booted.results, mode, cache, "kernel")["steps"][0]
        at = where(booted, mode, cache, "anonymous")
        if step["rc"] != 0 or step["stdout"] != plain["stdout"]:
            wrong.append(f"{at}: rc {step['rc']}, output differs: {step['stderr'][-500:]}")
            continue
        got = anonymous_copies(step)
        lines = got["objects"]
        if set(lines) != {Path(PROG).name, Path(LIB).name}:
            wrong.append(f"{at}: debug lines for {sorted(lines)}: {step['debug']}")
            continue
        windows = sum(total for _, total, _ in lines.values())
        if not supported(booted):
            if any(copied != total for copied, total, _ in lines.values()):
                wrong.append(f"{at}: not every window copied: {lines}")
            if got["anon_pmd"] != windows * (2 << 20):
                wrong.append(f"{at}: {got['anon_pmd'] >> 10} KiB of anonymous code PMD-mapped, not {windows} windows")
        else:
            if any(copied for copied, _, _ in lines.values()) or got["anon_vmas"]:
                wrong.append(f"{at}: copies made where the files give huge pages: {got}")
            if not fully_huge(step):
                wrong.append(f"{at}: the file-backed code is not all huge: {maps_text(step)}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_verdict_is_what_a_plain_cold_run_gets(booted: BootResult, mode: str) -> None:
    """Issue 20 item 5. The engine leaves cold windows to the kernel (state `kernel`)
    where its probe (recorded at boot) saw the kernel read a cold executable mapping as
    one PMD at the first fault. That verdict must say what a plain first run from a cold
    cache gets: all PMD-mapped with khugepaged collapsing nothing meanwhile (the fault's
    own doing) if and only if "yes". A run made huge by a collapse is khugepaged's, which
    works only on what stays mapped (test below): on 7.2 XFS the matrix once saw a plain
    cold run huge that way, and "no" was right. Prefetch then follows the verdict."""
    plain = case(booted.results, mode, "cold", "kernel")
    first = plain["steps"][0]
    verdict = plain["status"]["system"]["exec_pmd_readahead"]
    by_the_fault = fully_huge(first) and first["collapsed"] == 0
    assert verdict is by_the_fault, (where(booted, mode, "cold", "kernel"), verdict, maps_text(first), first)
    if supported(booted):
        report = case(booted.results, mode, "cold", "prefetch")["steps"][0]["prefetch"]
        states = {w["state"] for f in report["files"] if f["path"] in (PROG, LIB) for w in f["windows"]}
        assert states == ({"kernel"} if verdict else {"loaded"}), (where(booted, mode, "cold", "prefetch"), report)


@pytest.mark.parametrize("mode", MODES)
def test_khugepaged_makes_held_code_huge_only_where_it_collapses_files(booted: BootResult, mode: str) -> None:
    """What the kernel does by itself, later: a plain run that keeps its code mapped for
    a few khugepaged passes gets it all PMD-mapped with THP `always` on the kernels whose
    khugepaged collapses file-backed code (vm_matrix.KHUGEPAGED_TEXT_SINCE, on a
    filesystem with large folios), and never with `madvise` or elsewhere."""
    step = case(booted.results, mode, "cold", "held")["steps"][0]
    expected = mode == "always" and khugepaged_collapses_code(booted.kernel, booted.fs)
    assert step["rc"] == 0, step["stderr"][-2000:]
    assert set(step["maps"]) == {PROG, LIB}, step["maps"]
    at = where(booted, mode, "cold", "held")
    assert fully_huge(step) is expected, (at, maps_text(step), step["collapsed"])
    if expected:
        assert step["collapsed"] >= 2, (at, step["collapsed"])  # the program's window and the library's


# --- bad input: each fails with its reason -------------------------------------------------------


def test_a_kernel_that_cannot_be_fetched_fails_with_the_reason() -> None:
    with pytest.raises(KernelUnavailable, match="no linux-image-amd64 in no-such-suite"):
        kernel("no-such-suite")


@pytest.fixture(scope="module")
def trixie_ext4() -> dict[str, Any]:
    k = kernel("trixie")
    return {"k": k, "fs": "ext4", "thp": "always", "initrd": initramfs(k), "image": root_image("ext4", guest_inputs())}


def test_a_qemu_that_cannot_start_fails_with_the_reason(trixie_ext4: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(VmError, match=r"qemu could not run 6\.12 \(trixie\) on ext4 \(exit 1\): .*no-such-accel"):
        boot_uncached(**trixie_ext4, final=tmp_path / "boot", accel="no-such-accel")
    assert not (tmp_path / "boot").exists()


def test_a_guest_that_does_not_finish_in_time_fails_with_its_console(
    trixie_ext4: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(VmError, match=r"did not finish in 3 s; console:") as e:
        boot_uncached(**trixie_ext4, final=tmp_path / "boot", timeout=3)
    assert not (tmp_path / "boot").exists(), e.value


def test_a_panicking_guest_shows_its_console_last_lines(trixie_ext4: dict[str, Any], tmp_path: Path) -> None:
    # No init in the initramfs: the kernel looks for a root device of its own, finds none and panics.
    with pytest.raises(VmError, match=r"the guest panicked; console:\n") as e:
        boot_uncached(**trixie_ext4, final=tmp_path / "boot", extra="rdinit=/no-such-init", timeout=300)
    assert "Kernel panic" in str(e.value) and "VFS" in str(e.value), e.value
