"""`hugify repack` on real packages, checked with dpkg, rpm, gdb and the programs themselves.

Debian: real archive packages fetched with `apt-get download` (ninja, a C++ program,
and libstdc++6, a library with a symlink, a trigger, a maintainer script and a
symbols file). The Debian debug archive (debian-debug) is not reachable from the
test machines, so no archive -dbgsym package can be fetched: the -dbgsym cases are
packages built here without hugify by dpkg-buildpackage, tests/deb/hugify-repack-cxx
(C++) and tests/deb/hugify-deb-test (C, a library package, dwz's multifile).
Repacked packages are installed over the originals with `dpkg --root` into a
scratch root, verified with `dpkg --verify`, run, and debugged with gdb.

rpm: tests/rpm/hugify-repack-test.spec built with rpmbuild (scriptlets, a trigger, a
%config file, a library, a file capability, a -debuginfo package), its main package
and -debuginfo repacked,
installed over the original with `rpm --root`, verified with `rpm -V`, run, debugged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.cache import build_dir, cache_root, cached_build
from testkit.cli import hugify
from testkit.debian import (
    BUILD_TOOLS,
    LIB,
    PROG,
    DebBuild,
    build_id,
    build_variant,
    clean_env,
    collect,
    deb_field,
    debug_file,
    dpkg_buildpackage,
    files_key,
    gdb_backtrace,
    source_line,
    tool_versions,
    tree_files,
)
from testkit.elf import exec_load, hugified
from testkit.recipes import debian_packages

slow = pytest.mark.slow
MULTIARCH = "x86_64-linux-gnu"
NINJA = "usr/bin/ninja"
LIBSTDCXX = f"usr/lib/{MULTIARCH}/libstdc++.so.6.0.30"
#: ninja's code is under the default threshold of 1 MiB.
POLICY = 'threshold = "0"\n'


@pytest.fixture(scope="session")
def archive_debs() -> dict[str, Path]:
    """ninja-build and libstdc++6 .deb files from the archive (cached)."""
    cache = debian_packages("repack-debs", ["ninja-build", "libstdc++6"]).parent
    return {deb.name.split("_")[0]: deb for deb in sorted(cache.glob("*.deb"))}


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(POLICY)
    return p


def dpkg_root(path: Path) -> Path:
    """An empty dpkg database to install into with --root."""
    for d in ("var/lib/dpkg/updates", "var/lib/dpkg/info"):
        (path / d).mkdir(parents=True, exist_ok=True)
    (path / "var/lib/dpkg/status").touch()
    return path


def dpkg(root: Path, *args: str | Path) -> str:
    cmd = ["dpkg", "--root", str(root), "--force-depends", "--force-not-root", *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def contents(deb: Path) -> dict[str, tuple[str, str, str]]:
    """Path -> (mode, owner, link target) of every member of the data tarball."""
    out = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True).stdout
    members = {}
    for line in out.splitlines():
        mode, owner, _size, _date, _time, name = line.split(None, 5)
        path, _, target = name.partition(" -> ")
        members[path] = (mode, owner, target)
    return members


def control_members(deb: Path, dest: Path) -> dict[str, bytes]:
    subprocess.run(["dpkg-deb", "--control", str(deb), str(dest)], check=True)
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir())}


def fields(deb: Path) -> dict[str, str]:
    text = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^(\S+): (.*(?:\n .*)*)", text, re.M))


def repack(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return hugify("repack", *args, check=check)


def data_member(deb: Path) -> str:
    out = subprocess.run(["ar", "t", str(deb)], capture_output=True, text=True, check=True).stdout
    return next(n for n in out.split() if n.startswith("data.tar"))


def run_ninja(root: Path, libdir: Path, work: Path) -> tuple[str, str]:
    """ninja builds a two-step graph; its output and which libstdc++ it loaded."""
    work.mkdir()
    (work / "build.ninja").write_text(
        "rule cat\n  command = cat $in > $out && echo built $out\nrule up\n  command = tr a-z A-Z < $in > $out\n"
        "build a.txt: cat in.txt\nbuild b.txt: up a.txt\n"
    )
    (work / "in.txt").write_text("hello from ninja\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir), "LC_ALL": "C"}
    ninja = str(root / NINJA)
    res = subprocess.run([ninja, "-j1"], cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    debug = subprocess.run(
        [ninja, "--version"], env={**env, "LD_DEBUG": "libs"}, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = re.search(r"calling init: (\S*libstdc\+\+\S*)", debug.stderr)
    assert loaded, debug.stderr[-2000:]
    return res.stdout + debug.stdout + (work / "b.txt").read_text(), loaded.group(1)


@slow
def test_archive_program_and_library_install_in_place_of_the_originals(
    archive_debs: dict[str, Path], policy: Path, tmp_path: Path
) -> None:
    debs = [archive_debs["ninja-build"], archive_debs["libstdc++6"]]
    out = tmp_path / "out"
    res = repack(*debs, "--policy", policy, "-o", out)
    assert re.search(r"^ninja-build\s+1\s+0\s+0\s", res.stdout, re.M), res.stdout
    assert re.search(r"^libstdc\+\+6\s+1\s+0\s+0\s", res.stdout, re.M), res.stdout
    new = {p.name.split("_")[0]: p for p in out.iterdir()}
    assert sorted(new) == ["libstdc++6", "ninja-build"] and len(list(out.iterdir())) == 2

    for name, orig in zip(("ninja-build", "libstdc++6"), debs, strict=True):
        repacked = new[name]
        assert new[name].name == orig.name.replace("_amd64", "+hugify1_amd64")
        assert data_member(repacked) == data_member(orig)  # the same compression
        before, after = fields(orig), fields(repacked)
        assert after["Version"] == before["Version"] + "+hugify1"
        version = hugify("--version").stdout.split()[1]
        assert after["X-Hugify"] == f"original-version={before['Version']}; hugify={version}"
        source = before.get("Source", name).split()[0]
        assert after["Source"] == f"{source} ({before['Version']})"
        changed = {"Version", "Installed-Size", "Source", "X-Hugify"}
        assert {k: v for k, v in after.items() if k not in changed} == {
            k: v for k, v in before.items() if k not in changed
        }
        assert int(after["Installed-Size"]) > int(before["Installed-Size"])
        # Maintainer scripts, triggers, shlibs, symbols, conffiles: byte-identical.
        cb, ca = control_members(orig, tmp_path / f"c-{name}-0"), control_members(repacked, tmp_path / f"c-{name}-1")
        assert {k: v for k, v in ca.items() if k not in ("control", "md5sums")} == {
            k: v for k, v in cb.items() if k not in ("control", "md5sums")
        }
        # Every member keeps its mode, owner and link target; the manifest is added.
        mb, ma = contents(orig), contents(repacked)
        # A Multi-Arch: same package's manifest is named per architecture (it installs beside itself).
        listing = f"./usr/lib/hugify/manifest.d/{name}{':amd64' if before.get('Multi-Arch') == 'same' else ''}.list"
        assert set(ma) - set(mb) <= {"./usr/lib/", "./usr/lib/hugify/", "./usr/lib/hugify/manifest.d/", listing}
        assert {k: v for k, v in ma.items() if k in mb} == mb and listing in ma
    assert "triggers" in control_members(debs[1], tmp_path / "c-trig")

    before_root = dpkg_root(tmp_path / "before")
    dpkg(before_root, "-i", *debs)
    expected, lib = run_ninja(before_root, before_root / "usr/lib" / MULTIARCH, tmp_path / "w0")
    assert lib == str(before_root / "usr/lib" / MULTIARCH / "libstdc++.so.6")
    # The program is upgraded in place. libstdc++6 goes into a fresh root: its prerm,
    # which an upgrade runs, needs a shell and dpkg inside the root.
    root = dpkg_root(tmp_path / "root")
    dpkg(root, "-i", debs[0])
    upgrade = dpkg(root, "-i", *new.values())
    assert "Unpacking ninja-build (1.11.1-2~deb12u1+hugify1) over (1.11.1-2~deb12u1)" in upgrade, upgrade
    libdir = root / "usr/lib" / MULTIARCH
    assert dpkg(root, "--verify") == ""  # md5sums match the installed files
    status = subprocess.run(
        ["dpkg-query", "--root", str(root), "-W", "-f", "${Package} ${Version} ${X-Hugify}\\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ninja-build 1.11.1-2~deb12u1+hugify1 original-version=" in status, status
    for f in (NINJA, LIBSTDCXX):
        assert hugified(root / f), f
    assert (root / "var/lib/dpkg/info/libstdc++6:amd64.triggers").read_text().startswith("# Triggers added by dh_")
    assert os.readlink(libdir / "libstdc++.so.6") == "libstdc++.so.6.0.30"
    got, lib = run_ninja(root, libdir, tmp_path / "w1")
    assert (got, lib) == (expected, str(libdir / "libstdc++.so.6"))
    listed = (root / "usr/lib/hugify/manifest.d/libstdc++6:amd64.list").read_text()
    assert f"/{LIBSTDCXX}\t{build_id(root / LIBSTDCXX)}\t" in listed


@slow
def test_debug_packages_follow_and_gdb_breaks_at_source_lines(tmp_path: Path) -> None:
    plain = build_variant("plain").ok()
    names = ["hugify-deb-test", "hugify-deb-test-dbgsym", "libhugdebtest1", "libhugdebtest1-dbgsym"]
    debs = [plain.deb(n) for n in names]
    out = tmp_path / "out"
    res = repack(*debs, "-o", out)
    assert "debug file of /usr/bin/hugify-deb-test moved" in res.stdout, res.stdout
    new = {deb_field(p, "Package"): p for p in out.iterdir()}
    assert sorted(new) == sorted(names)
    version = plain.field("hugify-deb-test", "Version")
    for pkg in ("hugify-deb-test", "libhugdebtest1"):
        # The debug package's exact dependency follows its package's new version.
        assert f"{pkg} (= {version}+hugify1)" in deb_field(new[f"{pkg}-dbgsym"], "Depends")

    again = tmp_path / "again"
    repack(*debs, "-o", again)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {p.name: p.read_bytes() for p in out.iterdir()}

    root = dpkg_root(tmp_path / "root")
    dpkg(root, "-i", *new.values())
    assert dpkg(root, "--verify") == ""
    for f, pkg in ((PROG, "hugify-deb-test"), (LIB, "libhugdebtest1")):
        shipped, original = build_id(root / f), build_id(plain.root / f)
        assert shipped != original and hugified(root / f)
        dbg = debug_file(root, shipped)
        assert build_id(dbg) == shipped
        assert not debug_file(root, original).exists()
        # The debug file describes the layout that ships: the same executable load.
        assert exec_load(dbg).vaddr == exec_load(root / f).vaddr != exec_load(plain.root / f).vaddr
        assert shipped in deb_field(new[f"{pkg}-dbgsym"], "Build-Ids").split()
        assert original not in deb_field(new[f"{pkg}-dbgsym"], "Build-Ids").split()

    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/lib" / MULTIARCH)}
    got = subprocess.run([str(root / PROG)], env=env, capture_output=True, text=True, timeout=60, check=False)
    want = subprocess.run(
        [str(plain.root / PROG)],
        env={**os.environ, "LD_LIBRARY_PATH": str(plain.root / "usr/lib" / MULTIARCH)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (got.returncode, got.stdout) == (0, want.stdout) and want.stdout

    lib_line, main_line = source_line("lib.c", "lib-breakpoint"), source_line("main.c", "main-calls-lib")
    text = gdb_backtrace(root, PROG, f"lib.c:{lib_line}")
    assert re.search(rf"Breakpoint 1, lib_entry \(x=\S+\) at (\./)?src/lib\.c:{lib_line}", text), text
    assert re.search(rf"#1\s+0x[0-9a-f]+ in main \(.*\) at (\./)?src/main\.c:{main_line}", text), text
    # A function in the moved code of the program itself (its DWARF partly in dwz's multifile).
    text = gdb_backtrace(root, PROG, "exe_f700")
    assert re.search(r"#0\s+exe_f700 \(x=\S+\) at (\./)?exe_gen\d\.c:\d+", text), text
    assert re.search(r"#1\s+0x[0-9a-f]+ in exe_dispatch \(.*\) at (\./)?exe_table\.c:\d+", text), text
    assert (root / "usr/lib/debug/.dwz").is_dir()


CXX_SRC = REPO / "tests" / "deb" / "hugify-repack-cxx"
CXX_PROG = "usr/bin/hugify-repack-cxx"


def cxx_build() -> DebBuild:
    """tests/deb/hugify-repack-cxx built by dpkg-buildpackage (no hugify): a C++
    program and its -dbgsym package. Cached by its inputs."""
    key = files_key(tree_files(CXX_SRC), tool_versions(*BUILD_TOOLS, "g++-12"))

    def build(parent: Path, out: Path) -> tuple[int, str]:
        src = parent / CXX_SRC.name
        shutil.copytree(CXX_SRC, src, symlinks=True)
        rc, log = dpkg_buildpackage(src, clean_env())
        collect(parent, out)
        return rc, log

    group = cache_root() / "repack"
    return DebBuild(cached_build(build_dir("repack", "cxx", key), group / "build.lock", group / "build", build))


@slow
def test_cxx_program_and_its_dbgsym_gdb_breaks_in_a_template(policy: Path, tmp_path: Path) -> None:
    b = cxx_build().ok()
    debs = [b.deb("hugify-repack-cxx"), b.deb("hugify-repack-cxx-dbgsym")]
    out = tmp_path / "out"
    repack(*debs, "--policy", policy, "-o", out)
    root = dpkg_root(tmp_path / "root")
    dpkg(root, "-i", *out.iterdir())
    assert dpkg(root, "--verify") == ""
    shipped = build_id(root / CXX_PROG)
    assert hugified(root / CXX_PROG) and build_id(debug_file(root, shipped)) == shipped
    want = subprocess.run([str(b.root / CXX_PROG)], capture_output=True, text=True, check=True).stdout
    got = subprocess.run([str(root / CXX_PROG)], capture_output=True, text=True, check=True).stdout
    assert got == want == "caught negative\ntotal 7 area 9 counts 2 r 0\n"
    source = (CXX_SRC / "src/main.cpp").read_text().splitlines()
    call_line = next(n for n, line in enumerate(source, 1) if "main-calls-total" in line)
    # The original with its original -dbgsym, and the repacked pair: the same stops.
    before = dpkg_root(tmp_path / "before")
    dpkg(before, "-i", *debs)
    stops = []
    for r in (before, root):
        text = gdb_backtrace(r, CXX_PROG, "total<long>")
        stop = re.search(r"Breakpoint 1, total<long> \(values=std::vector of length 4.*\) at src/main\.cpp:\d+", text)
        assert stop and re.search(rf"#1\s+main \(argc=1\) at src/main\.cpp:{call_line}", text), text
        stops.append(stop.group(0))
    assert stops[0] == stops[1]


@slow
def test_dry_run_and_suffix(archive_debs: dict[str, Path], policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = repack(archive_debs["ninja-build"], "--policy", policy, "-o", out, "--dry-run")
    assert re.search(r"^ninja-build\s+1\s+0\s+0\s+\S+ MiB\s+100\.0% of", res.stdout, re.M), res.stdout
    assert list(out.iterdir()) == []
    repack(archive_debs["ninja-build"], "--policy", policy, "-o", out, "--suffix", "+hug2")
    (deb,) = out.iterdir()
    assert deb_field(deb, "Version").endswith("~deb12u1+hug2")
    again = tmp_path / "again"
    repack(archive_debs["ninja-build"], "--policy", policy, "-o", again, "--suffix", "+hug2")
    assert (again / deb.name).read_bytes() == deb.read_bytes()  # deterministic
    twice = repack(deb, "--policy", policy, "-o", tmp_path / "twice", check=False)
    assert twice.returncode == 4 and "(already-repacked)" in twice.stderr, twice.stderr


def _no_elf_deb(tmp_path: Path) -> Path:
    tree = tmp_path / "noelf"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: noelf\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: none\n"
    )
    (tree / "usr/share/doc/noelf").mkdir(parents=True)
    (tree / "usr/share/doc/noelf/README").write_text("no code here\n")
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(tmp_path / "noelf.deb")], check=True)
    return tmp_path / "noelf.deb"


@slow
def test_bad_input_gives_one_line_a_status_and_no_output(archive_debs: dict[str, Path], tmp_path: Path) -> None:
    ninja = archive_debs["ninja-build"]
    truncated = tmp_path / "truncated.deb"
    truncated.write_bytes(ninja.read_bytes()[: ninja.stat().st_size // 2])
    text = tmp_path / "text.deb"
    text.write_text("not a package\n")
    corrupt = tmp_path / "corrupt.deb"
    data = bytearray(ninja.read_bytes())
    data[-3000:-2000] = bytes(1000)  # inside the compressed data member
    corrupt.write_bytes(bytes(data))
    cases = [
        ([truncated], 3, "not-a-package", "truncated"),
        ([text], 3, "not-a-package", "neither a .deb"),
        ([corrupt], 3, "not-a-package", "dpkg-deb"),
        ([_no_elf_deb(tmp_path)], 4, "no-elf-file", "holds no ELF"),
        ([ninja], 4, "all-refused", "below-threshold"),  # the default threshold: 1 MiB
        ([ninja, truncated], 3, "not-a-package", "truncated"),
    ]
    for inputs, status, reason, words in cases:
        out = tmp_path / f"out-{reason}"
        res = repack(*inputs, "-o", out, check=False)
        assert res.returncode == status, (inputs, res.stdout, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and f"({reason})" in res.stderr and words in res.stderr, res.stderr
        assert list(out.iterdir()) == [], res.stderr  # nothing written, no temporary left
    explained = hugify("explain", "no-elf-file", "all-refused", "not-a-package").stdout
    assert "exit status 4" in explained and "exit status 3" in explained


# --- rpm ------------------------------------------------------------------------------

RPM_SPEC = REPO / "tests" / "rpm" / "hugify-repack-test.spec"
RPM_QUERY = (
    "[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILECAPS}"
    " %{FILEVERIFYFLAGS:hex}\\n]"
)


def rpmq(pkg: Path, *args: str) -> str:
    return subprocess.run(["rpm", "-qp", *args, str(pkg)], capture_output=True, text=True, check=True).stdout


def rpm_root(path: Path) -> Path:
    """An empty rpm database, and the users the test package's files belong to."""
    (path / "etc").mkdir(parents=True)
    (path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\ndaemon:x:1:1::/:/bin/false\n")
    (path / "etc/group").write_text("root:x:0:\ndaemon:x:1:\n")
    subprocess.run(["rpm", "--root", str(path), "--initdb"], check=True)
    return path


def rpm_install(root: Path, *args: str | Path) -> str:
    # Scriptlets run chrooted into the root, which has no shell: they are compared, not run.
    cmd = ["rpm", "--root", str(root), "--nodeps", "--noscripts", "--notriggers", *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


@slow
def test_rpm_keeps_its_header_installs_over_the_original_and_verifies(policy: Path, tmp_path: Path) -> None:
    top = tmp_path / "rpmbuild"
    subprocess.run(
        ["rpmbuild", "-bb", "--define", f"_topdir {top}", str(RPM_SPEC)], check=True, capture_output=True, text=True
    )
    built = {p.name.split("-2.1-")[0]: p for p in (top / "RPMS").rglob("*.rpm")}
    orig, orig_debug = built["hugify-repack-test"], built["hugify-repack-test-debuginfo"]
    out = tmp_path / "out"
    res = repack(orig, orig_debug, "--policy", policy, "-o", out)
    assert re.search(r"^hugify-repack-test\s+2\s+0\s+0\s", res.stdout, re.M), res.stdout
    assert re.search(r"^hugify-repack-test-debuginfo\s+2 debug file\(s\) moved", res.stdout, re.M), res.stdout
    new, new_debug = sorted(out.iterdir())
    assert new.name == "hugify-repack-test-2.1-3.hugify1.x86_64.rpm"
    assert new_debug.name == "hugify-repack-test-debuginfo-2.1-3.hugify1.x86_64.rpm"
    assert rpmq(new, "--qf", "%{EPOCH}:%{VERSION}-%{RELEASE} %{ARCH}") == "1:2.1-3.hugify1 x86_64"
    version = hugify("--version").stdout.split()[1]
    provides = rpmq(new, "--provides").splitlines()
    assert {"hugify-repack(original-version) = 1:2.1-3", f"hugify-repack(hugify) = {version}"} <= set(provides)

    # Every header tag, relationships with their versions too: tests/test_repack_oracle.py.
    for query in (["--scripts"], ["--triggers"], ["--changelog"], ["--conflicts"], ["--obsoletes"]):
        assert rpmq(new, *query) == rpmq(orig, *query), query
    files_before, files_after = rpmq(orig, "--qf", RPM_QUERY).splitlines(), rpmq(new, "--qf", RPM_QUERY).splitlines()
    build_ids = re.compile(r"^/usr/lib/\.build-id/\S+")
    assert [build_ids.sub("", f) for f in files_after if not f.startswith("/usr/lib/hugify")] == [
        build_ids.sub("", f) for f in files_before
    ]
    assert "/usr/lib/hugify/manifest.d/hugify-repack-test.list 100644 root root   ffffffff" in files_after
    assert "/etc/repack-test.conf 100640 root daemon cn  ffffffff" in files_after
    assert "/usr/bin/repack-test 100755 root root  cap_net_raw=ep ffffffff" in files_after
    assert "/var/lib/repack-test/state 100640 daemon daemon   ffffffdc" in files_after
    assert any(f.startswith("/var/log/repack-test.log ") and " g " in f for f in files_after)
    assert rpmq(new, "--qf", "%{PAYLOADCOMPRESSOR}") == rpmq(orig, "--qf", "%{PAYLOADCOMPRESSOR}")

    twice = repack(new, "--policy", policy, "-o", tmp_path / "twice", check=False)
    assert twice.returncode == 4 and "(already-repacked)" in twice.stderr, twice.stderr
    # A truncated payload (cpio) and a truncated header: refused, nothing written.
    data = orig.read_bytes()
    for n, cut in enumerate((len(data) - 200, 300)):
        bad = tmp_path / f"cut{n}.rpm"
        bad.write_bytes(data[:cut])
        empty = tmp_path / f"empty{n}"
        res = repack(bad, "--policy", policy, "-o", empty, check=False)
        assert res.returncode == 3 and "(not-a-package)" in res.stderr and len(res.stderr.splitlines()) == 1, res
        assert list(empty.iterdir()) == []

    root = rpm_root(tmp_path / "root")
    rpm_install(root, "-i", orig, orig_debug)
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/lib64")}
    prog = [str(root / "usr/bin/repack-test")]
    want = subprocess.run(prog, env=env, capture_output=True, text=True, check=True).stdout
    rpm_install(root, "-U", new, new_debug)
    query = ["rpm", "--root", str(root), "-q", "hugify-repack-test"]
    assert subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip() == (
        "hugify-repack-test-2.1-3.hugify1.x86_64"
    )
    # Files only: the root has none of the package's dependencies.
    verify = subprocess.run(
        ["rpm", "--root", str(root), "-V", "--nodeps", "hugify-repack-test"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (verify.returncode, verify.stdout) == (0, ""), verify.stdout + verify.stderr
    assert os.getxattr(root / "usr/bin/repack-test", "security.capability")
    for f in ("usr/bin/repack-test", "usr/lib64/librepacktest.so.1.0"):
        assert hugified(root / f), f
    got = subprocess.run(prog, env=env, capture_output=True, text=True, check=True).stdout
    assert got == want == "repack-test 43\n"
    # gdb finds the moved debug files of the program and the library by their new build-ids.
    for f in ("usr/bin/repack-test", "usr/lib64/librepacktest.so.1.0"):
        bid = build_id(root / f)
        assert build_id(debug_file(root, bid)) == bid
        assert exec_load(debug_file(root, bid)).vaddr == exec_load(root / f).vaddr
    text = gdb_backtrace(root, "usr/bin/repack-test", "lib_value", libdir="usr/lib64")
    assert re.search(r"Breakpoint 1, lib_value \(x=\S+\) at \S*lib\.c:1", text), text
    assert re.search(r"#1\s+0x[0-9a-f]+ in main \(\) at \S*main\.c:3", text), text


@slow
def test_signing_policy_ships_a_signed_statement_that_verifies(archive_debs: dict[str, Path], tmp_path: Path) -> None:
    from testkit.signing import env, keypair, verify

    key, pub = keypair(tmp_path / "keys")
    pol = tmp_path / "signed.toml"
    pol.write_text(f'{POLICY}[signing]\nmode = "required"\nkey = "{key}"\n')
    out = tmp_path / "out"
    res = hugify("repack", archive_debs["ninja-build"], "--policy", pol, "-o", out, env=env())
    (deb,) = out.iterdir()
    members = contents(deb)
    for suffix in ("intoto.json", "bundle"):
        assert f"./usr/share/hugify/attestations/ninja-build.{suffix}" in members, res.stdout
    root = dpkg_root(tmp_path / "root")
    dpkg(root, "-i", deb)
    assert dpkg(root, "--verify") == ""  # the statement is in md5sums too
    checked = verify(root, "--all", "--key", pub)
    assert checked.returncode == 0 and re.search(r"^/usr/bin/ninja: verified ", checked.stdout, re.M), checked.stdout

    # Signing required, no key anywhere: refused before anything is unpacked.
    nokey = tmp_path / "nokey.toml"
    nokey.write_text(f'{POLICY}[signing]\nmode = "required"\n')
    empty = tmp_path / "empty"
    res = hugify("repack", archive_debs["ninja-build"], "--policy", nokey, "-o", empty, check=False, env=env())
    assert res.returncode == 3 and "no signing.key" in res.stderr and "(bad-policy)" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert not empty.exists() or list(empty.iterdir()) == []


# --- a package built with hugify already (issue 42) ---------------------------------------


def _hugified_prog(tmp_path: Path) -> Path:
    """The suite's PIE, transformed as a package build would have: what a package built
    with hugify ships."""
    from testkit.recipes import BY_NAME, build

    prog = tmp_path / "prog"
    hugify("transform", "--threshold", "0", build(BY_NAME["gcc-bfd"]) / "prog", "-o", prog)
    return prog


def test_a_deb_built_with_hugify_is_refused_not_repacked_as_a_no_op(tmp_path: Path) -> None:
    """A .deb whose ELF file is hugified and which ships its manifest (dh_hugify's
    output): nothing would change, so no +hugify1 upgrade is written. On the old code
    the repack wrote one (exit 0)."""
    tree = tmp_path / "built"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: built\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@example.org>\nDescription: d\n d\n"
    )
    (tree / "usr/bin").mkdir(parents=True)
    shutil.copy(_hugified_prog(tmp_path), tree / "usr/bin/prog")
    manifest_dir = tree / "usr/lib/hugify/manifest.d"
    manifest_dir.mkdir(parents=True)
    listed = hugify("tree", tree, "--manifest-only", "--manifest", manifest_dir / "built.list", "--policy", "/dev/null")
    assert "1 aligned file(s) listed" in listed.stdout, listed.stdout
    deb = tmp_path / "built_1_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)], check=True, capture_output=True)
    out = tmp_path / "out"
    res = repack(deb, "-o", out, check=False)
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert res.stderr.strip().splitlines() == [
        f"hugify: {deb}: built 1: no ELF file would change (1 already on whole huge-page windows: built with hugify) "
        "and it ships /usr/lib/hugify/manifest.d/built.list; a repack would be a no-op upgrade (already-hugified)"
    ], res.stderr
    assert list(out.iterdir()) == []


def test_an_rpm_built_with_hugify_is_refused_not_repacked_as_a_no_op(tmp_path: Path) -> None:
    """An rpm whose ELF file is hugified, without a manifest (no %{?hugify_manifest}: the
    rpm file triggers list such files at installation): the issue's case, where the old
    code wrote a no-op .hugify1 upgrade."""
    top = tmp_path / "rpmbuild"
    (top / "SOURCES").mkdir(parents=True)
    shutil.copy(_hugified_prog(tmp_path), top / "SOURCES" / "prog")
    spec = tmp_path / "built.spec"
    spec.write_text(
        "Name: built\nVersion: 1\nRelease: 1\nSummary: s\nLicense: MIT\n%description\nd\n"
        "%install\ninstall -D -m 0755 %{_sourcedir}/prog %{buildroot}/usr/bin/prog\n"
        "%files\n/usr/bin/prog\n"
    )
    defines = {"_topdir": str(top), "__os_install_post": "%{nil}", "debug_package": "%{nil}", "_hugify": "0"}
    args = [a for k, v in defines.items() for a in ("--define", f"{k} {v}")]
    subprocess.run(["rpmbuild", "-bb", *args, str(spec)], check=True, capture_output=True)
    (rpm,) = (top / "RPMS").rglob("*.rpm")
    out = tmp_path / "out"
    res = repack(rpm, "-o", out, check=False)
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert "(already-hugified)" in res.stderr and "is an rpm" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert list(out.iterdir()) == []
