"""A real Debian source package built by sbuild in a clean chroot, with hugify
turned on the way docs/packaging-debian.md ("Turning it on, recorded") tells a
distribution: the source gets one Build-Depends, `dh-sequence-hugify` (the
`+hugify1` source a distribution's archive derives, issue 44), and the archive
offers hugify's packages; hugify depends on the distribution's policy package
(here the test distribution's, tests/deb/hugify-policy-test, threshold 4 KiB, as
GNU hello's code is about 10 KiB), so the .buildinfo records both exact versions.
The package is otherwise the archive's, unchanged (its debian/rules is a plain
`dh $@`, debhelper compat 13, with a -dbgsym package).

The source is fetched with `apt-get source` (testkit/debian_roots.py: a private
deb-src list); the chroot is a tarball made by mmdebstrap (--variant=buildd) and
used by sbuild's unshare backend, so every build starts from the same clean root
(testkit/debian_repro.py). The package is built twice, hugified and as the archive
has it, and each build (its .debs unpacked, its log and host lintian's tags) is
cached keyed by its inputs. tests/test_repro_switch.py rebuilds the hugified one
from its .buildinfo alone.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.debian import DebBuild, build_id, debug_file
from testkit.debian_repro import archive_build, hugified_build, parse_buildinfo
from testkit.debian_roots import source_package
from testkit.elf import bits_differing, exec_load, hugified

SOURCE = "hello"
PROGRAM = "usr/bin/hello"


def lintian_tags(debs: Path) -> list[str]:
    """Host lintian's tags for every .deb of a build, with its version numbers out."""
    res = subprocess.run(
        ["lintian", "--no-tag-display-limit", "--display-info", *sorted(map(str, debs.glob("*.deb")))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode in (0, 1), res.stderr
    return sorted(line for line in res.stdout.splitlines() if re.match(r"^[EWIXP]: ", line))


def with_lintian(b: DebBuild) -> DebBuild:
    lintian = b.dir / "lintian"
    if not lintian.exists():
        tmp = lintian.with_suffix(".tmp")
        tmp.write_text("\n".join(lintian_tags(b.dir / "debs")) + "\n")
        tmp.rename(lintian)
    return b


@pytest.fixture(scope="module")
def with_hugify() -> DebBuild:
    return with_lintian(hugified_build().ok())


@pytest.fixture(scope="module")
def without_hugify() -> DebBuild:
    return with_lintian(archive_build().ok())


def test_sbuild_with_the_recorded_switch_hugifies_the_archive_package(
    with_hugify: DebBuild, without_hugify: DebBuild
) -> None:
    log = with_hugify.log
    # hugify and the distribution's policy came in as build dependencies of the source.
    assert re.search(r"^Setting up hugify-policy-test ", log, re.M), log[-6000:]
    assert re.search(r"^Setting up hugify ", log, re.M), log[-6000:]
    assert not re.search(r"^(Setting up hugify|   dh_hugify)", without_hugify.log, re.M)
    steps = [line.split()[0] for line in log.splitlines() if line.startswith("   dh_")]
    order = [steps.index(s) for s in ("dh_hugify", "dh_dwz", "dh_strip", "dh_hugify_check", "dh_hugify_sign")]
    assert order == sorted(order), steps
    assert "DH_EXTRA_ADDONS" not in log
    # The .buildinfo records the switch: both packages at their exact versions.
    (buildinfo,) = (with_hugify.dir / "debs").glob("*.buildinfo")
    recorded = parse_buildinfo(buildinfo)["Installed-Build-Depends"]
    assert re.search(r"\bhugify \(= [^)]+\)", recorded), recorded
    assert "hugify-policy-test (= 1.0)" in recorded, recorded
    assert re.search(rf"^hugify: /{PROGRAM}: transformed \(", log, re.M), log[-6000:]
    prog = with_hugify.pkg(SOURCE) / PROGRAM
    plain = without_hugify.pkg(SOURCE) / PROGRAM
    x = exec_load(prog)
    assert (x.offset % HP, x.vaddr % HP, x.align) == (0, 0, HP)
    assert hugified(prog) and not hugified(plain)
    manifest = with_hugify.pkg(SOURCE) / "usr/lib/hugify/manifest.d" / f"{SOURCE}.list"
    assert f"/{PROGRAM}" in manifest.read_text()
    # The program still works: run it from the unpacked package.
    res = subprocess.run([str(prog)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout == "Hello, world!\n", res


def test_dbgsym_matches_the_hugified_build_ids(with_hugify: DebBuild, without_hugify: DebBuild) -> None:
    prog = with_hugify.pkg(SOURCE) / PROGRAM
    bid = build_id(prog)
    dbg = debug_file(with_hugify.pkg(f"{SOURCE}-dbgsym"), bid)
    assert dbg.is_file(), sorted(os.listdir(dbg.parent.parent)) if dbg.parent.parent.is_dir() else "no .build-id"
    assert build_id(dbg) == bid
    assert with_hugify.field(f"{SOURCE}-dbgsym", "Build-Ids") == bid
    # Both builds ran in the same path of the same chroot, from the same upstream
    # source and changelog date: hugify flipped one bit.
    plain = build_id(without_hugify.pkg(SOURCE) / PROGRAM)
    assert bits_differing(bytes.fromhex(bid), bytes.fromhex(plain)) == 1
    # gdb finds the debug file by the build-id and resolves main to a source line.
    res = subprocess.run(
        [
            "gdb",
            "-batch",
            "-nx",
            "-iex",
            f"set debug-file-directory {with_hugify.pkg(f'{SOURCE}-dbgsym') / 'usr/lib/debug'}",
            "-ex",
            "info line main",
            str(prog),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert re.search(r'Line \d+ of "[^"]*hello\.c"', res.stdout), res.stdout + res.stderr


def test_lintian_reports_nothing_new_with_hugify(with_hugify: DebBuild, without_hugify: DebBuild) -> None:
    before = set((without_hugify.dir / "lintian").read_text().splitlines())
    after = set((with_hugify.dir / "lintian").read_text().splitlines())
    assert after - before == set(), sorted(after - before)


def test_source_is_the_archives_and_untouched(with_hugify: DebBuild) -> None:
    dsc = source_package(SOURCE)
    res = subprocess.run(["dscverify", "--no-sig-check", str(dsc)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    version = with_hugify.field(SOURCE, "Version")
    assert dsc.name == f"{SOURCE}_{version.removesuffix('+hugify1')}.dsc"
