"""A Debian 13 (trixie) root to run the integration tests again on the next userland
(rpm 4.20, debhelper 13.2x, gcc 14, clang 19, binutils 2.44, elfutils 0.192, glibc 2.41):
tests/test_trixie.py runs a selection in it, bench/next_userland.py all of TEST_FILES.

The root is made with mmdebstrap from the Debian archive and cached under the test
cache, keyed by the suite, the mirror and its package list; each run works on an
overlay of it, so a run never changes the cached root. The checkout is bind-mounted
at the same path inside (hugify's extension, built on the host for the abi3 of
Python 3.9+ against an older glibc, loads in trixie's Python 3.13), and the test
programs the tests build go to their own cache beside the root's, persisting across
runs. The tests run with trixie's python3, pytest and pyelftools, under chroot in a
private mount and pid namespace (unshare).
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from testkit import REPO
from testkit.cache import building, cache_root, locked, note_used

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = sorted(
    {
        # the test runner
        "python3",
        "python3-pytest",
        "python3-pyelftools",
        "python3-pytest-xdist",
        # toolchains and the independent ELF/DWARF oracles (as tools/setup-dev-env)
        "build-essential",
        "clang",
        "lld",
        "llvm",
        "binutils",
        "binutils-gold",
        "elfutils",
        "dwz",
        "gdb",
        "debugedit",
        "ccache",
        "systemtap-sdt-dev",
        "file",
        "cpio",
        "zstd",
        "rustc",
        "g++-aarch64-linux-gnu",
        "g++-i686-linux-gnu",
        # i386's libc where dpkg-shlibdeps looks in the i386 cross-build of the Multi-Arch:
        # same test package (/lib32, Debian's multilib path; it does not search the -cross
        # packages' /usr/i686-linux-gnu)
        "libc6-i386",
        "qemu-user",
        # packaging
        "rpm",
        "rpm2cpio",
        "debhelper",
        "dpkg-dev",
        "fakeroot",
        # the corpus workloads' own tools and inputs, and what x265 links to
        "libnuma1",
        "openssl",
        "openssh-client",
        "systemd",
    }
)
#: The integration tests whose outcome depends on the userland's tools (rpm and
#: find-debuginfo, debhelper, the compilers, binutils, elfutils and dwz, the archive's own
#: binaries): bench/next_userland.py runs the whole of each file inside the root.
TEST_FILES = (
    "tests/test_rpm.py",
    "tests/test_debhelper.py",
    "tests/test_dwarf.py",
    "tests/test_debian_corpus.py",
    "tests/test_repack_oracle.py",
)


def root_key() -> str:
    recipe = "\n".join([SUITE, MIRROR, "variant=apt", *PACKAGES])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def trixie_root() -> Path:
    """The cached root, made on first use (a few minutes: about 1 GiB of packages)."""
    base = cache_root() / SUITE
    root = base / f"root-{root_key()}"
    note_used(root)
    with locked(cache_root() / f"{SUITE}.lock"):
        if root.is_dir():
            return root
        for stale in base.glob("root-*"):
            shutil.rmtree(stale)
        with building(root, stale=False) as work:  # the older roots went above
            # The package lists stay, so that apt-get download inside (the corpus) sees
            # the archive as it was when the root was made.
            cmd = [
                "mmdebstrap",
                "--mode=root",
                "--variant=apt",
                "--skip=cleanup/apt/lists",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(work),
                MIRROR,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise AssertionError(f"mmdebstrap failed ({res.returncode}):\n{res.stderr[-5000:]}")
    return root


#: Runs inside a private mount and pid namespace: the cached root under an overlay
#: (its writes go to a scratch directory), the checkout under another at its own
#: path, the persistent fixture cache, then chroot.
ENTER = r"""
set -eu
root=$1 scratch=$2 checkout=$3 cache=$4; shift 4
m=$scratch/merged
mkdir -p "$scratch/up" "$scratch/work" "$m" "$scratch/co-up" "$scratch/co-work"
mount -t overlay overlay -o "lowerdir=$root,upperdir=$scratch/up,workdir=$scratch/work" "$m"
mount -t proc proc "$m/proc"
mount -t sysfs sysfs "$m/sys"
mount --rbind /dev "$m/dev"
mkdir -p "$m$checkout" "$m/var/cache/hugify-tests"
mount -t overlay overlay -o "lowerdir=$checkout,upperdir=$scratch/co-up,workdir=$scratch/co-work" "$m$checkout"
mount --bind "$cache" "$m/var/cache/hugify-tests"
cp /etc/resolv.conf "$m/etc/resolv.conf"
exec chroot "$m" "$@"
"""


def run_inside(root: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    """Runs `cmd` in the checkout inside an overlay of `root`, with the inner fixture cache."""
    cache = cache_root() / f"{SUITE}-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "HUGIFY_TEST_CACHE": "/var/cache/hugify-tests",
    }
    inner = [
        "/usr/bin/env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        "sh",
        "-c",
        f'cd {shlex.quote(str(REPO))} && exec "$@"',
        "sh",
        *cmd,
    ]
    with tempfile.TemporaryDirectory(prefix="hugify-trixie-", dir=cache_root()) as scratch:
        return subprocess.run(
            [
                "unshare",
                "--mount",
                "--pid",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "sh",
                "-c",
                ENTER,
                "sh",
                str(root),
                scratch,
                str(REPO),
                str(cache),
                *inner,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
