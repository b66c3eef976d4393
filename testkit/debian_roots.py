"""Clean Debian 12 roots (and Debian 13 ones, testkit/vm/aarch64.py, testkit/debusine)
made by mmdebstrap from the archive, and Debian source packages fetched with apt-get
source (test_sbuild.py, test_boot.py; trixie's for bench/debusine_rebuild.py).

Both are cached under the test cache (testkit.cache: cache_root()): a root by
its mmdebstrap command line (suite, variant, package list, format, sources lines) and
mmdebstrap's version, a source package by its suite, name and version. The host's apt
configuration is left alone: apt-get source runs with a private sources list (the
suite's deb-src), package lists and cache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from testkit.cache import build_once, building, cache_root, locked, note_used
from testkit.debian import deb_field, tool_versions

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
EATMYDATA_HOOKS = "/usr/share/mmdebstrap/hooks/eatmydata"


def debian_root(
    name: str, *args: str, fmt: str = "directory", suite: str = SUITE, mirrors: tuple[str, ...] = ()
) -> Path:
    """`mmdebstrap ARGS SUITE OUT MIRRORS` (bookworm unless said; the archive's SUITE main
    unless MIRRORS are given, as mmdebstrap's own sources lines) once per ARGS, MIRRORS
    (and mmdebstrap version): OUT is a directory, or a tarball when fmt is "tar"."""
    other = [suite] if suite != SUITE else []  # bookworm's roots keep the keys they had
    other += mirrors
    key = hashlib.sha256("\0".join([*args, fmt, tool_versions("mmdebstrap"), *other]).encode()).hexdigest()[:16]
    group = cache_root() / "debian-roots"
    final = group / f"{name}-{key}"
    product = "root.tar" if fmt == "tar" else "root"
    note_used(final)

    def make(work: Path) -> None:
        res = mmdebstrap(work / product, f"--format={fmt}", *args, suite=suite, mirrors=mirrors)
        assert res.returncode == 0, f"mmdebstrap failed:\n{res.stdout[-6000:]}"

    return build_once(final, group / f"{name}.lock", make, product)


def mmdebstrap(
    target: Path, *args: str, suite: str = SUITE, mirrors: Iterable[str] = (), timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """`mmdebstrap --mode=root ARGS SUITE TARGET MIRRORS` (the archive's SUITE main unless
    MIRRORS are given) run to its end: its exit status and its output, stdout and
    stderr in one stream. dpkg runs under eatmydata while the root is made (mmdebstrap's
    own hooks, which take it out again: the root is the same), since its fsync of every
    file unpacked is most of a root's time on a busy disk.

    The packages' maintainer scripts do not see the test runner: debusine-server's
    postinst runs Django, whose settings switch to debusine's own test mode (importing
    its test-only modules, which the package does not depend on) when PYTEST_XDIST_WORKER
    is set, and fails to configure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    argv = ["mmdebstrap", "--mode=root", *args, f"--hook-dir={EATMYDATA_HOOKS}", suite, str(target)]
    argv += list(mirrors) or [MIRROR]
    out, err = subprocess.PIPE, subprocess.STDOUT  # one stream
    return subprocess.run(argv, stdout=out, stderr=err, text=True, timeout=timeout, env=env, check=False)


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


def _apt_source_options(state: Path, suite: str) -> list[str]:
    """apt options for the suite's deb-src line only (apt-get source)."""
    return apt_options(state, [f"deb-src [signed-by={KEYRING}] {MIRROR} {suite} main"])


def source_package(name: str, suite: str = SUITE) -> Path:
    """The archive's current source of `name` in suite (bookworm unless said), fetched
    with apt-get source (not unpacked): the path of its .dsc. Kept per version."""
    group = cache_root() / ("apt-source" if suite == SUITE else f"apt-source-{suite}")
    with locked(group / "apt.lock"):
        opts = _apt_source_options(group / "apt", suite)
        subprocess.run(["apt-get", "-q", *opts, "update"], capture_output=True, text=True, check=True)
        uris = subprocess.run(
            ["apt-get", *opts, "source", "--print-uris", name], capture_output=True, text=True, check=True
        ).stdout
        dsc_name = next(w.strip("'") for line in uris.splitlines() for w in line.split()[1:2] if w.endswith(".dsc"))
        dsc = group / dsc_name.removesuffix(".dsc") / dsc_name
        note_used(dsc.parent)
        if not dsc.exists():
            with building(dsc.parent, stale=False) as work:  # kept per version
                subprocess.run(
                    ["apt-get", "-q", *opts, "source", "--download-only", name],
                    cwd=work,
                    capture_output=True,
                    text=True,
                    check=True,
                )
    return dsc


#: The command prefix a booted root's session runs under (tests/test_boot.py,
#: testkit/debusine): private mount and PID namespaces, with the command as the PID
#: namespace's init, so that whatever ends the session ends every process started in it
#: and takes its mounts (an overlay over a cached root) with it.
PRIVATE_SESSION = ("unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private")

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
