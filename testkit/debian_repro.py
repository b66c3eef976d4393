"""Debian builds as a distribution and its rebuilders make them (tests/test_sbuild.py,
tests/test_repro*.py):

* the test distribution's policy package (tests/deb/hugify-policy-test: hugify's
  policy with a 4 KiB threshold, `Provides: hugify-policy`);
* a source package of the archive turned into its hugified derivative the way a
  distribution would (issue 44's `+hugifyN` source): one Build-Depends added
  (`dh-sequence-hugify`) and a changelog entry, nothing else;
* sbuild in a clean chroot (mmdebstrap's buildd variant, the unshare backend) with
  hugify's packages offered as extra packages, as a buildd that has them in its archive;
* a rebuild from a .buildinfo alone, as debrebuild does it: a fresh chroot holding
  exactly the recorded Installed-Build-Depends (from the archive and a local
  repository of hugify's packages), the source unpacked at the recorded Build-Path,
  dpkg-buildpackage run with the recorded Environment and nothing else, and the
  packages compared with the checksums the .buildinfo lists.

Every build is cached under the test cache, keyed by its inputs (testkit.cache).
"""

from __future__ import annotations

import datetime
import hashlib
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit import REPO
from testkit.cache import CachedBuild, build_dir, cache_root, cached, cached_build
from testkit.cli import hugify
from testkit.debian import (
    DebBuild,
    build_hugify_deb,
    clean_env,
    collect,
    dpkg_buildpackage,
    files_key,
    tool_versions,
    tree_files,
)
from testkit.debian_roots import KEYRING, MIRROR, SUITE, debian_root, mmdebstrap, source_package

POLICY_SRC = REPO / "tests" / "deb" / "hugify-policy-test"
#: Every sbuild run: the unshare backend, a fixed build path, no lintian inside (the
#: host's lintian runs on the results), apt's lists refreshed.
SBUILDRC_COMMON = """\
$chroot_mode = 'unshare';
$build_path = '/build/pkg';
$run_lintian = 0;
$run_piuparts = 0;
$run_autopkgtest = 0;
$apt_update = 1;
"""


def run(argv: list[str], *, timeout: float = 1800, **options: object) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end (never raising on its exit status), its stdout and stderr
    in one stream, in order: every build and tool run of this module."""
    return subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False, **options
    )  # type: ignore[call-overload]


def in_private_mounts(script: str, *args: str | Path, pid: bool = False) -> list[str]:
    """The command that runs `sh -c SCRIPT sh ARGS` in a private mount namespace (its
    mounts gone with it; with `pid`, in its own PID namespace too, so that nothing it
    started outlives it)."""
    pid_options = ["--pid", "--fork"] if pid else []
    return ["unshare", "--mount", "--propagation", "private", *pid_options, "sh", "-c", script, "sh", *map(str, args)]


def in_chroot(root: Path, *argv: str, prepare: str = "", sys: bool = False, pid: bool = False) -> list[str]:
    """The command that runs `argv` chrooted in `root`, in a private mount namespace
    (in_private_mounts): the root gets its /proc and the host's /dev (and /sys with
    `sys`), gone with the namespace. `prepare` is shell run first, with the root as $1
    (an overlay mounted there, say)."""
    steps = [prepare] if prepare else []
    steps += ['mount -t proc proc "$1/proc"', *(['mount --rbind /sys "$1/sys"'] if sys else [])]
    steps += ['mount --rbind /dev "$1/dev"', 'r=$1 && shift && exec chroot "$r" "$@"']
    return in_private_mounts(" && ".join(steps), root, *argv, pid=pid)


def policy_package() -> Path:
    """The test distribution's policy package (.deb), built once per its sources."""
    files = tree_files(POLICY_SRC)

    def build(parent: Path, out: Path) -> tuple[int, str]:
        src = parent / "hugify-policy-test"
        shutil.copytree(POLICY_SRC, src)
        rc, log = dpkg_buildpackage(src, clean_env())
        collect(parent, out)
        return rc, log

    group = cache_root() / "repro"
    key = files_key(files, tool_versions("debhelper", "dpkg-dev"))
    final = build_dir("repro", "policy-package", key)
    return (
        DebBuild(cached_build(final, group / "policy.lock", group / "policy-build", build))
        .ok()
        .deb("hugify-policy-test")
    )


def chroot_tarball() -> Path:
    """The clean build chroot sbuild starts every build from; dpkg in it does not sync
    every file it unpacks (as sbuild-createchroot sets up a buildd's chroot)."""
    return debian_root("sbuild-chroot", "--variant=buildd", "--dpkgopt=force-unsafe-io", fmt="tar")


# --- the derived source -----------------------------------------------------------------------


#: Who signs the derived sources' changelog entries.
MAINTAINER = "hugify developers <hugify-devel@example.org>"
#: The code that makes a derived source (part of its cache key).
DERIVE_CODE = (REPO / "hugify" / "derive.py", REPO / "hugify" / "commands" / "derive_source.py")


def hugified_source(name: str, suffix: str = "+hugify1") -> Path:
    """The archive's source `name` as a distribution derives it, with `hugify
    derive-source` of this checkout: one Build-Depends added (dh-sequence-hugify) and
    a changelog entry VERSION+hugify1 a second after the last one. The path of its
    .dsc, made once per source, suffix and derive-source's code."""
    dsc = source_package(name)
    inputs = [(p.name, p) for p in sorted(dsc.parent.iterdir())]
    code = [(str(p.relative_to(REPO)), p) for p in DERIVE_CODE]
    key = files_key(inputs + code, suffix, MAINTAINER, tool_versions("dpkg-dev"))

    def make(work: Path) -> None:
        hugify("derive-source", dsc, "-o", work, "--suffix", suffix, "--maintainer", MAINTAINER, env=clean_env())

    return next(cached(f"derived-{name}", key, make).glob("*.dsc"))


# --- sbuild --------------------------------------------------------------------------------------


def sbuild(name: str, dsc: Path, rc_text: str, key_parts: list[str]) -> DebBuild:
    """`dsc` built by sbuild in the clean chroot with configuration `rc_text` (its
    `1;` added), once per inputs: the source's files, the chroot, `key_parts` (what
    the configuration names by path: the extra packages' identities) and sbuild's
    version. Its .debs, .changes and .buildinfo in debs/, unpacked in pkgs/."""
    tarball = chroot_tarball()
    rc_text += "1;\n"
    inputs = [(p.name, p) for p in source_files(dsc)]
    key = files_key(inputs, tarball.parent.name, *key_parts, tool_versions("sbuild"))

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
        res = run(
            in_private_mounts(script, parent, tarball, dsc),
            env=clean_env(SBUILD_CONFIG=str(config), HOME=str(parent)),
            timeout=3600,
        )
        collect(parent / "out", out)
        return res.returncode, res.stdout

    group = cache_root() / "sbuild"
    return DebBuild(cached_build(build_dir("sbuild", name, key), group / "build.lock", group / "build", build))


def extra_packages_rc(debs: list[Path]) -> str:
    """sbuild lines that offer these packages to the dependency resolver (as an archive
    that has them would) and install nothing by themselves."""
    listed = ", ".join(f"'{d}'" for d in debs)
    return f"$extra_packages = [{listed}];\n"


def package_identity(deb: Path) -> str:
    """What a package counts with in a cache key: its name, version and digest."""
    return f"{deb.name} {hashlib.sha256(deb.read_bytes()).hexdigest()}"


def hugify_debs() -> list[Path]:
    """What the test distribution's archive offers besides Debian's: hugify and its
    policy package (not hugify-policy-debian, which hugify's Depends names first)."""
    return [build_hugify_deb().ok().deb("hugify"), policy_package()]


#: DEB_BUILD_OPTIONS of every build of a source (sbuild's, hence its .buildinfo's
#: Environment and the rebuild from it; reprotest's), where it is not the default:
#: rust-exa's tests compile the program and its 18 crates a second time, in cargo's
#: test profile, for a result its debian/rules ignores (`dh_auto_test || true`).
BUILD_OPTIONS = {"rust-exa": "nocheck"}


def hugified_build(source: str = "hello") -> DebBuild:
    """The hugified source (one Build-Depends added) built by sbuild, hugify's
    packages offered by the archive, with the source's BUILD_OPTIONS."""
    debs = hugify_debs()
    rc = SBUILDRC_COMMON + extra_packages_rc(debs)
    if source in BUILD_OPTIONS:
        rc += f"$build_environment = {{ 'DEB_BUILD_OPTIONS' => '{BUILD_OPTIONS[source]}' }};\n"
    return sbuild(f"hugified-{source}", hugified_source(source), rc, [rc, *map(package_identity, debs)])


def archive_build(source: str = "hello") -> DebBuild:
    """The archive's source, unchanged, built the same way without hugify."""
    return sbuild(f"archive-{source}", source_package(source), SBUILDRC_COMMON, [SBUILDRC_COMMON])


def local_switch_build(source: str = "hello") -> DebBuild:
    """The archive's source built with the local, unrecorded switch: DH_EXTRA_ADDONS
    in sbuild's build environment and hugify added to the build dependencies by the
    builder's configuration (docs/packaging-debian.md, "Turning it on, recorded")."""
    debs = hugify_debs()
    rc = (
        SBUILDRC_COMMON
        + extra_packages_rc(debs)
        + "$build_environment = { 'DH_EXTRA_ADDONS' => 'hugify' };\n$manual_depends = ['hugify'];\n"
    )
    return sbuild(f"local-switch-{source}", source_package(source), rc, [rc, *map(package_identity, debs)])


# --- a rebuild from the .buildinfo alone ----------------------------------------------------------


def parse_buildinfo(path: Path) -> dict[str, str]:
    """The fields of a .buildinfo (continuation lines joined with newlines)."""
    fields: dict[str, str] = {}
    last = ""
    for line in path.read_text().splitlines():
        if line.startswith((" ", "\t")) and last:
            fields[last] += "\n" + line.strip()
        elif ":" in line:
            last, _, value = line.partition(":")
            fields[last] = value.strip()
    return fields


def installed_build_depends(info: dict[str, str]) -> list[str]:
    """`package=version` for each entry of Installed-Build-Depends."""
    out = []
    for item in info["Installed-Build-Depends"].replace("\n", " ").split(","):
        m = re.fullmatch(r"\s*([a-z0-9.+-]+)(?::\w+)?\s*\(=\s*([^)\s]+)\s*\)\s*", item)
        assert m, f"not NAME (= VERSION): {item!r}"
        out.append(f"{m[1]}={m[2]}")
    return out


def recorded_environment(info: dict[str, str]) -> dict[str, str]:
    """The Environment field: VAR="value" lines."""
    env = {}
    for line in info.get("Environment", "").splitlines():
        m = re.fullmatch(r'\s*([A-Za-z_][A-Za-z0-9_]*)="(.*)"\s*', line)
        if m:
            env[m[1]] = m[2].replace('\\"', '"').replace("\\\\", "\\")
    return env


def listed_debs(info: dict[str, str]) -> dict[str, str]:
    """name -> sha256 of every .deb the .buildinfo lists (Checksums-Sha256)."""
    out = {}
    for line in info["Checksums-Sha256"].splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].endswith((".deb", ".udeb")):
            out[parts[2]] = parts[0]
    return out


def source_files(dsc: Path) -> list[Path]:
    """The files of a source package: its .dsc and what it names, beside it."""
    return [p for p in sorted(dsc.parent.iterdir()) if p.is_file() and p.name != "done" and p.suffix != ".tmp"]


def rebuild(build: DebBuild, dsc: Path, local_debs: list[Path]) -> DebBuild:
    """The build reproduced from its .buildinfo alone, as debrebuild does: a fresh
    chroot (mmdebstrap, essential variant) with exactly the packages and versions of
    Installed-Build-Depends, from the archive and a local repository holding
    `local_debs` (packages the archive does not have: hugify's); the source unpacked at
    Build-Path; `dpkg-buildpackage` with the recorded Environment only, for the
    recorded architectures. Cached by the .buildinfo and the local packages: one
    rebuild per .buildinfo, whichever test asks."""
    (buildinfo,) = sorted((build.dir / "debs").glob("*.buildinfo"))
    info = parse_buildinfo(buildinfo)
    sources = source_files(dsc)
    key = files_key(
        [("buildinfo", buildinfo), *((p.name, p) for p in sources), *((d.name, d) for d in local_debs)],
        tool_versions("mmdebstrap"),
    )

    def make(parent: Path, out: Path) -> tuple[int, str]:
        repo = local_repository(parent, local_debs)
        root = parent / "root"
        include = ",".join(installed_build_depends(info))
        mirrors = (f"deb {MIRROR} {SUITE} main", f"deb [trusted=yes] copy://{repo} ./")
        chroot = mmdebstrap(
            root, "--variant=essential", f"--include={include}", f"--keyring={KEYRING}", mirrors=mirrors
        )
        if chroot.returncode != 0:
            return chroot.returncode, chroot.stdout
        build_path = Path(info["Build-Path"])
        inside = root / build_path.parent.relative_to("/")
        inside.mkdir(parents=True, exist_ok=True)
        for p in sources:
            shutil.copy(p, inside / p.name)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nonexistent", **recorded_environment(info)}
        archs = info["Architecture"].split()
        binary = "any" if "all" not in archs else ("all" if archs == ["all"] else "any,all")
        if "source" in archs:
            binary = "source," + binary
        command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "dpkg-buildpackage", "-us", "-uc"]
        (root / "rebuild.sh").write_text(
            "set -e\n"
            f"cd {shlex.quote(str(build_path.parent))}\n"
            f"dpkg-source -x {shlex.quote(dsc.name)} {shlex.quote(build_path.name)} >/dev/null\n"
            f"cd {shlex.quote(build_path.name)}\n"
            f"exec {shlex.join(command)} --build={binary}\n"
        )
        again = run(in_chroot(root, "/bin/sh", "/rebuild.sh", pid=True))
        collect(inside, out)
        return again.returncode, chroot.stdout + again.stdout

    group = cache_root() / "repro"
    final = build_dir("repro", f"rebuild-{buildinfo.stem}", key)
    return DebBuild(cached_build(final, group / "rebuild.lock", group / "rebuild", make))


def deb_digests(build: DebBuild) -> dict[str, str]:
    """name -> sha256 of every .deb of a build."""
    return {
        d.name: hashlib.sha256(d.read_bytes()).hexdigest()
        for d in sorted((build.dir / "debs").iterdir())
        if d.suffix in (".deb", ".udeb")
    }


# --- reprotest ---------------------------------------------------------------------------------


def faked_time() -> str:
    """The time the experiment build is faked to (faketime's absolute time: each process
    of the build starts its clock there): December 31 of this year while a day of it
    remains, else January 1. It stays in this year because GNU hello writes its build's
    year into the program (configure.ac: COPYRIGHT_YEAR from `date +%Y`), as other
    upstreams do, so a faked time in another year makes the two builds differ with or
    without hugify; it is after the source's files were unpacked (by the real clock)
    whenever it can be, so that make sees no file from its future."""
    now = datetime.datetime.now(datetime.UTC)
    late = datetime.datetime(now.year, 12, 31, tzinfo=datetime.UTC)
    return f"{now.year}-12-31 00:00:00" if late - now >= datetime.timedelta(days=1) else f"{now.year}-01-01 00:00:00"


#: reprotest's variations: all of them (build path, time, umask, locales, timezone,
#: user and group, home, file ordering, number of CPUs, kernel, ASLR, domain and host
#: names, exec path, environment), the user the experiment builds as being the
#: chroot's `builduser` (and the host name set through sudo, which that needs), the
#: time always faked (reprotest otherwise leaves it alone in half of its runs).
def variations() -> str:
    return f"+all,user_group.available+=builduser:builduser,domain_host.use_sudo=1,time.faketimes+={faked_time()}"


#: Run as the build command's first word in the chroot: the experiment build (reprotest
#: builds it in build-experiment-N; its environment variable does not survive the sudo
#: of the user_group variation) runs with
#: transparent huge pages disabled for it and its children (prctl
#: PR_SET_THP_DISABLE, x86-64 syscall 157, option 41): THP "never" against the
#: control's "madvise". The machine-wide setting is shared with every other test
#: and user of the machine, so what a build can see of it is varied, not it.
THP_BY_VARIATION = r"""#!/bin/sh
if [ "${1:-}" = --report ]; then
    shift
    thp=$(grep THP_enabled /proc/self/status | tr '\t' ' ')
    echo "reprotest build: $thp, umask $(umask), $(nproc) CPUs, TZ=${TZ:-}, as $(id -un):$(id -gn), in $PWD" >&2
    exec "$@"
fi
case $PWD in */build-experiment-*)
    exec perl -e 'syscall(157, 41, 1, 0, 0, 0) == 0 or die "prctl: $!\n"; exec @ARGV or die' "$0" --report "$@" ;;
esac
exec "$0" --report "$@"
"""


#: /usr/local/bin/sudo in the chroot: reprotest 0.7.23 runs `sudo -h localhost ...` for
#: its user_group and domain_host variations, and bookworm's sudo (1.9.13) accepts a
#: host only for listing privileges ("a remote host may only be specified when listing
#: privileges"). The host is this one: the wrapper drops it.
SUDO_WITHOUT_HOST = """#!/bin/sh
if [ "$1" = -h ] && [ "$2" = localhost ]; then shift 2; fi
exec /usr/bin/sudo "$@"
"""


#: The chroot's /dev, its own (a tmpfs in the private mount namespace): the usual
#: nodes, and /dev/fuse open to every user, for disorderfs, which the file-ordering
#: variation runs as the experiment's user. The machine's /dev/fuse is root's only,
#: and a bind mount would share (and a chmod change) the machine's node.
PRIVATE_DEV = (
    'mount -t tmpfs -o mode=755 hugify-dev "$1/dev" && cd "$1/dev" && '
    "mknod -m 666 null c 1 3 && mknod -m 666 zero c 1 5 && mknod -m 666 full c 1 7 && "
    "mknod -m 666 random c 1 8 && mknod -m 666 urandom c 1 9 && mknod -m 666 tty c 5 0 && "
    "mknod -m 666 fuse c 10 229 && mkdir pts shm && mount -t devpts -o newinstance,ptmxmode=666 devpts pts && "
    "ln -s pts/ptmx ptmx && ln -s /proc/self/fd fd && ln -s /proc/self/fd/0 stdin && "
    "ln -s /proc/self/fd/1 stdout && ln -s /proc/self/fd/2 stderr && chmod 1777 shm && cd /"
)


def local_repository(parent: Path, debs: list[Path]) -> Path:
    """A flat apt repository (Packages beside the .debs) of `debs` in parent/repo."""
    repo = parent / "repo"
    repo.mkdir(parents=True)
    for d in debs:
        shutil.copy(d, repo / d.name)
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    (repo / "Packages").write_text(packages)
    return repo


def reprotest_root(dsc: Path, local_debs: list[Path]) -> Path:
    """A chroot for reprotest's chroot virtual server: the buildd variant, what
    reprotest's variations need (disorderfs, faketime, locales-all, sudo, a second
    user), the source's build dependencies (hugify and the policy package from a
    local repository), and the THP wrapper; built once per source and packages."""
    sources = source_files(dsc)
    files = [*((p.name, p) for p in sources), *((d.name, d) for d in local_debs)]
    key = files_key(files, THP_BY_VARIATION, SUDO_WITHOUT_HOST)
    source = dsc.name.split("_")[0]

    def stage(work: Path) -> None:
        local_repository(work, local_debs)
        (work / "src").mkdir()
        for p in sources:
            shutil.copy(p, work / "src" / p.name)
        for name, text in (("thp-by-variation", THP_BY_VARIATION), ("sudo", SUDO_WITHOUT_HOST)):
            (work / "bin").mkdir(exist_ok=True)
            (work / "bin" / name).write_text(text)
            (work / "bin" / name).chmod(0o755)

    # What the chroot gets copied in, kept under the key that names it (mmdebstrap's
    # hooks name it by path; debian_root keys the root by its command line).
    staged = cached(f"reprotest-stage-{source}", key, stage)
    hooks = [
        'mkdir -p "$1/srv/hugify-repo" "$1/srv/src"',
        f"sync-in {staged / 'repo'} /srv/hugify-repo",
        f"sync-in {staged / 'src'} /srv/src",
        f"sync-in {staged / 'bin'} /usr/local/bin",
        'echo "deb [trusted=yes] file:/srv/hugify-repo ./" > "$1/etc/apt/sources.list.d/hugify.list"',
        'chroot "$1" apt-get -q update',
        f'chroot "$1" sh -c "cd /srv/src && apt-get -q -y --no-install-recommends build-dep ./{dsc.name}"',
        'chroot "$1" useradd --create-home builduser',
    ]
    return debian_root(
        f"reprotest-root-{source}",
        "--variant=buildd",
        "--include=disorderfs,fakeroot,faketime,locales-all,sudo,util-linux,perl",
        *(f"--customize-hook={h}" for h in hooks),
    )


#: What reprotest runs in the chroot once started: the nodes and the mount table
#: disorderfs needs (reprotest's own Debian preset does the same, and installs the
#: tools, which the chroot has already: reprotest_root).
TESTBED_INIT = (
    "test -c /dev/fuse || mknod -m 666 /dev/fuse c 10 229; test -e /etc/mtab || ln -s ../proc/self/mounts /etc/mtab"
)


def build_command(source: str) -> str:
    """The build, in each build's copy of the source root (the unpacked tree in its
    directory `source`, so that the packages land beside it, where the build's user may
    write): binary-only (-B: Architecture: any, where the ELF files are), with the
    source's BUILD_OPTIONS, through the THP wrapper; then the sha256 of each package it
    made ("reprotest build output: DIGEST ../NAME"), since reprotest keeps only the
    control build's when diffoscope finds no difference."""
    options = f"env DEB_BUILD_OPTIONS={BUILD_OPTIONS[source]} " if source in BUILD_OPTIONS else ""
    return (
        f"cd source && {options}thp-by-variation dpkg-buildpackage -B --no-sign"
        ' && sha256sum ../*.*deb | sed "s|^|reprotest build output: |" >&2'
    )


def reprotest(dsc: Path, local_debs: list[Path]) -> CachedBuild:
    """reprotest on the source `dsc`, unpacked (dpkg-source -x, at the real time: under
    faketime dpkg-source cannot set the times of a quilt source's patched files, and
    reprotest's .dsc preset unpacks in the faked time; so reprotest gets the tree and
    the build command, build_command), in its chroot (reprotest_root),
    every variation on, the experiment under THP never (THP_BY_VARIATION): its exit
    status (0: every .deb the same), its log, and the artifacts of both builds under
    store/control and store/experiment-1. Cached by the source, the chroot and
    reprotest's version."""
    root = reprotest_root(dsc, local_debs)
    inputs = [(p.name, p) for p in source_files(dsc)]
    source = dsc.name.split("_")[0]
    recipe = (variations(), TESTBED_INIT, build_command(source), PRIVATE_DEV)
    key = files_key(inputs, root.parent.name, *recipe, tool_versions("reprotest", "diffoscope-minimal"))

    def make(parent: Path, out: Path) -> tuple[int, str]:
        top = parent / "top"
        top.mkdir()
        unpacked = run(["dpkg-source", "-x", str(dsc), str(top / "source")])
        if unpacked.returncode != 0:
            return unpacked.returncode, unpacked.stdout
        command = ["reprotest", "--verbosity=1", f"--store-dir={out / 'store'}", f"--variations={variations()}"]
        command += [f"--testbed-init={TESTBED_INIT}", "-c", build_command(source), str(top), "*.*deb"]
        command += ["--", "chroot", str(root)]
        script = (
            'mount -t proc proc "$1/proc" && mount -t tmpfs tmpfs "$1/tmp" && ' + PRIVATE_DEV + ' && shift && exec "$@"'
        )
        # Nothing of the test run's own environment (its HUGIFY_POLICY_PATH) reaches the builds.
        res = run(in_private_mounts(script, root, *command), env=clean_env(), timeout=7200)
        return res.returncode, unpacked.stdout + res.stdout

    group = cache_root() / "repro"
    return CachedBuild(
        cached_build(
            build_dir("repro", f"reprotest-{source}", key), group / "reprotest.lock", group / "reprotest", make
        )
    )


@dataclass(frozen=True)
class ReprotestOutcome:
    """What a reprotest run (reprotest()) showed, read from its log."""

    #: reprotest's verdict: exit 0 and "Reproduction successful", no difference in the .debs.
    reproduced: bool
    #: build ("control", "experiment") -> .deb name -> sha256, as each build printed them.
    outputs: dict[str, dict[str, str]]
    #: What the experiment varied, as reprotest announced it ("vary build_path": build_path).
    varied: list[str]
    #: The experiment's variations with a value, as reprotest logged them ("UMASK
    #: variation: umask 0002"; the build path and the user show in `builds`).
    variations: list[str]
    #: The THP wrapper's line of each build (THP state, umask, CPUs, TZ, user, directory).
    builds: list[str]
    #: hugify's "transformed" lines, both builds.
    transformed: list[str]


def reprotest_outcome(r: CachedBuild) -> ReprotestOutcome:
    control, _, experiment = r.log.partition('INFO:reprotest:build "experiment-1"')
    outputs = {}
    for build, text in (("control", control), ("experiment", experiment)):
        lines = re.findall(r"^reprotest build output: ([0-9a-f]{64})  \.\./(\S+)$", text, re.M)
        outputs[build] = {name: digest for digest, name in lines}
    return ReprotestOutcome(
        reproduced=r.rc == 0 and "Reproduction successful" in r.log and "No differences in ./*.*deb" in r.log,
        outputs=outputs,
        varied=re.findall(r"\bvary (\w+)", experiment.partition("\n")[0]),
        variations=re.findall(r"^INFO:reprotest\.build:(\w+ variation: .*)$", experiment, re.M),
        builds=re.findall(r"^reprotest build: (.*)$", r.log, re.M),
        transformed=re.findall(r"^hugify: (\S+): transformed \(", r.log, re.M),
    )
