"""The debhelper add-on (dh-hugify/), proven with the real tools.

Slow tests build the test source package tests/deb/hugify-deb-test (debhelper-compat
13: a program with more than 1 MiB of code linked to its own shared library
package, a hardlinked second name, a small program, a package with a non-PIE
program whose code already sits on a whole 2 MiB window, an Architecture: all
package and a udeb that both hold a large ELF module) with `dpkg-buildpackage -us
-uc -b`, in several variants, and check the .debs: dh_strip's -dbgsym packages must
describe the hugified files, whose build-id differs from the plain build's in
exactly one bit (Debian never recomputes build-ids); the non-PIE program is listed
as-is and ships byte-identical to the plain build's. The add-on and hugify come from this
checkout (PERL5LIB, PATH); test_packages.py does the same with hugify's own
installed .deb.

Fast tests run dh_hugify directly on debian/PKG trees holding a prebuilt program
(testkit/recipes.py), and `dh --no-act` for the sequence.

Every variant is built in the same directory, one at a time (a lock shared by the
xdist workers), and cached by its inputs under the test cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hugify import manifest
from testkit import HP
from testkit.cli import hugify
from testkit.debian import (
    DATA_MODULE,
    EXEC,
    LIB,
    LINK,
    LLD_LIB,
    LLD_PLUGIN,
    LLD_PROG,
    MANIFEST_DIR,
    PROG,
    SMALL,
    STEP_TIME,
    UDEB_MODULE,
    DebBuild,
    build_id,
    build_variant,
    debug_file,
    files_of,
    gdb_backtrace,
    hugify_step_times,
    in_tree_env,
    run_in_root,
    source_line,
)
from testkit.elf import bits_differing, exec_load, hugified, readelf_windows, window_offsets
from testkit.recipes import BY_NAME
from testkit.recipes import build as build_fixture

slow = pytest.mark.slow


@pytest.fixture(scope="session")
def deb_build() -> Callable[[str], DebBuild]:
    return build_variant


@slow
def test_program_and_library_are_hugified_small_program_is_not(deb_build) -> None:
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    for f in (PROG, LIB):
        assert hugified(b.root / f), f
        assert not hugified(plain.root / f), f
    assert not hugified(b.root / SMALL)
    assert (b.root / SMALL).read_bytes() == (plain.root / SMALL).read_bytes()
    assert "hugify: /usr/bin/hugify-deb-small: skipped (below-threshold)" in b.log
    assert re.search(
        r"hugify: /usr/bin/hugify-deb-test: transformed \(shift\).*\(also: /usr/bin/hugify-deb-test-link\)", b.log
    )
    assert re.search(rf"hugify: /{re.escape(LIB)}: transformed \(shift\)", b.log)
    assert "hugify: hugify-deb-test: 1 transformed, 0 as-is, 1 skipped, 0 failed" in b.log
    assert "hugify: libhugdebtest1: 1 transformed, 0 as-is, 0 skipped, 0 failed" in b.log
    assert "hugify: hugify-deb-test-exec: 0 transformed, 1 as-is, 0 skipped, 0 failed" in b.log
    # lld's layout: program and library shifted, the plugin linked on 2 MiB pages as-is.
    assert "hugify: hugify-deb-test-lld: 2 transformed, 1 as-is, 0 skipped, 0 failed" in b.log
    for f in (LLD_PROG, LLD_LIB):
        assert re.search(rf"hugify: /{re.escape(f)}: transformed \(shift\)", b.log), f
    assert f"hugify: /{LLD_PLUGIN}: as-is (already-aligned)" in b.log


@slow
def test_non_pie_program_is_listed_as_is_and_ships_unchanged(deb_build) -> None:
    """The ET_EXEC linked with its code on a whole 2 MiB window: dh_hugify lists it as-is
    and changes no byte of it. dh_strip runs after dh_hugify and rewrites the file, but
    keeps its program headers and its build-id note: the manifest, written before it,
    names the windows and the build-id of the file that ships."""
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    shipped = b.root / EXEC
    assert shipped.read_bytes() == (plain.root / EXEC).read_bytes()
    sections = subprocess.run(["readelf", "-SW", str(shipped)], capture_output=True, text=True, check=True).stdout
    assert " .text " in sections and " .symtab " not in sections, "the shipped file is dh_strip's output"
    assert re.search(
        rf"^hugify: /{re.escape(EXEC)}: as-is \(already-aligned\): \S+ MiB of its code on whole huge-page windows",
        b.log,
        re.M,
    ), b.log[-6000:]
    header = subprocess.run(["readelf", "-hW", str(shipped)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\s*Type:\s+EXEC ", header, re.M), header
    windows = window_offsets(readelf_windows(shipped, fixed=True))
    assert windows, "the test program has no whole window"
    (entry,) = manifest.parse((b.pkg("hugify-deb-test-exec") / MANIFEST_DIR / "hugify-deb-test-exec.list").read_text())
    assert (entry.path, entry.build_id) == ("/" + EXEC, build_id(shipped))
    assert window_offsets([(entry.offset, entry.size)]) == windows and entry.huge_page == HP
    (info,) = json.loads(hugify("inspect", "--json", shipped, check=False).stdout)
    assert info["kind"] == "executable" and info["refusal"]["reason"] == "already-aligned", info["refusal"]
    assert window_offsets([(w["offset"], w["len"]) for w in info["windows_before"]]) == windows
    # The package is the plain build's plus its manifest; its dbgsym is the plain build's.
    got, want = files_of(b.pkg("hugify-deb-test-exec")), files_of(plain.pkg("hugify-deb-test-exec"))
    assert sorted(set(got) - set(want)) == [f"{MANIFEST_DIR}/hugify-deb-test-exec.list"]
    assert {k: v for k, v in got.items() if k in want} == want
    dbgsym = "hugify-deb-test-exec-dbgsym"
    assert files_of(b.pkg(dbgsym)) == files_of(plain.pkg(dbgsym))
    assert not (b.pkg("hugify-deb-test-exec") / "usr/share/hugify/attestations").exists(), "nothing was transformed"


@slow
def test_dh_hugify_runs_after_dh_missing_and_before_dh_dwz_and_dh_strip(deb_build) -> None:
    # dh runs every step itself ("   dh_strip -a"): debian/rules overrides none.
    log = deb_build("with").ok().log
    assert "override_dh_" not in log
    steps = [m[1] for m in re.finditer(r"^   (dh_\w+)", log, re.M)]
    cmds = ("dh_missing", "dh_hugify", "dh_dwz", "dh_strip", "dh_hugify_check", "dh_hugify_sign", "dh_gencontrol")
    order = [steps.index(cmd) for cmd in cmds]
    assert order == sorted(order), steps


def test_each_hugify_step_ends_with_how_long_it_took(deb_build) -> None:
    """dh_hugify, dh_hugify_check and dh_hugify_sign each end their part of the log with
    one line of their wall time, for the packages dh_hugify summarised: hugify's share
    of a build, read off its log wherever it was built."""
    log = deb_build("with").ok().log
    summarised = re.findall(r"^hugify: ([a-z0-9.+-]+): \d+ transformed, ", log, re.M)
    assert len(summarised) >= 4, summarised
    parts = re.split(r"^   (dh_\w+)[^\n]*\n", log, flags=re.M)
    for step in ("dh_hugify", "dh_hugify_check", "dh_hugify_sign"):
        (text,) = [parts[i + 1] for i in range(1, len(parts) - 1, 2) if parts[i] == step]
        last = text.rstrip("\n").splitlines()[-1]
        took = STEP_TIME.fullmatch(last)
        assert took and took[1] == step, (step, text)
        assert 0 < float(took[2]) < 600 and int(took[3]) == len(summarised), (step, last, summarised)
    assert set(hugify_step_times(log)) == {"dh_hugify", "dh_hugify_check", "dh_hugify_sign"}


@slow
def test_hardlink_survives_the_package(deb_build) -> None:
    b = deb_build("with").ok()
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(b.deb("hugify-deb-test"))], capture_output=True, text=True, check=True
    ).stdout
    assert re.search(rf"^h\S+ .* \./{LINK} link to \./{PROG}$", listing, re.M), listing
    assert os.stat(b.root / PROG).st_ino == os.stat(b.root / LINK).st_ino


@slow
def test_architecture_all_package_and_udeb_are_left_alone(deb_build) -> None:
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    for f in (DATA_MODULE, UDEB_MODULE):
        assert not hugified(b.root / f), f
        assert (b.root / f).read_bytes() == (plain.root / f).read_bytes(), f
        assert f"hugify: /{f}" not in b.log
    assert not (b.pkg("hugify-deb-test-data") / MANIFEST_DIR).exists()
    assert not (b.pkg("hugify-deb-test-udeb") / MANIFEST_DIR).exists()


@slow
def test_dbgsym_has_the_debug_file_of_the_shipped_build_id_one_bit_from_plain(deb_build) -> None:
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    for f, pkg in ((PROG, "hugify-deb-test"), (LIB, "libhugdebtest1")):
        shipped, original = build_id(b.root / f), build_id(plain.root / f)
        assert bits_differing(bytes.fromhex(shipped), bytes.fromhex(original)) == 1, (f, shipped, original)
        dbg = debug_file(b.pkg(f"{pkg}-dbgsym"), shipped)
        assert dbg.is_file(), f"{pkg}-dbgsym lacks {dbg}"
        assert build_id(dbg) == shipped
        # The debug file describes the hugified layout: the same program headers.
        assert exec_load(dbg).vaddr == exec_load(b.root / f).vaddr
        assert shipped in b.field(f"{pkg}-dbgsym", "Build-Ids").split()
    ids = {build_id(b.root / f) for f in (PROG, SMALL)}
    assert set(b.field("hugify-deb-test-dbgsym", "Build-Ids").split()) == ids
    assert b.field("libhugdebtest1-dbgsym", "Build-Ids").split() == [build_id(b.root / LIB)]
    # The small program was not transformed: its id is the plain build's.
    assert build_id(b.root / SMALL) == build_id(plain.root / SMALL)
    # Nor was the non-PIE program, listed as-is: its id, and its debug file's, are the plain build's.
    shipped = build_id(b.root / EXEC)
    assert shipped == build_id(plain.root / EXEC)
    assert build_id(debug_file(b.pkg("hugify-deb-test-exec-dbgsym"), shipped)) == shipped
    assert b.field("hugify-deb-test-exec-dbgsym", "Build-Ids").split() == [shipped]


def program_headers(path: Path) -> tuple[int, list[str]]:
    """e_phoff and the type of every program header entry, as readelf shows them."""
    header = subprocess.run(["readelf", "-hW", str(path)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^\s*Start of program headers:\s+(\d+) \(bytes into file\)", header, re.M)
    assert m, header
    out = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True).stdout
    table = out.split("Program Headers:\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return int(m[1]), [line.split()[0] for line in table if not line.lstrip().startswith("[")]


@slow
def test_lld_package_goes_through_dwz_and_strip_and_still_loads(deb_build) -> None:
    """The lld files, hugified with their program header table grown in place, then
    rewritten by dh_dwz and dh_strip (binutils) like any package's: the shipped files keep
    every program header at e_phoff 64 (dwz 0.15 once zeroed a table it found past the
    first page, and strip moved it), run from the package alone, and its -dbgsym package
    holds the debug file of each shipped build-id."""
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    assert re.search(r"^\s+dh_dwz -a$", b.log, re.M) and re.search(r"^\s+dh_strip -a$", b.log, re.M)
    pkg = b.pkg("hugify-deb-test-lld")
    for f in (LLD_PROG, LLD_LIB, LLD_PLUGIN):
        phoff, types = program_headers(pkg / f)
        assert phoff == 64 and types and "NULL" not in types, (f, phoff, types)
        sections = subprocess.run(["readelf", "-SW", str(pkg / f)], capture_output=True, text=True, check=True).stdout
        assert " .symtab " not in sections and " .debug_info " not in sections, f"{f} is not dh_strip's output"
    # Shifted: a whole 2 MiB window of code each, which the plain build's files lack.
    plain_pkg = plain.pkg("hugify-deb-test-lld")
    for f in (LLD_PROG, LLD_LIB):
        assert window_offsets(readelf_windows(pkg / f, fixed=False)), f
        assert not window_offsets(readelf_windows(plain_pkg / f, fixed=False)), f
    # The program, its library beside it (RUNPATH $ORIGIN) and its plugin, from the package alone.
    expected = subprocess.run(
        [str(plain_pkg / LLD_PROG), str(plain_pkg / LLD_PLUGIN)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert expected.returncode == 0 and expected.stdout.startswith("hugify-deb-test-lld: "), expected
    got = subprocess.run(
        [str(pkg / LLD_PROG), str(pkg / LLD_PLUGIN)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (got.returncode, got.stdout) == (0, expected.stdout), got.stderr
    # Its -dbgsym package: the debug file of each shipped object, with its build-id and its DWARF.
    dbgsym = b.pkg("hugify-deb-test-lld-dbgsym")
    ids = []
    for f in (LLD_PROG, LLD_LIB, LLD_PLUGIN):
        shipped = build_id(pkg / f)
        dbg = debug_file(dbgsym, shipped)
        assert dbg.is_file(), f"hugify-deb-test-lld-dbgsym lacks {dbg} ({f})"
        assert build_id(dbg) == shipped, f
        sections = subprocess.run(["readelf", "-SW", str(dbg)], capture_output=True, text=True, check=True).stdout
        assert " .debug_info " in sections, f"{dbg} has no DWARF"
        ids.append(shipped)
    assert sorted(b.field("hugify-deb-test-lld-dbgsym", "Build-Ids").split()) == sorted(ids)
    # The shifted files' ids are the plain build's but for one bit (Debian never recomputes them).
    for f in (LLD_PROG, LLD_LIB):
        shipped, original = build_id(pkg / f), build_id(plain_pkg / f)
        assert bits_differing(bytes.fromhex(shipped), bytes.fromhex(original)) == 1, (f, shipped, original)


@slow
def test_gdb_breaks_at_source_lines_and_backtraces_with_the_dbgsym_files(deb_build) -> None:
    b = deb_build("with").ok()
    lib_line, main_line = source_line("lib.c", "lib-breakpoint"), source_line("main.c", "main-calls-lib")
    out = gdb_backtrace(b.root, PROG, f"lib.c:{lib_line}")
    assert re.search(rf"Breakpoint 1, lib_entry \(x=\S+\) at (\./)?src/lib\.c:{lib_line}", out), out
    assert re.search(rf"#0\s+lib_entry \(x=\S+\) at (\./)?src/lib\.c:{lib_line}", out), out
    assert re.search(rf"#1\s+0x[0-9a-f]+ in main \(.*\) at (\./)?src/main\.c:{main_line}", out), out
    # A breakpoint in the moved code of the program itself (debug info through dwz's multifile).
    out = gdb_backtrace(b.root, PROG, "exe_f700")
    assert re.search(r"#0\s+exe_f700 \(x=\S+\) at (\./)?exe_gen\d\.c:\d+", out), out
    assert re.search(r"#1\s+0x[0-9a-f]+ in exe_dispatch \(.*\) at (\./)?exe_table\.c:\d+", out), out
    assert re.search(r"in main \(.*\) at (\./)?src/main\.c:\d+", out), out
    # The non-PIE program listed as-is, with its own dbgsym file.
    out = gdb_backtrace(b.root, EXEC, "fix_f700")
    assert re.search(r"#0\s+fix_f700 \(x=\S+\) at (\./)?fix_gen\d\.c:\d+", out), out
    exec_line = source_line("exec.c", "exec-calls-generated")
    assert re.search(rf"in main \(.*\) at (\./)?src/exec\.c:{exec_line}", out), out


@slow
def test_programs_run_correctly(deb_build) -> None:
    b, plain = deb_build("with").ok(), deb_build("plain").ok()
    expected = run_in_root(plain.root, PROG)
    assert expected.returncode == 0 and expected.stdout.startswith("hugify-deb-test: "), expected
    for prog in (PROG, LINK):
        got = run_in_root(b.root, prog)
        assert (got.returncode, got.stdout) == (0, expected.stdout), got.stderr
    assert run_in_root(b.root, SMALL).stdout == "hugify-deb-small\n"
    expected = run_in_root(plain.root, EXEC)
    assert expected.returncode == 0 and expected.stdout.startswith("hugify-deb-exec: "), expected
    got = run_in_root(b.root, EXEC)
    assert (got.returncode, got.stdout) == (0, expected.stdout), got.stderr


@slow
def test_each_package_ships_its_manifest_with_the_shipped_build_ids(deb_build) -> None:
    b = deb_build("with").ok()
    expect = {
        "hugify-deb-test": [PROG, LINK],
        "libhugdebtest1": [LIB],
        "hugify-deb-test-exec": [EXEC],
        "hugify-deb-test-lld": [LLD_PROG, LLD_LIB, LLD_PLUGIN],
    }
    # The Multi-Arch: same library's manifest names its architecture (see the i386 test below).
    names = {"hugify-deb-test": "hugify-deb-test", "libhugdebtest1": "libhugdebtest1:amd64"}
    for pkg, paths in expect.items():
        m = b.pkg(pkg) / MANIFEST_DIR / f"{names.get(pkg, pkg)}.list"
        assert m.is_file(), f"{pkg} ships no manifest"
        assert (m.stat().st_mode & 0o777) == 0o644
        entries = {e.path: e for e in manifest.parse(m.read_text())}
        assert sorted(entries) == sorted("/" + p for p in paths)
        for p in paths:
            e = entries["/" + p]
            assert e.build_id == build_id(b.root / p), "the manifest must name the shipped build-id"
            assert e.offset % e.huge_page == 0 and e.huge_page == 2 << 20
    assert sorted(p.name for p in (b.root / MANIFEST_DIR).iterdir()) == [
        "hugify-deb-test-exec.list",
        "hugify-deb-test-lld.list",
        "hugify-deb-test.list",
        "libhugdebtest1:amd64.list",
    ]
    assert (b.dir / "reports" / "hugify-deb-test.json").is_file()


@slow
def test_dh_hugify_sign_records_the_shipped_files_after_dh_strip(deb_build) -> None:
    b = deb_build("with").ok()
    statement = b.pkg("hugify-deb-test") / "usr/share/hugify/attestations/hugify-deb-test.intoto.json"
    shipped = hashlib.sha256((b.root / PROG).read_bytes()).hexdigest()
    assert shipped in statement.read_text(), "the statement must cover the stripped file that ships"


@slow
def test_multi_arch_same_package_installs_beside_its_other_architecture(
    deb_build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libhugdebtest1 is Multi-Arch: same: its amd64 build and its i386 cross-build
    (g++-i686-linux-gnu) each ship their manifest and statement under a name that says
    the architecture, so real dpkg installs both together (into a throwaway root with
    its own database), and the runtime reads both manifests."""
    amd64, i386 = deb_build("with").ok(), deb_build("with-i386").ok()
    assert "hugify: /usr/lib/i386-linux-gnu/libhugdebtest.so.1: transformed (shift)" in i386.log
    debs = []
    for b, arch in ((amd64, "amd64"), (i386, "i386")):
        lib = b.pkg("libhugdebtest1")
        assert (b.field("libhugdebtest1", "Architecture"), b.field("libhugdebtest1", "Multi-Arch")) == (arch, "same")
        assert sorted(p.name for p in (lib / MANIFEST_DIR).iterdir()) == [f"libhugdebtest1:{arch}.list"]
        attestations = lib / "usr/share/hugify/attestations"
        assert sorted(p.name for p in attestations.iterdir()) == [f"libhugdebtest1:{arch}.intoto.json"]
        debs += [b.deb("libhugdebtest1"), b.deb("libhugdebtest1-dbgsym")]
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/updates", "var/lib/dpkg/info"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").touch()
    (root / "var/lib/dpkg/arch").write_text("amd64\ni386\n")
    cmd = ["dpkg", "--root", str(root), "--force-depends", "--force-not-root", "--force-script-chrootless", "-i"]
    res = subprocess.run([*cmd, *debs], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    query = ["dpkg-query", "--admindir", str(root / "var/lib/dpkg"), "-W", "-f"]
    query += ["${Package}:${Architecture} ${Status}\n", "libhugdebtest1"]
    installed = subprocess.run(query, capture_output=True, text=True, check=True).stdout
    assert sorted(installed.splitlines()) == [f"libhugdebtest1:{a} install ok installed" for a in ("amd64", "i386")]
    # What the runtime reads: both manifests, each naming its own architecture's library.
    from hugify import prefetch

    monkeypatch.setenv("HUGIFY_STATE_DIR", str(tmp_path / "state"))  # no rpm-discovered list
    read = prefetch.manifest_files(root / MANIFEST_DIR)
    listed = {f.name: [e.path for e in manifest.parse(f.read_text())] for f in read}
    assert listed == {
        "libhugdebtest1:amd64.list": ["/usr/lib/x86_64-linux-gnu/libhugdebtest.so.1"],
        "libhugdebtest1:i386.list": ["/usr/lib/i386-linux-gnu/libhugdebtest.so.1"],
    }


# --- opt-outs: byte-identical to a build without the add-on --------------------------------


def _same_packages(b: DebBuild, plain: DebBuild) -> None:
    assert b.packages() == plain.packages()
    for pkg in plain.packages():
        got, want = files_of(b.pkg(pkg)), files_of(plain.pkg(pkg))
        assert sorted(got) == sorted(want), pkg
        assert [k for k in want if got[k] != want[k]] == [], pkg
        for fld in ("Build-Ids", "Depends", "Installed-Size"):
            assert b.field(pkg, fld) == plain.field(pkg, fld), (pkg, fld)


@slow
@pytest.mark.parametrize("variant", ["nohugify", "without", "override"])
def test_opt_out_is_byte_identical_to_a_build_without_the_add_on(deb_build, variant: str) -> None:
    b, plain = deb_build(variant).ok(), deb_build("plain").ok()
    assert "hugify: " not in b.log
    steps = [line.split()[0] for line in b.log.splitlines() if line.startswith("   dh_")]
    if variant == "nohugify":
        assert "dh_hugify" in steps, "dh still runs dh_hugify, which exits at once"
    elif variant == "override":
        assert "dh_hugify" not in steps and "dh_hugify_sign" in steps, "dh_hugify_sign finds no report"
    else:
        assert "dh_hugify" not in steps and "dh_hugify_sign" not in steps
    _same_packages(b, plain)


@slow
def test_a_later_tool_that_undoes_the_layout_fails_the_build(deb_build) -> None:
    """debian/rules runs strip on the hugified program after dh_strip
    (execute_after_dh_strip): dh_hugify_check fails the build before anything is
    signed or packaged. On main the same build succeeds and ships the file unhugified."""
    b = deb_build("undone")
    assert b.rc != 0, b.log[-3000:]
    assert re.search(
        rf"^hugify: debian/hugify-deb-test: /{PROG}: the tree report has .* \(layout-undone\)$", b.log, re.M
    ), b.log[-6000:]
    steps = [m[1] for m in re.finditer(r"^   (dh_\w+)", b.log, re.M)]
    assert steps[-1] == "dh_hugify_check" and "dh_hugify_sign" not in steps and "dh_builddeb" not in steps, steps
    assert not (b.dir / "debs").exists() or not any((b.dir / "debs").glob("*.deb"))


@slow
def test_hugify_check_on_the_built_changes(deb_build) -> None:
    """An archive's QA on an upload: `hugify check` on the .changes (every .deb and
    .udeb it lists, -dbgsym packages included) finds every hugified file as hugify
    left it, with its debug file, in well under a second per package."""
    import time

    b = deb_build("with").ok()
    (changes,) = (b.dir / "debs").glob("*.changes")
    start = time.monotonic()
    res = hugify("check", changes, check=False)
    took = time.monotonic() - start
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.endswith(": 7 hugified file(s) as hugify left them\n"), res.stdout
    packages = len([d for d in (b.dir / "debs").iterdir() if d.suffix in (".deb", ".udeb")])
    print(f"hugify check: {took:.2f} s for {packages} packages")
    assert took / packages < 1.0, took


@slow
def test_dh_extra_addons_enables_it_without_changing_the_package(deb_build) -> None:
    b, with_addon = deb_build("extra-addons").ok(), deb_build("with").ok()
    assert "   dh_hugify" in b.log
    assert hugified(b.root / PROG)
    _same_packages(b, with_addon)


# --- the sequence (fast: dh --no-act) --------------------------------------------------------


def changelog(source: str) -> str:
    trailer = " -- T <t@example.org>  Mon, 01 Jan 2024 00:00:00 +0000\n"
    return f"{source} (1.0) unstable; urgency=medium\n\n  * Test.\n\n{trailer}"


def _dh_source(tmp: Path, compat: int = 13, build_depends: str = "", bd_arch: str = "") -> Path:
    src = tmp / "seq"
    (src / "debian").mkdir(parents=True)
    bd = f"debhelper-compat (= {compat}){', ' + build_depends if build_depends else ''}"
    (src / "debian" / "control").write_text(
        f"Source: hugify-seq\nBuild-Depends: {bd}\n"
        + (f"Build-Depends-Arch: {bd_arch}\n" if bd_arch else "")
        + "\nPackage: hugify-seq\nArchitecture: any\nDescription: test\n test\n"
    )
    (src / "debian" / "changelog").write_text(changelog("hugify-seq"))
    return src


def _sequence(src: Path, *args: str, **env: str) -> list[str]:
    res = subprocess.run(
        ["dh", *args, "--no-act"],
        cwd=src,
        capture_output=True,
        text=True,
        env=in_tree_env(src.parent / "bin", **env),
        check=True,
    )
    return [line.strip() for line in res.stdout.splitlines()]


def test_sequence_puts_dh_hugify_before_dh_dwz(tmp_path: Path) -> None:
    seq = _sequence(_dh_source(tmp_path), "binary", "--with", "hugify")
    i = seq.index("dh_hugify")
    assert seq[i - 1 : i + 5] == [
        "dh_missing",
        "dh_hugify",
        "dh_dwz -a",
        "dh_strip -a",
        "dh_hugify_check",
        "dh_hugify_sign",
    ]


@pytest.mark.parametrize(("compat", "after"), [(12, "dh_dwz"), (11, "dh_strip")])
def test_sequence_in_older_compat_levels(tmp_path: Path, compat: int, after: str) -> None:
    seq = _sequence(_dh_source(tmp_path, compat), "binary", "--with", "hugify")
    assert seq[seq.index("dh_hugify") + 1] == after
    assert seq[seq.index("dh_strip") + 1 : seq.index("dh_strip") + 3] == ["dh_hugify_check", "dh_hugify_sign"]
    if compat == 11:
        assert "dh_dwz" not in seq


def test_activation_by_build_depends_and_dh_extra_addons(tmp_path: Path) -> None:
    seq = _sequence(_dh_source(tmp_path / "bd", build_depends="dh-sequence-hugify"), "binary")
    assert "dh_hugify" in seq
    seq = _sequence(_dh_source(tmp_path / "bda", bd_arch="dh-sequence-hugify"), "binary")
    assert "dh_hugify -a" in seq
    src = _dh_source(tmp_path / "extra")
    assert "dh_hugify" not in _sequence(src, "binary")
    assert "dh_hugify" in _sequence(src, "binary", DH_EXTRA_ADDONS="hugify")
    assert "dh_hugify" not in _sequence(src, "binary", "--without", "hugify", DH_EXTRA_ADDONS="hugify")
    # Architecture: all packages never get it (nor does binary-indep run it).
    assert "dh_hugify" not in _sequence(src, "binary-indep", "--with", "hugify")


# --- dh_hugify itself on debian/PKG trees (fast) ---------------------------------------------

CONTROL = """Source: hugify-opts
Build-Depends: debhelper-compat (= 13)

Package: pa
Architecture: any
Description: arch package with a program, its hardlink and a 0644 library
 a

Package: pb
Architecture: any
Description: arch package with a program
 b

Package: pc
Architecture: all
Description: arch-independent package holding an ELF file
 c

Package: pd
Package-Type: udeb
Section: debian-installer
Architecture: any
Description: udeb holding an ELF file
 d

Package: pe
Architecture: any
Description: arch package without ELF files
 e
"""


@pytest.fixture(scope="module")
def large_elf() -> Path:
    """A program and a library with about 2.5 MiB of code each, with symbols."""
    return build_fixture(BY_NAME["gcc-bfd"])


@pytest.fixture
def opts_src(tmp_path: Path, large_elf: Path) -> Path:
    src = tmp_path / "src"
    (src / "debian").mkdir(parents=True)
    (src / "debian" / "control").write_text(CONTROL)
    (src / "debian" / "changelog").write_text(changelog("hugify-opts"))
    for pkg in ("pa", "pb", "pc", "pd"):
        d = src / "debian" / pkg / "usr" / "bin"
        d.mkdir(parents=True)
        shutil.copy(large_elf / "prog", d / "prog")
    os.link(src / "debian/pa/usr/bin/prog", src / "debian/pa/usr/bin/prog-link")
    lib = src / "debian/pa/usr/lib/x86_64-linux-gnu/libhug.so.1"
    lib.parent.mkdir(parents=True)
    shutil.copy(large_elf / "libhug.so", lib)
    lib.chmod(0o644)  # Debian's shared libraries are not executable
    (src / "debian/pe/usr/share/doc/pe").mkdir(parents=True)
    (src / "debian/pe/usr/share/doc/pe/README").write_text("no ELF here\n")
    return src


def _dh_hugify(src: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _dh_command(src, "dh_hugify", *args, **env)


def _dh_command(src: Path, command: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [command, *args],
        cwd=src,
        capture_output=True,
        text=True,
        env=in_tree_env(src.parent / "bin", **env),
        check=False,
    )


def _transformed(src: Path) -> set[str]:
    """The packages whose program was hugified."""
    return {pkg for pkg in ("pa", "pb", "pc", "pd") if hugified(src / "debian" / pkg / "usr/bin/prog")}


def test_dh_hugify_transforms_arch_packages_only(opts_src: Path, large_elf: Path) -> None:
    original = (large_elf / "prog").read_bytes()
    res = _dh_hugify(opts_src)
    assert res.returncode == 0, res.stderr
    assert _transformed(opts_src) == {"pa", "pb"}
    for pkg in ("pc", "pd"):  # Architecture: all, udeb
        assert (opts_src / "debian" / pkg / "usr/bin/prog").read_bytes() == original
        assert not (opts_src / "debian" / pkg / "usr/lib/hugify").exists()
    assert not (opts_src / "debian/pe/usr/lib").exists(), "no manifest for a package without ELF files"
    pa = opts_src / "debian/pa"
    lib = pa / "usr/lib/x86_64-linux-gnu/libhug.so.1"
    assert hugified(lib), "a 0644 library is selected by its header"
    assert lib.stat().st_mode & 0o777 == 0o644
    assert os.stat(pa / "usr/bin/prog").st_ino == os.stat(pa / "usr/bin/prog-link").st_ino
    entries = manifest.parse((pa / MANIFEST_DIR / "pa.list").read_text())
    assert [e.path for e in entries] == ["/usr/bin/prog", "/usr/bin/prog-link", "/usr/lib/x86_64-linux-gnu/libhug.so.1"]
    assert [e.path for e in manifest.parse((opts_src / "debian/pb" / MANIFEST_DIR / "pb.list").read_text())] == [
        "/usr/bin/prog"
    ]
    assert "hugify: pa: 2 transformed" in res.stdout and "hugify: pb: 1 transformed" in res.stdout
    assert (opts_src / "debian/.debhelper/generated/pa/hugify-report.json").is_file()


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, {"pa", "pb"}),
        (("-a",), {}, {"pa", "pb"}),
        (("-i",), {}, set()),
        (("-ppb",), {}, {"pb"}),
        (("-Npa",), {}, {"pb"}),
        (("-ppc",), {}, set()),
        ((), {"DH_INTERNAL_OPTIONS": "-ppa"}, {"pa"}),  # what dh passes inside override targets
    ],
)
def test_package_selection_options(
    opts_src: Path, args: tuple[str, ...], env: dict[str, str], expected: set[str]
) -> None:
    res = _dh_hugify(opts_src, *args, **env)
    assert res.returncode == 0, res.stderr
    assert _transformed(opts_src) == expected


def test_exclude_option_is_a_literal_substring(opts_src: Path) -> None:
    res = _dh_hugify(opts_src, "-ppa", "-X.so.1")
    assert res.returncode == 0, res.stderr
    assert "hugify: /usr/lib/x86_64-linux-gnu/libhug.so.1: skipped (excluded)" in res.stdout
    assert not hugified(opts_src / "debian/pa/usr/lib/x86_64-linux-gnu/libhug.so.1")
    assert hugified(opts_src / "debian/pa/usr/bin/prog")
    res = _dh_hugify(opts_src, "-ppb", "-Xin/pr")  # "." and "/" are not special
    assert "hugify: /usr/bin/prog: skipped (excluded)" in res.stdout
    assert not hugified(opts_src / "debian/pb/usr/bin/prog")


def test_no_act_changes_nothing_and_verbose_shows_the_command(opts_src: Path, large_elf: Path) -> None:
    res = _dh_hugify(opts_src, "--no-act")
    assert (res.returncode, res.stdout) == (0, ""), res.stderr
    assert _transformed(opts_src) == set() and not (opts_src / "debian/pa/usr/lib/hugify").exists()
    res = _dh_hugify(opts_src, "--no-act", "-v", "-ppa")
    assert res.returncode == 0, res.stderr
    assert (
        "hugify tree debian/pa --package pa --arch amd64 --jobs 1 --manifest "
        "debian/.debhelper/generated/pa/hugify-manifest.list --report "
        "debian/.debhelper/generated/pa/hugify-report.json --no-progress --recorded-policy"
    ) in res.stdout
    assert _transformed(opts_src) == set()


def test_parallel_build_option_sets_the_jobs(opts_src: Path) -> None:
    res = _dh_hugify(opts_src, "-v", "-ppa", DEB_BUILD_OPTIONS="parallel=3 nocheck")
    assert res.returncode == 0, res.stderr
    assert "--jobs 3" in res.stdout
    assert _transformed(opts_src) == {"pa"}


def test_nohugify_exits_at_once(opts_src: Path) -> None:
    before = files_of(opts_src)
    res = _dh_hugify(opts_src, DEB_BUILD_OPTIONS="parallel=2 nohugify")
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    assert files_of(opts_src) == before


def test_params_after_double_dash_reach_hugify_tree(opts_src: Path, tmp_path: Path) -> None:
    off = tmp_path / "off.toml"
    off.write_text("enabled = false\n")
    res = _dh_hugify(opts_src, "--", "--policy", str(off))
    assert res.returncode == 0, res.stderr
    assert "hugify: disabled by the policy (enabled = false" in res.stdout
    assert _transformed(opts_src) == set()
    assert not (opts_src / "debian/pa/usr/lib/hugify").exists(), "an empty manifest is not shipped"


def test_a_file_that_cannot_be_transformed_warns_or_fails_the_build(opts_src: Path, tmp_path: Path) -> None:
    damaged = opts_src / "debian/pb/usr/bin/prog"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # truncated inside its sections
    before = damaged.read_bytes()
    res = _dh_hugify(opts_src, "-ppb")
    assert res.returncode == 0, res.stderr
    assert "hugify: warning: /usr/bin/prog: not transformed" in res.stdout
    fail = tmp_path / "fail.toml"
    fail.write_text('on_error = "fail"\n')
    res = _dh_hugify(opts_src, "-ppb", "--", "--policy", str(fail))
    assert res.returncode != 0
    assert "dh_hugify: error: hugify tree debian/pb" in res.stderr and "returned exit code 1" in res.stderr
    assert damaged.read_bytes() == before


def test_second_run_is_idempotent(opts_src: Path) -> None:
    assert _dh_hugify(opts_src, "-ppa").returncode == 0
    first = files_of(opts_src / "debian/pa")
    res = _dh_hugify(opts_src, "-ppa")
    assert res.returncode == 0, res.stderr
    assert "hugify: /usr/bin/prog: as-is (already-aligned)" in res.stdout
    assert files_of(opts_src / "debian/pa") == first


def test_package_without_elf_files_does_not_run_hugify(opts_src: Path) -> None:
    res = _dh_hugify(opts_src, "-ppe", "-v")
    assert res.returncode == 0, res.stderr
    assert "skipping pe: no ELF file" in res.stdout
    assert "hugify tree" not in res.stdout


def test_dh_hugify_check_fails_when_a_later_tool_undid_the_layout(opts_src: Path) -> None:
    """dh_hugify_check after dh_strip: a later strip that shrinks the executable load
    (its trap padding removed) fails the build with one line naming the file and the
    reason; the policy's on_regression = "warn" lets it go on. On main there is no
    dh_hugify_check (and dh_hugify_sign signed such a file)."""
    assert _dh_hugify(opts_src, "-ppa").returncode == 0
    res = _dh_command(opts_src, "dh_hugify_check", "-ppa", "-v")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hugify check debian/pa --report debian/.debhelper/generated/pa/hugify-report.json" in res.stdout
    assert "hugify: check: debian/pa: 3 hugified file(s) as hugify left them" in res.stdout
    prog = opts_src / "debian/pa/usr/bin/prog"
    subprocess.run(["strip", "--remove-section=.hugify.pad", str(prog)], check=True)
    res = _dh_command(opts_src, "dh_hugify_check", "-ppa")
    assert res.returncode != 0
    assert "hugify: debian/pa: /usr/bin/prog: the tree report has " in res.stdout, res.stdout
    assert res.stdout.count("(layout-undone)") == 2, res.stdout  # both names of the inode
    assert "dh_hugify_check: error: hugify check debian/pa" in res.stderr
    warn = opts_src.parent / "warn.toml"
    warn.write_text('on_regression = "warn"\n')
    res = _dh_command(opts_src, "dh_hugify_check", "-ppa", "--", "--policy", str(warn))
    assert res.returncode == 0 and "hugify: warning: debian/pa: /usr/bin/prog: " in res.stdout
    assert _dh_command(opts_src, "dh_hugify_check", "-ppa", DEB_BUILD_OPTIONS="nohugify").stdout == ""


def test_dh_hugify_says_when_only_dh_extra_addons_turns_it_on(opts_src: Path) -> None:
    """The builder's DH_EXTRA_ADDONS is not in the .buildinfo: the log says so, unless
    the source turns hugify on itself (dh-sequence-hugify, --with hugify)."""
    res = _dh_hugify(opts_src, "-ppb", DH_EXTRA_ADDONS="foo,hugify")
    assert res.returncode == 0, res.stderr
    assert "hugify is on only through DH_EXTRA_ADDONS, which the .buildinfo does not record" in res.stderr
    assert "DH_EXTRA_ADDONS" not in _dh_hugify(opts_src, "-ppb").stderr
    control = opts_src / "debian/control"
    control.write_text(
        control.read_text().replace("debhelper-compat (= 13)", "debhelper-compat (= 13),\n dh-sequence-hugify")
    )
    res = _dh_hugify(opts_src, "-ppb", DH_EXTRA_ADDONS="hugify")
    assert res.returncode == 0 and "DH_EXTRA_ADDONS" not in res.stderr, res.stderr
