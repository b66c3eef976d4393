"""The rpm integration, proven with the real tools: rpmbuild -bb with the hugify
macros loaded where rpm would load them, find-debuginfo, rpm2cpio | cpio, readelf,
gdb. The test package (tests/rpm/hugify-test.spec) has a program and a shared
library with more than 1 MiB of code each, both built with -g, and a small program.
The macro files are loaded with `rpmbuild --load` (rpmbuild forgets `--macros` when
it reads its configuration for the build target); the fast `rpm --eval` tests at the
end put them at the places in rpm's macro path where a package or an administrator
installs them, which is what decides whether their definitions win.

Every variant is built once per test session, one after the other in the same
build directory (a lock shared by the xdist workers), so that builds which should
be byte-identical have the same paths in their debug info.

rpm's find-debuginfo recomputes build-ids (%_unique_build_ids), so the id that ships
is debugedit's hash of the hugified file, not hugify's flipped one; the checks below
compare against what the RPMs contain, never against hugify's own id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hugify import manifest
from testkit import HP, REPO
from testkit.cache import locked
from testkit.cli import hugify, rpm_env, write_launcher
from testkit.elf import exec_load, hugified, readelf_build_id
from testkit.rpm import BRP, HOST_MACROS, MACROS, WITH_MACROS, MacroFiles, macro_path, rpm_eval

RPM_DIR = REPO / "tests" / "rpm"
SPEC = RPM_DIR / "hugify-test.spec"
BROKEN_SPEC = RPM_DIR / "hugify-broken.spec"
PROG, LINK, SMALL = "usr/bin/hugify-test", "usr/bin/hugify-test-link", "usr/bin/hugify-small"
LIB = "usr/lib64/libhugtest.so.1"
MANIFEST = "usr/lib/hugify/manifest.d/hugify-test.list"


@dataclass(frozen=True)
class Variant:
    spec: Path = SPEC
    macros: MacroFiles = ()
    #: Lines a maintainer would add to the spec preamble.
    preamble: tuple[str, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()


VARIANTS = {
    # Off also when a system-wide hugify (make install, the hugify rpm) put its
    # macros into /usr/lib/rpm/macros.d, which every rpmbuild reads.
    "plain": Variant(defines=(("_hugify", "0"),)),
    "hugify": Variant(macros=WITH_MACROS),
    "hugify-0": Variant(macros=WITH_MACROS, preamble=("%global _hugify 0",)),
    "hugify-no": Variant(macros=WITH_MACROS, preamble=("%global _hugify no",)),
    "brp-nil": Variant(macros=WITH_MACROS, preamble=("%global __brp_hugify %{nil}",)),
    "host-nodebug": Variant(
        macros=((MACROS, "macros.d"), (HOST_MACROS, "etc")), defines=(("debug_package", "%{nil}"),)
    ),
    # A tool after find-debuginfo that undoes the layout (binutils' strip drops the trap
    # padding): the check that the host file puts last in %__spec_install_post fails.
    "undone": Variant(
        macros=((MACROS, "macros.d"), (HOST_MACROS, "etc")),
        defines=(("__arch_install_post", "strip --remove-section=.hugify.pad %{buildroot}/" + PROG),),
    ),
    "broken-warn": Variant(BROKEN_SPEC, WITH_MACROS),
    "broken-fail": Variant(BROKEN_SPEC, WITH_MACROS, defines=(("_hugify_opts", "--policy @FAIL@"),)),
    "broken-fail-excluded": Variant(
        BROKEN_SPEC,
        WITH_MACROS,
        preamble=(r"%global _hugify_exclude_from ^/usr/lib64/libdamaged\\.so$",),
        defines=(("_hugify_opts", "--policy @FAIL@"),),
    ),
}


@dataclass
class Built:
    rc: int
    log: str
    rpms: list[Path]
    root: Path  # every RPM of the build extracted here
    report: dict[str, object] | None = None
    contents: dict[str, list[str]] = field(default_factory=dict)  # rpm name -> paths

    def rpm(self, suffix: str) -> Path:
        return next(r for r in self.rpms if r.name.endswith(suffix))


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run
    d = base / "hugify-rpm"
    d.mkdir(exist_ok=True)
    return d


def _write_wrapper(shared: Path) -> Path:
    """The `hugify` command the brp script runs: this checkout, the shipped policy."""
    return write_launcher(shared / "bin" / "hugify", REPO / "policy" / "policy.toml")


def _build(shared: Path, name: str) -> Built:
    v = VARIANTS[name]
    out = shared / "variants" / name
    top = shared / "top"  # one build path for every variant
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    (out / "rpms").mkdir(parents=True)
    home = shared / "home"  # no ~/.rpmmacros of whoever runs the tests
    home.mkdir(exist_ok=True)
    fail_policy = shared / "fail.toml"
    fail_policy.write_text('on_error = "fail"\n')
    text = v.spec.read_text()
    spec = out / v.spec.name
    spec.write_text(text.replace("\nName:", "\n" + "".join(f"{line}\n" for line in v.preamble) + "Name:", 1))
    cmd = ["rpmbuild", "-bb", "--define", f"_topdir {top}", "--define", f"hugify_test_src {RPM_DIR}"]
    for f, _ in v.macros:
        # rpmbuild re-reads its configuration for the build target and forgets
        # --macros, so builds load the files last; the --eval tests below check the
        # same files at their real positions in rpm's macro path.
        cmd += ["--load", str(f)]
    cmd += ["--define", f"__hugify {_write_wrapper(shared)}", "--define", f"__hugify_brp {BRP}"]
    for k, val in v.defines:
        cmd += ["--define", f"{k} {val.replace('@FAIL@', str(fail_policy))}"]
    res = subprocess.run(
        [*cmd, str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the shell trace and the tools' output in order
        text=True,
        env={**os.environ, "HOME": str(home)},
        check=False,
    )
    log = res.stdout
    (out / "log").write_text(log)
    rpms = []
    for r in sorted((top / "RPMS").rglob("*.rpm")):
        rpms.append(out / "rpms" / r.name)
        shutil.move(r, rpms[-1])
    root = out / "root"
    root.mkdir()
    for r in rpms:
        subprocess.run(f"rpm2cpio {r} | cpio -idm --quiet", shell=True, cwd=root, check=True)
    # Beside the build (rpm >= 4.20 removes its own BUILD/NAME-VERSION-build after it).
    reports = list((top / "BUILD").glob("*.hugify.json"))
    (out / "rc").write_text(str(res.returncode))
    if reports:
        shutil.copy(reports[0], out / "report.json")
    shutil.rmtree(top, ignore_errors=True)
    (out / "done").touch()
    return _load(out)


def _load(out: Path) -> Built:
    rpms = sorted((out / "rpms").glob("*.rpm"))
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    contents = {}
    for r in rpms:
        q = subprocess.run(["rpm", "-qlp", str(r)], capture_output=True, text=True, check=True).stdout
        contents[r.name] = q.split()
    return Built(int((out / "rc").read_text()), (out / "log").read_text(), rpms, out / "root", report, contents)


@pytest.fixture(scope="session")
def rpm_build(tmp_path_factory: pytest.TempPathFactory):
    shared = _shared_dir(tmp_path_factory)

    def get(name: str) -> Built:
        out = shared / "variants" / name
        with locked(shared / "lock"):
            if (out / "done").exists():
                return _load(out)
            return _build(shared, name)

    return get


def _ok(b: Built) -> Built:
    assert b.rc == 0, b.log[-4000:]
    return b


def _lines(path: Path, marker: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def _run(b: Built, prog: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(b.root / "usr/lib64")}
    return subprocess.run([str(b.root / prog)], capture_output=True, text=True, env=env, timeout=60, check=False)


slow = pytest.mark.slow


# --- the default: macros.d file loaded, -debuginfo built -------------------------------


@slow
def test_program_and_library_are_hugified_small_program_is_not(rpm_build) -> None:
    b, plain = _ok(rpm_build("hugify")), _ok(rpm_build("plain"))
    for f in (PROG, LIB):
        assert hugified(b.root / f), f
        assert not hugified(plain.root / f), f
    assert not hugified(b.root / SMALL)
    assert (b.root / SMALL).read_bytes() != b""  # shipped, only not transformed
    assert re.search(r"hugify: /usr/bin/hugify-small: skipped \(below-threshold\)", b.log)
    assert re.search(r"hugify: /usr/bin/hugify-test: transformed \(shift\).*\(also: /usr/bin/hugify-test-link\)", b.log)
    assert re.search(r"hugify: /usr/lib64/libhugtest.so.1: transformed", b.log)
    assert "hugify: hugify-test: 2 transformed, 0 as-is, 1 skipped, 0 failed" in b.log
    # The hardlink survives hugify, find-debuginfo and the package.
    assert os.stat(b.root / PROG).st_ino == os.stat(b.root / LINK).st_ino


@slow
def test_hugify_runs_before_find_debuginfo(rpm_build) -> None:
    log = _ok(rpm_build("hugify")).log
    brp = log.index("+ " + str(BRP))
    fdi = log.index("find-debuginfo -j")
    assert brp < log.index("hugify: hugify-test: 2 transformed") < fdi
    # debugedit >= 5.1 says "Extracting debug info from N files".
    assert log.lower().index("extracting debug info from") > fdi


@slow
def test_debuginfo_package_has_build_id_files_of_the_shipped_files(rpm_build) -> None:
    b, plain = _ok(rpm_build("hugify")), _ok(rpm_build("plain"))
    debuginfo = b.contents[b.rpm("debuginfo-1.0-1.x86_64.rpm").name]
    for f in (PROG, LIB, SMALL):
        bid = readelf_build_id(b.root / f).hex()
        link = f"/usr/lib/debug/.build-id/{bid[:2]}/{bid[2:]}.debug"
        assert link in debuginfo, (f, bid)
        debug_file = b.root / link.lstrip("/")
        assert readelf_build_id(debug_file).hex() == bid
        # The debug file describes the hugified layout: same program headers.
        assert exec_load(debug_file).vaddr == exec_load(b.root / f).vaddr
    for f in (PROG, LIB):  # rpm recomputes ids, but a hugified file never gets the plain one
        assert readelf_build_id(b.root / f) != readelf_build_id(plain.root / f)


@slow
def test_gdb_breaks_at_source_lines_and_backtraces_with_the_debug_file(rpm_build) -> None:
    b = _ok(rpm_build("hugify"))
    lib_line = _lines(RPM_DIR / "lib.c", "lib-breakpoint")
    main_line = _lines(RPM_DIR / "main.c", "main-calls-lib")
    gdb = [
        "gdb",
        "-batch",
        "-nx",
        "-iex",
        f"set debug-file-directory {b.root / 'usr/lib/debug'}",
        "-ex",
        "set breakpoint pending on",
        "-ex",
        f"set environment LD_LIBRARY_PATH={b.root / 'usr/lib64'}",
    ]

    def backtrace(where: str) -> str:
        """gdb's output of a run of the program stopped at `where`, and its backtrace."""
        argv = [*gdb, "-ex", f"break {where}", "-ex", "run", "-ex", "bt", str(b.root / PROG)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        return res.stdout + res.stderr

    out = backtrace(f"lib.c:{lib_line}")
    assert re.search(rf"Breakpoint 1, lib_entry \(x=-?\d+\) at lib\.c:{lib_line}", out), out
    assert re.search(rf"#0\s+lib_entry \(x=-?\d+\) at lib\.c:{lib_line}", out), out
    assert re.search(rf"#1\s+0x[0-9a-f]+ in main \(argc=1, argv=0x[0-9a-f]+\) at main\.c:{main_line}", out), out
    # A breakpoint inside the moved code of the program itself.
    out = backtrace("exe_f700")
    assert re.search(r"#0\s+exe_f700 \(x=-?\d+\) at exe_gen\d\.c:\d+", out), out
    assert re.search(r"#1\s+0x[0-9a-f]+ in exe_dispatch \(seed=1\) at exe_table\.c:\d+", out), out
    assert re.search(r"in main \(argc=1, argv=0x[0-9a-f]+\) at main\.c:\d+", out), out


@slow
def test_programs_run_correctly(rpm_build) -> None:
    b, plain = _ok(rpm_build("hugify")), _ok(rpm_build("plain"))
    expected = _run(plain, PROG)
    assert expected.returncode == 0 and expected.stdout.startswith("hugify-test: "), expected
    for prog in (PROG, LINK):
        got = _run(b, prog)
        assert (got.returncode, got.stdout) == (0, expected.stdout), got.stderr
    assert _run(b, SMALL).stdout == "hugify-small\n"


@slow
def test_manifest_is_in_the_binary_rpm_with_the_shipped_build_ids(rpm_build) -> None:
    b = _ok(rpm_build("hugify"))
    assert "/" + MANIFEST in b.contents[b.rpm("hugify-test-1.0-1.x86_64.rpm").name]
    entries = {e.path: e for e in manifest.parse((b.root / MANIFEST).read_text())}
    assert sorted(entries) == sorted(["/" + PROG, "/" + LINK, "/" + LIB])
    for f in (PROG, LINK, LIB):
        e, x = entries["/" + f], exec_load(b.root / f)
        assert e.build_id == readelf_build_id(b.root / f).hex(), "the manifest must name the shipped build-id"
        assert (e.offset, e.size, e.huge_page) == (x.offset, x.filesz, HP)


@slow
def test_brp_script_is_driven_by_rpms_environment(rpm_build) -> None:
    b = _ok(rpm_build("hugify"))
    assert b.report is not None, "no JSON report beside the build"
    assert b.report["package"] == "hugify-test" and b.report["arch"] == "x86_64"
    statuses = {f["path"]: f["status"] for f in b.report["files"]}  # type: ignore[index, union-attr]
    assert statuses == {
        "/usr/bin/hugify-small": "skipped",
        "/usr/bin/hugify-test": "transformed",
        "/" + LIB: "transformed",
    }


# --- opt-outs: byte-identical to a build without hugify -----------------------------------


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if not p.is_symlink() else os.readlink(p).encode()
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


@slow
@pytest.mark.parametrize("variant", ["hugify-0", "hugify-no", "brp-nil"])
def test_opt_out_is_byte_identical_to_a_build_without_hugify(rpm_build, variant: str) -> None:
    b, plain = _ok(rpm_build(variant)), _ok(rpm_build("plain"))
    assert "brp-hugify" not in b.log and "hugify: " not in b.log
    got, want = _files(b.root), _files(plain.root)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []
    assert not (b.root / MANIFEST).exists()


# --- host-level integration: runs first, also without debuginfo --------------------------


@slow
def test_host_macros_hugify_builds_without_debuginfo(rpm_build) -> None:
    b = _ok(rpm_build("host-nodebug"))
    assert not any("debuginfo" in r.name for r in b.rpms)
    for f in (PROG, LIB):
        assert hugified(b.root / f), f
    assert _run(b, PROG).stdout == _run(rpm_build("plain"), PROG).stdout
    entries = {e.path: e for e in manifest.parse((b.root / MANIFEST).read_text())}
    assert entries["/" + PROG].build_id == readelf_build_id(b.root / PROG).hex()
    # brp-hugify ran once, as the first step of %__spec_install_post.
    assert b.log.count("hugify: hugify-test: 2 transformed") == 1


@slow
def test_a_later_tool_that_undoes_the_layout_fails_the_build(rpm_build) -> None:
    """strip after find-debuginfo (%__arch_install_post) rewrites the hugified program:
    hugify check, last in %__spec_install_post, fails the build. On main nothing
    checks: the build succeeds and ships the file unhugified."""
    b = rpm_build("undone")
    assert b.rc != 0, b.log[-3000:]
    assert re.search(rf"^hugify: \S+: /{PROG}: the tree report has .* \(layout-undone\)$", b.log, re.M), b.log[-5000:]
    assert "Bad exit status" in b.log and not b.rpms
    # The check after find-debuginfo (before the strip) passed.
    assert "hugify: check: " in b.log and "hugified file(s) as hugify left them" in b.log


@slow
def test_hugify_check_on_the_built_rpms(rpm_build) -> None:
    """An archive's QA on the build's rpms: the manifest's files are hugified, with the
    build-ids the -debuginfo package links (/usr/lib/debug/.build-id, symbolic links
    in an rpm). Without the -debuginfo package nothing is said about debug files."""
    b = _ok(rpm_build("hugify"))
    res = hugify("check", *b.rpms, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.endswith("3 hugified file(s) as hugify left them\n"), res.stdout
    main = [r for r in b.rpms if "debuginfo" not in r.name and "debugsource" not in r.name]
    res = hugify("check", *main, check=False)
    assert res.returncode == 0 and res.stdout.endswith("; no debug files given\n"), res.stdout + res.stderr


# --- on_error ----------------------------------------------------------------------


@slow
def test_untransformable_file_warns_under_on_error_warn(rpm_build) -> None:
    b = _ok(rpm_build("broken-warn"))
    assert re.search(r"hugify: warning: /usr/lib64/libdamaged.so: not transformed \(truncated\)", b.log)
    assert 'on_error = "warn"' in b.log
    assert "/usr/lib64/libdamaged.so" in b.contents[b.rpm("hugify-broken-1.0-1.x86_64.rpm").name]


@slow
def test_untransformable_file_fails_the_build_under_on_error_fail(rpm_build) -> None:
    b = rpm_build("broken-fail")
    assert b.rc != 0
    assert re.search(r"hugify: error: /usr/lib64/libdamaged.so: not transformed \(truncated\)", b.log)
    assert re.search(r'hugify: error: 1 file could not be transformed and on_error = "fail"', b.log)
    assert "Bad exit status" in b.log and "(%install)" in b.log
    assert b.rpms == []


@slow
def test_hugify_exclude_from_skips_paths(rpm_build) -> None:
    b = _ok(rpm_build("broken-fail-excluded"))
    assert re.search(r"hugify: /usr/lib64/libdamaged.so: skipped \(excluded\): matches --exclude-regex", b.log)


# --- the macros, expanded by rpm itself (fast) ----------------------------------------


def test_macro_step_is_on_by_default_and_switches_off() -> None:
    brp = "/usr/lib/rpm/brp-hugify --hugify '/usr/bin/hugify'"
    assert rpm_eval("--eval", "%{__brp_hugify}")[0].startswith(brp)
    for off in (["--define", "_hugify 0"], ["--undefine", "_hugify"], ["--define", "__brp_hugify %{nil}"]):
        assert rpm_eval(*off, "--eval", "[%{?__brp_hugify}]")[0] == "[]", off
        # find-debuginfo still runs, unchanged.
        assert rpm_eval(*off, "--eval", "%{__find_debuginfo}")[:2] == ["", "/usr/bin/find-debuginfo"], off
        assert rpm_eval(*off, "--eval", "[%{?__brp_hugify_check}]")[0] == "[]", off
    assert rpm_eval("--define", "_hugify 1", "--eval", "%{__brp_hugify}")[0].startswith(brp)


def test_macro_knobs_reach_the_brp_command() -> None:
    line = rpm_eval(
        "--define",
        r"_hugify_exclude_from ^/usr/lib64/foo/.*\\.so$",  # rpm drops one level of backslashes
        "--define",
        "_hugify_opts --policy /tmp/p.toml --jobs 3",
        "--eval",
        "%{__brp_hugify}",
    )[0]
    assert r"--exclude-from '^/usr/lib64/foo/.*\.so$'" in line
    # The report outlives the build: rpm >= 4.20 removes %{builddir} after it.
    assert (
        "--report-dir '/b/BUILD'"
        in rpm_eval("--define", "builddir /b/BUILD/foo-1-build", "--eval", "%{__brp_hugify}")[0]
    )
    assert "--report-dir '/b/BUILD'" in rpm_eval("--define", "_builddir /b/BUILD", "--eval", "%{__brp_hugify}")[0]
    assert line.endswith("--policy /tmp/p.toml --jobs 3")


def test_find_debuginfo_is_prefixed_by_the_step_on_its_own_line() -> None:
    first, second = rpm_eval("--eval", "%{__find_debuginfo}")[:2]
    assert first.startswith("/usr/lib/rpm/brp-hugify ") and "&&" not in first
    # find-debuginfo runs inside the step's --then, which checks the build root after it.
    assert second.startswith("/usr/lib/rpm/brp-hugify ") and second.endswith(" --then /usr/bin/find-debuginfo")


def test_manifest_line_ships_only_when_hugify_runs() -> None:
    # macros.d hook: hugify runs inside find-debuginfo, so only with %debug_package.
    assert rpm_eval("--eval", "[%{?hugify_manifest}]")[0] == "[]"
    out = rpm_eval(
        "--define",
        "__debug_package 1",
        "--define",
        "name foo",
        "--eval",
        "%{?hugify_manifest}",
        "--eval",
        "%{__find_debuginfo}",
    )
    assert out[0] == "/usr/lib/hugify/manifest.d/foo.list"
    assert "--manifest '" in out[1] and out[1].endswith("/usr/lib/hugify/manifest.d/foo.list' ")
    assert out[2].endswith(" --then /usr/bin/find-debuginfo")
    # rpm >= 4.20 platforms add %debug_package only when %install runs (a spec part
    # written by %__spec_install_template), after %files is read; a spec with a
    # build directory that is not noarch gets it.
    auto = ("_enable_debug_packages 1", "__spec_install_template %%{debug_package}", "buildsubdir foo-1")
    defines = [a for d in auto for a in ("--define", d)]
    assert rpm_eval(*defines, "--define", "name foo", "--eval", "[%{?hugify_manifest}]")[0] == (
        "[/usr/lib/hugify/manifest.d/foo.list]"
    )
    for off in ("_enable_debug_packages 0", "_target_cpu noarch", "__spec_install_template %{nil}"):
        assert rpm_eval(*defines, "--define", off, "--eval", "[%{?hugify_manifest}]")[0] == "[]", off
    # Host or distro hook: hugify runs first in %__spec_install_post, with or without debuginfo.
    host = ((MACROS, "macros.d"), (HOST_MACROS, "etc"))
    out = rpm_eval("--define", "name foo", "--eval", "%{?hugify_manifest}", "--eval", "%{__find_debuginfo}", files=host)
    assert out[0] == "/usr/lib/hugify/manifest.d/foo.list"
    assert out[1] == "", "the host hook runs hugify already; find-debuginfo must not run it again"
    assert out[2].endswith(" --then /usr/bin/find-debuginfo")
    # Opted out: nothing to ship.
    assert (
        rpm_eval("--define", "_hugify 0", "--define", "__debug_package 1", "--eval", "[%{?hugify_manifest}]")[0] == "[]"
    )


def test_host_macros_put_the_step_first_in_spec_install_post() -> None:
    host = ((MACROS, "macros.d"), (HOST_MACROS, "etc"))
    lines = [x.strip() for x in rpm_eval("--eval", "%{__spec_install_post}", files=host) if x.strip()]
    assert lines[0].startswith("/usr/lib/rpm/brp-hugify ")
    # The check last, after %__os_install_post's strip.
    assert lines[-1].startswith("/usr/lib/rpm/brp-hugify --check ")
    without = [x.strip() for x in rpm_eval("--eval", "%{__spec_install_post}", files=WITH_MACROS) if x.strip()]
    assert lines[1:-1] == without, "the host file must keep the platform's steps"


# --- brp-hugify itself, with a stand-in for the hugify command (fast) --------------------------


def _brp(tmp_path: Path, fake: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BRP), "--hugify", str(fake), *args],
        capture_output=True,
        text=True,
        env=rpm_env(tmp_path, RPM_BUILD_NCPUS="3", **env),
        check=False,
    )


def test_brp_passes_rpms_environment_to_hugify_tree(tmp_path: Path, fake_hugify) -> None:
    fake, calls = fake_hugify
    res = _brp(tmp_path, fake, "--exclude-from", "^/opt/x y$", "--manifest", "/m.list", "--policy", "/p.toml")
    assert res.returncode == 0, res.stderr
    root = tmp_path / "root"
    assert calls.read_text().splitlines() == [
        f"tree {root} --package foo --arch x86_64 --jobs 3 --exclude-regex ^/opt/x y$ --manifest /m.list "
        f"--report {tmp_path}/foo-1.2-3.x86_64.hugify.json --recorded-policy --policy /p.toml"
    ]
    calls.unlink()
    assert _brp(tmp_path, fake, "--report-dir", "/r d").returncode == 0
    assert calls.read_text().endswith(" --report /r d/foo-1.2-3.x86_64.hugify.json --recorded-policy\n")


def test_brp_leaves_a_real_root_alone(tmp_path: Path, fake_hugify) -> None:
    fake, calls = fake_hugify
    for root in ("/", ""):
        assert _brp(tmp_path, fake, RPM_BUILD_ROOT=root).returncode == 0
    assert not calls.exists()


def test_brp_fails_when_hugify_fails(tmp_path: Path, fake_hugify) -> None:
    fake, _ = fake_hugify
    assert _brp(tmp_path, fake, FAKE_STATUS="1").returncode == 1


def test_brp_then_runs_the_command_and_refreshes_the_manifest(tmp_path: Path, fake_hugify) -> None:
    fake, calls = fake_hugify
    marker = tmp_path / "ran"
    res = _brp(tmp_path, fake, "--manifest", "/m.list", "--then", "sh", "-c", f"touch {marker}; exit 0")
    assert res.returncode == 0 and marker.exists()
    assert calls.read_text().splitlines() == [
        f"tree {tmp_path / 'root'} --package foo --arch x86_64 --jobs 3 --manifest /m.list --manifest-only "
        "--recorded-policy"
    ]
    calls.unlink()
    res = _brp(tmp_path, fake, "--manifest", "/m.list", "--then", "sh", "-c", "exit 7")
    assert res.returncode == 7 and not calls.exists(), "a failing find-debuginfo must fail the build"
    assert _brp(tmp_path, fake, "--then", "true").returncode == 0 and not calls.exists()


# --- switch spellings ------------------------------------------------------------

ON = ["1", "2", "yes", "Yes", "TRUE", "true", "on", "On"]
OFF = ["0", "no", "No", "false", "FALSE", "off", "OFF", "%{nil}"]
BAD = ["maybe", "yes please", "0x", "n"]


def _switch_line(macro: str, value: str) -> str:
    return f'error: %{macro} is "{value}", which is not a switch value (1, yes, true or on; 0, no, false or off)'


@pytest.mark.parametrize("value", ON + OFF + BAD)
def test_hugify_switch_spellings_in_the_macros(value: str) -> None:
    step = rpm_eval("--define", f"_hugify {value}", "--eval", "[%{?__brp_hugify}]")[0]
    if value in ON:
        assert step.startswith("[/usr/lib/rpm/brp-hugify --hugify "), step
    elif value in OFF:
        assert step == "[]"
    else:  # a shell line that prints the one line and fails %install
        assert step.endswith("; exit 1]") and _switch_line("_hugify", value) in step, step
    # While rpm reads %files: the manifest line is there when hugify runs; a bad value fails.
    cmd = ["rpm", "--macros", macro_path(WITH_MACROS), "--define", f"_hugify {value}"]
    cmd += ["--define", "__debug_package 1", "--define", "name foo", "--eval", "[%{?hugify_manifest}]"]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HOME": "/nonexistent"}, check=False)
    if value in BAD:
        assert res.returncode != 0 and res.stderr.splitlines() == [_switch_line("_hugify", value)], res.stderr
    else:
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == ("[/usr/lib/hugify/manifest.d/foo.list]" if value in ON else "[]")


def test_integrators_switches_take_the_same_spellings() -> None:
    host = ((MACROS, "macros.d"), (HOST_MACROS, "etc"))
    # The host file says 1: find-debuginfo does not run the step again (only its --then,
    # which checks the build root after find-debuginfo).
    then = " --then /usr/bin/find-debuginfo"
    first, second = rpm_eval("--eval", "%{__find_debuginfo}", files=host)[:2]
    assert first == "" and second.endswith(then)
    for off in ("no", "Off", "0"):
        first = rpm_eval("--define", f"__hugify_in_spec_install_post {off}", "--eval", "%{__find_debuginfo}")[0]
        assert first.startswith("/usr/lib/rpm/brp-hugify "), (off, first)
    for on in ("yes", "ON", "1"):
        out = rpm_eval("--define", f"__hugify_in_spec_install_post {on}", "--eval", "%{__find_debuginfo}")
        assert out[0] == "" and out[1].endswith(then), (on, out)
    out = rpm_eval("--define", "__hugify_in_spec_install_post sometimes", "--eval", "%{__find_debuginfo}")[0]
    assert _switch_line("__hugify_in_spec_install_post", "sometimes") in out and out.endswith("exit 1")
    out = rpm_eval("--define", "__hugify_sign_in_spec_install_post perhaps", "--eval", "%{__brp_hugify}")[0]
    assert _switch_line("__hugify_sign_in_spec_install_post", "perhaps") in out


TINY_SPEC = """Name: hugify-switch
Version: 1
Release: 1
Summary: switch test
License: MIT
%description
t
%install
mkdir -p %{buildroot}/usr/share/hugify-switch
echo x > %{buildroot}/usr/share/hugify-switch/x
%files
/usr/share/hugify-switch/x
"""


@pytest.mark.parametrize("value", ["no", "On", "yes", "maybe"])
def test_hugify_switch_in_a_real_build(tmp_path: Path, value: str) -> None:
    """rpmbuild on a tiny spec, hugify hooked in by the host file (so no -debuginfo is
    needed); a stand-in for brp-hugify records whether the step ran."""
    calls = tmp_path / "calls"
    stub = tmp_path / "brp"
    stub.write_text(f"#!/bin/sh\necho ran >> {calls}\n")
    stub.chmod(0o755)
    spec = tmp_path / "t.spec"
    spec.write_text(f"%global _hugify {value}\n" + TINY_SPEC)
    cmd = ["rpmbuild", "-bb", "--define", f"_topdir {tmp_path / 'top'}"]
    cmd += ["--load", str(MACROS), "--load", str(HOST_MACROS), "--define", f"__hugify_brp {stub}", str(spec)]
    (tmp_path / "home").mkdir()
    res = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HOME": str(tmp_path / "home")},
        check=False,
    )
    if value == "maybe":
        assert res.returncode != 0, res.stdout
        errors = [line for line in res.stdout.splitlines() if "maybe" in line]
        assert errors == [_switch_line("_hugify", value)], res.stdout
        assert "Bad exit status" in res.stdout and "(%install)" in res.stdout
        assert not calls.exists()
        return
    assert res.returncode == 0, res.stdout[-3000:]
    assert calls.exists() == (value != "no"), res.stdout[-3000:]
