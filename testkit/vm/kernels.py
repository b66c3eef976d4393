"""Debian's own kernels for the kernel x filesystem matrix (tests/test_kernel_matrix.py,
bench/kernel_matrix.py): the one list of them, and fetching them from the archive.

Each kernel is a suite's `linux-image-amd64` (a metapackage; `linux-image-arm64` for the
arm64 guest of testkit/vm/aarch64.py), resolved to the image package it depends on
through a private apt state per architecture (testkit.debian_roots.apt_options: its own
sources list, lists and cache; the host's apt configuration is left alone), fetched
with `apt-get download` and unpacked with `dpkg-deb -x` under the test cache, one
directory per package and version. Other packages of a suite are fetched the same way
(`unpacked`: the arm64 initramfs's busybox).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testkit.cache import building, cache_root, locked, note_used
from testkit.debian_roots import KEYRING, MIRROR, apt_options

#: The suites whose linux-image-amd64 the matrix boots, oldest first.
SUITES = ("bookworm", "trixie", "trixie-backports", "sid")
#: The package lists are fetched again when older than this (a new kernel upload is
#: then picked up within a day; warm runs do not touch the network).
LISTS_MAX_AGE = 24 * 3600


class KernelUnavailable(Exception):
    """A kernel package that cannot be resolved or fetched (the reason is the message)."""


@dataclass(frozen=True)
class Kernel:
    suite: str
    package: str  # linux-image-<release>
    version: str  # the package's version
    dir: Path  # the unpacked package

    @property
    def release(self) -> str:
        """The kernel's release string (uname -r), e.g. 6.12.57+deb13-amd64."""
        return self.package.removeprefix("linux-image-").removesuffix("-unsigned")

    @property
    def vmlinuz(self) -> Path:
        """/boot/vmlinuz-<release>, or from 7.x on <modules>/vmlinuz."""
        boot = self.dir / "boot" / f"vmlinuz-{self.release}"
        return boot if boot.is_file() else self.modules / "vmlinuz"

    @property
    def modules(self) -> Path:
        """/lib/modules/<release> (under /usr/lib on merged-/usr packages)."""
        for base in ("lib", "usr/lib"):
            d = self.dir / base / "modules" / self.release
            if d.is_dir():
                return d
        raise KernelUnavailable(f"{self.package} {self.version} ships no modules directory")

    @property
    def short(self) -> str:
        """major.minor, e.g. 6.12."""
        return ".".join(self.release.split(".")[:2])

    @property
    def label(self) -> str:
        return f"{self.short} ({self.suite})"


#: The host's architecture, whose kernels the matrix boots.
NATIVE = "amd64"


def _apt_state(arch: str = NATIVE) -> tuple[Path, list[str]]:
    state = cache_root() / "kernels" / ("apt" if arch == NATIVE else f"apt-{arch}")
    lines = [f"deb [signed-by={KEYRING}] {MIRROR} {suite} main" for suite in SUITES]
    opts = apt_options(state, lines)
    if arch != NATIVE:
        opts += ["-o", f"APT::Architecture={arch}", "-o", f"APT::Architectures={arch}"]
    return state, opts


def _lock(arch: str) -> Path:
    return cache_root() / "kernels" / ("apt.lock" if arch == NATIVE else f"apt-{arch}.lock")


def _apt(opts: list[str], *args: str, cwd: Path | None = None) -> str:
    res = subprocess.run(
        ["apt-get", "-q", *opts, *args], capture_output=True, text=True, cwd=cwd, check=False, timeout=900
    )
    if res.returncode != 0:
        raise KernelUnavailable(f"apt-get {' '.join(args)} failed: {res.stderr.strip()[-600:]}")
    return res.stdout


def update_lists(state: Path, opts: list[str]) -> None:
    stamp = state / "updated"
    if stamp.exists() and time.time() - stamp.stat().st_mtime < LISTS_MAX_AGE:
        return
    _apt(opts, "update")
    stamp.touch()


def _show(opts: list[str], package: str, suite: str) -> str:
    """The record apt-cache shows first for package/suite (that release's), or ""."""
    res = subprocess.run(
        ["apt-cache", *opts, "show", f"{package}/{suite}"], capture_output=True, text=True, check=False
    )
    return res.stdout.split("\n\n")[0] if res.returncode == 0 else ""


def _field(record: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*)$", record, re.M)
    return m[1] if m else ""


def _image_packages(opts: list[str], suite: str, arch: str = NATIVE) -> tuple[str, str, list[str]]:
    """The image package linux-image-ARCH depends on in `suite`, its version, and
    the packages to fetch for it: the image itself and, from 7.x on, the
    linux-binary-<release> (vmlinuz) and linux-modules-<release> it depends on."""
    meta = _show(opts, f"linux-image-{arch}", suite)
    if not meta:
        raise KernelUnavailable(f"no linux-image-{arch} in {suite} (not a suite of {', '.join(SUITES)}?)")
    images = re.findall(r"\b(linux-image-[0-9][^ ,]*)", _field(meta, "Depends"))
    if not images:
        raise KernelUnavailable(f"linux-image-{arch} in {suite} depends on no image: {meta[:300]!r}")
    name = images[0]
    record = _show(opts, name, suite)
    version = _field(record, "Version")
    if not version:
        raise KernelUnavailable(f"{name} is not in {suite}")
    release = name.removeprefix("linux-image-")
    parts = re.findall(rf"\b(linux-(?:binary|modules)-{re.escape(release)})\b", _field(record, "Depends"))
    return name, version, [name, *dict.fromkeys(parts)]


def _depmod(root: Path, release: str) -> None:
    """modules.dep for the unpacked package (the package leaves it to depmod at
    installation). depmod -b looks under <root>/lib/modules: merged-/usr packages get
    a lib -> usr/lib link."""
    if not (root / "lib").exists() and (root / "usr" / "lib" / "modules").is_dir():
        (root / "lib").symlink_to("usr/lib")
    res = subprocess.run(["depmod", "-b", str(root), release], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise KernelUnavailable(f"depmod for {release} failed: {res.stderr.strip()[-300:]}")


def _fetch(opts: list[str], suite: str, parts: list[str], work: Path) -> None:
    """The packages `parts` of `suite` unpacked into the directory `work`."""
    _apt(opts, "download", *(f"{p}/{suite}" for p in parts), cwd=work)
    debs = sorted(work.glob("*.deb"))
    if len(debs) != len(parts):
        raise KernelUnavailable(f"apt-get download {' '.join(parts)} ({suite}) gave {[d.name for d in debs]}")
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work)], check=True)
        deb.unlink()


def kernel(suite: str, arch: str = NATIVE) -> Kernel:
    """The newest linux-image-ARCH of `suite`, unpacked (fetched once per version)."""
    group = cache_root() / "kernels"
    with locked(_lock(arch)):
        state, opts = _apt_state(arch)
        update_lists(state, opts)
        package, version, parts = _image_packages(opts, suite, arch)
        final = group / f"{package}_{version}"
        note_used(final)
        if (final / "done").exists():
            return Kernel(suite, package, version, final)
        # Named by package and version, not NAME-KEY: other versions stay (stale=False).
        with building(final, stale=False) as work:
            _fetch(opts, suite, parts, work)
            _depmod(work, package.removeprefix("linux-image-"))
            (work / "done").write_text(f"{package} {version}\n")
    k = Kernel(suite, package, version, final)
    if not k.vmlinuz.is_file():
        raise KernelUnavailable(f"{package} {version} has no {k.vmlinuz.name}")
    return k


def newest_suite() -> str:
    """The suite of SUITES whose linux-image-amd64 is of the highest version (dpkg's
    ordering), read from the package lists: only that kernel is fetched."""
    with locked(_lock(NATIVE)):
        state, opts = _apt_state()
        update_lists(state, opts)
        versions = {suite: _image_packages(opts, suite)[1] for suite in SUITES}
    best = SUITES[0]
    for suite in SUITES[1:]:
        gt = subprocess.run(["dpkg", "--compare-versions", versions[suite], "gt", versions[best]], check=False)
        if gt.returncode == 0:
            best = suite
    return best


def unpacked(suite: str, package: str, arch: str = NATIVE) -> Path:
    """The newest `package` of `suite` for `arch`, unpacked (fetched once per version)."""
    with locked(_lock(arch)):
        state, opts = _apt_state(arch)
        update_lists(state, opts)
        version = _field(_show(opts, package, suite), "Version")
        if not version:
            raise KernelUnavailable(f"no {package} ({arch}) in {suite}")
        final = cache_root() / "kernels" / f"{package}_{version.replace(':', '%3a')}_{arch}"
        note_used(final)
        if not (final / "done").exists():
            with building(final, stale=False) as work:
                _fetch(opts, suite, [package], work)
                (work / "done").write_text(f"{package} {version}\n")
    return final
