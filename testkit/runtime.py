"""Support for the runtime tests (test_runtime*.py): a hugified test program that
reports its own /proc/self/smaps, cache dropping, and serialisation of the tests that
depend on the state of the page cache.

The test program `prog` (about 4.4 MiB of code) links `libbig.so` (about 2.5 MiB of
code) through RUNPATH $ORIGIN and, given a path, dlopen()s `libplug.so` (about 1.6 MiB).
All three are hugified with `hugify transform`. It runs all of its code, reads one
byte of every 2 MiB of each executable mapping, and prints /proc/self/smaps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testkit import REPO, recipes
from testkit.cli import hugify
from testkit.elf import exec_load
from testkit.smaps import Mapping, exec_mappings, smaps_text

RUNTIME = REPO / "runtime"
HUGIFY_RUN = RUNTIME / "hugify-run"
AUDIT_LIB = RUNTIME / "libhugify-audit.so"
#: Every test that drops the page cache or depends on it holds this lock, so that the
#: two pytest-xdist workers never evict each other's freshly prefetched files.
LOCK = Path("/tmp/hugify-runtime-tests.lock")


def padded_functions(prefix: str, count: int, fill: int = 16384, factor: int = 3) -> str:
    """C source of `count` functions PREFIX_fI, each padded with `fill` bytes of nop
    (16 KiB: a few hundred make whole 2 MiB windows of code), the table
    PREFIX_table of them and PREFIX_all(x), which calls every one through the table, so
    that the linker keeps them all and a run touches every one."""
    out = [
        f'long {prefix}_f{i}(long x) {{ __asm__ volatile(".fill {fill}, 1, 0x90"); return x * {factor} + {i}; }}'
        for i in range(count)
    ]
    table = ", ".join(f"{prefix}_f{i}" for i in range(count))
    out.append(f"long (*const {prefix}_table[])(long) = {{ {table} }};")
    out.append(
        f"long {prefix}_all(long x) {{ for (int i = 0; i < {count}; i++) x = {prefix}_table[i](x) & 0xffff;"
        " return x; }"
    )
    return "\n".join(out) + "\n"


#: A function that keeps a CPU busy for a while (about a second here): what perf's
#: samples must name, in a window of the program.
HOT_SPIN = r"""
__attribute__((noinline)) long hugify_hot_spin(long x) {
    for (long i = 0; i < 300000000; i++) x = x * 6364136223846793005L + 1442695040888963407L;
    return x;
}
"""

#: A program (build_spin hugifies it) that spends its time in hugify_hot_spin, inside a
#: window: with an argument it first says "waiting" and waits for a line on stdin (time
#: for perf or gdb to attach), then prints its result.
SPIN = (
    "#include <stdio.h>\n#include <unistd.h>\n"
    + HOT_SPIN
    + padded_functions("spin", 200)
    + r"""
int main(int argc, char **argv) {
    if (argc > 1) { printf("waiting\n"); fflush(stdout); char c; if (read(0, &c, 1) < 0) return 2; }
    printf("result %ld %ld\n", spin_all(1), hugify_hot_spin(argc));
    return 0;
}
"""
)

MAIN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
long lib_all(long);

/* Reads one byte of every 2 MiB of every executable file mapping: each window is
 * faulted once, so smaps shows how the page cache holds it. */
static void touch_code(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[4096];
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[2] == 'x'
            && strchr(line, '/'))
            for (unsigned long a = (lo + 0x1fffff) & ~0x1fffffUL; a < hi; a += 0x200000)
                (void)*(volatile char *)a;
    }
    fclose(m);
}

int main(int argc, char **argv) {
    long x = exe_all(1) + lib_all(2);
    if (argc > 1 && strcmp(argv[1], "-")) {
        void *h = dlopen(argv[1], RTLD_NOW);
        if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
        long (*f)(long) = (long (*)(long))dlsym(h, "plug_all");
        x += f(3);
    }
    if (argc > 2)  /* wait until told to go on: lets a test look at this process */
        { printf("waiting\n"); fflush(stdout); char c; if (read(0, &c, 1) < 0) return 2; }
    touch_code();
    printf("result %ld\n--- smaps\n", x);
    fflush(stdout);
    FILE *f = fopen("/proc/self/smaps", "r");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, stdout);
    return 0;
}
"""


@dataclass
class Programs:
    """Hugified copies in `dir`: prog, libbig.so, libplug.so; `orig` has the originals."""

    dir: Path
    orig: Path

    @property
    def prog(self) -> Path:
        return self.dir / "prog"

    @property
    def lib(self) -> Path:
        return self.dir / "libbig.so"

    @property
    def plug(self) -> Path:
        return self.dir / "libplug.so"

    @property
    def files(self) -> list[Path]:
        return [self.prog, self.lib, self.plug]


def run_checked(cmd: list[str | Path], cwd: Path | None = None) -> None:
    """Runs a build step (a compiler, make, dpkg): a failure raises with its output."""
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} -> {res.returncode}\n{res.stdout}\n{res.stderr}")


def file_backed_only(directory: Path) -> Path:
    """A policy layer (for `hugify prefetch --policy`) with the shared copies off: for the
    tests of the file-backed way on filesystems without huge pages (tmpfs, btrfs), where
    root's prefetch would otherwise copy the files to a huge-page tmpfs and mount one
    (docs/runtime.md "Shared copies"; tests/test_runtime_shared.py)."""
    path = directory / "file-backed-only.toml"
    path.write_text('[runtime]\nshared = "off"\n')
    return path


def build_runtime(*targets: str) -> None:
    """Builds runtime/, or the make `targets` there (make is incremental; the lock keeps
    pytest's workers from building the same file at once: two makes of hugify-run-asan
    were seen to fail that way)."""
    with locked(Path("/tmp/hugify-runtime-build.lock")):
        run_checked(["make", "-s", "-C", RUNTIME, *targets])


@dataclass(frozen=True)
class Layout:
    """How the test objects are compiled, linked and given their windows: one of the
    layouts hugify produces."""

    name: str
    cc: str = "gcc"
    ldflags: tuple[str, ...] = ()
    #: `hugify transform --mode`; None: not rewritten, linked on 2 MiB pages (as-is).
    mode: str | None = "auto"
    #: Generated functions of 16 KiB in the program, libbig.so and libplug.so.
    funcs: tuple[int, int, int] = (280, 160, 100)


GNU_LD = Layout("gnu-ld")
#: The layouts of lld (clang -fuse-ld=lld), whose rodata-first shift splits the first
#: load and grows its program header table (issue 32; at e_phoff since the metadata
#: after it moves, tests/test_dwz_lld.py): the shift of
#: its default layout and of --no-rosegment; the alignment-only mode, whose executable
#: load does not start on a window boundary (its first partial window stays in small
#: pages: whole windows are the 2 MiB-aligned ranges inside the load); and objects linked
#: on 2 MiB pages, listed as-is without a rewrite. The align and as-is objects are larger:
#: their code starts at its linked place, so a whole window needs more than 2 MiB of it;
#: so is the shifted plugin: the shift leaves the window next to the read-only data partial
#: (in small pages, never executable data), so 1.6 MiB of code would have no whole window.
LLD_LAYOUTS = (
    Layout("lld-shift", "clang", ("-fuse-ld=lld",), funcs=(280, 160, 160)),
    Layout("lld-no-rosegment", "clang", ("-fuse-ld=lld", "-Wl,--no-rosegment")),
    Layout("lld-align", "clang", ("-fuse-ld=lld",), mode="align", funcs=(280, 270, 270)),
    Layout("lld-as-is", "clang", ("-fuse-ld=lld", "-Wl,-z,max-page-size=0x200000"), mode=None, funcs=(280, 270, 270)),
)


def build_programs(work: Path, layout: Layout = GNU_LD, main: str = MAIN, factor: int = 3) -> Programs:
    """Compiles the test program (`main`: the program text after the generated
    functions) and its libraries in `work`/orig and hugifies them into
    `work`/hugified, as `layout` says. Another `factor` gives another version of them:
    the same layout, other code and output."""
    src = work / "orig"
    src.mkdir(parents=True)
    exe, lib, plug = layout.funcs
    (src / "lib.c").write_text(padded_functions("lib", lib, factor=factor))
    (src / "plug.c").write_text(padded_functions("plug", plug, factor=factor))
    (src / "main.c").write_text(padded_functions("exe", exe, factor=factor) + main)
    cc, ld = layout.cc, list(layout.ldflags)
    run_checked([cc, "-O1", "-fPIC", "-shared", *ld, "-Wl,-soname,libbig.so", "-o", "libbig.so", "lib.c"], src)
    run_checked([cc, "-O1", "-fPIC", "-shared", *ld, "-o", "libplug.so", "plug.c"], src)
    run_checked(
        [cc, "-O1", "-fPIE", "-pie", *ld, "-o", "prog", "main.c", "-L.", "-lbig", "-Wl,-rpath,$ORIGIN", "-ldl"],
        src,
    )
    out = work / "hugified"
    out.mkdir()
    for name in ("prog", "libbig.so", "libplug.so"):
        if layout.mode is None:
            shutil.copy2(src / name, out / name)
            continue
        res = hugify("transform", "--threshold", "0", "--mode", layout.mode, src / name, "-o", out / name, check=False)
        assert res.returncode == 0, res.stderr
    return Programs(out, src)


def copy_programs(p: Programs, dest: Path) -> Programs:
    """Fresh copies (new inodes, so no page-cache state is shared with other tests),
    written back to disk so that nothing is dirty."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in p.files:
        shutil.copy2(f, dest / f.name)
        fd = os.open(dest / f.name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return Programs(dest, p.orig)


#: The transparent huge page settings in sysfs.
THP = Path("/sys/kernel/mm/transparent_hugepage")


def thp_setting(name: str = "enabled") -> str:
    """The value selected (the bracketed one) of THP's setting `name` in sysfs:
    `enabled`, `shmem_enabled`, `defrag`."""
    return (THP / name).read_text().split("[")[1].split("]")[0]


#: The machine's transparent huge pages as tests see them (THP's sysfs settings, and the
#: shared-memory huge pages /proc/meminfo counts): a test changes the settings, or reads
#: those machine-wide counts, only holding this lock exclusively (thp_alone); the tests
#: that depend on them without the runtime tests' lock (the shared copies: shmem_enabled)
#: hold it shared (thp_steady).
THP_LOCK = Path("/tmp/hugify-thp.lock")
#: Whether this process holds THP_LOCK exclusively (its one entry: the holder).
_ALONE: list[bool] = []


@contextlib.contextmanager
def thp_alone() -> Iterator[None]:
    """No test that holds thp_steady runs during the block (leave for thp_set). Taken
    before any other lock (the runtime tests' too), so that a test holding it shared and
    waiting for one of those is never waited for by a test that holds that one."""
    with recipes.locked(THP_LOCK):
        _ALONE.append(True)
        try:
            yield
        finally:
            _ALONE.pop()


def thp_steady() -> contextlib.AbstractContextManager[None]:
    """No test changes THP's settings, or counts the machine's shared-memory huge pages,
    during the block (the lock held shared)."""
    return recipes.locked(THP_LOCK, shared=True)


@contextlib.contextmanager
def thp_set(name: str, value: str) -> Iterator[None]:
    """THP's setting `name` set to `value` for the block, the value before put back
    after it. The caller holds thp_alone (for the tests that read the setting with
    thp_steady) and the runtime tests' lock (for theirs)."""
    assert _ALONE, "thp_set outside thp_alone()"
    before = thp_setting(name)
    (THP / name).write_text(value)
    try:
        yield
    finally:
        (THP / name).write_text(before)
    assert thp_setting(name) == before


def starts_during(start: Callable[[int], None], starts: int, change: Callable[[int], None], changes: int) -> int:
    """Calls start(0), start(1), ... (a process started each) while another thread calls
    change(0), change(1), ... (an upgrade each): at least `starts` starts and `changes`
    changes, the changes going on until the starts are made and the starts until the
    changes are; the thread is joined at the end, also when a start fails. Returns the
    number of starts. (A change that raises ends the changes early: the caller counts
    them.)"""
    done = threading.Event()

    def changing() -> None:
        made = 0
        while not done.is_set() or made < changes:
            change(made)
            made += 1

    changer = threading.Thread(target=changing)
    changer.start()
    made = 0
    try:
        while made < starts or changer.is_alive():
            if made >= starts:
                done.set()
            start(made)
            made += 1
    finally:
        done.set()
        changer.join()
    return made


def locked(path: Path = LOCK) -> contextlib.AbstractContextManager[None]:
    """The runtime tests' lock (they share the page cache and THP settings)."""
    return recipes.locked(path)


def drop_caches() -> None:
    """Empties the page cache (as root): every file is cold afterwards."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def read_plainly(paths: list[Path]) -> None:
    """Reads files with read() in 64 KiB pieces: the page cache then holds them in
    small folios (the pollution hugify prefetch has to repair). Without readahead
    (POSIX_FADV_RANDOM): on a filesystem with large folios (XFS, ext4 from 6.16) the
    kernel's readahead of a sequential read grows its folios up to 2 MiB."""
    for p in paths:
        with p.open("rb", buffering=0) as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            while f.read(65536):
                pass


def run_mappings(argv: list[str | Path], env: dict[str, str] | None = None) -> dict[str, Mapping]:
    """Runs a test program that prints its own smaps (without this process's LD_AUDIT
    and LD_PRELOAD), checks it finished, and returns its executable file mappings."""
    return run_accounted(argv, env)[0]


def run_accounted(argv: list[str | Path], env: dict[str, str] | None = None) -> tuple[dict[str, Mapping], str]:
    """run_mappings, and what the program wrote on stderr (with HUGIFY_DEBUG=1 in `env`,
    the runtime's account of each object's windows)."""
    full = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD")}
    res = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env={**full, **(env or {})}, check=False, timeout=120
    )
    assert res.returncode == 0, f"{argv} -> {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr}"
    assert "result " in res.stdout
    return parse_smaps(res.stdout), res.stderr


def parse_smaps(output: str) -> dict[str, Mapping]:
    """Executable file mappings of the program's own smaps (printed after `--- smaps`):
    path -> size, FilePmdMapped."""
    return exec_mappings(smaps_text(output))


def exec_segment_size(path: Path) -> int:
    """The size of the executable PT_LOAD, read with readelf."""
    return exec_load(path).memsz


def cached_pages(path: Path) -> int:
    """Pages of the file in the page cache, by mincore(2) on a mapping that is never
    faulted (independent of the cachestat(2) hugify uses)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            vec = ctypes.create_string_buffer((size + 4095) // 4096)
            assert libc.mincore(addr, size, vec) == 0
            return sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


# --- what the kernel does, measured without hugify ----------------------------------------
#
# The runtime tests derive what hugify must report from these, not from the runtime under
# test: whether the host's kernel gives a file's filesystem 2 MiB folios, and whether it
# maps a cold executable window huge by itself, differ between kernels and filesystems.

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def cold_window(path: Path, advice: int | None) -> tuple[int, int]:
    """Maps the first 2 MiB window of the file's code like the ELF loader (PROT_READ |
    PROT_EXEC, MAP_PRIVATE, 2 MiB-aligned) in a child process, the file alone evicted
    from the page cache first, gives it `advice` (if any), reads one byte, and returns
    (the madvise errno, 0 if it worked; FilePmdMapped of that mapping in KiB, from its
    smaps)."""
    code = r"""
import ctypes, os, re, sys
path, off, advice = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hp = 2 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
res = libc.mmap(None, 2 * hp, 0, 0x22 | 0x4000, -1, 0)  # PROT_NONE, PRIVATE|ANONYMOUS|NORESERVE
at = (res + hp - 1) & ~(hp - 1)
fd = os.open(path, os.O_RDONLY)
assert libc.mmap(at, hp, 5, 0x12, fd, off) == at  # PROT_READ|PROT_EXEC, MAP_PRIVATE|MAP_FIXED
err = 0
if advice >= 0 and libc.madvise(ctypes.c_void_p(at), ctypes.c_size_t(hp), advice) != 0:
    err = ctypes.get_errno()
ctypes.string_at(at, 1)
smaps = open("/proc/self/smaps").read()
block = smaps.split(f"{at:x}-", 1)[1]
print(err, int(re.search(r"FilePmdMapped:\s+(\d+)", block).group(1)))
"""
    offset = exec_load(path).offset
    # This file alone: a test beside it (pytest -n 2) may be reading the page cache of
    # its own files, such as test_boot's container asking `hugify status` of the windows
    # its boot service just loaded (dropping the whole page cache failed it).
    evict([path])
    out = subprocess.run(
        [sys.executable, "-c", code, str(path), str(offset), str(-1 if advice is None else advice)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    err, kb = out.stdout.split()
    return int(err), int(kb)


def gives_large_folios(path: Path) -> bool:
    """Whether the file's first window, read through a MADV_HUGEPAGE mapping, got a PMD."""
    return cold_window(path, MADV_HUGEPAGE)[1] > 0


def kernel_maps_exec_huge(path: Path) -> bool:
    """Whether the kernel made the file's first window one PMD at the first fault of a
    mapping made as the ELF loader makes it (no madvise): its PMD exec readahead."""
    return cold_window(path, None)[1] > 0


#: The readahead (KiB) of loop_fs's devices: the kernel's default (VM_READAHEAD_PAGES).
LOOP_READ_AHEAD_KB = 128


def set_read_ahead(mnt: Path, kb: int) -> None:
    """Sets read_ahead_kb of the block device mounted at `mnt`."""
    device = subprocess.run(["findmnt", "-no", "SOURCE", str(mnt)], capture_output=True, text=True, check=True)
    Path(f"/sys/block/{Path(device.stdout.strip()).name}/queue/read_ahead_kb").write_text(f"{kb}\n")


@contextlib.contextmanager
def loop_fs(
    work: Path,
    fs: str,
    options: str = "",
    programs: Programs | None = None,
    size: int = 320 << 20,
    *,
    fill: Callable[[Path], object] | None = None,
) -> Iterator[Path]:
    """A fresh `fs` filesystem on a loop device (a sparse image of `size` bytes: mkfs.xfs
    wants 300 MiB), mounted with `options`; its mount point. With `programs`, they are
    copied to bin/ first, and with `fill`, it is called with the mount point; then the
    filesystem is mounted again, so that nothing written is left in the page cache
    (ext4 with data=journal keeps written pages pinned by the journal until then). The
    device's readahead is LOOP_READ_AHEAD_KB: loop devices are reused, and one keeps
    what a test before set (or what attaching an image gave it: 2560 here), which
    changes what a plain start reads by megabytes."""
    image, mnt = work / f"{fs}.img", work / f"{fs}-mnt"
    with image.open("wb") as f:
        f.truncate(size)
    force = "-F" if fs.startswith("ext") else "-f"
    subprocess.run([f"mkfs.{fs}", "-q", force, str(image)], check=True, capture_output=True)
    mnt.mkdir()
    mount = ["mount", "-o", ",".join(["loop", *filter(None, [options])]), str(image), str(mnt)]

    def mounted() -> None:
        subprocess.run(mount, check=True)
        set_read_ahead(mnt, LOOP_READ_AHEAD_KB)

    mounted()
    try:
        if programs:
            copy_programs(programs, mnt / "bin")
        if fill:
            fill(mnt)
        if programs or fill:
            subprocess.run(["umount", str(mnt)], check=True)
            mounted()
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# --- cost ----------------------------------------------------------------------------


def children_read(argv: list[str], times: int, env: dict[str, str]) -> int:
    """Bytes read from storage by `times` runs of argv, in a process of their own whose
    children's I/O accounting (ru_inblock) counts them alone, not other processes on the
    machine."""
    code = (
        "import resource, subprocess, sys, json\n"
        "argv, n, env = json.loads(sys.argv[1])\n"
        "for _ in range(n):\n"
        "    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([argv, times, env])], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def blocks_read_by(argv: list[str], times: int, env: dict[str, str]) -> int:
    """Bytes read from storage by `times` runs of argv, after one run that brings the
    tools themselves (hugify-run, the audit library, libc) into the page cache."""
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return children_read(argv, times, env)


def clean_env(run: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_AUDIT", "LD_PRELOAD", "HUGIFY_DEBUG")}
    return env | {"HUGIFY_RUNTIME_DIR": str(run)} | extra


def cachestat_works() -> bool:
    """Whether this kernel has cachestat(2) (Linux 6.5), asked of the kernel directly."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/proc/self/exe", os.O_RDONLY)
    try:
        rng, out = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
        return int(libc.syscall(451, fd, rng, out, 0)) == 0
    finally:
        os.close(fd)


def memory_cgroup(tmp_name: str) -> Path:
    """A child of this process's cgroup v1 memory controller (or of cgroup v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/") / tmp_name
    own = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
    return Path("/sys/fs/cgroup") / own.lstrip("/") / tmp_name


@contextlib.contextmanager
def limited_cgroup(limit: int) -> Iterator[Path]:
    """A fresh memory cgroup with `limit` bytes (cgroup v1 or v2); its cgroup.procs."""
    cg = memory_cgroup(f"hugify-test-{os.getpid()}")
    cg.mkdir()
    try:
        name = "memory.limit_in_bytes" if (cg / "memory.limit_in_bytes").exists() else "memory.max"
        (cg / name).write_text(f"{limit}\n")
        yield cg / "cgroup.procs"
    finally:
        cg.rmdir()


def in_cgroup(procs: Path, argv: list[str | Path]) -> list[str]:
    """argv run inside the cgroup whose cgroup.procs is `procs` (by a shell that moves
    itself there, then execs it)."""
    return ["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", str(procs), *map(str, argv)]


#: Returns of a seccomp filter (linux/seccomp.h): the call fails with EPERM
#: (SECCOMP_RET_ERRNO | 1); the process is killed (SECCOMP_RET_KILL_PROCESS).
SECCOMP_EPERM = 0x00050001
SECCOMP_KILL_PROCESS = 0x80000000
_SECCOMP_ALLOW = 0x7FFF0000


def seccomp_program(
    syscall: dict[str, int], action: int, equal: dict[int, int] | None = None, unequal: dict[int, int] | None = None
) -> str:
    """A Python program (for `python3 -c PROGRAM ARGV…`) that runs ARGV under a seccomp
    filter: the system call numbered syscall[machine] gets the filter's return `action`
    when each argument named in `equal` (by its index) is the value given there and each
    named in `unequal` is not (the arguments' low 32 bits); every other call is allowed."""
    conditions = [(i, v, True) for i, v in (equal or {}).items()]
    conditions += [(i, v, False) for i, v in (unequal or {}).items()]
    allow = 2 * len(conditions) + 3  # the index of the last instruction, `ret ALLOW`
    lines = [("0x20, 0, 0, 0", "ld [0]: the system call number"), (f"0x15, 0, {allow - 2}, nr", "jeq nr, else allow")]
    for i, value, is_equal in conditions:
        lines.append((f"0x20, 0, 0, {16 + 8 * i}", f"ld args[{i}], its low half"))
        skip = allow - len(lines) - 1  # from the jump that comes next to `ret ALLOW`
        if is_equal:
            lines.append((f"0x15, 0, {skip}, {value:#x}", f"jeq {value:#x}, else allow"))
        else:
            lines.append((f"0x15, {skip}, 0, {value:#x}", f"jeq {value:#x}: allow"))
    lines += [(f"0x06, 0, 0, {action:#x}", "ret action"), (f"0x06, 0, 0, {_SECCOMP_ALLOW:#x}", "ret ALLOW")]
    body = "".join(f'    struct.pack("HBBI", {fields}),  # {why}\n' for fields, why in lines)
    return rf"""
import ctypes, os, platform, struct, sys
nr = {syscall!r}[platform.machine()]
insns = [
{body}]
prog = ctypes.create_string_buffer(b"".join(insns))
buf = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(insns), ctypes.addressof(prog)))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.addressof(buf), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
os.execvp(sys.argv[1], sys.argv[1:])
"""


#: Runs argv[1:] with MADV_HUGEPAGE (14, the advice: args[2]) refused with EPERM by a
#: seccomp filter on madvise, every other madvise allowed: what a service's
#: SystemCallFilter can do to the runtime.
NO_MADV_HUGEPAGE = seccomp_program({"x86_64": 28, "aarch64": 233}, SECCOMP_EPERM, equal={2: 14})


def build_hugified(work: Path, name: str, source: str, *flags: str) -> Path:
    """`source` built as a PIE (gcc -O1, `flags` after the source: -g, -ldl) into
    WORK/NAME.orig and hugified into WORK/NAME, which it returns."""
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.c").write_text(source)
    run_checked(["gcc", "-O1", "-fPIE", "-pie", "-o", f"{name}.orig", f"{name}.c", *flags], work)
    hugify("transform", "--threshold", "0", work / f"{name}.orig", "-o", work / name)
    return work / name


def build_spin(work: Path) -> Path:
    """SPIN built with debug info and hugified in `work`."""
    return build_hugified(work, "spin", SPIN, "-g")


def perf_record(data: Path, *target: str | Path) -> list[str]:
    """The command line of `perf record` sampling the cpu-clock (hardware counters are
    not available in these VMs) into `data`, of `target`: `-p PID`, `-a`, or `--
    COMMAND...` (perf launching it)."""
    return ["perf", "record", "-q", "-e", "cpu-clock", "-o", str(data), *map(str, target)]


def perf_attached(data: Path, *target: str | Path) -> subprocess.Popen[str]:
    """perf_record(data, *target) started in the background (`-p PID` or `-a`): its
    output dropped, its errors kept for `communicate`."""
    return subprocess.Popen(perf_record(data, *target), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def build_idle(work: Path) -> Path:
    """A hugified program of two whole windows of code that it never runs: it exits at
    once, so that it runs as quickly in a memory cgroup of 2 MiB as anywhere."""
    return build_hugified(work, "idle", padded_functions("idle", 200) + "int main(void) { return 0; }\n")


@contextlib.contextmanager
def public_dir() -> Iterator[Path]:
    """A directory that every user may enter (pytest's are root's alone): for the runs as
    another user."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="hugify-test-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


#: Runs argv as the user nobody (no groups): a process that may not keep records.
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def nobody_env(**extra: str) -> dict[str, str]:
    """The environment for hugify run as nobody: the suite's log of reason ids is root's
    (conftest), which nobody may not append to."""
    from hugify.reasons import LOG_ENV

    return {k: v for k, v in os.environ.items() if k != LOG_ENV} | {"PYTHONDONTWRITEBYTECODE": "1"} | extra


def hugify_as_nobody(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The hugify CLI of this checkout run as nobody."""
    return hugify(*args, runner=AS_NOBODY, env=nobody_env(), check=False)


def evict(paths: list[Path]) -> None:
    """Drops the files from the page cache (POSIX_FADV_DONTNEED; nothing may map them),
    leaving every other file cached. Each file is read whole first: eviction passes by
    pages still being read (a process that faulted one page and exited leaves its
    readahead of megabytes in flight; btrfs keeps them locked while it checks their
    checksums), and a read waits for them. Left cached, they made the next series of
    cold starts read megabytes less, now and then (test_runtime_cost's bounds). Written
    pages are written back first: dirty ones, those of a file just copied, stay cached."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            while os.read(fd, 1 << 20):
                pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def starts_read(argv: list[str], times: int, env: dict[str, str], files: list[Path], cache: str) -> int:
    """Bytes read from storage by `times` starts of argv (the children's I/O accounting,
    so that other processes on the machine do not count), the first one included: the
    tools (hugify-run, the audit library, libc) are brought into the page cache first by
    the same command line with /bin/true for the program (files[0]), and the program's
    `files` are put "cold" (evicted) or in "small" folios (read plainly)."""
    warm = ["/bin/true" if a == str(files[0]) else a for a in argv]
    subprocess.run(warm, env=env, stdout=subprocess.DEVNULL, check=True)
    evict(files)
    if cache == "small":
        read_plainly(files)
    return children_read(argv, times, env)
