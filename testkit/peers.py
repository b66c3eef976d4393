"""The peers bench/speedup.py measures beside hugify (bench/peers.py, bench/README.md
"The ways"), built into the test cache from their sources, keyed by their recipe.

The sources are third-party archives kept beside the project, not in it (MIT, each
with its licence inside): the Hugifier paper's artifact hugifyr (a rewriter, and its
runtime tcollapse.so) and Intel's iodlr large_page-c (liblppreload.so). They are
looked for in $HUGIFY_PEERS, else in shared/peers beside the checkout or beside the
directory holding it (a git worktree's). What is the project's own is the recipe: the
configure and make lines, and for hugifyr on Debian 12 a header given with -include
that supplies the names its headers lack yet (bench/README.md lists them).

A build that fails is cached too, as its log's last lines: a peer that does not build
is a column of the benchmark that says why, not a failed benchmark, and the next run
does not try again until the recipe or the sources change.

Also here: hugifyr's output for one file (cached by the file's content and the build),
the iTLB program relinked with 2 MiB segment alignment, and the files of Debian's
glibc 2.44 (testkit/vm/glibc_thp.py fetches it) unpacked for a side to show over the
system's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testkit import REPO
from testkit.cache import cached

# testkit.recipes (and testkit.vm) are imported where used: recipes imports pytest.

HUGIFYR_ARCHIVE = "hugifyr-369d59a.tar.gz"
IODLR_ARCHIVE = "iodlr-large_page-c-676bb7d.tar.gz"
#: Bump when a recipe below changes what it builds.
RECIPE = "2"
#: The linker options of the relink answer: every segment at a 2 MiB-aligned address
#: and file offset.
RELINK_LDFLAGS = ("-Wl,-z,max-page-size=0x200000", "-Wl,-z,common-page-size=0x200000")

#: The names hugifyr 369d59a uses that Debian 12's headers (glibc 2.36, elfutils 0.188,
#: Linux 6.1's UAPI) do not have yet, with their values from the newer headers: (a
#: probe that compiles where the headers have the name, what to supply where they do
#: not). The header given with -include holds only what the probes find missing, and
#: includes nothing: included before the sources' own `#define _GNU_SOURCE`, a system
#: header would fix the feature macros without it.
COMPAT = (
    ("#include <elf.h>\nint x = ELFCOMPRESS_ZSTD;", "#define ELFCOMPRESS_ZSTD 2"),
    (
        "#include <elf.h>\nint x = DT_X86_64_PLT;",
        "#define DT_X86_64_PLT (DT_LOPROC + 0)\n#define DT_X86_64_PLTSZ (DT_LOPROC + 1)\n"
        "#define DT_X86_64_PLTENT (DT_LOPROC + 3)",
    ),
    ("#include <gelf.h>\nGElf_Relr x;", "typedef unsigned long long GElf_Relr;"),
    ("#define _GNU_SOURCE\n#include <sys/syscall.h>\nint x = __NR_cachestat;", "#define __NR_cachestat 451"),
    (
        "#define _GNU_SOURCE\n#include <sys/mman.h>\n#include <linux/mman.h>\nstruct cachestat c;",
        "struct cachestat_range { unsigned long long off, len; };\n"
        "struct cachestat { unsigned long long nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; };",
    ),
)


class PeerUnavailable(Exception):
    """A peer cannot be had here: one line why."""


def sources() -> Path:
    """The directory of the peers' archives; PeerUnavailable if none is found."""
    env = os.environ.get("HUGIFY_PEERS")
    candidates = [Path(env)] if env else [REPO.parent / "shared" / "peers", REPO.parent.parent / "shared" / "peers"]
    for c in candidates:
        if (c / HUGIFYR_ARCHIVE).is_file() or (c / IODLR_ARCHIVE).is_file():
            return c
    raise PeerUnavailable(f"the peers' sources are not found in {' or '.join(map(str, candidates))} (HUGIFY_PEERS)")


def _archive(name: str) -> Path:
    path = sources() / name
    if not path.is_file():
        raise PeerUnavailable(f"{path} is missing")
    return path


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _unpack(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as t:
        t.extractall(into, filter="data")


def _step(argv: list[str], cwd: Path, log: list[str], env: dict[str, str] | None = None) -> None:
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, check=False)
    log.append(f"$ {' '.join(argv)}\n{res.stdout}{res.stderr}")
    if res.returncode != 0:
        errors = [line for line in (res.stdout + res.stderr).splitlines() if "error" in line.lower()]
        last = (errors or (res.stdout + res.stderr).strip().splitlines() or ["(no output)"])[0]
        raise PeerUnavailable(f"`{Path(argv[0]).name}` failed (exit status {res.returncode}): {last.strip()[:300]}")


@dataclass(frozen=True)
class Built:
    """A peer's build: its directory, holding the files named, or why it failed."""

    dir: Path

    def file(self, name: str) -> Path:
        """The built file; PeerUnavailable (the build's failure) if there is none."""
        failed = self.dir / "failed"
        if failed.exists():
            raise PeerUnavailable(failed.read_text().strip())
        return self.dir / name


def _build(name: str, key_text: str, steps: Callable[[Path, list[str]], None]) -> Built:
    from testkit.recipes import cached_dir

    def make(work: Path) -> None:
        log: list[str] = []
        try:
            steps(work, log)
        except PeerUnavailable as e:
            (work / "failed").write_text(f"{name} failed to build: {e}\n")
        (work / "log").write_text("\n".join(log))

    return Built(cached_dir(name, key_text, make))


def compat_header(work: Path) -> str:
    """The -include header for hugifyr on this system's headers (COMPAT)."""
    out = ["/* Supplied by hugify's benchmark recipe (testkit/peers.py): names these headers lack. */"]
    probe = work / "probe.c"
    for code, supply in COMPAT:
        probe.write_text(code + "\n")
        res = subprocess.run(["gcc", "-c", "-o", "/dev/null", str(probe)], capture_output=True, check=False)
        if res.returncode != 0:
            out.append(supply)
    probe.unlink()
    return "\n".join(out) + "\n"


def hugifyr() -> Built:
    """hugifyr and tcollapse.so (`hugifyr` and `tcollapse.so` in the directory)."""
    archive = _archive(HUGIFYR_ARCHIVE)

    def steps(work: Path, log: list[str]) -> None:
        src = work / "src"
        _unpack(archive, src)
        (work / "compat.h").write_text(compat_header(work))
        tree = src / "hugifyr"
        _step(["./configure", f"CFLAGS=-O2 -include {work / 'compat.h'}"], tree, log)
        _step(["make"], tree, log)
        for f in ("hugifyr", "tcollapse.so"):
            shutil.copy2(tree / "bin" / f, work / f)
        shutil.rmtree(src)

    return _build("peer-hugifyr", "\n".join([_digest(archive), repr(COMPAT), RECIPE]), steps)


def iodlr() -> Built:
    """iodlr's liblppreload.so (`liblppreload.so` in the directory), built by its own
    Makefile.preload."""
    archive = _archive(IODLR_ARCHIVE)

    def steps(work: Path, log: list[str]) -> None:
        src = work / "src"
        _unpack(archive, src)
        found = sorted(src.rglob("Makefile.preload"))
        if not found:
            raise PeerUnavailable(f"{archive.name} has no Makefile.preload")
        _step(["make", "-f", "Makefile.preload"], found[0].parent, log)
        shutil.copy2(found[0].parent / "liblppreload.so", work / "liblppreload.so")
        shutil.rmtree(src)

    return _build("peer-iodlr", "\n".join([_digest(archive), RECIPE]), steps)


def hugifyr_output(tool: Path, original: Path) -> Path | str:
    """hugifyr's rewrite of `original` (cached by its content and hugifyr's build), or
    why hugifyr refused it, in one line."""
    key = hashlib.sha256(f"{_digest(original)}\0{tool.parent.name}\0{RECIPE}".encode()).hexdigest()[:16]

    def make(work: Path) -> None:
        res = subprocess.run(
            [str(tool), str(original), str(work / "file")], capture_output=True, text=True, timeout=600, check=False
        )
        (work / "log").write_text(res.stdout + res.stderr)
        if res.returncode != 0 or not (work / "file").exists():
            lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
            # its first complaint says why ("Unsupported relocation type: 5"); its last
            # only that it failed
            said = [ln for ln in lines if any(w in ln.lower() for w in ("unsupported", "error", "fail", "cannot"))]
            why = (said or lines or ["no message"])[0][:300]
            (work / "file").unlink(missing_ok=True)
            (work / "refused").write_text(f"exit status {res.returncode}: {why}\n")

    out = cached(f"peer-hugifyr-out-{original.name}", key, make)
    refused = out / "refused"
    return refused.read_text().strip() if refused.exists() else out / "file"


def relinked_itlb(functions: int) -> Path:
    """The iTLB program of testkit.recipes, linked with RELINK_LDFLAGS: `itlb` in the
    directory returned."""
    from testkit.recipes import ITLB_CFLAGS, cached_dir, itlb_program

    source = itlb_program(functions)
    flags = (*ITLB_CFLAGS, *RELINK_LDFLAGS)

    def make(work: Path) -> None:
        (work / "itlb.c").write_text(source)
        subprocess.run(["gcc", *flags, "-o", "itlb", "itlb.c"], cwd=work, check=True, capture_output=True)

    return cached_dir(f"itlb{functions}-relink", "\n".join([source, *flags, RECIPE]), make) / "itlb"


def glibc_files() -> Path:
    """Debian's libc6 with glibc.elf.thp (2.44 or later), unpacked: the directory, its
    files at their paths below it."""
    from testkit.vm.boot import VmError
    from testkit.vm.glibc_thp import glibc_debs

    try:
        debs = glibc_debs()
    except (VmError, subprocess.CalledProcessError, OSError) as e:
        raise PeerUnavailable(f"no glibc with glibc.elf.thp: {e}") from None
    (libc6,) = [d for d in debs if d.name.startswith("libc6_")]
    from testkit.recipes import cached_dir

    def make(work: Path) -> None:
        subprocess.run(["dpkg-deb", "-x", str(libc6), str(work)], check=True)

    return cached_dir("peer-glibc", "\n".join([libc6.name, _digest(libc6), RECIPE]), make)
