"""The runtime never maps in or copies another file's code.

The audit library opens an object's file again by the name ld.so loaded it by (l_name)
to repair a window held in small folios (the file's fresh mapping is moved over the
process's) and, in the anonymous mode, to learn how far the file has bytes and to name
the copied functions. Between ld.so's open and la_objopen a package upgrade (dpkg and rpm
rename the new version over the path) can put another version at that name; the old
runtime then moved a 2 MiB window of the other version's code into the running process.
Now a file the runtime opens is used only if it is the inode the process maps
(runtime/hp_map.c: device, inode and offset of both mappings as /proc/self/maps names
them), else its windows stay as mapped, said with the reason `replaced`.

The rename is made deterministic here: a second LD_AUDIT library, listed before hugify's,
renames version 2 over the object's path in its own la_objopen, which ld.so calls
first, after mapping version 1. Version 1 is cached in small folios, so the audit library
repairs (the old splice). The program's output must be version 1's (what a plain run of
version 1 prints), the process must map only version 1's inode, and HUGIFY_DEBUG says
`replaced` for the object. For a library found through DT_NEEDED and through dlopen, for
the program run through ld.so as a command (its file then comes by name too), with the
mappings looked up by PROCMAP_QUERY and by reading /proc/self/maps (kernels before
6.11), through the audit library alone, in the anonymous mode and through hugify-run.

The proof compares the kernel's view of both mappings, not fstat(2) with /proc/self/maps:
on btrfs the two name different devices (a device per subvolume), and a comparison with
fstat would leave every window there alone. The last tests run the runtime on a btrfs
subvolume and on overlayfs (containers), where nothing is replaced and the runtime does
its work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.elf import readelf_windows, window_offsets
from testkit.runtime import (
    AUDIT_LIB,
    GNU_LD,
    HUGIFY_RUN,
    LLD_LAYOUTS,
    build_programs,
    build_runtime,
    drop_caches,
    locked,
    read_plainly,
    run_checked,
)

LDSO = Path("/lib64/ld-linux-x86-64.so.2")
SETTLED = re.compile(r"^hugify-audit: (\S+): (\d+) windows: (\d+) huge .*, (\d+) replaced, (\d+) not-mapped$", re.M)
COPIED = re.compile(r"^hugify-audit: anonymous (\S+): (\d+)/(\d+) windows copied(.*)$", re.M)

RENAMER = r"""
/* An LD_AUDIT library listed before hugify's: in la_objopen of the object whose name ends
 * in $RENAME_WHEN (the main program: its name is empty, also when ld.so runs it as a
 * command) it renames $RENAME_FROM to $RENAME_TO, as a package manager renames a new
 * version over an installed file. */
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
unsigned int la_version(unsigned int v) { return v; }
unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    const char *when = getenv("RENAME_WHEN"), *from = getenv("RENAME_FROM"), *to = getenv("RENAME_TO");
    size_t n = strlen(map->l_name), k = when ? strlen(when) : 0;
    (void)lmid, (void)cookie;
    if (when && from && to && n >= k && !strcmp(map->l_name + n - k, when) && (k || !n) && rename(from, to) != 0)
        perror("renamer");
    return 0;
}
"""


@dataclass
class Versions:
    """Version 1 and 2 of the hugified program and its libraries: the same layout, other
    code (and output)."""

    v1: Path
    v2: Path
    renamer: Path


@pytest.fixture(scope="module", params=[GNU_LD, LLD_LAYOUTS[0]], ids=["gnu-ld", "lld-shift"])
def versions(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Versions:
    assert os.geteuid() == 0, "the runtime tests drop the page cache and need root (CI runs as root)"
    build_runtime()
    work = tmp_path_factory.mktemp(f"versions-{request.param.name}")
    v1 = build_programs(work / "one", request.param).dir
    v2 = build_programs(work / "two", request.param, factor=5).dir
    for f in v1.iterdir():
        assert f.stat().st_size == (v2 / f.name).stat().st_size, f"{f.name}: the versions' layouts differ"
    (work / "renamer.c").write_text(RENAMER)
    run_checked(["gcc", "-O1", "-fPIC", "-shared", "-o", "renamer.so", "renamer.c"], work)
    return Versions(v1, v2, work / "renamer.so")


def result(out: str) -> str:
    m = re.search(r"^result -?\d+$", out, re.M)
    assert m, out[-2000:]
    return m[0]


def plain_result(d: Path) -> str:
    """What the program in `d` prints with the plugin in `d`, run plainly."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD")}
    res = subprocess.run([d / "prog", d / "libplug.so"], capture_output=True, text=True, env=env, check=True)
    return result(res.stdout)


def exec_inodes(smaps: str, name: str) -> set[int]:
    """Inodes of the executable mappings of files called `name` in the program's smaps."""
    text = smaps.split("--- smaps\n", 1)[1]
    return {
        int(m[2])
        for m in re.finditer(r"^[0-9a-f]+-[0-9a-f]+ (\S{4}) \S+ \S+ (\d+)\s+(\S+)", text, re.M)
        if "x" in m[1] and Path(m[3]).name == name
    }


def install(src: Path, d: Path, replace: dict[str, Path] | None = None) -> Path:
    """Copies of the files of `src` in `d` (fresh inodes), some taken from elsewhere."""
    d.mkdir()
    for f in src.iterdir():
        shutil.copy2((replace or {}).get(f.name, f), d / f.name)
    return d


#: How the program is started: argv and environment from (program, plugin, environment).
WAYS = {
    "audit": lambda prog, plug, env: ([prog, plug], env),
    "audit-maps-text": lambda prog, plug, env: ([prog, plug], {**env, "HUGIFY_FORCE_SMAPS": "1"}),
    "anonymous": lambda prog, plug, env: ([prog, plug], {**env, "HUGIFY_ANONYMOUS": "always"}),
    "hugify-run": lambda prog, plug, env: ([HUGIFY_RUN, prog, plug], {**env, "HUGIFY_AUDIT_LIB": str(AUDIT_LIB)}),
}
#: The object renamed over, how ld.so comes to it, and whether the program is run
#: through ld.so as a command (its file is then opened by name, like a library's).
CASES = [
    ("libbig.so", "dt-needed", False),
    ("libplug.so", "dlopen", False),
    ("prog", "program-run-by-ldso", True),
]


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
def test_a_version_renamed_over_after_ldso_mapped_it_is_never_spliced_in(
    versions: Versions, tmp_path: Path, way: str, case: tuple[str, str, bool]
) -> None:
    target, _, by_ldso = case
    d = install(versions.v1, tmp_path / "bin")
    want = plain_result(d)  # version 1 throughout
    other = install(versions.v1, tmp_path / "other", {target: versions.v2 / target})
    assert plain_result(other) != want, "the versions print the same"
    new = d / f"{target}.new"
    shutil.copy2(versions.v2 / target, new)
    old_inode = (d / target).stat().st_ino

    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_ANONYMOUS")}
    env |= {
        "RENAME_WHEN": "" if target == "prog" else f"/{target}",
        "RENAME_FROM": str(new),
        "RENAME_TO": str(d / target),
    }
    env["HUGIFY_DEBUG"] = "1"
    env |= {"HUGIFY_RUNTIME_DIR": str(tmp_path / "run"), "HUGIFY_PERF_MAP": "0"}
    argv, env = WAYS[way](d / "prog", d / "libplug.so", env)
    # hugify-run appends its audit library to LD_AUDIT: after the renamer, as here.
    env["LD_AUDIT"] = str(versions.renamer) if way == "hugify-run" else f"{versions.renamer}:{AUDIT_LIB}"
    if by_ldso:
        argv.insert(1 if way == "hugify-run" else 0, LDSO)
    with locked():
        drop_caches()
        read_plainly([d / "prog", d / "libbig.so", d / "libplug.so"])
        res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert res.returncode == 0, f"{argv} -> {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr}"
    assert not new.exists() and (d / target).stat().st_ino != old_inode, "the renamer did not rename"

    assert result(res.stdout) == want, res.stderr
    assert exec_inodes(res.stdout, target) == {old_inode}, "the process maps another inode than version 1's"
    n = len(window_offsets(readelf_windows(versions.v1 / target, fixed=False)))
    settled = {Path(m[1]).name: (int(m[2]), int(m[3]), int(m[4])) for m in SETTLED.finditer(res.stderr)}
    if way == "anonymous":
        copied = {Path(m[1]).name: (int(m[2]), m[4]) for m in COPIED.finditer(res.stderr)}
        assert copied[target] == (0, ", window 0 replaced: file mapping kept"), res.stderr
    elif way == "hugify-run" and target == "libbig.so":
        # hugify-run repaired version 1's windows from its own descriptor before the
        # exec: the audit library finds them huge and needs no file.
        assert settled[target] == (n, n, 0), res.stderr
    else:
        assert settled[target] == (n, 0, n), res.stderr


# --- where fstat and /proc/self/maps name different devices: nothing is replaced ---------


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture(params=["btrfs-subvolume", "overlayfs"])
def elsewhere(request: pytest.FixtureRequest, versions: Versions, tmp_path: Path) -> Iterator[Path]:
    """Version 1 on a btrfs subvolume (loop device) or in an overlayfs merged directory."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if request.param == "btrfs-subvolume":
        image = tmp_path / "btrfs.img"
        with image.open("wb") as f:
            f.truncate(320 << 20)
        subprocess.run(["mkfs.btrfs", "-q", "-f", str(image)], check=True, capture_output=True)
        _mount("-o", "loop", str(image), str(mnt))
        subprocess.run(["btrfs", "subvolume", "create", str(mnt / "sub")], check=True, capture_output=True)
        where = mnt / "sub"
    else:
        for d in ("lower", "upper", "work"):
            (tmp_path / d).mkdir()
        _mount(
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'}",
            str(mnt),
        )
        where = mnt
    try:
        for f in versions.v1.iterdir():
            shutil.copy2(f, where / f.name)
        os.sync()
        yield where
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_nothing_is_replaced_where_stat_and_maps_name_other_devices(elsewhere: Path, tmp_path: Path) -> None:
    d = elsewhere
    base = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_ANONYMOUS")}
    env = base | {"LD_AUDIT": str(AUDIT_LIB), "HUGIFY_DEBUG": "1", "HUGIFY_RUNTIME_DIR": str(tmp_path / "run")}
    files = [d / "prog", d / "libbig.so", d / "libplug.so"]
    argv = [str(d / "prog"), str(d / "libplug.so")]
    with locked():
        drop_caches()
        read_plainly(files)
        settled = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=120)
        copied = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env | {"HUGIFY_ANONYMOUS": "always", "HUGIFY_PERF_MAP": "0"},
            check=True,
            timeout=120,
        )
    lines = {Path(m[1]).name: (int(m[2]), int(m[4]), int(m[5])) for m in SETTLED.finditer(settled.stderr)}
    assert set(lines) == {f.name for f in files}, settled.stderr
    for name, (windows, replaced, not_mapped) in lines.items():
        assert windows and replaced == 0 and not_mapped == 0, (name, settled.stderr)
    # The windows were repaired where the filesystem gives large folios (overlayfs over
    # this host's ext4), else found unsupported (btrfs): either way the file was used.
    assert re.search(r"(repaired\), 0 busy|[1-9]\d* unsupported)", settled.stderr), settled.stderr
    got = {Path(m[1]).name: (int(m[2]), int(m[3]), m[4]) for m in COPIED.finditer(copied.stderr)}
    assert got == {f.name: (w, w, "") for f, w in ((f, lines[f.name][0]) for f in files)}, copied.stderr
