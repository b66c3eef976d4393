"""Clean Debian 12 roots (and Debian 13 ones, testkit/vm/aarch64.py) made by mmdebstrap
from the archive, and Debian source packages fetched with apt-get source
(test_sbuild.py, test_boot.py).

Both are cached under the test cache (testkit.cache: cache_root()): a root by
its mmdebstrap command line (suite, variant, package list, format) and
mmdebstrap's version, a source package by its name and version. The host's apt
configuration is left alone: apt-get source runs with a private sources list
(bookworm's deb-src), package lists and cache.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from testkit.cache import cache_root, drop_stale, locked
from testkit.debian import deb_field, tool_versions

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def debian_root(name: str, *args: str, fmt: str = "directory", suite: str = SUITE) -> Path:
    """`mmdebstrap ARGS SUITE OUT` (bookworm unless said) once per ARGS (and mmdebstrap
    version): OUT is a directory, or a tarball when fmt is "tar"."""
    other = [suite] if suite != SUITE else []  # bookworm's roots keep the keys they had
    key = hashlib.sha256("\0".join([*args, fmt, tool_versions("mmdebstrap"), *other]).encode()).hexdigest()[:16]
    group = cache_root() / "debian-roots"
    final = group / f"{name}-{key}"
    out = final / ("root.tar" if fmt == "tar" else "root")
    if out.exists():
        return out
    with locked(group / f"{name}.lock"):
        if out.exists():
            return out
        work = final.with_name(final.name + ".tmp")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        target = work / out.name
        res = subprocess.run(
            ["mmdebstrap", "--mode=root", f"--format={fmt}", *args, suite, str(target), MIRROR],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1200,
            check=False,
        )
        assert res.returncode == 0, f"mmdebstrap failed:\n{res.stdout[-6000:]}"
        work.rename(final)
        drop_stale(final)
    return out


def apt_options(state: Path, sources: list[str]) -> list[str]:
    """apt options that make apt-get read only the given sources.list lines and keep
    its lists and cache under `state` (the host's apt configuration is left alone)."""
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources_list = state / "sources.list"
    sources_list.write_text("".join(f"{line}\n" for line in sources))
    return [
        "-o",
        f"Dir::Etc::SourceList={sources_list}",
        "-o",
        f"Dir::Etc::SourceParts={state / 'sources.list.d'}",
        "-o",
        f"Dir::Etc::Preferences={state / 'preferences'}",
        "-o",
        f"Dir::Etc::PreferencesParts={state / 'preferences.d'}",
        "-o",
        f"Dir::State::Lists={state / 'lists'}",
        "-o",
        f"Dir::Cache={state / 'cache'}",
    ]


def _apt_source_options(state: Path) -> list[str]:
    """apt options for bookworm's deb-src line only (apt-get source)."""
    return apt_options(state, [f"deb-src [signed-by={KEYRING}] {MIRROR} {SUITE} main"])


def source_package(name: str) -> Path:
    """The archive's current bookworm source of `name`, fetched with apt-get source
    (not unpacked): the path of its .dsc. Kept per version."""
    group = cache_root() / "apt-source"
    with locked(group / "apt.lock"):
        opts = _apt_source_options(group / "apt")
        subprocess.run(["apt-get", "-q", *opts, "update"], capture_output=True, text=True, check=True)
        uris = subprocess.run(
            ["apt-get", *opts, "source", "--print-uris", name], capture_output=True, text=True, check=True
        ).stdout
        dsc_name = next(w.strip("'") for line in uris.splitlines() for w in line.split()[1:2] if w.endswith(".dsc"))
        dsc = group / dsc_name.removesuffix(".dsc") / dsc_name
        if not dsc.exists():
            work = dsc.parent.with_name(dsc.parent.name + ".tmp")
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            subprocess.run(
                ["apt-get", "-q", *opts, "source", "--download-only", name],
                cwd=work,
                capture_output=True,
                text=True,
                check=True,
            )
            work.rename(dsc.parent)
    return dsc


#: What a root booted with systemd as PID 1 needs besides hugify's own dependencies.
SYSTEMD_BASE = ("systemd", "systemd-sysv", "dbus")


def hugify_depends(deb: Path) -> list[str]:
    """The package names hugify's .deb depends on (first alternative of each) that
    the archive has: not its policy package, which comes from hugify's own build."""
    names = []
    for dep in deb_field(deb, "Depends").split(","):
        name = dep.split("|")[0].split("(")[0].strip().removesuffix(":any")
        if name.startswith("hugify-policy"):
            continue
        if name not in names:
            names.append(name)
    return names


def systemd_root(hugify_deb: Path) -> Path:
    """A minbase bookworm root with systemd as init and what hugify's .deb depends
    on (tests/test_boot.py boots it in a container, tests/test_kernel_matrix.py under
    qemu): the same cached root for both."""
    include = ",".join([*SYSTEMD_BASE, *hugify_depends(hugify_deb)])
    return debian_root("boot-root", "--variant=minbase", f"--include={include}")
