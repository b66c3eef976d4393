"""hugify's own packages, built and installed as a distribution would use them.

* debian/: `dpkg-buildpackage -b -Ppkg.hugify.rustup` builds hugify_*.deb from a
  copy of this checkout (the files git tracks or would track, without tests/ and
  bench/); lintian must report no error. `apt-get install ./hugify_*.deb`, then the
  test source package tests/deb/hugify-deb-test, with `Build-Depends:
  dh-sequence-hugify` and a plain `dh $@`, is built with a clean environment (no
  PERL5LIB, no PATH additions) and checked like in test_debhelper.py; its packages
  are installed (the dpkg file trigger must prefetch them) and everything is purged.
* spec/hugify.spec: `rpmbuild -bb` from a source tarball; `rpm -i --nodeps` into
  Debian's rpm database; then the rpm test package tests/rpm/hugify-test.spec is
  built with the installed macros and checked; its rpm is installed (the
  %transfiletriggerin must run) and everything is erased.

The installs happen for real (apt-get, dpkg and rpm with their maintainer scripts
and triggers) but in a private mount namespace where /usr, /etc, /var and the rpm
database are copy-on-write overlays on tmpfs: the tests running at the same time
(pytest -n 2) never see /usr/bin/hugify, /usr/lib/rpm/macros.d/macros.hugify or
/usr/lib/hugify, and nothing is left behind even when a session is killed. The
sessions also hold an exclusive lock (cache_root()/system-install.lock), and purge
or erase what they installed, checking that nothing remains.

Builds and sessions are cached under the test cache, keyed by their inputs.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hugify import manifest
from hugify.commands import COMMANDS
from testkit import REPO, trixie
from testkit.cache import CachedBuild, build_dir, building, cache_root, cached_build, locked, save_result
from testkit.debian import (
    CARGO_TARGET,
    EXEC,
    LIB,
    LINK,
    MANIFEST_DIR,
    PROG,
    SMALL,
    STD_PATH,
    VERSION,
    DebBuild,
    build_hugify_deb,
    build_id,
    build_variant,
    cargo_target_held,
    clean_env,
    collect,
    debug_file,
    files_key,
    hugify_sources,
    package_source_files,
    prepare_test_source,
    rust_env,
    toolchain_key,
)
from testkit.elf import bits_differing, hugified, readelf_build_id, readelf_windows
from testkit.recipes import ccache_env

slow = pytest.mark.slow
RPM_TEST = REPO / "tests" / "rpm"


@pytest.fixture(scope="session")
def hugify_deb() -> DebBuild:
    return build_hugify_deb().ok()


def test_build_depends_need_rust_1_85_unless_the_rustup_profile() -> None:
    res = subprocess.run(
        ["dpkg-checkbuilddeps", "-Ppkg.hugify.rustup"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    res = subprocess.run(["dpkg-checkbuilddeps"], cwd=REPO, capture_output=True, text=True, check=False)
    cargo = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "cargo"], capture_output=True, text=True, check=False
    )
    new_enough = (
        cargo.returncode == 0
        and subprocess.run(["dpkg", "--compare-versions", cargo.stdout, "ge", "1.85"], check=False).returncode == 0
    )
    if not new_enough:  # Debian 12: cargo 0.66 / rustc 1.63
        assert res.returncode != 0 and "cargo:native (>= 1.85)" in res.stderr, res.stderr


def test_versions_agree() -> None:
    changelog = subprocess.run(
        ["dpkg-parsechangelog", "-S", "Version"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    spec = subprocess.run(
        ["rpmspec", "-q", "--srpm", "--qf", "%{VERSION}", str(REPO / "spec" / "hugify.spec")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert changelog == spec == VERSION


def test_debian_trigger_and_rpm_file_trigger_are_the_runtimes() -> None:
    dpkg_trigger = (REPO / "systemd" / "dpkg" / "hugify-runtime.triggers").read_text()
    assert (REPO / "debian" / "hugify.triggers").read_text() == dpkg_trigger
    snippet = (REPO / "systemd" / "rpm" / "hugify-runtime.triggers.spec").read_text()
    trigger = re.search(r"^%transfiletriggerin .*\n.*\n", snippet, re.M)
    assert trigger, snippet
    assert trigger.group(0) in (REPO / "spec" / "hugify.spec").read_text()
    postinst = (REPO / "debian" / "hugify.postinst").read_text()
    assert postinst.count("#DEBHELPER#") == 1 and "/usr/lib/hugify/prefetch-trigger || true" in postinst


def test_debhelper_perl_compiles_and_documents_itself() -> None:
    for f in (
        "dh_hugify",
        "dh_hugify_check",
        "dh_hugify_sign",
        "Debian/Debhelper/Sequence/hugify.pm",
        "Debian/Debhelper/Hugify.pm",
    ):
        res = subprocess.run(
            ["perl", "-I", str(REPO / "dh-hugify"), "-c", str(REPO / "dh-hugify" / f)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0 and "syntax OK" in res.stderr, res.stderr
    res = subprocess.run(
        ["podchecker", str(REPO / "dh-hugify" / "dh_hugify")], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr


SHIPPED = [
    "usr/bin/hugify",
    "usr/bin/hugify-run",
    "usr/bin/dh_hugify",
    "usr/bin/dh_hugify_check",
    "usr/bin/dh_hugify_sign",
    "usr/share/perl5/Debian/Debhelper/Sequence/hugify.pm",
    "usr/share/perl5/Debian/Debhelper/Hugify.pm",
    "usr/lib/hugify/prefetch-trigger",
    "usr/lib/hugify/libhugify-audit.so",
    "usr/lib/hugify/libhugify-engine.so",
    "usr/lib/hugify/libhugify-record.so",
    "usr/lib/hugify/python/hugify/_core.abi3.so",
    "usr/lib/hugify/python/hugify/cli.py",
    "usr/lib/hugify/python/hugify/trial/session.py",
    "usr/lib/rpm/brp-hugify",
    "usr/lib/rpm/macros.d/macros.hugify",
]
MAN_PAGES = ["hugify.1", "hugify-run.1", "dh_hugify.1", "dh_hugify_check.1", "dh_hugify_sign.1"] + [
    f"hugify-{c}.1" for c in COMMANDS
]
#: The policy, in its own package (docs/packaging-debian.md, "Turning it on, recorded").
POLICY = "usr/lib/hugify/policy.toml"


@slow
def test_hugify_deb_is_built_with_cargo_locked_and_ships_everything(hugify_deb: DebBuild) -> None:
    b = hugify_deb
    assert "cargo build --release --locked" in b.log
    root = b.pkg("hugify")
    for f in SHIPPED:
        assert (root / f).is_file(), f
    assert not (root / POLICY).exists()
    assert (b.pkg("hugify-policy-debian") / POLICY).is_file()
    assert b.field("hugify", "Depends").startswith("hugify-policy-debian | hugify-policy,")
    assert b.field("hugify-policy-debian", "Provides") == "hugify-policy"
    for m in MAN_PAGES:
        assert (root / "usr/share/man/man1" / f"{m}.gz").is_file(), m
    units = {p.name for d in ("lib/systemd/system", "usr/lib/systemd/system") for p in (root / d).glob("*")}
    assert units == {"hugify-prefetch.service", "hugify-prefetch.timer", "run-hugify-shared.mount"}
    assert (root / MANIFEST_DIR).is_dir()
    assert "dh-sequence-hugify" in b.field("hugify", "Provides")
    control = subprocess.run(
        ["dpkg-deb", "--info", str(b.deb("hugify")), "triggers"], capture_output=True, text=True, check=True
    )
    assert "interest-noawait /usr/lib/hugify/manifest.d" in control.stdout
    # The launcher runs the packaged CLI.
    launcher = (root / "usr/bin/hugify").read_text()
    assert launcher.startswith("#!/usr/bin/python3\n") and "/usr/lib/hugify/python" in launcher
    # Every document the man pages and units name is there under that name (not .md.gz).
    named = set()
    for page in (root / "usr/share/man/man1").glob("*.gz"):
        named |= set(re.findall(r"/usr/share/doc/hugify/[\w.-]+\.md", gzip.decompress(page.read_bytes()).decode()))
    for unit in (root / d for d in ("lib/systemd/system", "usr/lib/systemd/system")):
        for u in unit.glob("*"):
            named |= set(re.findall(r"/usr/share/doc/hugify/[\w.-]+\.md", u.read_text()))
    assert "/usr/share/doc/hugify/exit-status.md" in named and "/usr/share/doc/hugify/runtime.md" in named, named
    assert [n for n in sorted(named) if not (root / n.lstrip("/")).is_file()] == []


@slow
def test_lintian_reports_no_errors(hugify_deb: DebBuild) -> None:
    res = subprocess.run(
        ["lintian", "--fail-on", "error", "--display-info", *map(str, hugify_deb.installable())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not re.search(r"^E: ", res.stdout, re.M), res.stdout


@slow
def test_hugify_deb_built_on_debian_12_installs_and_runs_on_debian_13(hugify_deb: DebBuild) -> None:
    """debusine's workers build for trixie, and a derivative's builds install hugify's
    packages there (docs/packaging-debian.md, "On debusine"): the .debs `make deb` builds
    on Debian 12 install with dpkg in a Debian 13 root (its Python 3.13, no python3.11)
    and run. dh_python3 used to pin the package to the Python it was built with."""
    depends = hugify_deb.field("hugify", "Depends")
    assert not re.search(r"\bpython3\.\d+\b", depends), depends
    # The root's inner cache is what it sees at /var/cache/hugify-tests.
    inner = cache_root() / f"{trixie.SUITE}-cache"
    offered = inner / "hugify-debs-under-test"
    with locked(inner / "hugify-debs-under-test.lock"):
        shutil.rmtree(offered, ignore_errors=True)
        offered.mkdir(parents=True)
        for deb in hugify_deb.installable():
            shutil.copy(deb, offered)
        script = (
            "dpkg -i /var/cache/hugify-tests/hugify-debs-under-test/*.deb > /dev/null"
            " && hugify --version && hugify policy check /usr/lib/hugify/policy.toml"
            " && ls /usr/lib/hugify/python/hugify/__pycache__"
        )
        res = trixie.run_inside(trixie.trixie_root(), "sh", "-ec", script)
        shutil.rmtree(offered)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"hugify {VERSION}\n"), res.stdout
    # Byte-compiled at installation for the root's Python, which the 3.11- range takes.
    assert ".cpython-313.pyc" in res.stdout, res.stdout


# --- hugify's .rpm ------------------------------------------------------------------------------


class RpmBuild(CachedBuild):
    """An rpmbuild run (see collect_rpms for the layout of its directory)."""

    @property
    def rpms(self) -> list[Path]:
        return sorted((self.dir / "rpms").glob("*.rpm"))

    def rpm(self, prefix: str) -> Path:
        return next(r for r in self.rpms if r.name.startswith(prefix))


def collect_rpms(top: Path, out: Path) -> None:
    (out / "rpms").mkdir(parents=True)
    (out / "root").mkdir()
    for r in sorted((top / "RPMS").rglob("*.rpm")):
        shutil.move(r, out / "rpms" / r.name)
    for r in sorted((out / "rpms").glob("*.rpm")):
        subprocess.run(f"rpm2cpio '{r}' | cpio -idm --quiet", shell=True, cwd=out / "root", check=True)


def build_hugify_rpm() -> RpmBuild:
    sources = hugify_sources()

    def build(parent: Path, out: Path) -> tuple[int, str]:
        top = parent / "top"
        (top / "SOURCES").mkdir(parents=True)
        (parent / "home").mkdir()  # no ~/.rpmmacros of whoever runs the tests
        with tarfile.open(top / "SOURCES" / f"hugify-{VERSION}.tar.gz", "w:gz") as tar:
            for name, p in sources:
                tar.add(p, arcname=f"hugify-{VERSION}/{name}", recursive=False)
        rust = rust_env()
        env = clean_env(
            HOME=str(parent / "home"),
            CARGO_HOME=rust["CARGO_HOME"],
            RUSTUP_HOME=rust["RUSTUP_HOME"],
            PATH=f"{rust['cargo_dir']}:{STD_PATH}",
            CARGO_TARGET_DIR=str(CARGO_TARGET),
        )
        # --nodeps: Debian's rpm database does not know the Debian packages.
        cmd = ["rpmbuild", "-bb", "--nodeps", "--define", f"_topdir {top}", str(REPO / "spec" / "hugify.spec")]
        with cargo_target_held():
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False)
        collect_rpms(top, out)
        return res.returncode, res.stdout

    group = cache_root() / "packages"
    # Keyed by where it compiles too: a build into its own target directory is not reused.
    final = build_dir("packages", "hugify-rpm", files_key(sources, toolchain_key(), f"CARGO_TARGET_DIR={CARGO_TARGET}"))
    return RpmBuild(cached_build(final, group / "hugify-rpm.lock", group / "hugify-rpm-build", build))


@pytest.fixture(scope="session")
def hugify_rpm() -> RpmBuild:
    return build_hugify_rpm().ok()


@slow
def test_hugify_rpm_reuses_the_crates_the_checkout_compiled(hugify_rpm: RpmBuild) -> None:
    """The rpm's cargo build shares the checkout's target directory, as the .deb's does:
    the Rust crates that depend on neither the Python nor the C compiler found (the
    heaviest to compile) are those `make build` compiled before the tests, not compiled
    once more."""
    assert re.search(r"^\s*Finished `release` profile", hugify_rpm.log, re.M), hugify_rpm.log[-3000:]
    compiled = set(re.findall(r"^\s*Compiling (\S+) v", hugify_rpm.log, re.M))
    assert compiled.isdisjoint({"gimli", "iced-x86", "syn"}), sorted(compiled)


@slow
def test_hugify_rpm_is_built_with_make_install_and_ships_everything(hugify_rpm: RpmBuild) -> None:
    b = hugify_rpm
    assert re.search(r"make install DESTDIR=\S+ INSTALL=.* PREFIX=/usr", b.log), b.log[-3000:]
    listing = subprocess.run(
        ["rpm", "-qlp", str(b.rpm(f"hugify-{VERSION}-"))], capture_output=True, text=True, check=True
    )
    files = set(listing.stdout.split())
    for f in [
        *SHIPPED,
        "usr/lib/systemd/system/hugify-prefetch.service",
        "usr/lib/systemd/system/hugify-prefetch.timer",
        "usr/lib/systemd/system/run-hugify-shared.mount",
    ]:
        assert "/" + f in files, f
    for m in MAN_PAGES:
        assert any(f.startswith(f"/usr/share/man/man1/{m}") for f in files), m
    assert "/" + MANIFEST_DIR in files
    assert "/" + POLICY not in files, "the policy is in its own package"
    # The policy package owns the policy's directory as well (shared with hugify).
    shipped_by = {"policy-vendor": ["/usr/lib/hugify", "/" + POLICY], "buildroot-hook": ["/etc/rpm/macros.hugify"]}
    for name, shipped in shipped_by.items():
        sub = subprocess.run(
            ["rpm", "-qlp", str(b.rpm(f"hugify-{name}-{VERSION}-"))], capture_output=True, text=True, check=True
        )
        assert sub.stdout.split() == shipped, (name, sub.stdout)
    assert any(re.search(r"/__pycache__/cli\.cpython-\d+\.pyc$", f) for f in files), "byte-compiled at build time"
    triggers = subprocess.run(
        ["rpm", "-qp", "--filetriggers", str(b.rpm(f"hugify-{VERSION}-"))], capture_output=True, text=True, check=False
    )
    assert "transfiletriggerin scriptlet (using /bin/sh) -- /usr/lib/hugify/manifest.d" in triggers.stdout
    dirs = "/usr/bin, /usr/lib, /usr/lib64, /usr/libexec, /usr/sbin"
    for kind, action in (("transfiletriggerin", "record"), ("transfiletriggerun", "forget")):
        script = triggers.stdout.split(f"{kind} scriptlet (using /bin/sh) -- {dirs}\n", 1)[1]
        assert f"\n/usr/bin/hugify manifest {action} --from-stdin --quiet || :" in script, triggers.stdout
    manifest_d_script = triggers.stdout.split("scriptlet (using /bin/sh)")[1]
    assert "/usr/lib/hugify/manifest.d" in manifest_d_script and "discovered" not in manifest_d_script
    requires = subprocess.run(
        ["rpm", "-qpR", str(b.rpm(f"hugify-{VERSION}-"))], capture_output=True, text=True, check=True
    ).stdout
    assert "Debian::Debhelper" not in requires, "dh_hugify must not pull debhelper into rpm systems"


# --- installed, in a private mount namespace ------------------------------------------------

#: Mounts copy-on-write overlays (tmpfs) on /usr, /etc, /var and the rpm database,
#: then runs the session script given as its first argument.
NAMESPACE_SETUP = r"""
set -euo pipefail
W=$1
ov=$W/overlay
mkdir -p "$ov"
mount -t tmpfs hugify-e2e "$ov"
n=0
# /run too: the package's postinst prefetches, which writes /run/hugify.
for d in /usr /etc /var /run "$RPMDB"; do
    [ -d "$d" ] || continue
    n=$((n + 1))
    mkdir -p "$ov/$n/upper" "$ov/$n/work"
    mount -t overlay hugify-e2e -o "lowerdir=$d,upperdir=$ov/$n/upper,workdir=$ov/$n/work" "$d"
done
# A machine that never had hugify: no administrator's policy from the host.
rm -rf /etc/hugify
export DEBIAN_FRONTEND=noninteractive
clean=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "HOME=$W/home" LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
mkdir -p "$W/home"
cat > "$W/record-hugify" <<EOF
#!/bin/sh
echo "\$*" >> "$W/trigger-calls"
exec /usr/bin/hugify "\$@"
EOF
chmod 0755 "$W/record-hugify"
"""

DEB_SESSION = r"""
echo "== apt-get install hugify"
"${clean[@]}" apt-get install -y --no-install-recommends "$W"/debs/hugify_*.deb "$W"/debs/hugify-policy-debian_*.deb
"${clean[@]}" sh -c 'for c in hugify dh_hugify dh_hugify_check dh_hugify_sign; do command -v $c; done' > "$W/which"
echo "== dpkg-buildpackage (Build-Depends: dh-sequence-hugify)"
cd "$W/src/hugify-deb-test"
rc=0
# The compilers through ccache, as in the variants' builds (testkit.recipes.ccache_env):
# the same sources with the same flags, compiled once (the cache is read through /var's
# overlay; what this build adds to it goes with the session).
"${clean[@]}" PATH="/usr/lib/ccache:$PATH" CCACHE_DIR="$CCACHE_DIR" \
    CCACHE_BASEDIR="$W/src" dpkg-buildpackage -us -uc -b -j2 > "$W/build.log" 2>&1 || rc=$?
echo "$rc" > "$W/build.rc"
cd "$W"
if [ "$rc" = 0 ]; then
    echo "== apt-get install the built packages"
    "${clean[@]}" HUGIFY="$W/record-hugify" apt-get install -y --no-install-recommends \
        "$W"/src/hugify-deb-test_*.deb "$W"/src/libhugdebtest1_*.deb "$W"/src/hugify-deb-test-exec_*.deb \
        > "$W/install-built.log" 2>&1
    "${clean[@]}" /usr/bin/hugify-deb-test > "$W/run.out" 2>&1 || true
    "${clean[@]}" /usr/libexec/hugify-deb-exec > "$W/run-exec.out" 2>&1 || true
    "${clean[@]}" hugify status > "$W/hugify-status" 2>&1 || true
    "${clean[@]}" apt-get purge -y hugify-deb-test libhugdebtest1 hugify-deb-test-exec > "$W/purge-built.log" 2>&1
fi
echo "== apt-get purge hugify"
"${clean[@]}" apt-get purge -y hugify hugify-policy-debian > "$W/purge.log" 2>&1
ls -d /usr/bin/hugify /usr/bin/dh_hugify /usr/lib/hugify /usr/share/perl5/Debian/Debhelper/Sequence/hugify.pm \
    /usr/lib/rpm/macros.d/macros.hugify > "$W/left" 2>/dev/null || true
dpkg-query -W -f '${db:Status-Abbrev}' hugify > "$W/status-after" 2>/dev/null || true
"""

RPM_SESSION = r"""
echo "== rpm -i --nodeps hugify"
"${clean[@]}" rpm --dbpath "$RPMDB" -i --nodeps "$W"/rpms/hugify-[0-9]*.rpm "$W"/rpms/hugify-policy-vendor-*.rpm
"${clean[@]}" rpm --dbpath "$RPMDB" -q hugify > "$W/rpm-q"
"${clean[@]}" sh -c 'for c in hugify dh_hugify; do command -v $c; done' > "$W/which"
echo "== rpmbuild tests/rpm/hugify-test.spec with the installed macros"
rc=0
"${clean[@]}" rpmbuild -bb --define "_topdir $W/top" --define "hugify_test_src $RPM_TEST" \
    "$RPM_TEST/hugify-test.spec" > "$W/build.log" 2>&1 || rc=$?
echo "$rc" > "$W/build.rc"
if [ "$rc" = 0 ]; then
    echo "== rpm -i the built package"
    "${clean[@]}" HUGIFY="$W/record-hugify" rpm --dbpath "$RPMDB" -i --nodeps \
        "$W"/top/RPMS/*/hugify-test-1.0-1.*.rpm > "$W/install-built.log" 2>&1
    "${clean[@]}" LD_LIBRARY_PATH=/usr/lib64 /usr/bin/hugify-test > "$W/run.out" 2>&1 || true
    "${clean[@]}" rpm --dbpath "$RPMDB" -e --nodeps hugify-test > "$W/erase-built.log" 2>&1
fi
echo "== rpm -e hugify"
"${clean[@]}" rpm --dbpath "$RPMDB" -e --nodeps hugify hugify-policy-vendor > "$W/erase.log" 2>&1
ls -d /usr/bin/hugify /usr/bin/dh_hugify /usr/lib/hugify /usr/lib/rpm/macros.d/macros.hugify \
    > "$W/left" 2>/dev/null || true
"${clean[@]}" rpm --dbpath "$RPMDB" -q hugify > "$W/status-after" 2>&1 || true
"""


#: Issue 14, item 5: a package built with the installed macros but without
#: %{?hugify_manifest} in %files, installed with hugify's rpm by `rpm --root` into a
#: scratch root (copy-on-write overlays of /usr and /etc, so the triggers find a
#: shell and python3 there); `hugify prefetch --all` and `status` run inside it.
DISCOVERY_SESSION = r"""
echo "== rpm -i --nodeps hugify, rpmbuild the test package without %{?hugify_manifest}, rpm -e hugify"
"${clean[@]}" rpm --dbpath "$RPMDB" -i --nodeps "$W"/rpms/hugify-[0-9]*.rpm
grep -vxF '%{?hugify_manifest}' "$RPM_TEST/hugify-test.spec" > "$W/hugify-test.spec"
rc=0
"${clean[@]}" rpmbuild -bb --define "_topdir $W/top" --define "hugify_test_src $RPM_TEST" \
    "$W/hugify-test.spec" > "$W/build.log" 2>&1 || rc=$?
echo "$rc" > "$W/build.rc"
"${clean[@]}" rpm --dbpath "$RPMDB" -e --nodeps hugify
[ "$rc" = 0 ] || exit 0
echo "== a scratch root"
R=$W/scratch
mkdir -p "$R"
mount -t tmpfs hugify-scratch "$R"
for d in usr etc; do
    mkdir -p "$ov/scratch-$d/upper" "$ov/scratch-$d/work" "$R/$d"
    mount -t overlay hugify-scratch -o "lowerdir=/$d,upperdir=$ov/scratch-$d/upper,workdir=$ov/scratch-$d/work" "$R/$d"
done
for d in bin sbin lib lib64; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"; fi
done
mkdir -p "$R/dev" "$R/proc" "$R/sys" "$R/tmp" "$R/run" "$R/var/lib/rpm"
mount --rbind /dev "$R/dev"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
ls "$R/usr/bin/hugify" > "$W/hugify-before" 2>&1 || true
in_root=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root LC_ALL=C.UTF-8 chroot "$R")
rpmr=("${clean[@]}" rpm --root "$R" --dbpath /var/lib/rpm)
"${rpmr[@]}" --initdb
echo "== rpm --root: hugify, then the test package"
"${rpmr[@]}" -i --nodeps "$W"/rpms/hugify-[0-9]*.rpm > "$W/install-hugify.log" 2>&1
"${rpmr[@]}" -i --nodeps "$W"/top/RPMS/*/hugify-test-1.0-1.*.rpm > "$W/install-built.log" 2>&1
"${rpmr[@]}" -qlp "$W"/top/RPMS/*/hugify-test-1.0-1.*.rpm > "$W/test-files"
cp "$R/var/lib/hugify/discovered.list" "$W/discovered-installed.list" || true
ls "$R/usr/lib/hugify/manifest.d" > "$W/manifest-d-installed" 2>&1 || true
rc=0
"${in_root[@]}" hugify prefetch --all --json > "$W/prefetch-installed.json" 2> "$W/prefetch-installed.err" || rc=$?
echo "$rc" > "$W/prefetch-installed.rc"
"${in_root[@]}" hugify status --json > "$W/status-installed.json" 2>&1 || true
echo "== rpm --root -e the test package"
"${rpmr[@]}" -e hugify-test > "$W/erase-built.log" 2>&1
cp "$R/var/lib/hugify/discovered.list" "$W/discovered-erased.list" || true
rc=0
"${in_root[@]}" hugify prefetch --all --json > "$W/prefetch-erased.json" 2> "$W/prefetch-erased.err" || rc=$?
echo "$rc" > "$W/prefetch-erased.rc"
echo "== rpm --root -e hugify"
"${rpmr[@]}" -e hugify > "$W/erase.log" 2>&1
ls -A "$R/var/lib" > "$W/var-lib-left"
"""


@dataclass
class Session:
    """What an installed session left in its result directory."""

    dir: Path

    def text(self, name: str) -> str:
        p = self.dir / name
        return p.read_text() if p.exists() else ""

    @property
    def rc(self) -> int:
        return int(self.text("session.rc"))

    @property
    def build_rc(self) -> int:
        return int(self.text("build.rc") or -1)

    def ok(self) -> Session:
        assert self.rc == 0, self.text("session.log")[-6000:]
        assert self.build_rc == 0, self.text("build.log")[-6000:]
        return self


def rpm_dbpath() -> str:
    return subprocess.run(["rpm", "--eval", "%{_dbpath}"], capture_output=True, text=True, check=True).stdout.strip()


def run_session(
    name: str,
    script: str,
    inputs_key: str,
    prepare: Callable[[Path], None],
    first: Callable[[], object] | None = None,
) -> Session:
    """Runs a session script in a private mount namespace (see the module doc),
    once per inputs; the result directory is cached. `first`, when the session has to
    run, is called before it waits for its turn: a cached build the session's own reuses
    (its compiles, through ccache), so that the two are not made side by side."""
    assert os.geteuid() == 0, "the sessions install packages: they need root and mount namespaces (CI runs as root)"
    final = build_dir("packages", name, inputs_key)
    if (final / "session.rc").exists():
        return Session(final)
    if first is not None:
        first()
    # One session at a time (it installs system-wide), and each only once: a worker
    # that waited finds the other's result.
    with locked(cache_root() / "system-install.lock"):
        if not (final / "session.rc").exists():
            _run_session(name, script, prepare, final)
    return Session(final)


def _run_session(name: str, script: str, prepare: Callable[[Path], None], final: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"hugify-{name}-", dir="/tmp"))  # outside the overlays
    try:
        with building(final) as out:
            prepare(work)
            (work / "session.sh").write_text(NAMESPACE_SETUP + script)
            env = ccache_env(clean_env(PATH=STD_PATH, RPMDB=rpm_dbpath(), RPM_TEST=str(RPM_TEST)))
            res = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "bash", str(work / "session.sh"), str(work)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                timeout=1800,
                check=False,
            )
            for f in work.iterdir():
                if f.is_file():
                    shutil.copy(f, out / f.name)
            if (work / "src").is_dir():
                collect(work / "src", out / "deb")
                save_result(out / "deb", int((work / "build.rc").read_text()), (work / "build.log").read_text())
            if (work / "top").is_dir():
                collect_rpms(work / "top", out / "rpm")
            (out / "session.log").write_text(res.stdout)
            (out / "session.rc").write_text(str(res.returncode))
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def deb_session(hugify_deb: DebBuild) -> Session:
    def prepare(work: Path) -> None:
        (work / "debs").mkdir()
        for deb in hugify_deb.installable():
            shutil.copy(deb, work / "debs")
        prepare_test_source(work / "src", build_depends="dh-sequence-hugify")

    key = files_key(package_source_files(), hugify_deb.dir.name, DEB_SESSION, NAMESPACE_SETUP, toolchain_key())
    # The variant first: its compiles fill ccache, which the session's build then hits
    # (from empty caches the two built side by side and neither had the other's objects).
    return run_session("e2e-deb", DEB_SESSION, key, prepare, first=lambda: build_variant("with").ok())


def _rpm_session(name: str, script: str, hugify_rpm: RpmBuild) -> Session:
    """A session with hugify's rpm at hand and the rpm test package's sources."""

    def prepare(work: Path) -> None:
        (work / "rpms").mkdir()
        for package in ("hugify", "hugify-policy-vendor"):
            shutil.copy(hugify_rpm.rpm(f"{package}-{VERSION}-"), work / "rpms")

    rpm_inputs = [(p.name, p) for p in sorted(RPM_TEST.iterdir())]
    rpm_inputs.append(("gen_code.py", REPO / "tests" / "programs" / "gen_code.py"))
    key = files_key(rpm_inputs, hugify_rpm.dir.name, script, NAMESPACE_SETUP, toolchain_key())
    return run_session(name, script, key, prepare)


@pytest.fixture(scope="session")
def rpm_session(hugify_rpm: RpmBuild) -> Session:
    return _rpm_session("e2e-rpm", RPM_SESSION, hugify_rpm)


@pytest.fixture(scope="session")
def discovery_session(hugify_rpm: RpmBuild) -> Session:
    return _rpm_session("e2e-rpm-discovery", DISCOVERY_SESSION, hugify_rpm)


# --- Debian, end to end ---------------------------------------------------------------------


@slow
def test_installed_deb_provides_the_add_on_without_any_path_tricks(deb_session: Session) -> None:
    s = deb_session.ok()
    assert s.text("which").split() == [
        "/usr/bin/hugify",
        "/usr/bin/dh_hugify",
        "/usr/bin/dh_hugify_check",
        "/usr/bin/dh_hugify_sign",
    ]
    log = s.text("build.log")
    assert re.search(r"^dh binary$", log, re.M), "debian/rules says only `dh $@`"
    # dh announces each step as "   dh_X": debian/rules overrides none.
    assert "override_dh_" not in log
    steps = [line.split()[0] for line in log.splitlines() if line.startswith("   dh_")]
    order = [steps.index(c) for c in ("dh_hugify", "dh_dwz", "dh_strip", "dh_hugify_check", "dh_hugify_sign")]
    assert order == sorted(order), steps
    assert "hugify: hugify-deb-test: 1 transformed, 0 as-is, 1 skipped, 0 failed" in log
    assert "hugify: hugify-deb-test-exec: 0 transformed, 1 as-is, 0 skipped, 0 failed" in log
    assert "hugify: hugify-deb-test-lld: 2 transformed, 1 as-is, 0 skipped, 0 failed" in log


@slow
def test_package_built_with_the_installed_add_on_is_hugified(deb_session: Session) -> None:
    s = deb_session.ok()
    b = DebBuild(s.dir / "deb").ok()
    plain = build_variant("plain").ok()  # the same package built without the add-on
    # The Multi-Arch: same library's manifest is named after its architecture.
    listings = {"hugify-deb-test": "hugify-deb-test", "libhugdebtest1": "libhugdebtest1:amd64"}
    for f, pkg in ((PROG, "hugify-deb-test"), (LIB, "libhugdebtest1")):
        assert hugified(b.root / f), f
        shipped = build_id(b.root / f)
        assert bits_differing(bytes.fromhex(shipped), readelf_build_id(plain.root / f)) == 1, f
        assert build_id(debug_file(b.pkg(f"{pkg}-dbgsym"), shipped)) == shipped
        assert shipped in b.field(f"{pkg}-dbgsym", "Build-Ids").split()
        listed = manifest.parse((b.pkg(pkg) / MANIFEST_DIR / f"{listings[pkg]}.list").read_text())
        entries = {e.path: e.build_id for e in listed}
        assert entries["/" + f] == shipped
    assert not hugified(b.root / SMALL)
    assert os.stat(b.root / PROG).st_ino == os.stat(b.root / LINK).st_ino
    # The non-PIE program is listed as-is and ships as the build without the add-on made it.
    assert (b.root / EXEC).read_bytes() == (plain.root / EXEC).read_bytes()
    exec_list = b.pkg("hugify-deb-test-exec") / MANIFEST_DIR / "hugify-deb-test-exec.list"
    (entry,) = manifest.parse(exec_list.read_text())
    assert (entry.path, entry.build_id) == ("/" + EXEC, build_id(b.root / EXEC))
    assert [(entry.offset, entry.size)] == readelf_windows(b.root / EXEC, fixed=True)


@slow
def test_dpkg_trigger_prefetches_the_installed_packages(deb_session: Session) -> None:
    s = deb_session.ok()
    assert "Processing triggers for hugify" in s.text("install-built.log"), s.text("install-built.log")
    assert "prefetch --quiet --all" in s.text("trigger-calls").splitlines()
    assert s.text("run.out").startswith("hugify-deb-test: "), s.text("run.out")
    assert "/usr/bin/hugify-deb-test" in s.text("hugify-status"), s.text("hugify-status")
    assert s.text("run-exec.out").startswith("hugify-deb-exec: "), s.text("run-exec.out")
    assert f"/{EXEC}" in s.text("hugify-status"), s.text("hugify-status")


@slow
def test_purging_hugify_leaves_nothing_behind(deb_session: Session) -> None:
    s = deb_session.ok()
    assert s.text("left") == "", "left after apt-get purge: " + s.text("left")
    assert s.text("status-after").strip() in ("", "un", "pn"), s.text("status-after")


# --- rpm, end to end ---------------------------------------------------------------------------


@slow
def test_installed_rpm_macros_hugify_the_rpm_test_package(rpm_session: Session) -> None:
    s = rpm_session.ok()
    assert s.text("rpm-q").startswith(f"hugify-{VERSION}-")
    assert s.text("which").split() == ["/usr/bin/hugify", "/usr/bin/dh_hugify"]
    log = s.text("build.log")
    # The installed macros run the installed brp-hugify with the installed hugify,
    # and it transforms before find-debuginfo extracts anything.
    assert "+ /usr/lib/rpm/brp-hugify --hugify /usr/bin/hugify " in log, log[-4000:]
    assert log.index("hugify: /usr/bin/hugify-test: transformed") < log.index("extracting debug info"), log[-4000:]
    assert "hugify: hugify-test: 2 transformed, 0 as-is, 1 skipped, 0 failed" in log
    root = s.dir / "rpm" / "root"
    for f in ("usr/bin/hugify-test", "usr/lib64/libhugtest.so.1"):
        assert hugified(root / f), f
        shipped = build_id(root / f)
        assert build_id(debug_file(root, shipped)) == shipped
    assert not hugified(root / "usr/bin/hugify-small")
    entries = {e.path: e.build_id for e in manifest.parse((root / MANIFEST_DIR / "hugify-test.list").read_text())}
    assert entries["/usr/bin/hugify-test"] == build_id(root / "usr/bin/hugify-test")


@slow
def test_rpm_file_trigger_prefetches_the_installed_package(rpm_session: Session) -> None:
    s = rpm_session.ok()
    calls = s.text("trigger-calls").splitlines()
    assert "prefetch --quiet --manifests /usr/lib/hugify/manifest.d/hugify-test.list" in calls, calls
    assert s.text("run.out").startswith("hugify-test: "), s.text("run.out")


@slow
def test_erasing_the_hugify_rpm_leaves_nothing_behind(rpm_session: Session) -> None:
    s = rpm_session.ok()
    assert s.text("left") == "", "left after rpm -e: " + s.text("left")
    assert "is not installed" in s.text("status-after")


# --- rpm: hugified files found without a manifest ----------------------------------------


def _prefetched(s: Session, name: str) -> dict[str, dict]:
    text = s.text(f"prefetch-{name}.json")
    assert text, s.text(f"prefetch-{name}.err")
    return {f["path"]: f for f in json.loads(text)["files"]}


@slow
def test_rpm_file_trigger_records_hugified_files_of_a_package_without_a_manifest(discovery_session: Session) -> None:
    s = discovery_session.ok()
    assert s.text("hugify-before") == "" or "No such file" in s.text("hugify-before")
    log = s.text("build.log")
    assert "hugify: hugify-test: 2 transformed, 0 as-is, 1 skipped, 0 failed" in log, log[-3000:]
    files = s.text("test-files").split()
    assert "/usr/bin/hugify-test" in files and not any("/usr/lib/hugify/manifest.d/" in f for f in files)
    assert s.text("manifest-d-installed").split() == [], "the package ships no manifest"
    root = s.dir / "rpm" / "root"
    recorded = {e.path: e for e in manifest.parse(s.text("discovered-installed.list"))}
    hugified_paths = ["/usr/bin/hugify-test", "/usr/bin/hugify-test-link", "/usr/lib64/libhugtest.so.1"]
    assert sorted(recorded) == hugified_paths, s.text("discovered-installed.list")
    for path, e in recorded.items():
        # Against the package's own file, read by readelf, not by hugify.
        assert e.build_id == readelf_build_id(root / path.lstrip("/")).hex(), path
        assert hugified(root / path.lstrip("/")), path
        assert e.offset % e.huge_page == 0 and e.size % e.huge_page == 0 and e.size > 0
    prefetched = _prefetched(s, "installed")
    for path in hugified_paths:
        f = prefetched[path]
        assert f["manifest"] == "/var/lib/hugify/discovered.list", f
        assert f.get("error", {}).get("reason") in (None, "hardlink"), f
    assert "/usr/bin/hugify-small" not in prefetched
    status = json.loads(s.text("status-installed.json"))
    assert {f["path"] for f in status["files"]} >= set(hugified_paths)


@slow
def test_rpm_erase_forgets_the_discovered_files(discovery_session: Session) -> None:
    s = discovery_session.ok()
    assert manifest.parse(s.text("discovered-erased.list")) == [], s.text("discovered-erased.list")
    assert not any(p.startswith("/usr/bin/hugify-test") for p in _prefetched(s, "erased"))
    assert "hugify" not in s.text("var-lib-left").split(), "erasing hugify removes its state directory"
