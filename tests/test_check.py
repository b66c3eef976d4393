"""`hugify check`: a built tree or a set of built packages, checked after the last tool
that rewrites ELF files. The trees are made the way a build makes them: `hugify tree`
with its report and manifest (and `hugify sign` for the statement), then a real tool
after it: `strip --remove-section=.hugify.pad` (binutils) shrinks the executable load
to the end of its code, so its last window is no longer whole; a file installed again
from the build directory (the unhugified original); `objcopy --only-keep-debug` for
the debug files. Packages are real .debs made with dpkg-deb.

On main there is no `hugify check`: every test here fails there (the command is
unknown, exit 2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from testkit.cli import hugify
from testkit.recipes import BY_NAME, build

PROG = "usr/bin/prog"
LIB = "usr/lib/x86_64-linux-gnu/libhug.so.1"
MANIFEST = "usr/lib/hugify/manifest.d/p.list"


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every name under root with its mode and content (a symlink: its target)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b""
        out[str(p.relative_to(root))] = (st.st_mode, data)
    return out


@pytest.fixture(scope="module")
def large_elf() -> Path:
    return build(BY_NAME["gcc-bfd"])


@pytest.fixture
def built(tmp_path: Path, large_elf: Path) -> Path:
    """A build's tree after `hugify tree` (report beside it, manifest installed), with
    the debug files of the hugified files as dh_strip makes them (objcopy
    --only-keep-debug, named by build-id) in tmp_path/debug."""
    root = tmp_path / "root"
    (root / PROG).parent.mkdir(parents=True)
    (root / LIB).parent.mkdir(parents=True)
    shutil.copy(large_elf / "prog", root / PROG)
    shutil.copy(large_elf / "libhug.so", root / LIB)
    (root / MANIFEST).parent.mkdir(parents=True)
    hugify("tree", root, "--package", "p", "--report", tmp_path / "report.json", "--manifest", root / MANIFEST)
    for f in (PROG, LIB):
        bid = hugify("inspect", "--json", root / f, check=False).stdout.split('"build_id": "')[1][:40]
        dbg = tmp_path / "debug/usr/lib/debug/.build-id" / bid[:2] / f"{bid[2:]}.debug"
        dbg.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["objcopy", "--only-keep-debug", str(root / f), str(dbg)], check=True)
    return tmp_path


def check(tmp: Path, *extra: str | Path, debug: bool = True) -> subprocess.CompletedProcess[str]:
    args: list[str | Path] = [tmp / "root", "--report", tmp / "report.json"]
    if debug:
        args += ["--debug-root", tmp / "debug"]
    return hugify("check", *args, *extra, check=False)


def test_a_build_as_hugify_left_it_passes(built: Path) -> None:
    before = snapshot(built)
    start = time.monotonic()
    res = check(built)
    took = time.monotonic() - start
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines() == [f"hugify: check: {built / 'root'}: 2 hugified file(s) as hugify left them"]
    assert snapshot(built) == before, "check writes nothing"
    assert took < 30, took


def test_a_later_strip_that_undoes_the_layout_fails_with_one_line(built: Path) -> None:
    subprocess.run(["strip", "--remove-section=.hugify.pad", str(built / "root" / PROG)], check=True)
    res = check(built)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"hugify: {built / 'root'}: /{PROG}: the tree report has 4.0 MiB of windows")
    assert lines[0].endswith("a tool after hugify rewrote it (layout-undone)")
    assert lines[1].endswith("1 regression(s) in 2 file(s); the check fails")
    # The policy, or the command line, can make it a warning.
    (built / "warn.toml").write_text('on_regression = "warn"\n')
    res = check(built, "--policy", built / "warn.toml")
    assert res.returncode == 0 and "hugify: warning: " in res.stdout and "(layout-undone)" in res.stdout
    res = check(built, "--on-regression", "warn")
    assert res.returncode == 0 and "(layout-undone)" in res.stdout


def test_the_unhugified_file_installed_again_fails_its_manifest_and_debug_file(built: Path, large_elf: Path) -> None:
    """A later step copies the build directory's (plain) library over the hugified one."""
    shutil.copy(large_elf / "libhug.so", built / "root" / LIB)
    res = check(built)
    assert res.returncode == 1
    reasons = sorted(line.rsplit("(", 1)[1].rstrip(")") for line in res.stdout.splitlines()[:-1])
    assert reasons == ["debug-file-mismatch", "layout-undone", "manifest-stale"], res.stdout
    assert all(f"/{LIB}: " in line for line in res.stdout.splitlines()[:-1])


def test_debug_files_of_the_build_must_carry_the_shipped_build_id(built: Path) -> None:
    shutil.rmtree(built / "debug/usr/lib/debug/.build-id")
    (built / "debug/usr/lib/debug").mkdir(exist_ok=True)
    res = check(built)
    assert res.returncode == 1
    assert sorted(line.split(": ")[2] for line in res.stdout.splitlines()[:-1]) == sorted([f"/{LIB}", f"/{PROG}"])
    assert res.stdout.count("(debug-file-mismatch)") == 2
    # Without --debug-root, nothing is said about debug files.
    res = check(built, debug=False)
    assert res.returncode == 0 and res.stdout.endswith("; no debug files given\n"), res.stdout


def test_the_statement_must_name_the_bytes_that_ship(built: Path) -> None:
    root = built / "root"
    hugify("sign", root, "--report", built / "report.json", "--package", "p")
    assert check(built).returncode == 0
    # A tool that rewrites the file without touching its layout: the statement is stale.
    subprocess.run(["objcopy", "--remove-section=.comment", str(root / PROG)], check=True)
    res = check(built)
    assert res.returncode == 1
    assert "(statement-stale)" in res.stdout and "statement p names sha256" in res.stdout, res.stdout


def test_exposure_over_the_policy_limit_is_a_regression(tmp_path: Path) -> None:
    """lld's read-only data let into the code's window by the build's policy (1M): a
    check under the distribution's policy (exposure_limit 0) says so."""
    lib = build(BY_NAME["clang-lld-now"]) / "libhug.so"
    root = tmp_path / "root"
    (root / LIB).parent.mkdir(parents=True)
    shutil.copy(lib, root / LIB)
    (tmp_path / "expose.toml").write_text('exposure_limit = "1M"\n')
    hugify("tree", root, "--report", tmp_path / "report.json", "--policy", tmp_path / "expose.toml")
    assert (
        hugify("check", root, "--report", tmp_path / "report.json", "--policy", tmp_path / "expose.toml").returncode
        == 0
    )
    res = hugify("check", root, "--report", tmp_path / "report.json", check=False)
    assert res.returncode == 1, res.stdout
    assert "bytes made executable that were not; exposure_limit is 0" in res.stdout
    assert res.stdout.splitlines()[0].endswith("(exposure-over-limit)")


# --- packages -------------------------------------------------------------------------------


def _deb(tree: Path, name: str, out: Path) -> Path:
    (tree / "DEBIAN").mkdir(exist_ok=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: t\n t\n"
    )
    deb = out / f"{name}_1.0_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    shutil.rmtree(tree / "DEBIAN")
    return deb


def test_packages_and_their_dbgsym(built: Path) -> None:
    out = built / "out"
    out.mkdir()
    main = _deb(built / "root", "p", out)
    dbgsym = _deb(built / "debug", "p-dbgsym", out)
    res = hugify("check", main, dbgsym, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.endswith("p_1.0_amd64.deb: 2 hugified file(s) as hugify left them\n"), res.stdout
    # The package of the build with the file stripped after hugify.
    subprocess.run(["strip", "--remove-section=.hugify.pad", str(built / "root" / PROG)], check=True)
    bad = _deb(built / "root", "p", out)
    res = hugify("check", bad, dbgsym, check=False)
    assert res.returncode == 1 and f"p_1.0_amd64.deb: /{PROG}: " in res.stdout and "(layout-undone)" in res.stdout


# --- bad input: one line, its own exit status, nothing changed -------------------------------


def test_not_a_package_and_a_truncated_deb(built: Path) -> None:
    out = built / "out"
    out.mkdir()
    deb = _deb(built / "root", "p", out)
    text = out / "notes.deb"
    text.write_text("not a package\n")
    cut = out / "cut.deb"
    cut.write_bytes(deb.read_bytes()[: deb.stat().st_size // 2])
    before = snapshot(out)
    for target, says in ((text, "neither a .deb"), (cut, "cut.deb")):
        res = hugify("check", target, check=False)
        assert res.returncode == 3, res.stdout + res.stderr
        assert res.stdout == "" and len(res.stderr.splitlines()) == 1, res.stderr
        assert says in res.stderr and res.stderr.rstrip().endswith("(not-a-package)"), res.stderr
    assert snapshot(out) == before


@pytest.mark.parametrize("where", ["manifest-dir", "listed-file"])
def test_a_tree_with_a_symlink_out_of_it(built: Path, where: str) -> None:
    root = built / "root"
    outside = built / "outside"
    outside.mkdir()
    if where == "manifest-dir":
        (outside / "p.list").write_text((root / MANIFEST).read_text())
        shutil.rmtree(root / MANIFEST.rsplit("/", 1)[0])
        (root / MANIFEST.rsplit("/", 1)[0]).symlink_to(outside)
    else:
        shutil.move(root / PROG, outside / "prog")
        (root / PROG).symlink_to(outside / "prog")
    before, before_outside = snapshot(root), snapshot(outside)
    res = check(built)
    assert res.returncode == 6, res.stdout + res.stderr
    assert res.stdout == "" and len(res.stderr.splitlines()) == 1 and res.stderr.rstrip().endswith("(symlink)")
    assert snapshot(root) == before and snapshot(outside) == before_outside


def test_explain_knows_the_check_reasons() -> None:
    out = hugify("explain").stdout
    for rid in ("layout-undone", "manifest-stale", "debug-file-mismatch", "exposure-over-limit", "statement-stale"):
        assert rid in out, rid


def test_check_writes_the_same_verdict_whatever_the_order_of_packages(built: Path) -> None:
    out = built / "out"
    out.mkdir()
    main, dbgsym = _deb(built / "root", "p", out), _deb(built / "debug", "p-dbgsym", out)
    a = hugify("check", main, dbgsym, check=False).stdout
    b = hugify("check", dbgsym, main, check=False).stdout
    assert a == b and a.endswith("2 hugified file(s) as hugify left them\n")
