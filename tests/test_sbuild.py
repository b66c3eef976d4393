"""A real Debian source package built by sbuild in a clean chroot, with hugify
turned on exactly as docs/packaging-debian.md ("Turning it on for every build")
tells a buildd administrator: hugify's own .deb as an extra package that every
build depends on, and `DH_EXTRA_ADDONS=hugify` in sbuild's build environment.
The package itself is the archive's, unchanged (its debian/rules is a plain
`dh $@`, debhelper compat 13, with a -dbgsym package).

The source is fetched with `apt-get source` (testkit/debian_roots.py: a private
deb-src list); the chroot is a tarball made by mmdebstrap (--variant=buildd) and
used by sbuild's unshare backend, so every build starts from the same clean root.
The package is built twice, with and without hugify, and each build (its .debs
unpacked, its log and host lintian's tags) is cached keyed by its inputs: the
source package version, the chroot's key, hugify's .deb and the sbuild
configuration.

GNU hello builds in well under a minute; its code (about 10 KiB) is below the
vendor policy's 1 MiB threshold, so the buildd configuration also installs an
administrator's policy (/etc/hugify/policy.toml) with a 4 KiB threshold.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from testkit import HP
from testkit.cache import build_dir, cache_root, cached_build
from testkit.debian import (
    DebBuild,
    build_hugify_deb,
    build_id,
    clean_env,
    collect,
    debug_file,
    files_key,
    tool_versions,
)
from testkit.debian_roots import debian_root, source_package
from testkit.elf import bits_differing, exec_load, hugified

SOURCE = "hello"
PROGRAM = "usr/bin/hello"
ADMIN_POLICY = 'threshold = "4K"\n'
#: Every sbuild run: the unshare backend, a fixed build path (the two builds must
#: differ only by hugify) and no lintian inside (the host's lintian runs on both).
SBUILDRC_COMMON = """\
$chroot_mode = 'unshare';
$build_path = '/build/pkg';
$run_lintian = 0;
$run_piuparts = 0;
$run_autopkgtest = 0;
$apt_update = 1;
"""
#: The lines of docs/packaging-debian.md, with this test's paths, and the
#: administrator's policy installed in the chroot before the build dependencies.
SBUILDRC_HUGIFY = """\
$build_environment = {{ 'DH_EXTRA_ADDONS' => 'hugify' }};
$extra_packages = ['{deb}'];
$manual_depends = ['hugify'];
$external_commands = {{ 'chroot-setup-commands' => [
    q{{mkdir -p /etc/hugify && printf '{policy}' > /etc/hugify/policy.toml}},
] }};
"""


def sbuildrc(deb: Path | None) -> str:
    text = SBUILDRC_COMMON
    if deb is not None:
        text += SBUILDRC_HUGIFY.format(deb=deb, policy=ADMIN_POLICY.replace("\n", "\\n"))
    return text + "1;\n"


def chroot_tarball() -> Path:
    return debian_root("sbuild-chroot", "--variant=buildd", fmt="tar")


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


def sbuild(name: str, hugify: bool) -> DebBuild:
    """The source package built by sbuild in the clean chroot, once per inputs."""
    dsc = source_package(SOURCE)
    tarball = chroot_tarball()
    deb = build_hugify_deb().ok().deb("hugify") if hugify else None
    rc_text = sbuildrc(deb)
    inputs = [(p.name, p) for p in sorted(dsc.parent.iterdir())]
    # The configuration counts with the .deb's name, not where the cache keeps it.
    hugify_key = (deb.parent.parent.name, sbuildrc(Path(deb.name))) if deb else ("", rc_text)
    key = files_key(inputs, tarball.parent.name, *hugify_key, tool_versions("sbuild"))

    def build(parent: Path, out: Path) -> tuple[int, str]:
        config = parent / "sbuildrc"
        config.write_text(rc_text)
        # The unshare backend maps root's subordinate ids, which a Debian system
        # does not give root: a private mount namespace lends it a range.
        for f in ("subuid", "subgid"):
            (parent / f).write_text("root:200000:65536\n")
        script = (
            'mount --bind "$1/subuid" /etc/subuid && mount --bind "$1/subgid" /etc/subgid && '
            'cd "$1/out" && exec sbuild --nolog --dist=bookworm --arch-any --no-arch-all '
            '--chroot="$2" --build-dir="$1/out" "$3"'
        )
        (parent / "out").mkdir()
        res = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
                *map(str, (parent, tarball, dsc)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(SBUILD_CONFIG=str(config), HOME=str(parent)),
            timeout=1800,
            check=False,
        )
        collect(parent / "out", out)
        (out / "lintian").write_text("\n".join(lintian_tags(out / "debs")) + "\n")
        return res.returncode, res.stdout

    group = cache_root() / "sbuild"
    return DebBuild(cached_build(build_dir("sbuild", name, key), group / "build.lock", group / "build", build))


@pytest.fixture(scope="module")
def with_hugify() -> DebBuild:
    return sbuild("with-hugify", hugify=True).ok()


@pytest.fixture(scope="module")
def without_hugify() -> DebBuild:
    return sbuild("without-hugify", hugify=False).ok()


def test_sbuild_with_dh_extra_addons_hugifies_the_archive_package(
    with_hugify: DebBuild, without_hugify: DebBuild
) -> None:
    log = with_hugify.log
    # hugify came in only as the build dependency the configuration adds.
    assert re.search(r"^Setting up hugify ", log, re.M), log[-6000:]
    assert not re.search(r"^(Setting up hugify|   dh_hugify)", without_hugify.log, re.M)
    steps = [line.split()[0] for line in log.splitlines() if line.startswith("   dh_")]
    assert steps.index("dh_hugify") < steps.index("dh_dwz") < steps.index("dh_strip") < steps.index("dh_hugify_sign")
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
    # Both builds ran in the same path of the same chroot: hugify flipped one bit.
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
    assert dsc.name == f"{SOURCE}_{version}.dsc"
