"""glibc 2.44's own huge-page advice for hugified files (the tunable glibc.elf.thp), on
this host: a chroot of a Debian 12 root carrying Debian's glibc 2.44
(testkit/vm/glibc_thp.py host_root), the hugified test programs on an XFS image on a
loop device (XFS gives the page cache large folios on every kernel since 5.18) whose
read_ahead_kb each test sets, the page cache dropped before every cold start.

- ld.so advises (MADV_HUGEPAGE, its own LD_DEBUG=files lines) exactly the windows the
  core says it does (core/src/glibc_thp.rs), for the program the kernel maps and for
  its library, and none of an align output whose code starts inside a window;
- a cold start gets every window PMD-mapped, DT_NEEDED and dlopen alike, at the largest
  read_ahead_kb the core's limit allows, and none without the tunable; above the limit
  the loader's own faults read small pages into the windows first (at 8192, a cloud
  disk's default, for the GNU ld output; at the kernel's default 128 for the gold one,
  whose writable data follows its code directly);
- `hugify status` run in that root says whether the tunable is set system-wide
  (/etc/tunables.conf through ldconfig), for how many files it works, and which
  read_ahead_kb keeps it working — and what it says works: at the read_ahead_kb it
  names, a cold start with the system-wide tunable gets the code huge; run on this
  host's glibc, which has no such tunable, it says nothing about it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hugify import _core
from testkit import HP, REPO
from testkit.cli import command, hugify, transform
from testkit.recipes import RECIPES, build
from testkit.runtime import drop_caches, locked
from testkit.vm.boot import GUEST
from testkit.vm.glibc_thp import hint_limit, host_root

#: (recipe, mode, files hugified): GNU ld's separate-code layout shifted (its writable
#: load 376 KiB after the windows), gold's (writable data right after them), and a GNU ld
#: program aligned only (its code starts inside a window: nothing for ld.so to advise;
#: its library, too small to align, stays as linked).
CASES = {
    "bfd": ("gcc-bfd", "shift", ("prog", "libhug.so")),
    "gold": ("gcc-gold", "shift", ("prog", "libhug.so")),
    "align": ("gcc-bfd-large", "align", ("prog",)),
}
PROBE_OUT = "/tmp/probe.jsonl"
DLOPEN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    if (argc != 2 || !dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    return 0;
}
"""
MADVISE = re.compile(r"madvise \(0x[0-9a-f]+, (0x[0-9a-f]+), MADV_HUGEPAGE\) returns 0")


@dataclass
class Root:
    path: Path
    loop: str  # the loop device's name, e.g. loop3

    def files(self, case: str) -> list[str]:
        """The case's hugified files as the chroot sees them (program first)."""
        return [f"/mnt/xfs/{case}/{n}" for n in CASES[case][2]]

    def host(self, path: str) -> Path:
        return self.path / path.lstrip("/")

    def set_read_ahead(self, kb: int) -> None:
        Path(f"/sys/block/{self.loop}/queue/read_ahead_kb").write_text(f"{kb}\n")

    def run(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": "/opt/hugify", **(env or {})}
        return subprocess.run(
            ["chroot", str(self.path), *argv], env=full, capture_output=True, text=True, timeout=300, check=False
        )

    def system_wide(self, on: bool) -> None:
        conf = self.path / "etc" / "tunables.conf"
        if on:
            conf.write_text("glibc.elf.thp=1\n")
        else:
            conf.unlink(missing_ok=True)
        res = self.run("/usr/sbin/ldconfig")
        assert res.returncode == 0, res.stderr


@dataclass
class Start:
    """One cold start: FilePmdMapped of each executable mapping of the test files
    (path -> (PMD-mapped, size)) and the sizes ld.so said it advised."""

    maps: dict[str, tuple[int, int]]
    advised: list[int]

    def huge(self, path: str) -> bool:
        pmd, size = self.maps[path]
        return pmd == size > 0


def cold_start(root: Root, argv: list[str], tunable: bool, env: dict[str, str] | None = None) -> Start:
    drop_caches()
    full = {"LD_PRELOAD": "/probe.so", "HUGIFY_PROBE_OUT": PROBE_OUT, "LD_DEBUG": "files", **(env or {})}
    if tunable:
        full["GLIBC_TUNABLES"] = "glibc.elf.thp=1"
    out = root.host(PROBE_OUT)
    out.unlink(missing_ok=True)
    res = root.run(*argv, env=full)
    assert res.returncode == 0, res.stderr[-3000:]
    maps: dict[str, tuple[int, int]] = {}
    for line in out.read_text().splitlines():
        for m in json.loads(line)["maps"]:
            if m.get("path", "").startswith("/mnt/xfs/"):
                maps[m["path"]] = (m["pmd"], m["size"])
    return Start(maps, [int(m[1], 16) for m in MADVISE.finditer(res.stderr)])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Root]:
    """A copy of the glibc 2.44 root with this checkout's hugify in /opt/hugify, the
    matrix's probe, a dlopen program, /proc, /sys and /dev, and the cases' hugified
    files on an XFS loop image at /mnt/xfs; the runtime tests' lock held throughout
    (the tests drop the page cache)."""
    tmp = tmp_path_factory.mktemp("glibc-thp")
    path = tmp / "root"
    subprocess.run(["cp", "-a", str(host_root()), str(path)], check=True)
    opt = path / "opt" / "hugify"
    shutil.copytree(REPO / "hugify", opt / "hugify", ignore=shutil.ignore_patterns("__pycache__"))
    (opt / "runtime").mkdir()
    shutil.copy(REPO / "runtime" / "libhugify-engine.so", opt / "runtime")
    flags = ["-O2", "-Wall", "-Werror"]
    subprocess.run(["gcc", *flags, "-shared", "-fPIC", "-o", path / "probe.so", GUEST / "probe.c"], check=True)
    (tmp / "dlopen.c").write_text(DLOPEN_C)
    subprocess.run(["gcc", *flags, "-o", path / "dlopen", tmp / "dlopen.c", "-ldl"], check=True)
    image, xfs = tmp / "xfs.img", path / "mnt" / "xfs"
    with image.open("wb") as f:
        f.truncate(320 << 20)  # mkfs.xfs wants 300 MiB
    subprocess.run(["mkfs.xfs", "-q", "-f", str(image)], check=True, capture_output=True)
    xfs.mkdir(parents=True)
    mounted: list[Path] = []
    try:
        for name, opts in (("proc", ["-t", "proc", "proc"]), ("sys", ["--bind", "/sys"]), ("dev", ["--bind", "/dev"])):
            subprocess.run(["mount", *opts, str(path / name)], check=True)
            mounted.append(path / name)
        subprocess.run(["mount", "-o", "loop", str(image), str(xfs)], check=True)
        mounted.append(xfs)
        for case, (recipe, mode, names) in CASES.items():
            (r,) = [r for r in RECIPES if r.name == recipe]
            (xfs / case).mkdir()
            for name in ("prog", "libhug.so"):
                if name in names:
                    transform(build(r) / name, xfs / case / name, "--mode", mode)
                else:
                    shutil.copy(build(r) / name, xfs / case / name)
        os.sync()
        dev = subprocess.run(["findmnt", "-no", "SOURCE", str(xfs)], capture_output=True, text=True, check=True)
        loop = Path(dev.stdout.strip()).name
        saved = Path(f"/sys/block/{loop}/queue/read_ahead_kb").read_text()
        with locked():
            yield Root(path, loop)
        Path(f"/sys/block/{loop}/queue/read_ahead_kb").write_text(saved)
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", str(m)], check=False)


def core(root: Root, path: str) -> _core.GlibcThp:
    p = _core.probe(root.host(path))
    assert p is not None and p["problem"] is None, p
    return _core.windows(p, HP)["glibc_thp"]


def test_ld_so_advises_the_windows_the_core_says(root: Root) -> None:
    """The sizes ld.so 2.44 says it advised (LD_DEBUG=files) for the program (mapped by
    the kernel) and its library are the core's advised bytes: the whole windows of a
    shift output, nothing of an align output whose code starts inside a window. Without
    the tunable it advises nothing."""
    for case in CASES:
        prog, lib = f"/mnt/xfs/{case}/prog", f"/mnt/xfs/{case}/libhug.so"
        want = sorted(n for n in (core(root, prog)["advised"], core(root, lib)["advised"]) if n)
        root.set_read_ahead(128)
        got = cold_start(root, [prog], tunable=True)
        assert sorted(got.advised) == want, (case, got.advised, want)
        assert cold_start(root, [prog], tunable=False).advised == [], case
    assert core(root, root.files("align")[0])["advised"] == 0
    assert core(root, root.files("bfd")[0])["advised"] == 2 * HP


def test_cold_starts_are_huge_up_to_the_core_limit_and_not_without_the_tunable(root: Root) -> None:
    """At the largest read_ahead_kb the core's limit allows, a cold start gets all of the
    program's and its library's code PMD-mapped with the tunable, DT_NEEDED and through
    dlopen; without the tunable, none of it (this kernel reads no exec code as 2 MiB
    folios at a fault by itself). Above the limit the loader's own faults win: the GNU
    ld output loses its windows at 8192, the gold output its last window at 128."""
    prog, lib = root.files("bfd")
    limit = min(core(root, p)["read_ahead_limit"] or 0 for p in (prog, lib))
    assert limit >= 512 << 10, limit  # its writable load is 376 KiB away
    root.set_read_ahead(limit >> 10)
    start = cold_start(root, [prog], tunable=True)
    assert start.huge(prog) and start.huge(lib), start.maps
    loaded = cold_start(root, ["/dlopen", lib], tunable=True)
    assert loaded.huge(lib), loaded.maps
    off = cold_start(root, [prog], tunable=False)
    assert off.maps[prog][0] == off.maps[lib][0] == 0, off.maps
    root.set_read_ahead(8192)
    late = cold_start(root, [prog], tunable=True)
    assert not late.huge(prog) and not late.huge(lib), late.maps

    gprog, glib = root.files("gold")
    assert core(root, gprog)["read_ahead_limit"] == core(root, glib)["read_ahead_limit"] == 0
    root.set_read_ahead(128)
    gold = cold_start(root, [gprog], tunable=True)
    for p in (gprog, glib):
        pmd, size = gold.maps[p]
        assert pmd == size - HP, (p, gold.maps)  # all but the window next to the writable data


def status(root: Root, *files: str) -> tuple[str, dict[str, object]]:
    text = root.run(*command("status", *files, python="python3"))
    js = root.run(*command("status", "--json", *files, python="python3"))
    assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    return text.stdout, json.loads(js.stdout)["system"]["glibc_elf_thp"]


def hints(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("hint: glibc.elf.thp")]


def test_status_says_what_the_tunable_does_and_its_advice_works(root: Root) -> None:
    """In the glibc 2.44 root with the tunable set system-wide and the disk reading 8192
    KiB ahead, `hugify status` says it is on, works for the four shifted files, and that
    8192 defeats it: the GNU ld files keep their windows at the read_ahead_kb it names,
    the gold ones at none. At that read_ahead_kb a cold start with nothing in its
    environment gets the GNU ld program's and library's code huge. With the tunable
    unset it says how to set it."""
    files = [f for case in CASES for f in root.files(case)]
    bfd, gold = root.files("bfd"), root.files("gold")
    root.system_wide(True)
    try:
        root.set_read_ahead(8192)
        text, advice = status(root, *files)
        lines = hints(text)
        assert advice["glibc"] == "2.44" and advice["system_wide"] == 1, advice
        assert lines[0] == (
            "hint: glibc.elf.thp (glibc 2.44): on system-wide; ld.so itself asks for huge pages for the code of "
            "4 of 5 files"
        ), lines
        assert lines[1].startswith(f"hint: glibc.elf.thp: read_ahead_kb 8192 of {root.loop} defeats it for 4 of them")
        assert f"none keeps {', '.join(gold)} (their writable data" in lines[1], lines
        kb = hint_limit(lines)
        limits = [core(root, f)["read_ahead_limit"] or 0 for f in bfd]
        assert kb == min(limits) >> 10, (lines, limits)
        root.set_read_ahead(kb)
        start = cold_start(root, [bfd[0]], tunable=False)
        assert start.huge(bfd[0]) and start.huge(bfd[1]), start.maps
        text, advice = status(root, *files)
        assert [f["path"] for f in advice["files"] if f["defeated"]] == gold, advice  # type: ignore[index]
    finally:
        root.system_wide(False)
    text, advice = status(root, *files)
    assert advice["system_wide"] == 0, advice
    assert hints(text)[0] == (
        "hint: glibc.elf.thp (glibc 2.44): off system-wide; set, ld.so itself would ask for huge pages for the code "
        "of 4 of 5 files at every cold start, with no runtime (add glibc.elf.thp=1 to /etc/tunables.conf, run "
        "ldconfig)"
    ), text


def test_status_says_nothing_of_it_where_glibc_has_no_such_tunable(root: Root) -> None:
    """This host's glibc (Debian 12's 2.36) has no glibc.elf.thp: status names its
    version in --json and prints no hint about it."""
    files = [str(root.host(f)) for f in root.files("bfd")]
    text = hugify("status", *files).stdout
    js = hugify("status", "--json", *files).stdout
    advice = json.loads(js)["system"]["glibc_elf_thp"]
    host = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
    assert advice == {"glibc": host, "has_tunable": False, "system_wide": None, "advises": False, "files": []}, advice
    assert "glibc.elf.thp" not in text, text
