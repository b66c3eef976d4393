"""The runtime sees lld's hugified objects too. lld's rodata-first
shift used to move the program header table out of the first page, into the load that
stays (now it grows at e_phoff: tests/test_dwz_lld.py; a table nothing after it makes
room for still moves);
the audit library read the table only from the first 4 KiB of an object and so did
nothing for such a library: no MADV_HUGEPAGE, no repair, no anonymous copy, loaded by
DT_NEEDED or by dlopen. Now it reads the table wherever it lies inside the object's first
load, bounded by that mapping (runtime/hp_map.c).

Every layout hugify produces from lld output (testkit.runtime.LLD_LAYOUTS: the shift of
the default layout and of --no-rosegment; the alignment-only mode and objects linked on
2 MiB pages, whose executable load does not start on a window boundary), on this host's
kernel and filesystem, a program whose library comes by DT_NEEDED and a plugin by
dlopen: exactly their whole windows (readelf's program headers say which) end up
PMD-mapped through the audit library alone, from a cold cache and from small folios; the
same with the mappings read from /proc/self/maps' text (kernels before 6.11, which have
no PROCMAP_QUERY); through hugify-run; and every window is one anonymous huge page in
the anonymous-copy mode. HUGIFY_DEBUG says so per object."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.elf import readelf_windows, window_offsets
from testkit.runtime import (
    AUDIT_LIB,
    HUGIFY_RUN,
    LLD_LAYOUTS,
    Layout,
    Programs,
    build_programs,
    build_runtime,
    copy_programs,
    drop_caches,
    locked,
    parse_smaps,
    read_plainly,
)

SETTLED = re.compile(r"^hugify-audit: (\S+): (\d+) windows: (\d+) huge .* (\d+) replaced, (\d+) not-mapped$", re.M)
COPIED = re.compile(r"^hugify-audit: anonymous (\S+): (\d+)/(\d+) windows copied(.*)$", re.M)


@pytest.fixture(scope="module", params=LLD_LAYOUTS, ids=[x.name for x in LLD_LAYOUTS])
def layout_built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Programs:
    assert os.geteuid() == 0, "the runtime tests drop the page cache and need root (CI runs as root)"
    build_runtime()
    layout: Layout = request.param
    return build_programs(tmp_path_factory.mktemp(f"lld-{layout.name}"), layout)


@pytest.fixture
def progs(layout_built: Programs, tmp_path: Path) -> Programs:
    return copy_programs(layout_built, tmp_path / "bin")


def windows(path: Path) -> int:
    return len(window_offsets(readelf_windows(path, fixed=False)))


def run(argv: list[str | Path], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_ANONYMOUS")}
    p = subprocess.Popen(
        [str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **env}
    )
    try:
        out, err = p.communicate(timeout=120)
    finally:
        Path(f"/tmp/perf-{p.pid}.map").unlink(missing_ok=True)
    assert p.returncode == 0, f"{argv} -> {p.returncode}\n{out[-2000:]}\n{err}"
    assert "result " in out, out[-2000:]
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def assert_windows_huge(res: subprocess.CompletedProcess[str], progs: Programs) -> None:
    """Exactly the whole windows of each object are PMD-mapped in the program's smaps."""
    maps = parse_smaps(res.stdout)
    got = {p.name: maps[str(p)].pmd for p in progs.files}
    assert got == {p.name: windows(p) * HP for p in progs.files}, (got, res.stderr)
    assert all(windows(p) for p in progs.files)


def assert_debug_says_settled(res: subprocess.CompletedProcess[str], progs: Programs) -> None:
    """One HUGIFY_DEBUG line per object: all its windows huge, none left alone."""
    lines = {Path(m[1]).name: (int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in SETTLED.finditer(res.stderr)}
    assert lines == {p.name: (windows(p), windows(p), 0, 0) for p in progs.files}, res.stderr


@pytest.mark.parametrize("cache", ["cold", "small"])
@pytest.mark.parametrize("maps", ["procmap-query", "maps-text"])
def test_audit_library_makes_lld_objects_huge_dt_needed_and_dlopen(
    progs: Programs, tmp_path: Path, cache: str, maps: str
) -> None:
    env = {"LD_AUDIT": str(AUDIT_LIB), "HUGIFY_DEBUG": "1", "HUGIFY_RUNTIME_DIR": str(tmp_path)}
    if maps == "maps-text":
        env["HUGIFY_FORCE_SMAPS"] = "1"
    with locked():
        drop_caches()
        if cache == "small":
            read_plainly(progs.files)
        res = run([progs.prog, progs.plug], env)
    assert_windows_huge(res, progs)
    assert_debug_says_settled(res, progs)


def test_hugify_run_makes_lld_objects_huge(progs: Programs, tmp_path: Path) -> None:
    env = {"HUGIFY_AUDIT_LIB": str(AUDIT_LIB), "HUGIFY_DEBUG": "1", "HUGIFY_RUNTIME_DIR": str(tmp_path)}
    with locked():
        drop_caches()
        res = run([HUGIFY_RUN, progs.prog, progs.plug], env)
    assert_windows_huge(res, progs)
    for p in (progs.prog, progs.lib):
        n = windows(p)
        assert re.search(rf"^hugify-run: \S*{p.name}: {n} windows: {n} huge \({n} loaded", res.stderr, re.M), res.stderr


def test_anonymous_copies_of_lld_objects(progs: Programs, tmp_path: Path) -> None:
    env = {
        "LD_AUDIT": str(AUDIT_LIB),
        "HUGIFY_DEBUG": "1",
        "HUGIFY_ANONYMOUS": "always",
        "HUGIFY_RUNTIME_DIR": str(tmp_path),
    }
    res = run([progs.prog, progs.plug], env)
    lines = {Path(m[1]).name: (int(m[2]), int(m[3]), m[4]) for m in COPIED.finditer(res.stderr)}
    assert lines == {p.name: (windows(p), windows(p), "") for p in progs.files}, res.stderr
    # The program's own smaps: anonymous executable memory, all of it huge pages, one
    # 2 MiB page per window copied.
    text = res.stdout.split("--- smaps\n", 1)[1]
    anon_exec = anon_huge = 0
    cur = None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)", line)
        if m:
            cur = (int(m[2], 16) - int(m[1], 16), "x" in m[3] and m[4] == "0")
            anon_exec += cur[0] if cur[1] else 0
        elif line.startswith("AnonHugePages:") and cur and cur[1]:
            anon_huge += int(line.split()[1]) * 1024
    total = sum(windows(p) for p in progs.files) * HP
    assert anon_huge == total, (anon_huge, anon_exec, total)
