"""Support for the Debian packaging tests (test_debhelper.py, test_packages.py):
building the test source package tests/deb/hugify-deb-test for real with
dpkg-buildpackage, extracting what it produced, and caching the results.

hugify's own .deb is built here too (build_hugify_deb), for every test that
installs it. Heavy builds are cached under the test cache (testkit.cache: cache_root()),
keyed by everything that goes into them (the package sources, hugify's sources,
the tool versions), one directory per key; a changed input rebuilds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from testkit import REPO
from testkit.cache import CachedBuild, build_dir, cache_root, cached_build, locked
from testkit.cli import write_launcher
from testkit.elf import readelf_build_id
from testkit.recipes import ccache_env
from testkit.runtime import run_checked

DEB_SRC = REPO / "tests" / "deb" / "hugify-deb-test"
GEN_CODE = REPO / "tests" / "programs" / "gen_code.py"
DH_HUGIFY_DIR = REPO / "dh-hugify"

PROG, LINK, SMALL = "usr/bin/hugify-deb-test", "usr/bin/hugify-deb-test-link", "usr/bin/hugify-deb-small"
MULTIARCH = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True, check=True).stdout.strip()
LIB = f"usr/lib/{MULTIARCH}/libhugdebtest.so.1"
DATA_MODULE = "usr/share/hugify-deb-test/hugtest-module"  # in the Architecture: all package
UDEB_MODULE = "usr/lib/hugify-deb-test-udeb/hugtest-module"
MANIFEST_DIR = "usr/lib/hugify/manifest.d"
#: The non-PIE program (ET_EXEC) of package hugify-deb-test-exec, linked with its code
#: on a whole 2 MiB window: dh_hugify lists it as-is and leaves it unchanged.
EXEC = "usr/libexec/hugify-deb-exec"
#: Package hugify-deb-test-lld, linked by lld: its program and the library it needs are
#: shifted (the program header table grown in place at e_phoff), the plugin it can dlopen
#: as-is.
LLD_DIR = "usr/lib/hugify-deb-test-lld"
LLD_PROG, LLD_LIB, LLD_PLUGIN = (
    f"{LLD_DIR}/{n}" for n in ("hugify-deb-test-lld", "libhugdebtest-lld.so", "hugtest-lld-plugin.so")
)

#: What the build environment must not inherit from whoever runs the tests.
_SCRUBBED = (
    "DEB_BUILD_OPTIONS",
    "DEB_BUILD_PROFILES",
    "DEB_BUILD_MAINT_OPTIONS",
    "DH_EXTRA_ADDONS",
    "DH_VERBOSE",
    "DH_QUIET",
    "DH_OPTIONS",
    "DH_INTERNAL_OPTIONS",
    "DH_NO_ACT",
    "DH_ALWAYS_EXCLUDE",
    "MAKEFLAGS",
    "MAKELEVEL",
    "MFLAGS",
    "PERL5LIB",
    "HUGIFY_POLICY_PATH",
    "SOURCE_DATE_EPOCH",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["LC_ALL"] = "C.UTF-8"
    env.update(extra)
    return env


# --- cache keys ----------------------------------------------------------------------


def tool_versions(*packages: str) -> str:
    """The installed versions of Debian packages (part of a cache key)."""
    res = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *packages], capture_output=True, text=True, check=False
    )
    return res.stdout


BUILD_TOOLS = (
    "debhelper",
    "dpkg-dev",
    "gcc-12",
    "binutils",
    "dwz",
    "libc6-dev",
    "python3.11",
    "gcc-12-i686-linux-gnu",
    "libc6-dev-i386-cross",
    "clang",
    "lld",
)


def files_key(files: Iterable[tuple[str, Path]], *extra: str) -> str:
    """A hash of (name, content) pairs (a symlink counts by its target) and strings."""
    h = hashlib.sha256()
    for name, path in sorted(files, key=lambda x: x[0]):
        h.update(name.encode() + b"\0")
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        h.update(b"\0")
    for e in extra:
        h.update(e.encode() + b"\0")
    return h.hexdigest()[:16]


def tree_files(root: Path) -> list[tuple[str, Path]]:
    return [(str(p.relative_to(root)), p) for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()]


def package_source_files() -> list[tuple[str, Path]]:
    """The test source package and the code generator copied into it."""
    return [*tree_files(DEB_SRC), ("gen_code.py", GEN_CODE)]


# --- the test source package ------------------------------------------------------------


def prepare_test_source(
    parent: Path, *, dh_args: str = "", override: bool = False, build_depends: str = "", rules_extra: str = ""
) -> Path:
    """A fresh copy of tests/deb/hugify-deb-test in parent, with the dh line of
    debian/rules, an empty override_dh_hugify target, more rules and extra
    Build-Depends as asked."""
    src = parent / "hugify-deb-test"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(DEB_SRC, src, symlinks=True)
    shutil.copy(GEN_CODE, src / "gen_code.py")
    rules = src / "debian" / "rules"
    text = rules.read_text()
    assert "\tdh $@\n" in text
    text = text.replace("\tdh $@\n", f"\tdh $@{' ' + dh_args if dh_args else ''}\n")
    if override:
        text += "\n# This package opts out of hugify.\noverride_dh_hugify:\n"
    text += rules_extra
    rules.write_text(text)
    if build_depends:
        control = src / "debian" / "control"
        text = control.read_text()
        old = next(line for line in text.splitlines(keepends=True) if line.startswith("Build-Depends:"))
        control.write_text(text.replace(old, f"{old[:-1]}, {build_depends}\n"))
    return src


def dpkg_buildpackage(src: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    """dpkg-buildpackage -us -uc -b in src: exit status and the log (stdout and
    stderr in one stream, in order). The compilers are Debian's ccache wrappers
    (/usr/lib/ccache first in PATH): the variants build the same sources in the
    same directory."""
    res = subprocess.run(
        ["dpkg-buildpackage", "-us", "-uc", "-b", "-j2", *args],
        cwd=src,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ccache_env({**env, "PATH": f"/usr/lib/ccache:{env['PATH']}"}, src.parent),
        check=False,
    )
    return res.returncode, res.stdout


#: Run in a private mount namespace: the prepared build directory (the same path as
#: every other variant's, so that debug information names the same directories) moved
#: onto a fresh filesystem of another kind mounted over it, the transparent huge page
#: setting processes read replaced, what the build made copied back out.
_ON_FS = r"""
set -e
scratch=$1 fs=$2 stash=$3 thp=$4
shift 4
mkdir -p "$stash/tree" "$stash/out"
cp -a "$scratch/." "$stash/tree/"
case $fs in
tmpfs) mount -t tmpfs -o size=6G,huge=never hugify-build "$scratch" ;;
btrfs)
    truncate -s 6G "$stash/btrfs.img"
    mkfs.btrfs -q -f "$stash/btrfs.img"
    mount -o loop "$stash/btrfs.img" "$scratch"
    ;;
esac
cp -a "$stash/tree/." "$scratch/"
if [ -n "$thp" ]; then
    printf '%s\n' "$thp" > "$stash/thp"
    mount --bind "$stash/thp" /sys/kernel/mm/transparent_hugepage/enabled
fi
state=$(grep THP_enabled /proc/self/status | tr '\t' ' ')
echo "build directory: $(stat -f -c %T "$scratch"); THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled); $state"
cd "$scratch/hugify-deb-test"
set +e
dpkg-buildpackage "$@"
rc=$?
for f in "$scratch"/*.deb "$scratch"/*.udeb "$scratch"/*.changes "$scratch"/*.buildinfo; do
    [ -e "$f" ] && cp "$f" "$stash/out/"
done
exit $rc
"""

#: prctl(PR_SET_THP_DISABLE): no transparent huge pages for the process and its
#: children, whatever the system's setting (what THP "never" means to a process).
PR_SET_THP_DISABLE = 41


def _thp_disabled() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")


def dpkg_buildpackage_on(fs: str, thp: str, src: Path, env: dict[str, str], *args: str) -> tuple[int, str, Path]:
    """dpkg_buildpackage in src, its parent directory moved onto a fresh `fs` (tmpfs
    without huge pages, or btrfs on a loop device) at the same path, in a private
    mount namespace, with the THP setting the build reads being `thp` ("never": also
    prctl(PR_SET_THP_DISABLE) for the whole build; "always": the text only, the
    machine's setting is shared with everyone on it). Exit status, log, and the
    directory the packages were copied to."""
    stash = src.parent.with_name(src.parent.name + ".on-" + fs)
    shutil.rmtree(stash, ignore_errors=True)
    stash.mkdir()
    view = {"never": "always madvise [never]", "always": "[always] madvise never", "": ""}[thp]
    script = ["sh", "-c", _ON_FS, "sh", str(src.parent), fs, str(stash), view]
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", *script, "-us", "-uc", "-b", "-j2", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ccache_env({**env, "PATH": f"/usr/lib/ccache:{env['PATH']}"}, src.parent),
        preexec_fn=_thp_disabled if thp == "never" else None,
        check=False,
    )
    return res.returncode, res.stdout, stash / "out"


def collect(parent: Path, out: Path) -> None:
    """Moves the .deb/.udeb/.changes/.buildinfo files from parent to out/debs and
    extracts every package into out/pkgs/PACKAGE and all of them into out/root."""
    (out / "debs").mkdir(parents=True)
    for f in sorted(parent.iterdir()):
        if f.suffix in (".deb", ".udeb", ".changes", ".buildinfo"):
            shutil.move(f, out / "debs" / f.name)
    for deb in sorted((out / "debs").iterdir()):
        if deb.suffix in (".deb", ".udeb"):
            pkg = deb_field(deb, "Package")
            for dest in (out / "pkgs" / pkg, out / "root"):
                dest.mkdir(parents=True, exist_ok=True)
                subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)


#: The line each hugify debhelper command ends its part of a build log with
#: (dh-hugify/Debian/Debhelper/Hugify.pm): its name, wall time and packages.
STEP_TIME = re.compile(r"^hugify: (dh_hugify\w*) took (\d+\.\d\d) s for (\d+) package\(s\)$", re.M)


def hugify_step_times(log: str) -> dict[str, float]:
    """The seconds each hugify debhelper command took in a build log, by command (a log
    of several builds, an sbuild log of arch-any and arch-all tasks, adds them up)."""
    times: dict[str, float] = {}
    for m in STEP_TIME.finditer(log):
        times[m[1]] = times.get(m[1], 0.0) + float(m[2])
    return times


def deb_field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


#: What a package installs that no program reads: its documents and manual pages.
UNREAD = ("./usr/share/doc/", "./usr/share/man/")
#: Fields of the control file that say nothing of what is installed or run.
UNREAD_FIELDS = ("Version:", "Installed-Size:")


def installed_digest(debs: Iterable[Path]) -> str:
    """A digest of what dpkg installs from the .debs and runs while it does: each file's
    path, mode, owner, kind and content (a link: its target), the control file and the
    maintainer scripts and triggers; not the documents and manual pages (UNREAD) nor
    the version and installed size. A snapshot of hugify (tools/stamp-snapshot) is
    versioned by a digest of every source, documents, tests and packaging files
    included, so its version (and the build's cache key) changes where nothing that
    is installed and read does."""
    h = hashlib.sha256()
    for deb in debs:
        h.update(deb_field(deb, "Package").encode() + b"\0")
        for part in ("--ctrl-tarfile", "--fsys-tarfile"):
            tar = subprocess.run(["dpkg-deb", part, str(deb)], capture_output=True, check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as members:
                for m in sorted(members.getmembers(), key=lambda m: m.name):
                    if m.name.startswith(UNREAD) or m.name == "./md5sums":  # md5sums: the documents' too
                        continue
                    f = members.extractfile(m)
                    data = f.read() if f else m.linkname.encode()
                    if m.name == "./control":
                        lines = data.decode().splitlines(keepends=True)
                        data = "".join(line for line in lines if not line.startswith(UNREAD_FIELDS)).encode()
                    h.update(f"{m.name}\0{m.mode:o} {m.uid}:{m.gid} {m.type!r}\0".encode() + data + b"\0")
    return h.hexdigest()[:16]


class DebBuild(CachedBuild):
    """A dpkg-buildpackage run (see collect for the layout of its directory)."""

    def installable(self) -> list[Path]:
        """hugify's own build: the .debs that install it, hugify and the policy
        package it depends on (hugify-policy-debian)."""
        return [self.deb("hugify"), self.deb("hugify-policy-debian")]

    def pkg(self, name: str) -> Path:
        return self.dir / "pkgs" / name

    def deb(self, package: str) -> Path:
        debs = (self.dir / "debs").iterdir()
        return next(d for d in debs if d.name.startswith(package + "_") and d.suffix in (".deb", ".udeb"))

    def field(self, package: str, name: str) -> str:
        return deb_field(self.deb(package), name)

    def packages(self) -> list[str]:
        return sorted(p.name for p in (self.dir / "pkgs").iterdir()) if (self.dir / "pkgs").is_dir() else []


def hugify_inputs() -> list[tuple[str, Path]]:
    """Everything of this checkout that an in-tree dh_hugify run uses."""
    files = [(f"dh-hugify/{n}", p) for n, p in tree_files(DH_HUGIFY_DIR)]
    files += [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "hugify").rglob("*.py"))]
    files += [("hugify/_core.abi3.so", REPO / "hugify" / "_core.abi3.so"), ("policy", REPO / "policy" / "policy.toml")]
    return files


def in_tree_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """The environment that puts this checkout's add-on, dh_hugify and hugify
    first: PERL5LIB for the Sequence module, PATH for the commands."""
    write_launcher(bin_dir / "hugify", REPO / "policy" / "policy.toml")
    path = f"{bin_dir}:{DH_HUGIFY_DIR}:{os.environ['PATH']}"
    return clean_env(PATH=path, PERL5LIB=str(DH_HUGIFY_DIR), **extra)


VERSION = re.search(r'^version = "(.*)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
STD_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
PACKAGING_TOOLS = ("debhelper", "dpkg-dev", "dh-python", "help2man", "gcc-12", "python3.11", "rpm", "perl")


# --- sources and toolchain ---------------------------------------------------------------


def hugify_sources() -> list[tuple[str, Path]]:
    """The files of the source package: what git tracks or would track (so no build
    products), without the test suite and the benchmarks."""
    res = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    out = []
    for name in sorted(set(res.stdout.decode().split("\0"))):
        if not name or name.split("/", 1)[0] in ("tests", "bench", "testkit"):
            continue
        p = REPO / name
        if p.is_symlink() or p.is_file():
            out.append((name, p))
    return out


def snapshot_digest(files: list[tuple[str, Path]]) -> str:
    """The digest a snapshot of these sources carries in its version (docs/packaging-debian.md,
    "Which hugify a build used"), written from the rule, apart from tools/stamp-snapshot:
    sha256 over each file's path, NUL, content (a symlink: its target), NUL, in path
    order; its first 12 hex digits."""
    h = hashlib.sha256()
    for name, path in sorted(files, key=lambda f: f[0].encode()):
        h.update(name.encode() + b"\0")
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:12]


def copy_sources(files: list[tuple[str, Path]], dest: Path) -> None:
    for name, p in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            os.symlink(os.readlink(p), target)
        else:
            shutil.copy2(p, target)


def rust_env() -> dict[str, str]:
    """Where rustup's cargo lives; Rust >= 1.85 is needed (README)."""
    cargo = shutil.which("cargo")
    assert cargo, "cargo (Rust >= 1.85) is needed to build hugify's packages"
    home = Path.home()
    env = {
        "CARGO_HOME": os.environ.get("CARGO_HOME", str(home / ".cargo")),
        "RUSTUP_HOME": os.environ.get("RUSTUP_HOME", str(home / ".rustup")),
        "cargo_dir": str(Path(cargo).parent),
    }
    return env


def toolchain_key() -> str:
    rustc = subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=False).stdout
    return tool_versions(*PACKAGING_TOOLS) + rustc


#: The checkout's cargo target directory (the suite's `make build` fills it first): the
#: builds of hugify's .deb and rpm and of its wheel compile into it, so that the crates
#: hugify depends on are compiled once, not once more for each.
CARGO_TARGET = REPO / "target"


def cargo_target_held() -> contextlib.AbstractContextManager[None]:
    """Held around a build that compiles into CARGO_TARGET: cargo copies every build's
    library to the same target/release/lib_core.so, where a build beside it (the .deb's
    and the rpm's under pytest -n 2, the wheel's) would install it as its own."""
    return locked(CARGO_TARGET / ".hugify-package-builds.lock")


# --- hugify's own .deb (test_packages.py, test_sbuild.py, test_boot.py) ----------------------


def build_hugify_deb() -> DebBuild:
    """hugify's .deb as README's install step builds it: `make deb` (dpkg-buildpackage
    with the rustup profile, in a copy of the sources; its version a snapshot's,
    VERSION+src.DIGEST: tools/stamp-snapshot), its output collected."""
    sources = hugify_sources()

    def build(parent: Path, out: Path) -> tuple[int, str]:
        src = parent / f"hugify-{VERSION}"
        copy_sources(sources, src)
        rust = rust_env()
        # The build profile finds cargo in $CARGO_HOME/bin by itself; PATH gets the
        # cargo directory only when it is somewhere else.
        path = (
            STD_PATH
            if Path(rust["cargo_dir"]) == Path(rust["CARGO_HOME"]) / "bin"
            else f"{rust['cargo_dir']}:{STD_PATH}"
        )
        # CARGO_HOME and RUSTUP_HOME as the user has them (debian/rules' default is
        # ~/.cargo): the crates in CARGO_TARGET were compiled from that CARGO_HOME's
        # registry by `make build` and the rpm's build, and cargo compiles them all again
        # for another one.
        env = clean_env(
            PATH=path,
            DEB_BUILD_OPTIONS="parallel=2",
            CARGO_TARGET_DIR=str(CARGO_TARGET),
            CARGO_HOME=rust["CARGO_HOME"],
            RUSTUP_HOME=rust["RUSTUP_HOME"],
        )
        make = ["make", "deb"]
        with cargo_target_held():
            res = subprocess.run(
                make, cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False
            )
        (src / "dist").mkdir(exist_ok=True)  # a make deb that failed early made none
        collect(src / "dist", out)
        return res.returncode, res.stdout

    group = cache_root() / "packages"
    final = build_dir("packages", "hugify-deb", files_key(sources, toolchain_key()))
    return DebBuild(cached_build(final, group / "hugify-deb.lock", group / "hugify-deb-build", build))


# --- the test package built in variants (test_debhelper.py) ------------------------------


@dataclass(frozen=True)
class Variant:
    dh_args: str = ""  # appended to `dh $@` in debian/rules
    override: bool = False  # an empty override_dh_hugify target
    env: tuple[tuple[str, str], ...] = ()
    in_tree: bool = True  # this checkout's add-on on PERL5LIB and PATH
    #: Cross-built for this Debian architecture (dpkg-buildpackage -a) with the
    #: installed cross toolchain; "" builds for the machine's own.
    host_arch: str = ""
    #: Appended to debian/rules.
    rules_extra: str = ""
    #: The build directory on another filesystem (tmpfs, btrfs) and the transparent
    #: huge page setting the build sees (dpkg_buildpackage_on).
    fs: str = ""
    thp: str = ""


VARIANTS = {
    "plain": Variant(in_tree=False),  # no add-on anywhere
    "with": Variant("--with hugify"),
    "nohugify": Variant("--with hugify", env=(("DEB_BUILD_OPTIONS", "nohugify"),)),
    "without": Variant("--without hugify", env=(("DH_EXTRA_ADDONS", "hugify"),)),
    "override": Variant("--with hugify", override=True),
    "extra-addons": Variant(env=(("DH_EXTRA_ADDONS", "hugify"),)),
    # Multi-Arch: same packages of two architectures must install together.
    "with-i386": Variant("--with hugify", host_arch="i386"),
    # The same build on other filesystems, under other THP settings (tests/test_repro_host.py).
    "with-tmpfs-thp-never": Variant("--with hugify", fs="tmpfs", thp="never"),
    "with-btrfs-thp-always": Variant("--with hugify", fs="btrfs", thp="always"),
    # A tool after dh_strip that undoes the layout (binutils' strip drops the trap
    # padding, so the executable load ends mid-window): dh_hugify_check fails the build.
    "undone": Variant(
        "--with hugify",
        rules_extra="\nexecute_after_dh_strip:\n\tstrip --remove-section=.hugify.pad debian/hugify-deb-test/"
        + PROG
        + "\n",
    ),
}


def build_variant(name: str) -> DebBuild:
    """The test package built (once per inputs) in the named variant."""
    v = VARIANTS[name]
    inputs = package_source_files() + (hugify_inputs() if v.in_tree else [])
    key = files_key(inputs, repr(v), tool_versions(*BUILD_TOOLS))

    def build(parent: Path, out: Path) -> tuple[int, str]:
        src = prepare_test_source(parent, dh_args=v.dh_args, override=v.override, rules_extra=v.rules_extra)
        env = in_tree_env(cache_root() / "debhelper" / "bin", **dict(v.env)) if v.in_tree else clean_env(**dict(v.env))
        arch_args = [f"--host-arch={v.host_arch}"] if v.host_arch else []
        if v.fs:
            rc, log, made = dpkg_buildpackage_on(v.fs, v.thp, src, env, *arch_args)
            collect(made, out)
            shutil.rmtree(made.parent, ignore_errors=True)
        else:
            rc, log = dpkg_buildpackage(src, env, *arch_args)
            collect(parent, out)
        reports = out / "reports"
        for r in sorted((src / "debian" / ".debhelper" / "generated").glob("*/hugify-report.json")):
            reports.mkdir(exist_ok=True)
            shutil.copy(r, reports / f"{r.parent.name}.json")
        return rc, log

    # One scratch path for every variant: the builds take turns.
    group = cache_root() / "debhelper"
    return DebBuild(cached_build(build_dir("debhelper", name, key), group / "build.lock", group / "build", build))


# --- checks on ELF files -----------------------------------------------------------------


def build_id(path: Path) -> str:
    return readelf_build_id(path).hex()


def debug_file(root: Path, bid: str) -> Path:
    return root / "usr/lib/debug/.build-id" / bid[:2] / f"{bid[2:]}.debug"


def files_of(root: Path) -> dict[str, bytes]:
    """Every file and symlink under root: contents (symlinks: their target)."""
    return {
        str(p.relative_to(root)): os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def source_line(name: str, marker: str) -> int:
    path = DEB_SRC / "src" / name
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def gdb_backtrace(root: Path, prog: str, breakpoint: str, libdir: str = f"usr/lib/{MULTIARCH}") -> str:
    """Runs the extracted program under gdb with the extracted debug files, stops at
    the breakpoint and prints a backtrace; gdb's whole output."""
    cmd = [
        "gdb",
        "-batch",
        "-nx",
        "-iex",
        f"set debug-file-directory {root / 'usr/lib/debug'}",
        "-ex",
        "set breakpoint pending on",
        "-ex",
        f"set environment LD_LIBRARY_PATH={root / libdir}",
        "-ex",
        f"break {breakpoint}",
        "-ex",
        "run",
        "-ex",
        "bt",
        str(root / prog),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    return res.stdout + res.stderr


def run_in_root(root: Path, prog: str) -> subprocess.CompletedProcess[str]:
    """Runs `prog` of an unpacked package tree with the tree's libraries first."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr/lib" / MULTIARCH)}
    return subprocess.run([str(root / prog)], capture_output=True, text=True, env=env, timeout=60, check=False)


def build_deb(work: Path, package: str, version: str, files: dict[str, Path]) -> Path:
    """A binary package of `files` (path in the package -> file) built with dpkg-deb
    (for dpkg to install into a throwaway root: dpkg_root)."""
    tree = work / f"{package}_{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: amd64\n"
        "Maintainer: hugify tests <tests@hugify.invalid>\nDescription: hugify's upgrade test\n"
    )
    for path, src in files.items():
        dest = tree / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
        dest.chmod(0o755 if os.access(src, os.X_OK) else 0o644)
    deb = work / f"{package}_{version}_amd64.deb"
    run_checked(["dpkg-deb", "--root-owner-group", "-Zxz", "-z1", "--build", str(tree), str(deb)])
    return deb


def dpkg_root(root: Path) -> list[str]:
    """dpkg for the throwaway root and its own database (never this machine's)."""
    admin = root / "var/lib/dpkg"
    for d in ("info", "updates", "triggers"):
        (admin / d).mkdir(parents=True, exist_ok=True)
    for f in ("status", "available"):
        (admin / f).touch()
    return ["dpkg", f"--root={root}", f"--admindir={admin}", "--log=/dev/null"]
