"""Malformed objects through the runtime: a program whose hugified
library is replaced by a mutant (truncated; program headers pointing outside the file,
the first load or the mapping, misaligned, too many; loads overlapping the code, past the
end of the file, without protections; ...) runs, or is refused by ld.so, exactly as
without hugify: the same exit status, the same output and the same error from ld.so,
through the audit library (file-backed and in the anonymous mode, the cache cold and in
small folios), through hugify-run, and through hugify-run built with AddressSanitizer
(which must report nothing). Never a crash in hugify's code. For a library that comes by
DT_NEEDED and one opened with dlopen, of GNU ld's and of lld's layout.

The readers themselves are fuzzed with libFuzzer and ASan (fuzz/runtime/, bench/fuzz.py,
tests/test_fuzz.py)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import HP
from testkit.runtime import (
    AUDIT_LIB,
    GNU_LD,
    HUGIFY_RUN,
    LLD_LAYOUTS,
    RUNTIME,
    Programs,
    build_programs,
    build_runtime,
    read_plainly,
    run_checked,
)

HUGIFY_RUN_ASAN = RUNTIME / "hugify-run-asan"
PT_LOAD, PT_DYNAMIC, PF_X, PF_W, PF_R = 1, 2, 1, 2, 4
PHDR = struct.Struct("<IIQQQQQQ")  # type, flags, offset, vaddr, paddr, filesz, memsz, align
PAGE = 4096

MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
long lib_all(long);
int main(int argc, char **argv) {
    long x = exe_all(1) + lib_all(2);
    if (argc > 1) {
        void *h = dlopen(argv[1], RTLD_NOW);
        if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
        long (*f)(long) = (long (*)(long))dlsym(h, "plug_all");
        if (!f) { printf("dlsym: %s\n", dlerror()); return 1; }
        x += f(3);
    }
    printf("result %ld\n", x);
    return 0;
}
"""


class Elf:
    """A hugified library's bytes, with its program headers at hand."""

    def __init__(self, data: bytes) -> None:
        self.d = bytearray(data)
        self.phoff = struct.unpack_from("<Q", self.d, 32)[0]
        self.phnum = struct.unpack_from("<H", self.d, 56)[0]
        self.phdrs = [list(PHDR.unpack_from(self.d, self.phoff + PHDR.size * i)) for i in range(self.phnum)]
        loads = [i for i, p in enumerate(self.phdrs) if p[0] == PT_LOAD]
        self.first = loads[0]
        (self.code,) = [i for i in loads if self.phdrs[i][1] & PF_X]
        self.after = loads[loads.index(self.code) + 1]

    def put(self, i: int, **fields: int) -> Elf:
        names = ["type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align"]
        for k, v in fields.items():
            self.phdrs[i][names.index(k)] = v
        PHDR.pack_into(self.d, self.phoff + PHDR.size * i, *self.phdrs[i])
        return self

    def header(self, fmt: str, at: int, value: int) -> Elf:
        struct.pack_into(fmt, self.d, at, value)
        return self

    def table_at(self, offset: int) -> Elf:
        """The program header table copied to `offset`, and e_phoff pointing there."""
        table = bytes(self.d[self.phoff : self.phoff + PHDR.size * self.phnum])
        self.d[offset : offset + len(table)] = table
        return self.header("<Q", 32, offset)

    def end(self, i: int) -> int:
        return self.phdrs[i][2] + self.phdrs[i][5]

    def grow(self, i: int, by: int, flags: int | None = None) -> Elf:
        """Load i starts `by` bytes lower (address and offset), so it overlaps the load before."""
        p = self.phdrs[i]
        self.put(i, offset=p[2] - by, vaddr=p[3] - by, paddr=p[4] - by, filesz=p[5] + by, memsz=p[6] + by)
        return self.put(i, flags=p[1] if flags is None else flags)

    def code_tail_past_eof(self) -> bytes:
        """The loads after the code moved into the gap before it (their bytes copied
        there, at offsets congruent to their addresses) and the file cut inside the trap
        padding of the last window: the code's mapping ends past the end of the file
        where nothing runs. Loads extending past the others would be worse: ld.so maps
        them over whatever lies beyond its reservation."""
        at = page_up(self.end(self.first))
        for i, p in enumerate(self.phdrs):
            if p[0] != PT_LOAD or p[3] <= self.phdrs[self.code][3]:
                continue
            new = at + (p[3] - at) % PAGE
            assert new + p[5] < self.phdrs[self.code][2], "no room before the code"
            self.d[new : new + p[5]] = self.d[p[2] : p[2] + p[5]]
            for j, q in enumerate(self.phdrs):  # PT_DYNAMIC, PT_GNU_RELRO, ... inside it
                if j != i and q[0] != PT_LOAD and p[2] <= q[2] < p[2] + max(p[5], 1):
                    self.put(j, offset=q[2] - p[2] + new)
            self.put(i, offset=new, align=min(p[7], PAGE))
            at = page_up(new + p[5])
        return bytes(self.d[: self.end(self.code) - HP // 4])


def page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


#: name -> the mutant's bytes, from the hugified library.
MUTANTS: dict[str, Callable[[Elf], bytes]] = {
    "truncated-in-header": lambda e: bytes(e.d[:100]),
    "truncated-in-phdrs": lambda e: bytes(e.d[: e.phoff + PHDR.size * 2]),
    "truncated-after-first-load": lambda e: bytes(e.d[: e.end(e.first)]),
    "truncated-in-first-window": lambda e: bytes(e.d[: e.phdrs[e.code][2] + HP // 2]),
    "truncated-in-last-window": lambda e: bytes(e.d[: e.end(e.code) - HP // 2]),
    "truncated-in-data": lambda e: bytes(e.d[: e.phdrs[e.after][2] + 16]),
    "phoff-past-eof": lambda e: bytes(e.header("<Q", 32, len(e.d) + 0x1000).d),
    # e_phoff + the table's size wraps around to 1024: a reader that adds before comparing
    # with the file's size takes the table for inside the file. With e_phnum 64 (the
    # runtime reads up to 512) the sum lands past the 832 bytes ld.so reads first, so
    # ld.so reads the table from the file at e_phoff, and fails to. Wrapping around to
    # inside those 832 bytes instead, ld.so would take its program headers from its own
    # stack below that buffer (fbp->buf + e_phoff in dl-load.c's open_verify and
    # _dl_map_object_from_fd), memory that an audit library's la_objsearch leaves changed.
    "phoff-wraps-around": lambda e: bytes(e.header("<H", 56, 64).header("<Q", 32, 2**64 - PHDR.size * 64 + 1024).d),
    "phoff-past-the-first-load": lambda e: bytes(e.table_at(page_up(e.end(e.first)) + 0x40).d),
    "phoff-in-the-code": lambda e: bytes(e.table_at(e.end(e.code) - 0x1000).d),
    "phoff-misaligned": lambda e: bytes(e.table_at(e.phoff + 4).d),
    "phnum-zero": lambda e: bytes(e.header("<H", 56, 0).d),
    "phnum-xnum": lambda e: bytes(e.header("<H", 56, 0xFFFF).d),
    "phnum-past-the-first-load": lambda e: bytes(
        e.header("<H", 56, min(512, (e.end(e.first) - e.phoff) // PHDR.size + 16)).d
    ),
    "phentsize-wrong": lambda e: bytes(e.header("<H", 54, 32).d),
    "code-tail-past-eof": lambda e: e.code_tail_past_eof(),
    "code-offset-past-eof": lambda e: bytes(e.put(e.code, offset=e.phdrs[e.code][2] + -(-len(e.d) // HP) * HP).d),
    "next-load-over-the-code-unreadable": lambda e: bytes(e.grow(e.after, PAGE, flags=0).d),
    "next-load-over-the-code-writable": lambda e: bytes(e.grow(e.after, PAGE, flags=PF_R | PF_W).d),
    "first-load-unreadable": lambda e: bytes(e.put(e.first, flags=0).d),
    "code-execute-only": lambda e: bytes(e.put(e.code, flags=PF_X).d),
    "code-offset-not-congruent": lambda e: bytes(e.put(e.code, offset=e.phdrs[e.code][2] + PAGE).d),
    "code-small-alignment": lambda e: bytes(e.put(e.code, align=PAGE).d),
    "dynamic-moved": lambda e: bytes(
        e.put(
            next(i for i, p in enumerate(e.phdrs) if p[0] == PT_DYNAMIC),
            offset=next(p for p in e.phdrs if p[0] == PT_DYNAMIC)[2] + 16,
            vaddr=next(p for p in e.phdrs if p[0] == PT_DYNAMIC)[3] + 16,
        ).d
    ),
}


@dataclass(frozen=True)
class Outcome:
    """What a run came to, as far as hugify may not change it."""

    rc: int
    stdout: str
    stderr: tuple[str, ...]

    @staticmethod
    def of(res: subprocess.CompletedProcess[str]) -> Outcome:
        errors = tuple(
            line
            for line in res.stderr.splitlines()
            if not line.startswith(("hugify-audit: ", "hugify-run: ")) and line.strip()
        )
        return Outcome(res.returncode, res.stdout, errors)


@pytest.fixture(scope="module", params=[GNU_LD, LLD_LAYOUTS[0]], ids=["gnu-ld", "lld-shift"])
def originals(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Programs:
    assert os.geteuid() == 0, "the runtime tests drop the page cache and need root (CI runs as root)"
    build_runtime()
    build_runtime("hugify-run-asan")
    return build_programs(tmp_path_factory.mktemp(f"mutants-{request.param.name}"), request.param, main=MAIN)


def set_cache(path: Path, state: str) -> None:
    if state == "small":
        read_plainly([path])
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ways(rundir: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each way to start the program: (argv prefix, environment)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    base["HUGIFY_RUNTIME_DIR"] = str(rundir)
    audit = base | {"LD_AUDIT": str(AUDIT_LIB), "HUGIFY_DEBUG": "1", "HUGIFY_PERF_MAP": "0"}
    run = base | {"HUGIFY_AUDIT_LIB": str(AUDIT_LIB), "HUGIFY_DEBUG": "1", "HUGIFY_PERF_MAP": "0"}
    # ASan's own checks only: a leak report at exit would be the program's, not ours.
    asan = run | {"ASAN_OPTIONS": "detect_leaks=0"}
    return {
        "plain": ([], base),
        "audit": ([], audit),
        "audit-anonymous": ([], audit | {"HUGIFY_ANONYMOUS": "always"}),
        "hugify-run": ([str(HUGIFY_RUN)], run),
        "hugify-run-asan": ([str(HUGIFY_RUN_ASAN)], asan),
    }


@pytest.mark.parametrize("target", ["libbig.so", "libplug.so"], ids=["dt-needed", "dlopen"])
def test_mutants_run_or_are_refused_as_without_hugify(originals: Programs, tmp_path: Path, target: str) -> None:
    wrong, tried = [], 0
    for name, mutate in MUTANTS.items():
        d = tmp_path / name
        shutil.copytree(originals.dir, d)
        (d / target).write_bytes(mutate(Elf((originals.dir / target).read_bytes())))
        argv = [str(d / "prog")] + ([str(d / "libplug.so")] if target == "libplug.so" else [])
        outcomes: dict[str, Outcome] = {}
        for state in ("cold", "small"):
            for way, (prefix, env) in ways(tmp_path / "run").items():
                set_cache(d / target, state)
                res = subprocess.run(
                    [*prefix, *argv], capture_output=True, text=True, env=env, timeout=120, check=False
                )
                outcomes[f"{way}, {state}"] = Outcome.of(res)
                if "AddressSanitizer" in res.stderr:
                    wrong.append(f"{name}: {way}: AddressSanitizer:\n{res.stderr[-3000:]}")
                tried += 1
        want = outcomes["plain, cold"]
        for key, got in outcomes.items():
            if got != want:
                wrong.append(f"{name}: {key}: {got}\n    without hugify: {want}")
    assert tried == len(MUTANTS) * 10
    assert not wrong, "\n".join(wrong)


def test_the_mutants_are_what_they_say(originals: Programs) -> None:
    """The mutants are not all refused alike: some run, some are refused by ld.so, some
    crash without hugify too (the table covers each kind of outcome)."""
    kinds = set()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "HUGIFY_"))}
    for mutate in MUTANTS.values():
        lib = Elf((originals.dir / "libbig.so").read_bytes())
        d = Path(originals.dir.parent / "kinds")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(originals.dir, d)
        (d / "libbig.so").write_bytes(mutate(lib))
        res = subprocess.run([str(d / "prog")], capture_output=True, text=True, env=env, timeout=120, check=False)
        kinds.add(
            "runs"
            if res.returncode == 0 and res.stdout.startswith("result ")
            else "refused by ld.so"
            if "error while loading shared libraries" in res.stderr
            else "crashes"
            if res.returncode < 0
            else f"exit {res.returncode}"
        )
    assert {"runs", "refused by ld.so"} <= kinds, kinds


#: The audit library's verdict line for one object (runtime/audit.c debug_settled).
SETTLED = re.compile(
    r"^hugify-audit: (?P<path>\S+): (?P<windows>\d+) windows: \d+ huge .* (?P<unsupported>\d+) unsupported, "
    r"(?P<skipped>\d+) skipped, \d+ unverified, \d+ replaced, (?P<not_mapped>\d+) not-mapped$",
    re.M,
)

#: An audit library listed before hugify's that changes the protection of the first page
#: of libbig.so's first window in its own la_objopen (made writable too: the program still
#: runs): that window is no longer one mapping of the file with the code's protections when
#: hugify's audit library looks, though the program headers show no other load over it.
PROTECTOR = r"""
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
unsigned la_version(unsigned v) { return v; }
unsigned la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)lmid, (void)cookie;
    size_t n = strlen(map->l_name);
    if (n < 9 || strcmp(map->l_name + n - 9, "libbig.so"))
        return 0;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)map->l_addr;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(map->l_addr + eh->e_phoff);
    for (int i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X)) {
            uintptr_t window = (map->l_addr + ph[i].p_vaddr + 0x1fffff) & ~(uintptr_t)0x1fffff;
            mprotect((void *)window, 4096, PROT_READ | PROT_WRITE | PROT_EXEC);
        }
    return 0;
}
"""


def test_a_window_the_process_does_not_map_as_the_file_is_skipped_not_unsupported(
    originals: Programs, tmp_path: Path
) -> None:
    """A window held in small folios that the process does not map as one mapping of the
    file (found when it is about to be repaired) is left as it is, with reason
    not-mapped, counted as skipped: never as a window the filesystem cannot make huge
    ("unsupported", which would speak of the filesystem where this process is the cause)."""
    protector = tmp_path / "protector.so"
    (tmp_path / "protector.c").write_text(PROTECTOR)
    run_checked(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", protector, tmp_path / "protector.c"])
    _, env = ways(tmp_path / "run")["audit"]
    env = env | {"LD_AUDIT": f"{protector}:{AUDIT_LIB}"}
    set_cache(originals.lib, "small")
    res = subprocess.run([str(originals.prog)], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.startswith("result "), res
    (line,) = [m for m in SETTLED.finditer(res.stderr) if m["path"] == str(originals.lib)]
    assert int(line["not_mapped"]) >= 1, line[0]
    assert int(line["skipped"]) >= int(line["not_mapped"]), line[0]
    assert line["unsupported"] == "0", line[0]
