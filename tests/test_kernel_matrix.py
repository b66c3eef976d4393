"""hugify's runtime on Debian's own kernels, booted for real under qemu, on a real
Debian 12 root with systemd as PID 1 (testkit/vm/boot.py), one disk per filesystem.

The suite boots a subset of the matrix (testkit.vm.matrix.SUBSET: trixie's 6.12 on ext4,
no large folios, and the newest kernel on ext4, large folios); bench/kernel_matrix.py boots
all of it (XFS and btrfs on every kernel among them) and regenerates
docs/runtime-reference.md's "Where it works" table. A boot's results are cached by all its inputs.

What is asserted, per boot, with THP `always` (booted) and `madvise` (set through
sysfs), cold and with the files cached in small folios (`madvise` cold only:
testkit.vm.matrix.SUITE_SECOND_CACHES):
- where the kernel gives the filesystem large folios (testkit.vm.matrix.LARGE_FOLIOS_SINCE,
  from the kernel's history): after `hugify prefetch`, through hugify-run and through
  the audit library (DT_NEEDED and dlopen) the program's and the library's code is
  100 % PMD-mapped, and the engine's verdicts say what the process got (no "failed"
  window in a process that got it all huge);
- where it does not: the engine's verdict is `unsupported` and names the filesystem;
- what it costs (pgpgin, 10 starts each way, from the files in small folios and cold):
  through the audit library as root, the windows read once where it works and nothing
  more than plain starts where it cannot; as a user with no runtime directory (no
  service ran: nothing kept between starts), nothing more than plain starts from small
  folios, the windows at most once from cold, and where it works the code huge after;
- a file unlike its filesystem (chattr +j, which ext4 from 6.16 gives no large folios)
  gets a verdict of its own, recorded for the file and not for the filesystem;
- the anonymous-copy mode (issue 21): every window of the program and of its library one
  anonymous PMD where the filesystem gives no large folios, nothing copied where it does;
  under Debian 12's `perf record -e cpu-clock` the program's and the library's samples
  named by their functions, and gdb stopping and backtracing in the copies, both as
  with the mode off; with no free 2 MiB block (fragmented memory, provoked in the guest)
  the program keeps its file mappings and says `fragmented` once per object;
- the kernel's own part (issue 20 item 5): the engine's verdict on PMD exec readahead
  (windows left to the kernel, state `kernel`) is what a plain cold run gets, and
  khugepaged makes a held program's code huge exactly where and when it collapses
  file-backed code.
lld's objects (package hugify-deb-test-lld: a program and its library
shifted, their program header table grown in place, and a plugin as-is that the program
opens with dlopen), in the THP mode booted, cold and in small folios: where the
filesystem gives large folios exactly their whole windows are PMD-mapped after prefetch,
through hugify-run and through the audit library, whose debug line says so per object;
where it does not, none is, the anonymous-copy mode copies every window of each, and
through the shared copies every window is mapped from its object's copy, PMD-mapped.
The non-PIE program the test package ships as-is (not rewritten: only its whole
windows can be PMD-mapped, not its whole executable mapping), run the same ways: where
the filesystem gives large folios, exactly its whole windows (those of its manifest
entry) are PMD-mapped after prefetch, through hugify-run and through the audit library,
and `hugify status` says they are huge; where it does not, `unsupported`, naming the
filesystem.
glibc's own advice (issue 31 item 7): the newest kernel on ext4 booted once more on the
same root with Debian's glibc 2.44 unpacked over it (testkit/vm/glibc_thp.py, one boot
of a few minutes): with glibc.elf.thp set, in the environment or system-wide, a cold
start gets the program's, the library's (DT_NEEDED and dlopen) and the as-is program's
code all PMD-mapped exactly where the disk's read_ahead_kb is within the core's limit
for the file (at 128, and at the disk's default 8192 only the as-is program), none of
it without the tunable; `hugify status` there names what defeats it.
A kernel that cannot be fetched, a qemu that cannot start, a guest that panics or does
not finish in time fail the test with the reason (and the console's last lines).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hugify import _core, manifest
from testkit import HP
from testkit.debian import EXEC, LLD_LIB, LLD_PLUGIN, LLD_PROG, MANIFEST_DIR, build_variant, installed_digest
from testkit.elf import readelf_loads, readelf_windows, window_offsets
from testkit.vm import glibc_thp, matrix_table
from testkit.vm.boot import BootResult, GuestPanic, VmError, boot, boot_uncached, guest_inputs, initramfs, root_image
from testkit.vm.kernels import KernelUnavailable, kernel
from testkit.vm.matrix import (
    CACHES,
    PGPGIN_NOISE_KIB,
    SHARED_WAYS,
    SUBSET,
    anonymous_copies,
    case,
    copy_lines,
    fully_huge,
    gives_large_folios,
    khugepaged_collapses_code,
    planned_caches,
    resolve,
    row,
    shared_copies,
    suite_boot,
)

MODES = ("always", "madvise")
CODE_WAYS = ("prefetch", "hugify-run", "audit", "audit-dlopen")
#: The ways the guest runs the program listed as-is (guest_driver.as_is_ways).
AS_IS_WAYS = ("as-is-prefetch", "as-is-hugify-run", "as-is-audit")
PROG = "/usr/bin/hugify-deb-test"
LIB = "/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"


@pytest.fixture(scope="module", params=SUBSET, ids=[f"{s}-{fs}" for s, fs in SUBSET])
def booted(request: pytest.FixtureRequest) -> BootResult:
    suite, fs = request.param
    try:
        return suite_boot(suite, fs)
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
    for cache in planned_caches(booted, mode):
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
        for cache in planned_caches(booted, mode):
            for way in CODE_WAYS:
                step = case(booted.results, mode, cache, way)["steps"][-1]
                assert not fully_huge(step), (where(booted, mode, cache, way), maps_text(step))
        return
    missing = []
    for cache in planned_caches(booted, mode):
        for way in CODE_WAYS:
            step = case(booted.results, mode, cache, way)["steps"][-1]
            if not fully_huge(step):
                missing.append(f"{where(booted, mode, cache, way)}: {maps_text(step)}")
    assert not missing, "\n".join(missing)


@pytest.fixture(scope="module")
def as_is_windows() -> list[int]:
    """The file offsets of the whole windows of the program listed as-is: its package's
    manifest entry, checked against readelf's program headers of the file installed."""
    root = build_variant("with").ok().root
    (entry,) = manifest.parse((root / MANIFEST_DIR / "hugify-deb-test-exec.list").read_text())
    windows = window_offsets(readelf_windows(root / EXEC, fixed=True))
    assert windows and window_offsets([(entry.offset, entry.size)]) == windows, (windows, entry)
    return windows


@pytest.mark.parametrize("mode", MODES)
def test_the_as_is_program_gets_its_windows_huge_where_the_kernel_gives_large_folios(
    booted: BootResult, mode: str, as_is_windows: list[int]
) -> None:
    """Only its whole windows can be PMD-mapped (it is not rewritten): where the kernel
    gives large folios, every one of them is, after prefetch, through hugify-run and
    through the audit library, and status and hugify-run's verdict say "huge"; where it
    does not, they say "unsupported", naming the filesystem."""
    prog = "/" + EXEC
    wrong = []
    for cache in planned_caches(booted, mode):
        plain = case(booted.results, mode, cache, "as-is-plain")["steps"]
        want = plain[0]["stdout"]
        if not want.startswith("hugify-deb-exec: ") or any(s["rc"] != 0 or s["stdout"] != want for s in plain):
            wrong.append(
                f"{where(booted, mode, cache, 'as-is-plain')}: {[(s['rc'], s['stderr'][-500:]) for s in plain]}"
            )
        for way in AS_IS_WAYS:
            at = where(booted, mode, cache, way)
            c = case(booted.results, mode, cache, way)
            step = c["steps"][-1]
            if step["rc"] != 0 or step["stdout"] != want or set(step["maps"]) != {prog}:
                wrong.append(f"{at}: rc {step['rc']}, maps {step['maps']}: {step['stderr'][-500:]}")
                continue
            pmd = step["maps"][prog]["pmd"]
            status = next((f for f in c["status"].get("files", []) if f["path"] == prog), {})
            states = [w["state"] for w in status.get("windows", [])]
            if [w["offset"] for w in status.get("windows", [])] != as_is_windows:
                wrong.append(f"{at}: status windows {status}, the manifest's at {as_is_windows}")
            whole = len(as_is_windows) * HP
            if supported(booted):
                if pmd != whole or set(states) != {"huge"}:
                    wrong.append(f"{at}: {pmd >> 10} KiB PMD-mapped of {whole >> 10} KiB of windows, status {states}")
            elif pmd == whole or set(states) != {"unsupported"} or booted.fs not in json.dumps(status):
                wrong.append(f"{at}: {pmd >> 10} KiB PMD-mapped, status {states}, not unsupported: {status}")
            if way == "as-is-hugify-run":
                counts = _debug_counts(step["debug"], prog)
                verdict = "huge" if supported(booted) else "unsupported"
                if counts.get(verdict) != len(as_is_windows) or counts.get("failed", 0):
                    wrong.append(f"{at}: hugify-run's verdict {counts}, not all {verdict}: {step['debug']}")
    assert not wrong, "\n".join(wrong)


def _debug_counts(lines: list[str], path: str) -> dict[str, int]:
    line = next((ln for ln in lines if Path(path).name + ":" in ln and "windows:" in ln), "")
    return {name: int(n) for n, name in re.findall(r"(\d+) (huge|failed|busy|skipped|unverified|unsupported)", line)}


@pytest.mark.parametrize("mode", MODES)
def test_hugify_run_verdict_says_what_the_process_got(booted: BootResult, mode: str) -> None:
    """Issue 20's false "failed": a window the process then maps huge is not "failed";
    where the filesystem gives no large folios, the verdict is "unsupported"."""
    wrong = []
    for cache in planned_caches(booted, mode):
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
    for cache in planned_caches(booted, mode):
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


@pytest.fixture(scope="module")
def windows_kib() -> int:
    """KiB of the program's and the library's whole windows (readelf on the package's files)."""
    root = build_variant("with").ok().root
    return sum(size for path in (PROG, LIB) for _, size in readelf_windows(root / path.lstrip("/"), False)) >> 10


def test_the_runtime_reads_the_windows_once_where_it_works_and_nothing_more_where_it_cannot(
    booted: BootResult, windows_kib: int
) -> None:
    """Issue 32 item 6: bounds on both sides, also for a user with no runtime directory.
    From the files cached in small folios, through the audit library as root (the service
    kept its records this boot): where the kernel gives the filesystem large folios, the
    windows read once (the first start evicts and reads each again, the others find them
    huge), within noise; where it does not, within noise of plain starts. As a user who is
    not root with no runtime directory (moved away: what a boot without the service gives;
    the kernel does not tell such a process which pages of root's files are cached, so it
    evicts nothing), within noise of plain starts either way; from cold, each window read
    at most once more, and where it works the code is PMD-mapped afterwards."""
    kib = next(e["pgpgin_kib"] for e in booted.results["thp"].values() if "pgpgin_kib" in e)
    small, cold = kib["small"], kib["cold"]
    noise = PGPGIN_NOISE_KIB
    at = f"{booted.kernel.label} {booted.fs}: {kib}, windows {windows_kib} KiB"
    extra = small["audit"] - small["plain"]
    if supported(booted):
        assert windows_kib - noise <= extra <= windows_kib + noise, at
    else:
        assert extra <= noise, at
    for way in ("audit-user", "hugify-run-user"):
        assert small[way] <= small["plain"] + noise, (way, at)
        assert cold[way] <= cold["plain"] + windows_kib + noise, (way, at)
        huge = {p: m["pmd"] == m["size"] > 0 for p, m in cold[f"{way}-maps"].items()}
        assert huge == {PROG: supported(booted), LIB: supported(booted)}, (way, huge, at)


def test_root_with_no_runtime_directory_reads_nothing_more_where_the_kernel_rules_it_out(
    booted: BootResult, windows_kib: int
) -> None:
    """Issue 38 item 4: root with no runtime directory to be had (a chroot or container
    without /run: the guest driver's NO_RUN) keeps nothing between starts. Where the
    kernel gives the filesystem no large folios (its version says so: ext4 before 6.16,
    btrfs) it takes that for a hint, as a user does, and reads nothing more than plain
    starts, through the audit library and through hugify-run, from small folios and
    cold (on main cd6bc40 a directory merely missing skipped the hint and every start
    read the windows again: 40 MiB in 10 starts through hugify-run on 6.12 ext4); where
    it gives them, the windows are read once and the code is PMD-mapped afterwards."""
    kib = next(e["pgpgin_kib"] for e in booted.results["thp"].values() if "pgpgin_kib" in e)
    small, cold = kib["small"], kib["cold"]
    noise = PGPGIN_NOISE_KIB
    at = f"{booted.kernel.label} {booted.fs}: {kib}, windows {windows_kib} KiB"
    for way in ("audit-root-norun", "hugify-run-root-norun"):
        extra = {"small": small[way] - small["plain"], "cold": cold[way] - cold["plain"]}
        if supported(booted):
            assert windows_kib - noise <= extra["small"] <= windows_kib + noise, (way, at)
            assert extra["cold"] <= windows_kib + noise, (way, at)
        else:
            assert extra["small"] <= noise and extra["cold"] <= noise, (way, at)
        huge = {p: m["pmd"] == m["size"] > 0 for p, m in cold[f"{way}-maps"].items()}
        assert huge == {PROG: supported(booted), LIB: supported(booted)}, (way, huge, at)


def test_a_file_unlike_its_filesystem_gets_a_verdict_of_its_own(booted: BootResult) -> None:
    """Two copies of the library, the second with data journalling (chattr +j), each first
    measured without hugify (a cold window read through MADV_HUGEPAGE), then prefetched
    together with a runtime directory of their own: each file's windows are what the
    measurement says; one that gets no large folios where the other does is the file's
    verdict alone (file-no-large-folios, recorded for its inode), never the filesystem's;
    where neither gets them, the second file makes it the filesystem's. Where the kernel
    gives ext4 large folios (6.16 on), chattr +j is what takes them from the file."""
    f = booted.results["file_verdicts"]
    plain, journalled = sorted(f["measured_pmd_kib"], key=lambda p: "journalled" in p)
    large = {p: kib == 2048 for p, kib in f["measured_pmd_kib"].items()}
    at = f"{booted.kernel.label} {booted.fs}: {f['measured_pmd_kib']}, chattr {f['chattr']['rc']}, {f['records']}"
    if booted.fs == "ext4" and supported(booted):
        assert f["chattr"]["rc"] == 0 and (large[plain], large[journalled]) == (True, False), at
    states = {x["path"]: {(w["state"], w.get("reason", "")) for w in x["windows"]} for x in f["prefetch"]["files"]}
    fs_record = f"no-large-folios-{f['device']}"
    file_records = {p: f"{fs_record}-{ino}" for p, ino in f["inodes"].items()}
    verdicts = [r for r in f["records"] if r.startswith("no-large-folios-")]
    if large[plain] and large[journalled]:
        assert states == {plain: {("loaded", "")}, journalled: {("loaded", "")}}, at
        assert verdicts == [], at
    elif large[plain]:
        # The journalled file's small folios are never the filesystem's. Since a verdict
        # takes a read this process made of the whole window (its thread's I/O count),
        # the journalled file on ext4 from 6.16, which a cold read gives small, gets no
        # verdict of its own either: its windows stay busy (read-meanwhile), retried by
        # the timer, and nothing is recorded (booted on 7.3: the count falls short of the
        # window on every try; docs/runtime-reference.md says so).
        assert states == {plain: {("loaded", "")}, journalled: {("busy", "read-meanwhile")}}, at
        assert verdicts == [], at
    else:
        assert states == {
            plain: {("unsupported", "file-no-large-folios")},
            journalled: {("unsupported", "no-large-folios")},
        }, at
        assert sorted(verdicts) == sorted([fs_record, file_records[plain]]), at


@pytest.mark.parametrize("way", ["anonymous", "anonymous-root-norun"])
@pytest.mark.parametrize("mode", MODES)
def test_anonymous_copies_only_where_files_get_no_huge_pages(booted: BootResult, mode: str, way: str) -> None:
    """Issue 21 in the matrix: with the opt-in mode on (HUGIFY_ANONYMOUS=1 for the audit
    library), where the filesystem gives no large folios every window of the program and
    of its library is copied and is one anonymous PMD, the program's output unchanged;
    where it does, nothing is copied and the code is file-backed and huge. The same for
    `hugify-run --anonymous` as root with no runtime directory to be had (issue 38 item
    4: on main cd6bc40, 0 KiB copied on 6.1 ext4)."""
    wrong = []
    for cache in planned_caches(booted, mode):
        step = case(booted.results, mode, cache, way)["steps"][-1]
        plain = case(booted.results, mode, cache, "kernel")["steps"][0]
        at = where(booted, mode, cache, way)
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


# --- the shared copies (issue 31) --------------------------------------------------------------


def page_rounded(n: int) -> int:
    return -(-n // 4096) * 4096


@pytest.mark.parametrize("mode", MODES)
def test_shared_copies_make_the_code_huge_where_the_files_get_no_huge_pages(booted: BootResult, mode: str) -> None:
    """Issue 31 item 5. Where the kernel gives the filesystem no large folios, the boot
    service (hugify-prefetch.service after run-hugify-shared.mount) made one copy of the
    program and of the library, listed by `hugify status` at boot; through hugify-run and
    the audit library (DT_NEEDED and dlopen), cold and with the files cached in small
    folios, every window of both was mapped from the copies and PMD-mapped
    (ShmemPmdMapped), the output unchanged; each copy is whole and holds its file's size
    in memory, once. Where the filesystem gives large folios, no copy exists and the same
    ways are file-backed huge."""
    wrong = []
    at_boot = {c["path"] for c in booted.results["boot_status"].get("shared_copies", {}).get("copies", [])}
    if supported(booted) == bool(at_boot & {PROG, LIB}):
        wrong.append(f"{booted.kernel.label} {booted.fs}: copies made at boot: {sorted(at_boot)}")
    for cache in planned_caches(booted, mode):
        got = shared_copies(booted.results, mode, cache)
        for way in SHARED_WAYS:
            at = where(booted, mode, cache, way)
            step = case(booted.results, mode, cache, way)["steps"][-1]
            alone = case(booted.results, mode, cache, way.removeprefix("shared-"))["steps"][-1]
            if step["rc"] != 0 or step["stdout"] != alone["stdout"]:
                wrong.append(f"{at}: rc {step['rc']}, output {step['stdout'][-200:]!r}: {step['stderr'][-500:]}")
                continue
            if not fully_huge(step):
                wrong.append(f"{at}: not all huge: {maps_text(step)}")
            copied = {p: m.get("shared", 0) for p, m in step["maps"].items()}
            if supported(booted) and any(copied.values()):
                wrong.append(f"{at}: mapped from copies where the files give huge pages: {copied}")
            if not supported(booted) and any(m.get("shared", 0) != m["size"] for m in step["maps"].values()):
                wrong.append(f"{at}: not every window from the copies: {step['maps']}")
        copies = got["copies"]
        if supported(booted):
            if copies:
                wrong.append(f"{where(booted, mode, cache, 'shared')}: copies where none is needed: {copies}")
            continue
        for path in (PROG, LIB):
            c = copies.get(path)
            if not c or c["huge_windows"] != c["windows"] or c["held_bytes"] != page_rounded(c["size"]):
                wrong.append(f"{where(booted, mode, cache, 'shared')}: {path}'s copy: {c}")
        if got["held"] != sum(page_rounded(c["size"]) for c in copies.values()):
            wrong.append(f"{where(booted, mode, cache, 'shared')}: held {got['held']}, copies {copies}")
    assert not wrong, "\n".join(wrong)


def test_starts_through_shared_copies_read_nothing_more(booted: BootResult) -> None:
    """10 starts through the audit library as root with the shared copies allowed, from
    the files cached in small folios and cold. Where the kernel gives the filesystem no
    large folios the boot service made the copies, the code is mapped from them (in
    memory): within noise of 10 plain starts. Where it gives them, no copy exists (none
    is needed) and the series is the audit library's file-backed one, within noise of
    it: from small folios that reads the windows once, as it should (the runtime test
    above bounds it)."""
    kib = next(e["pgpgin_kib"] for e in booted.results["thp"].values() if "pgpgin_kib" in e)
    copies = {c["path"] for c in booted.results["boot_status"].get("shared_copies", {}).get("copies", [])}
    assert ({PROG, LIB} <= copies) != supported(booted), sorted(copies)
    for cache in CACHES:
        got = kib[cache]
        if supported(booted):
            assert abs(got["shared"] - got["audit"]) <= PGPGIN_NOISE_KIB, (cache, kib)
        else:
            assert got["shared"] <= got["plain"] + PGPGIN_NOISE_KIB, (cache, kib)


# --- the anonymous-copy mode under perf and gdb, and with fragmented memory (issue 21) ------------

#: The functions of the test package's program and library (tests/programs/gen_code.py,
#: tests/deb/hugify-deb-test/src): all its code, the generated functions hot.
PACKAGE_FUNCTION = re.compile(r"^(main|(exe|lib)_(f\d+|dispatch|entry))$")
OBJECTS = {Path(PROG).name, Path(LIB).name}
#: perf's samples in the program's and the library's code, at least (fewer would not tell
#: named from unnamed; a TCG guest gives about 2000 a run).
MIN_SAMPLES = 100
#: The share of those samples in the package's own functions, at least: the rest are in
#: the code the toolchain adds (_init, _start, PLT stubs, register_tm_clones...).
OWN_SHARE = 0.9
#: The share of them perf may leave as bare addresses, at most.
UNRESOLVED_SHARE = 0.01


def anon_checks(b: BootResult) -> dict[str, Any]:
    return dict(b.results["anonymous_checks"])


@pytest.mark.parametrize("mode", ("on", "off"))
def test_perf_names_the_hot_functions_of_the_copied_code(booted: BootResult, mode: str) -> None:
    """The program run again and again under `perf record -e cpu-clock` (Debian 12's perf,
    launched by it), through the audit library with the mode on (HUGIFY_ANONYMOUS=1, no
    perf map) and off: the same output at every run; with the mode on, where the
    filesystem gives no large folios, every window of the program and of its library
    copied at every run (where it gives them, none); and the samples in their code named
    by perf report with their functions (through the files and their -dbgsym debug files,
    as without copies): nearly all in the package's own functions, the hottest one of
    them, hardly any left as a bare address."""
    a = anon_checks(booted)
    p = a["perf"][mode]
    plain = a["plain"]["stdout"].strip()
    assert p["rc"] == 0 and p["report_rc"] == 0, p
    assert p["runs"] == p["planned"] and p["outputs"] == [plain], (p["runs"], p["outputs"])
    lines = copy_lines(p["debug"])
    if mode == "off":
        assert not lines, p["debug"][:10]
    elif not supported(booted):
        complete = [ln for ln in lines if ln[1] == ln[2] > 0 and ln[3] == ""]
        assert {ln[0] for ln in lines} == OBJECTS and len(complete) == len(lines) == 2 * p["runs"], lines[:6]
    else:  # the files give huge pages: the mode copies nothing
        kept = [ln for ln in lines if ln[1] == 0 and ln[3] == ", window 0 not-needed: file-backed"]
        assert {ln[0] for ln in lines} == OBJECTS and len(kept) == len(lines) == 2 * p["runs"], lines[:6]
    ours = [r for r in p["rows"] if r["dso"] in OBJECTS]
    samples = sum(r["samples"] for r in ours)
    own = sum(r["samples"] for r in ours if PACKAGE_FUNCTION.match(r["sym"]))
    # Bare addresses: only where no symbol covers the code (the .plt.got stub of
    # __cxa_finalize), a few samples, with the mode as without it.
    unresolved = [r for r in ours if r["sym"].startswith("0x")]
    assert samples >= MIN_SAMPLES, (samples, p["rows"][:20])
    assert sum(r["samples"] for r in unresolved) <= UNRESOLVED_SHARE * samples, unresolved[:20]
    assert own >= OWN_SHARE * samples, (own, samples, [r for r in ours if not PACKAGE_FUNCTION.match(r["sym"])][:20])
    top = max(ours, key=lambda r: r["samples"])
    assert PACKAGE_FUNCTION.match(top["sym"]), top


GDB_MAPPING = re.compile(r"^\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+0x[0-9a-f]+\s+0x[0-9a-f]+\s+(\S+)\s*(\S*)$", re.M)


def gdb_libraries(text: str) -> list[str]:
    """The file names `info sharedlibrary` lists ("Yes", "Yes (*)": without debug files)."""
    return [Path(p).name for p in re.findall(r"^0x[0-9a-f]+\s+0x[0-9a-f]+\s+Yes.*?\s(/\S+)$", text, re.M)]


def test_gdb_breaks_and_backtraces_in_the_copied_code(booted: BootResult) -> None:
    """gdb -batch runs the program with the audit library: with HUGIFY_ANONYMOUS=always
    (a traced process is never repaired in place, so only `always` copies under a
    debugger, on any filesystem) it stops in the program's exe_dispatch and the library's
    lib_dispatch, backtraces to main, and $pc is in anonymous memory (no file): the copies,
    one per window; without the mode the same stops and libraries, $pc in the files."""
    g = anon_checks(booted)["gdb"]
    on, off = g["on"]["output"], g["off"]["output"]
    for text in (on, off):
        assert re.search(r"^Breakpoint 1, (0x[0-9a-f]+ in )?exe_dispatch \(", text, re.M), text[-3000:]
        assert re.search(r"^Breakpoint 2, (0x[0-9a-f]+ in )?lib_dispatch \(", text, re.M), text[-3000:]
        assert re.search(r"^#1 +0x[0-9a-f]+ in main \(", text, re.M), text[-3000:]
        assert re.search(r"^#1 +0x[0-9a-f]+ in lib_entry \(", text, re.M), text[-3000:]
    assert gdb_libraries(on) == gdb_libraries(off), (gdb_libraries(on), gdb_libraries(off))
    assert {Path(LIB).name, "libc.so.6", "libhugify-audit.so"} <= set(gdb_libraries(on)), on[-2000:]
    lines = copy_lines(on.splitlines())
    assert {ln[0] for ln in lines} == OBJECTS and all(ln[1] == ln[2] > 0 for ln in lines), lines
    assert not copy_lines(off.splitlines()), off[-2000:]
    for text, copies in ((on, sum(ln[2] for ln in lines)), (off, 0)):
        pcs = [int(x, 16) for x in re.findall(r"^\$\d+ = 0x([0-9a-f]+)$", text, re.M)]
        maps = [(int(lo, 16), int(hi, 16), perms, obj) for lo, hi, perms, obj in GDB_MAPPING.findall(text)]
        anon = [(lo, hi) for lo, hi, perms, obj in maps if "x" in perms and obj == ""]
        assert len(pcs) == 2 and len(anon) == copies, (pcs, anon, text[-3000:])
        # exe_dispatch's pc: in a copy, or in the program's own mapping without them
        (where_pc,) = [obj for lo, hi, _, obj in maps if lo <= pcs[0] < hi]
        assert where_pc == ("" if copies else PROG), (hex(pcs[0]), maps)


def test_fragmented_memory_leaves_the_file_mapping_with_one_line(booted: BootResult) -> None:
    """No free 2 MiB block, provoked in the guest (most free memory held in small pages
    with every other page given back, what 2 MiB blocks were left taken as hugetlb pages,
    compaction off): the program in the mode (`always`) gives the same output, keeps its
    file mappings, and the audit library says so in one line per object naming
    fragmentation (the core's reason id `fragmented`); the settings are restored after."""
    f = anon_checks(booted)["fragmented"]
    plain = anon_checks(booted)["plain"]
    run = f["run"]
    left = {zone: n for zone, n in f["rounds"][-1].items() if zone != "DMA"}
    assert f["hugetlb_pages"] > 0 and not any(left.values()), (f["rounds"], f["hugetlb_pages"])
    assert run["rc"] == 0 and run["stdout"] == plain["stdout"], run["stderr"][-2000:]
    lines = copy_lines(run["debug"])
    assert sorted(ln[0] for ln in lines) == sorted(OBJECTS), run["debug"]
    for _, copied, windows, rest in lines:
        assert copied == 0 and windows > 0 and rest == ", window 0 fragmented: file mapping kept", lines
    got = anonymous_copies(run)
    assert got["anon_vmas"] == 0 and set(run["maps"]) == {PROG, LIB}, (got, run["maps"])
    assert f["thp_fault_fallback"] >= 1, f["thp_fault_fallback"]  # the kernel was asked, and had none
    assert f["restored"] == f["saved"] and f["hugetlb_pages_after"] == 0, f
    assert sum(n for zone, n in f["free_after"].items() if zone != "DMA") > 0, f["free_after"]


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
    khugepaged collapses file-backed code (testkit.vm.matrix.KHUGEPAGED_TEXT_SINCE, on a
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


def test_the_support_table_says_what_the_boot_asserts(booted: BootResult, as_is_windows: list[int]) -> None:
    """docs/runtime-reference.md's "Where it works" cells for this boot, as bench/matrix_table.py
    writes them from its row (testkit.vm.matrix.row), say what the tests above assert of it:
    every way huge, khugepaged's too where it collapses file-backed code, and the as-is
    program's whole window, where the kernel gives large folios; "no" where it does not."""
    r = row(booted)
    code, as_is, shared = matrix_table.cell(r), matrix_table.as_is_cell(r), matrix_table.shared_cell(r)
    if not supported(booted):
        # Through the shared copies (issue 31), with what they hold.
        ways = "hugify-run, audit library, audit library (dlopen)"
        assert re.fullmatch(rf"yes, through shared copies: {re.escape(ways)} \([\d.]+ MiB held\)", code), code
        assert re.fullmatch(rf"yes: {re.escape(ways)}; \d+ copies hold [\d.]+ MiB for \d+ windows .*", shared), shared
        assert as_is == "no", as_is
        return
    assert shared.startswith("not used: no copy made"), shared
    assert code.startswith("yes: prefetch, hugify-run, audit library, audit library (dlopen)"), code
    assert ("also khugepaged" in code) == khugepaged_collapses_code(booted.kernel, booted.fs), code
    whole = len(as_is_windows) * HP / 2**20
    assert re.fullmatch(rf"{whole:.1f} of [\d.]+ MiB: prefetch, hugify-run, audit library", as_is), as_is


def test_a_guest_is_keyed_by_what_dpkg_installs_and_runs(tmp_path: Path) -> None:
    """The guests' images and boots are keyed by what dpkg installs from hugify's and the
    test package's debs (testkit.debian.installed_digest): another version (a snapshot's
    is a digest of every source file) or other documents leave the key alone; another
    installed file's content or mode, or another maintainer script, change it."""

    def deb(version: str = "1.0", doc: str = "doc", code: str = "code", mode: int = 0o644, script: str = "") -> Path:
        root = tmp_path / f"{len(list(tmp_path.iterdir()))}"
        control = f"Package: hugify-key-test\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        files = {
            "DEBIAN/control": control + "Description: a test\n",
            "usr/share/doc/hugify-key-test/README": doc,
            "usr/share/man/man1/hugify-key-test.1": doc,
            "usr/lib/hugify-key-test/code.py": code,
        }
        if script:
            files["DEBIAN/postinst"] = f"#!/bin/sh\n{script}\n"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        (root / "usr/lib/hugify-key-test/code.py").chmod(mode)
        if script:
            (root / "DEBIAN/postinst").chmod(0o755)
        out = root.with_suffix(".deb")
        subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(out)], check=True, capture_output=True)
        return out

    key = installed_digest([deb()])
    assert installed_digest([deb(version="1.0+src.0123456789ab", doc="other documents")]) == key
    assert installed_digest([deb(code="other code")]) != key
    assert installed_digest([deb(mode=0o755)]) != key
    assert installed_digest([deb(script="true")]) != key


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
    # No init in the initramfs: the kernel looks for a root device of its own, finds none and
    # panics (GuestPanic: the kind of failure boot() tries once more).
    with pytest.raises(GuestPanic, match=r"the guest panicked; console:\n") as e:
        boot_uncached(**trixie_ext4, final=tmp_path / "boot", extra="rdinit=/no-such-init", timeout=300)
    assert "Kernel panic" in str(e.value) and "VFS" in str(e.value), e.value


# --- lld's objects ------------------------------------------------------------------------

LLD_WAYS = ("lld-prefetch", "lld-hugify-run", "lld-audit", "lld-anonymous", "lld-shared")
#: The audit library's verdict line for one object (runtime/audit.c debug_settled).
SETTLED = re.compile(r"^hugify-audit: (\S+): (\d+) windows: (\d+) huge .*, (\d+) replaced, (\d+) not-mapped$", re.M)


def test_lld_objects_get_their_windows_huge_or_copied(booted: BootResult) -> None:
    """lld's three objects, every way with HUGIFY_SHARED=0 but lld-shared (as the
    package's own program's ways): where the filesystem gives large folios exactly their
    whole windows PMD-mapped, file-backed, and nothing copied; where it does not, none of
    them file-backed huge, the anonymous mode copying every window, and through the
    boot service's shared copies every window mapped from its object's copy and
    PMD-mapped (ShmemPmdMapped). With a copy present the anonymous mode has nothing to
    do (the window is mapped from the copy before it looks: "not-needed"), so it is
    measured without the copies, as ways()' anonymous way is."""
    root = build_variant("with").ok().root
    windows = {
        "/" + p: len(window_offsets(readelf_windows(root / p, fixed=False))) for p in (LLD_PROG, LLD_LIB, LLD_PLUGIN)
    }
    assert all(windows.values()), windows
    mode = booted.results["boot_thp"]
    wrong = []
    for cache in CACHES:
        for way in LLD_WAYS:
            at = where(booted, mode, cache, way)
            step = booted.results["thp"][mode]["lld"][cache][way]["steps"][-1]
            if step["rc"] != 0 or not step["stdout"].startswith("hugify-deb-test-lld: "):
                wrong.append(f"{at}: exit {step['rc']}: {step['stdout'][-300:]} {step['stderr'][-1000:]}")
                continue
            pmd = {p: step["maps"].get(p, {"pmd": -1})["pmd"] for p in windows}
            if way == "lld-anonymous":
                got = anonymous_copies(step)["objects"]
                copied = {"/" + p: got.get(Path(p).name, (None,))[0] for p in (LLD_PROG, LLD_LIB, LLD_PLUGIN)}
                want = {p: 0 if supported(booted) else n for p, n in windows.items()}
                if copied != want:
                    wrong.append(f"{at}: windows copied {copied}, not {want}: {step['debug']}")
                if not supported(booted) and anonymous_copies(step)["anon_pmd"] < sum(windows.values()) * HP:
                    wrong.append(f"{at}: {anonymous_copies(step)['anon_pmd'] >> 10} KiB anonymous PMD-mapped")
                continue
            from_copy = way == "lld-shared" and not supported(booted)
            want_pmd = {p: n * HP if supported(booted) or from_copy else 0 for p, n in windows.items()}
            if pmd != want_pmd:
                wrong.append(f"{at}: PMD-mapped {pmd}, not {want_pmd}")
            shared = {p: step["maps"].get(p, {"shared": -1})["shared"] for p in windows}
            if shared != {p: n * HP if from_copy else 0 for p, n in windows.items()}:
                wrong.append(f"{at}: mapped from the shared copies {shared}: {step['debug']}")
            if way != "lld-prefetch":
                lines = {m[1]: (int(m[2]), int(m[4]), int(m[5])) for m in SETTLED.finditer("\n".join(step["debug"]))}
                if {p: lines.get(p) for p in windows} != {p: (n, 0, 0) for p, n in windows.items()}:
                    wrong.append(f"{at}: the audit library's lines {lines}, not one per lld object: {step['debug']}")
    assert not wrong, "\n".join(wrong)


# --- glibc's own advice, glibc.elf.thp (issue 31 item 7) -------------------------------------

#: The one glibc boot of the suite (bench/kernel_matrix.py boots all of the matrix): the
#: newest kernel on ext4, where the files get large folios.
GLIBC_SUBSET = ("newest", "ext4")


@pytest.fixture(scope="module")
def glibc_booted() -> BootResult:
    suite, fs = GLIBC_SUBSET
    try:
        return boot(resolve(suite), fs, extra=glibc_thp.root_extra())
    except (KernelUnavailable, VmError) as e:
        pytest.fail(f"{suite} on {fs} with glibc 2.44: {e}", pytrace=False)


@pytest.fixture(scope="module")
def glibc_limits() -> dict[str, int | None]:
    """The read_ahead_limit the core gives each of the package's files (installed path ->
    bytes), from the files the guest installed."""
    root = build_variant("with").ok().root
    out = {}
    for path in (PROG, LIB, "/" + EXEC, "/" + LLD_PLUGIN):
        p = _core.probe(root / path.lstrip("/"))
        assert p is not None, path
        w = _core.windows(p, HP)
        assert w["glibc_thp"]["advised"] == HP, (path, w)
        out[path] = w["glibc_thp"]["read_ahead_limit"]
    return out


def test_glibc_thp_makes_cold_code_huge_up_to_the_read_ahead_the_layout_allows(
    glibc_booted: BootResult, glibc_limits: dict[str, int | None]
) -> None:
    """Debian's glibc 2.44 over the matrix's root, booted: with glibc.elf.thp set, in the
    environment or system-wide, ld.so advises the program's, the library's and the as-is
    program's code (LD_DEBUG=files) and a cold start gets it all PMD-mapped — the library
    DT_NEEDED and through dlopen — exactly where the disk's read_ahead_kb is within the
    core's limit for the file: at 128 all of them; at 8192 (the virtio disk's default
    under this kernel) not the program and library (their writable data lies 432 KiB
    after their window), but the as-is program, whose lies 8 MiB after. Without the
    tunable nothing is advised and nothing is huge."""
    r = glibc_booted.results
    assert (
        r["glibc"] == "glibc 2.44" and r["tunable_before"] == r["tunable_after"] == "glibc.elf.thp: 0 (min: 0, max: 1)"
    )
    assert {"128", "8192"} <= set(r["runs"]) and str(r["read_ahead_default"]) in r["runs"], r["runs"].keys()
    runs = {"program": (PROG, LIB), "dlopen": (LIB,), "as-is": ("/" + EXEC,)}
    wrong = []
    for ra, per_ra in r["runs"].items():
        assert per_ra["system"]["tunable"] == "glibc.elf.thp: 1 (min: 0, max: 1)", per_ra["system"]["tunable"]
        for setting in ("off", "env", "system"):
            for name, paths in runs.items():
                step = per_ra[setting][name]
                at = f"read_ahead_kb {ra}, tunable {setting}, {name}"
                if step["rc"] != 0 or set(step["maps"]) != set(paths):
                    wrong.append(f"{at}: rc {step['rc']}, maps {step['maps']}")
                    continue
                advised = sorted(int(size, 16) for _, size, rc in step["madvise"] if rc == "0")
                for path in paths:
                    limit = glibc_limits[path]
                    want = setting != "off" and (limit is None or int(ra) << 10 <= limit)
                    got = step["maps"][path]
                    huge = glibc_thp.windows_huge({"rc": 0, "maps": {path: [got["pmd"], got["size"]]}}, path)
                    if huge != want or (not want and got["pmd"]):
                        wrong.append(f"{at}: {path} {got['pmd'] >> 10} of {got['size'] >> 10} KiB PMD-mapped")
                if (setting == "off") != (advised == []):
                    wrong.append(f"{at}: ld.so advised {advised}")
    assert not wrong, "\n".join(wrong)
    assert glibc_limits[PROG] is not None and 128 << 10 <= glibc_limits[PROG] < 8192 << 10, glibc_limits


def advised_by_ld_so(path: Path) -> bool:
    """Whether glibc 2.44's ld.so under glibc.elf.thp advises a window of the file that
    can come cold, from readelf's program headers: a load that is not writable, at least
    one huge page long, its address and file offset huge-page aligned (glibc's
    _dl_segment_thp_eligible), holding a whole window past the one of the ELF header."""
    return any(
        "W" not in ld.flags
        and ld.filesz >= HP
        and ld.vaddr % HP == 0
        and ld.offset % HP == 0
        and ld.offset + ld.filesz >= max(ld.offset, HP) + HP
        for ld in readelf_loads(path)
    )


def read_around_reaches_code(path: Path, read_ahead: int) -> bool:
    """Whether the fault in the last page of a load before the code (past the first
    page, which the kernel or ld.so reads with the ELF header) reads into the code's
    first window: mm/filemap.c reads `read_ahead` around a fault, half of it after."""
    loads = readelf_loads(path)
    code = min(ld.offset for ld in loads if "W" not in ld.flags and ld.offset % HP == 0 and ld.offset)
    ends = [-(-(ld.offset + ld.filesz) // 4096) * 4096 for ld in loads if ld.offset < code]
    end = max((e for e in ends if e > 4096), default=None)
    return end is not None and code - end < read_ahead // 2


@pytest.fixture(scope="module")
def manifest_files() -> list[str]:
    """The files the guest's manifests list, one path per inode as `hugify status` counts
    them (the package's program has a hard link)."""
    root = build_variant("with").ok().root
    listed = sorted({e.path for f in (root / MANIFEST_DIR).glob("*.list") for e in manifest.parse(f.read_text())})
    by_inode: dict[int, str] = {}
    for path in listed:
        by_inode.setdefault((root / path.lstrip("/")).stat().st_ino, path)
    return sorted(by_inode.values())


def test_status_in_the_glibc_root_names_the_read_ahead_that_defeats_it(
    glibc_booted: BootResult, glibc_limits: dict[str, int | None], manifest_files: list[str]
) -> None:
    """`hugify status` in the booted glibc 2.44 root, the tunable set system-wide: on, for
    the files whose code ld.so advises, as readelf's program headers tell: the program,
    the library, the as-is program and lld's plugin (linked as-is with its code at a
    2 MiB boundary), not lld's shifted program and library (their executable load
    starts mid-window after the read-only data lld puts first: only the windows inside
    it are whole, and ld.so advises whole loads only). At 8192 it names the virtio disk
    as defeating it for those whose earlier load's read-around reaches their code (the
    program, the library and the plugin; the as-is program's only earlier page is its
    header's, and the cold starts above show its writable data far enough), with the
    least of their limits as the value that keeps them (the cold starts above show the
    program's and the library's limit right); at 128 it names nothing."""
    root = build_variant("with").ok().root
    advised = [p for p in manifest_files if advised_by_ld_so(root / p.lstrip("/"))]
    assert set(advised) == {PROG, LIB, "/" + EXEC, "/" + LLD_PLUGIN}, advised
    defeated = {p for p in advised if read_around_reaches_code(root / p.lstrip("/"), 8192 << 10)}
    assert defeated == {PROG, LIB, "/" + LLD_PLUGIN}, defeated
    row = glibc_thp.glibc_thp_row(glibc_booted.results)
    head = (
        "hint: glibc.elf.thp (glibc 2.44): on system-wide; ld.so itself asks for huge pages for the code of "
        f"{len(advised)} of {len(manifest_files)} files"
    )
    low, high = row["runs"]["128"]["system"]["hint"], row["runs"]["8192"]["system"]["hint"]
    assert low == [head], low
    kb = min(glibc_limits[p] or 0 for p in defeated) >> 10
    assert high[0] == head and high[1].startswith(
        f"hint: glibc.elf.thp: read_ahead_kb 8192 of vda defeats it for {len(defeated)} of them"
    ), high
    assert glibc_thp.hint_limit(high) == kb, (high, kb)
    advice = row["runs"]["8192"]["system"]["advice"]
    assert advice["system_wide"] == 1 and {f["path"] for f in advice["files"] if f["defeated"]} == defeated, advice


def test_the_support_table_says_what_the_glibc_boot_asserts(
    glibc_booted: BootResult, glibc_limits: dict[str, int | None]
) -> None:
    """The "Where it works" cell bench/matrix_table.py writes for the glibc boot: per
    read_ahead_kb (the disk's default first), "yes" where the program's and the library's
    code all came PMD-mapped, which is within their limit, and none of it above; the
    as-is program's window where it differs."""
    row = {"glibc_thp": glibc_thp.glibc_thp_row(glibc_booted.results)}
    limit = min(glibc_limits[p] or 0 for p in (PROG, LIB))
    default = glibc_booted.results["read_ahead_default"]
    as_is = glibc_limits["/" + EXEC]
    parts = []
    for ra in dict.fromkeys((default, 128, 8192)):
        code, window = ra << 10 <= limit, as_is is None or ra << 10 <= as_is
        text = f"{ra}{' (default)' if ra == default else ''}: {'yes' if code else '0 of 4 MiB'}"
        parts.append(text + (f", the as-is program's window {'yes' if window else 'no'}" if window != code else ""))
    assert matrix_table.glibc_cell(row) == "read_ahead_kb " + "; ".join(parts), row
