"""The kernel x filesystem matrix: which boots the suite runs, what the kernels are known
to give, and the reading of a boot's results (tests/test_kernel_matrix.py,
bench/kernel_matrix.py, bench/matrix_table.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from testkit.vm.boot import FILESYSTEMS, BootResult, boot
from testkit.vm.kernels import SUITES, Kernel, kernel, newest_suite

#: The suite's subset of the matrix, one boot for each side of the large-folio line:
#: trixie's 6.12 on ext4, where files get no large folios (the verdict `unsupported`, the
#: anonymous and shared copies, perf and gdb in the copies), and the newest kernel (of
#: every suite's) on ext4, where they do (the code huge every way, khugepaged's collapse).
#: A third boot (6.12 on XFS, large folios the same way) added 9-16 minutes of TCG to a
#: run from empty caches and nothing the newest's does not assert; it, and every other
#: kernel and filesystem, is booted by bench/kernel_matrix.py (all of SUITES x FILESYSTEMS).
SUBSET = (("trixie", "ext4"), ("newest", "ext4"))
#: The suite's boots run the THP mode they were not booted in from a cold cache only
#: (the guest driver's hugify.second_caches=): the cache state changes what the runtime
#: reads and evicts, which the mode booted covers from both; the THP mode changes what
#: the kernel maps, which a cold start shows. bench/kernel_matrix.py runs every mode
#: from every cache state.
SUITE_SECOND_CACHES = ("cold",)

#: The first Linux release whose page cache holds this filesystem's file data in large
#: folios (what a 2 MiB window needs), from the kernel's history, not from hugify: XFS
#: since 5.18, ext4 since 6.16; btrfs only under CONFIG_BTRFS_EXPERIMENTAL, which
#: Debian's kernels do not set (None: never, for these kernels).
LARGE_FOLIOS_SINCE: dict[str, tuple[int, int] | None] = {"xfs": (5, 18), "ext4": (6, 16), "btrfs": None}

#: The first of the matrix's kernels whose khugepaged collapses the code of a running
#: program on such a filesystem into 2 MiB folios (THP `always`, or a MADV_HUGEPAGE
#: mapping): seen on 7.2 and 7.3, which no longer have CONFIG_READ_ONLY_THP_FOR_FS, the
#: option that gated it (off in Debian's 6.1 and 6.12: no collapse there). Releases
#: between 6.12 and 7.2 were not booted.
KHUGEPAGED_TEXT_SINCE = (7, 2)

#: The ways a process can get the code huge, in the order the table names them: "kernel"
#: is the fault path alone, "khugepaged" the kernel's later collapse of code that stays
#: mapped (the guest driver's "held" run, from a cold cache only).
WAYS = ("kernel", "khugepaged", "prefetch", "hugify-run", "audit", "audit-dlopen")
#: The ways through root's shared copies (issue 31): the guest driver runs hugify-run and
#: the audit library with them (every other way without: HUGIFY_SHARED=0).
SHARED_WAYS = ("shared-hugify-run", "shared-audit", "shared-audit-dlopen")
CACHES = ("cold", "small")
#: A series of starts reads "nothing more than without hugify" when it reads no more
#: than this much above the plain series (KiB): the plain series itself reads a few
#: hundred KiB (libc's and the loader's pages evicted by the cache drop before it).
PGPGIN_NOISE_KIB = 1024


def resolve(suite: str) -> Kernel:
    """A suite's kernel; "newest" is the one of the highest version among SUITES'."""
    if suite == "newest":
        return kernel(newest_suite())
    return kernel(suite)


def _version(k: Kernel) -> tuple[int, int]:
    major, minor = (int(x) for x in k.short.split("."))
    return major, minor


def gives_large_folios(k: Kernel, fs: str) -> bool:
    since = LARGE_FOLIOS_SINCE[fs]
    return since is not None and _version(k) >= since


def khugepaged_collapses_code(k: Kernel, fs: str) -> bool:
    """Whether khugepaged makes the code of a program that stays mapped long enough 2 MiB
    folios by itself on `fs` (in THP `always`)."""
    return gives_large_folios(k, fs) and _version(k) >= KHUGEPAGED_TEXT_SINCE


def fully_huge(step: dict[str, Any]) -> bool:
    """Whether every executable mapping of a hugified file in the step's processes was
    all PMD-mapped (and there was at least one)."""
    maps = step.get("maps") or {}
    return step.get("rc") == 0 and bool(maps) and all(m["pmd"] == m["size"] > 0 for m in maps.values())


#: The program the test package ships as-is (non-PIE, not rewritten): the guest driver's
#: cases for it, by the way they correspond to (its plain runs are the kernel's).
AS_IS_CASES = {
    "kernel": "as-is-plain",
    "prefetch": "as-is-prefetch",
    "hugify-run": "as-is-hugify-run",
    "audit": "as-is-audit",
}


def case(result: dict[str, Any], mode: str, cache: str, way: str) -> dict[str, Any]:
    name = {"kernel": "plain", "khugepaged": "held"}.get(way, way)
    return dict(result["thp"][mode]["cases"][cache][name])


def before_khugepaged(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain runs of a case up to the first during which khugepaged collapsed
    something: that collapse may have been of the run's code, and a later run finds the
    folios it made in the page cache (seen on a slow guest: the first of two plain runs
    from cold collapsed, the second mapped the code huge at once)."""
    out = []
    for step in steps:
        if step.get("collapsed"):
            break
        out.append(step)
    return out


def huge_by(result: dict[str, Any], mode: str, cache: str) -> dict[str, bool]:
    """way -> whether the program's (or the library's) code was fully PMD-mapped that
    way; "kernel" counts a plain first or second run before khugepaged collapsed anything
    (before_khugepaged: a collapse may have been of that run's code, khugepaged's, not the fault's),
    "khugepaged" the held run, which only boots since the driver had it made."""
    out = {}
    for way in WAYS:
        if way == "khugepaged" and "held" not in result["thp"][mode]["cases"][cache]:
            out[way] = False
            continue
        steps = case(result, mode, cache, way)["steps"]
        if way == "kernel":
            out[way] = any(fully_huge(s) for s in before_khugepaged(steps))
        else:
            out[way] = fully_huge(steps[-1])
    return out


def as_is_pmd(result: dict[str, Any], mode: str, cache: str) -> dict[str, dict[str, int]]:
    """way -> the as-is program's executable mapping: its bytes and how many of them were
    PMD-mapped (for "kernel", the most any plain run got without a khugepaged collapse);
    empty for boots made before the driver ran it."""
    cases = result["thp"][mode]["cases"][cache]
    out = {}
    for way, name in AS_IS_CASES.items():
        if name not in cases:
            continue
        # As for the code (huge_by): the plain runs count only without a collapse by
        # khugepaged meanwhile (it may have been of that run's code); a way's last step
        # counts as it is.
        steps = before_khugepaged(cases[name]["steps"]) if way == "kernel" else cases[name]["steps"][-1:]
        maps = [m for s in steps if s.get("rc") == 0 for m in s.get("maps", {}).values()]
        if maps:
            out[way] = max(maps, key=lambda m: m["pmd"])
    return out


def shared_bytes(step: dict[str, Any]) -> int:
    """Bytes of the program's and the library's executable mappings that were mapped from
    root's shared copies in the step's processes (the guest driver's probe)."""
    return sum(m.get("shared", 0) for m in (step.get("maps") or {}).values())


def shared_copies(result: dict[str, Any], mode: str, cache: str) -> dict[str, Any]:
    """What the shared ways got in one THP mode and cache state: per way whether the code
    was all PMD-mapped and how much of it came from the copies; the copies `hugify status`
    listed afterwards (path -> windows, huge windows, bytes held) and what they held in
    all (each copy once, whatever maps it)."""
    ways = {}
    copies: dict[str, Any] = {}
    for way in SHARED_WAYS:
        c = case(result, mode, cache, way)
        step = c["steps"][-1]
        ways[way] = {"huge": fully_huge(step), "from_copies": shared_bytes(step)}
        for cp in c["status"].get("shared_copies", {}).get("copies", []):
            copies[cp["path"]] = {k: cp[k] for k in ("size", "windows", "huge_windows", "held_bytes")}
    return {"ways": ways, "copies": copies, "held": sum(cp["held_bytes"] for cp in copies.values())}


def kernel_fields(k: Kernel, fs: str) -> dict[str, Any]:
    """What names a row of the matrix: the kernel, the filesystem and what they give."""
    return {
        "suite": k.suite,
        "package": k.package,
        "version": k.version,
        "release": k.release,
        "short": k.short,
        "fs": fs,
        "large_folios_expected": gives_large_folios(k, fs),
    }


def recorded(result: dict[str, Any], mode: str) -> list[str]:
    """The cache states the boot ran `mode` from (a suite's boot: its second mode cold only)."""
    return [cache for cache in CACHES if cache in result["thp"][mode]["cases"]]


def row(b: BootResult) -> dict[str, Any]:
    """One boot as the matrix's JSON records it."""
    r = b.results
    return kernel_fields(b.kernel, b.fs) | {
        "boot_seconds": b.seconds,
        "huge_by": {mode: {cache: huge_by(r, mode, cache) for cache in recorded(r, mode)} for mode in r["thp"]},
        "as_is": {mode: {cache: as_is_pmd(r, mode, cache) for cache in recorded(r, mode)} for mode in r["thp"]},
        "pgpgin_kib": next(e["pgpgin_kib"] for e in r["thp"].values() if "pgpgin_kib" in e),
        "io_starts": r.get("io_starts", EARLIER_IO_STARTS),
        "shared": {mode: {cache: shared_copies(r, mode, cache) for cache in recorded(r, mode)} for mode in r["thp"]},
        "boot_shared_copies": r["boot_status"].get("shared_copies", {}),
        "hold_seconds": hold_seconds(r),
        **{
            key: {
                mode: {cache: anonymous_copies(case(r, mode, cache, way)["steps"][-1]) for cache in recorded(r, mode)}
                for mode in r["thp"]
            }
            for key, way in ANONYMOUS_WAYS.items()
            if way in r["thp"][next(iter(r["thp"]))]["cases"]["cold"]  # boots before issue 38 lack the second
        },
    }


#: The starts per series of the guest driver's I/O check before it recorded the number.
EARLIER_IO_STARTS = 20
#: How long the guest driver held the program's code mapped in its "held" run before it
#: recorded the seconds (boots made until then).
EARLIER_HOLD_SECONDS = 30


def hold_seconds(result: dict[str, Any]) -> int:
    """The seconds the boot's "held" run kept the program's code mapped for khugepaged."""
    held = [e["cases"]["cold"]["held"] for e in result["thp"].values() if "held" in e["cases"]["cold"]]
    return max((h.get("hold_seconds", EARLIER_HOLD_SECONDS) for h in held), default=EARLIER_HOLD_SECONDS)


#: The anonymous-copy mode's ways, by the row's key: through the audit library
#: (HUGIFY_ANONYMOUS=1), and `hugify-run --anonymous` as root with no runtime directory
#: to be had (issue 38 item 4).
ANONYMOUS_WAYS = {"anonymous": "anonymous", "anonymous_root_norun": "anonymous-root-norun"}


#: The audit library's line for one object in the anonymous-copy mode (runtime/hp_anon.c).
ANON_LINE = re.compile(r"^hugify-audit: anonymous (\S+): (\d+)/(\d+) windows copied(.*)$", re.M)


def copy_lines(debug: list[str]) -> list[tuple[str, int, int, str]]:
    """The mode's debug lines in order: (file name, copied, windows, the rest of the line)."""
    return [(Path(m[1]).name, int(m[2]), int(m[3]), m[4]) for m in ANON_LINE.finditer("\n".join(debug))]


def anonymous_copies(step: dict[str, Any]) -> dict[str, Any]:
    """What the anonymous-copy mode did in one run: per object (by file name: ld.so names
    a library by the path it found, /lib/… on a merged-/usr root) (copied, windows, the
    rest of its line), and the executable anonymous memory PMD-mapped in the process."""
    objects = {name: (copied, windows, rest) for name, copied, windows, rest in copy_lines(step["debug"])}
    return {"objects": objects, "anon_pmd": step["anon_exec"]["pmd"], "anon_vmas": step["anon_exec"]["vmas"]}


def suite_boot(suite: str, fs: str) -> BootResult:
    """One of the suite's boots (SUBSET), with its second THP mode cold only."""
    return boot(resolve(suite), fs, kernel_args=f"hugify.second_caches={','.join(SUITE_SECOND_CACHES)}")


def planned_caches(b: BootResult, mode: str) -> tuple[str, ...]:
    """The cache states a suite's boot (suite_boot) ran `mode` from."""
    return CACHES if mode == b.results["boot_thp"] else SUITE_SECOND_CACHES


def boot_matrix(pairs: list[tuple[str, str]]) -> list[BootResult]:
    return [boot(resolve(suite), fs) for suite, fs in pairs]


def full_matrix() -> list[tuple[str, str]]:
    return [(suite, fs) for suite in SUITES for fs in FILESYSTEMS]
