"""aarch64 branch protection: a shared library built with -mbranch-protection=standard
carries BTI and PAC GNU properties, and qemu-user's loader then enforces BTI on its
pages (an indirect branch to anything but a landing pad traps). The rewritten library
must keep both properties and still run. And the runtime's reader of the BTI marking
(runtime/hp_bti.c, which decides whether a replaced window gets PROT_BTI) says what
readelf says of every such file, and what ld.so's rule says of the corners readelf
reads differently (tests/test_aarch64_boot.py shows the runtime keep PROT_BTI in a
booted arm64 guest).

Debian 12's crt objects have no BTI marking, so the library is linked without them
(-nostartfiles); otherwise the linker drops the property (or, forced, the program
traps in crti's _init)."""

from __future__ import annotations

import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from testkit import HP, REPO
from testkit.cli import hugify, run_program
from testkit.elf import readelf_loads
from testkit.recipes import generate_code

CC = "aarch64-linux-gnu-gcc"
RUNNER = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]

LIB_EXTRA = """
#include "lib_gen.h"
long lib_dispatch(long);
long lib_entry(long seed) { return lib_dispatch(seed) ^ (long)lib_table[3](seed); }
"""
MAIN = """
#include <stdio.h>
long lib_entry(long);
int main(int argc, char **argv) { printf("%ld\\n", lib_entry(argc)); return 0; }
"""


def _properties(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("Properties:")[1].strip() for line in out.splitlines() if "AArch64 feature" in line]


@pytest.fixture(scope="module")
def bti_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("bti")
    flags = ["-O2", "-fPIC", "-mbranch-protection=standard"]
    sources = [*generate_code("lib", 1400, 2, work, compiler=[CC], flags=flags), "lib_extra.c"]
    (work / "lib_extra.c").write_text(LIB_EXTRA)
    (work / "main.c").write_text(MAIN)
    compile_jobs = [[CC, *flags, "-c", s, "-o", f"{s}.o"] for s in sources]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for job in [pool.submit(subprocess.run, cmd, cwd=work, check=True) for cmd in compile_jobs]:
            job.result()
    objs = [f"{s}.o" for s in sources]
    subprocess.run([CC, "-shared", "-nostartfiles", "-o", "libbti.so", *objs], cwd=work, check=True)
    subprocess.run([CC, "-O2", "-o", "prog", "main.c", "-L.", "-lbti"], cwd=work, check=True)
    return work


def test_bti_pac_library_keeps_its_properties_and_runs(bti_build: Path, tmp_path: Path) -> None:
    orig = bti_build / "libbti.so"
    assert _properties(orig) == ["AArch64 feature: BTI, PAC"]
    new_dir = tmp_path / "new"
    new_dir.mkdir()
    new = new_dir / "libbti.so"
    hugify("transform", orig, "-o", new, "--mode", "shift")

    assert _properties(new) == _properties(orig)
    code = [seg for seg in readelf_loads(new) if seg.flags == "RE"]
    assert len(code) == 1 and code[0].vaddr % HP == 0 and code[0].offset % HP == 0, code
    phdrs = subprocess.run(["readelf", "-lW", str(new)], capture_output=True, text=True, check=True).stdout
    assert "GNU_PROPERTY" in phdrs

    prog = bti_build / "prog"
    before = run_program(prog, env={"LD_LIBRARY_PATH": str(bti_build)}, runner=RUNNER)
    after = run_program(prog, env={"LD_LIBRARY_PATH": str(new_dir)}, runner=RUNNER)
    assert before[0] == 0, before
    assert after == before


#: Loads each file's PT_LOADs the way ld.so does (read-only here) and asks the runtime's
#: reader (runtime/hp_bti.c) whether the file is marked BTI-compatible, from that memory.
READER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include "hp_bti.h"

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        Elf64_Ehdr eh;
        Elf64_Phdr ph[64];
        int fd = open(argv[a], O_RDONLY);
        if (fd < 0 || pread(fd, &eh, sizeof eh, 0) != sizeof eh || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
            eh.e_phentsize != sizeof ph[0] || eh.e_phnum > 64 ||
            pread(fd, ph, eh.e_phnum * sizeof ph[0], eh.e_phoff) != (long)(eh.e_phnum * sizeof ph[0])) {
            printf("%s unreadable\n", argv[a]);
            continue;
        }
        unsigned long top = 0, page = 65536;
        for (int i = 0; i < eh.e_phnum; i++)
            if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr + ph[i].p_memsz > top)
                top = ph[i].p_vaddr + ph[i].p_memsz;
        char *base = mmap(0, top + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        base = (char *)(((unsigned long)base + page - 1) & ~(page - 1));
        for (int i = 0; i < eh.e_phnum; i++) {
            unsigned long skew = ph[i].p_vaddr % page;
            if (ph[i].p_type == PT_LOAD && ph[i].p_filesz &&
                mmap(base + ph[i].p_vaddr - skew, ph[i].p_filesz + skew, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd,
                     ph[i].p_offset - skew) == MAP_FAILED)
                perror("mmap");
        }
        printf("%s %d\n", argv[a], hp_bti_marked(ph, eh.e_phnum, (uintptr_t)base));
        close(fd);
    }
    return 0;
}
"""

PT_LOAD, PT_GNU_PROPERTY, PF_R, PF_X = 1, 0x6474E553, 4, 1
AARCH64_FEATURE_1_AND, X86_FEATURE_1_AND, BTI, PAC = 0xC0000000, 0xC0000002, 1, 2


def _property_note(props: list[tuple[int, bytes]], name: bytes = b"GNU\0", kind: int = 5) -> bytes:
    desc = b"".join(struct.pack("<II", t, len(d)) + d + bytes(-len(d) % 8) for t, d in props)
    return struct.pack("<III", len(name), len(desc), kind) + name + bytes(-len(name) % 4) + desc


def _note_elf(path: Path, note: bytes, *, align: int = 8, note_off: int = 0x200, load_size: int = 0x1000) -> None:
    """An aarch64 ELF file of a header, a readable PT_LOAD of `load_size` bytes from
    offset 0 and a PT_GNU_PROPERTY over `note` at `note_off` (aligned `align`)."""
    phdrs = struct.pack("<IIQQQQQQ", PT_LOAD, PF_R | PF_X, 0, 0, 0, load_size, load_size, 0x10000)
    phdrs += struct.pack("<IIQQQQQQ", PT_GNU_PROPERTY, PF_R, note_off, note_off, note_off, len(note), len(note), align)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)  # ET_DYN, EM_AARCH64
    data = bytearray(max(load_size, note_off + len(note)))
    data[: len(ehdr) + len(phdrs)] = ehdr + phdrs
    data[note_off : note_off + len(note)] = note
    path.write_bytes(bytes(data))


def _feature(bits: int) -> tuple[int, bytes]:
    return (AARCH64_FEATURE_1_AND, struct.pack("<I", bits))


#: name -> (note, _note_elf options, marked as ld.so decides): corners of ld.so's rule
#: (glibc's _dl_process_pt_gnu_property), several of which readelf reads otherwise.
CORNERS: dict[str, tuple[bytes, dict[str, int], int]] = {
    "bti": (_property_note([_feature(BTI)]), {}, 1),
    "pac-only": (_property_note([_feature(PAC)]), {}, 0),
    "bti-after-1-needed": (_property_note([(0xB0008000, b"\1\0\0\0"), _feature(BTI | PAC)]), {}, 1),
    "properties-out-of-order": (_property_note([(X86_FEATURE_1_AND, b"\3\0\0\0"), _feature(BTI)]), {}, 0),
    "feature-of-8-bytes": (_property_note([(AARCH64_FEATURE_1_AND, struct.pack("<Q", BTI))]), {}, 0),
    "note-aligned-4": (_property_note([_feature(BTI)]), {"align": 4}, 0),
    "owner-not-gnu": (_property_note([_feature(BTI)], name=b"GNV\0"), {}, 0),
    "not-a-property-note": (_property_note([_feature(BTI)], kind=3), {}, 0),
    "note-past-the-load": (_property_note([_feature(BTI)]), {"note_off": 0x1000 - 16}, 0),
    # A segment that ends inside the padding of its last note, at the end of the mapping:
    # the walk stops there, reading nothing past it.
    "ends-in-a-note's-padding": (struct.pack("<III", 4, 1, 3) + b"GNU\0" + b"\1", {"note_off": 0x1000 - 24}, 0),
    "after-a-build-id-note": (
        struct.pack("<III", 4, 8, 3) + b"GNU\0" + bytes(8) + _property_note([_feature(BTI)]),
        {},
        1,
    ),
}


def _readelf_bti(path: Path) -> int:
    return int(any("BTI" in p for p in _properties(path)))


def test_the_runtime_reads_the_bti_marking_as_ld_so_does(bti_build: Path, tmp_path: Path) -> None:
    """Real files (BTI, PAC, both, neither, before and after hugify, x86 files with x86
    properties) as readelf reads them; constructed corners as ld.so's rule reads them."""
    reader = tmp_path / "hp_bti_reader"
    (tmp_path / "reader.c").write_text(READER)
    runtime = REPO / "runtime"
    subprocess.run(
        ["gcc", "-O1", "-Wall", "-Werror", f"-I{runtime}", "-o", reader, tmp_path / "reader.c", runtime / "hp_bti.c"],
        check=True,
    )
    real = []
    for flavour in ("standard", "bti", "pac-ret", "none"):
        lib = tmp_path / f"lib-{flavour}.so"
        cmd = [CC, "-O2", "-fPIC", f"-mbranch-protection={flavour}", "-shared", "-nostartfiles", "-o", lib]
        subprocess.run([*cmd, "-x", "c", "-"], input=b"long f(long x) { return x + 1; }\n", check=True)
        real.append(lib)
    real += [bti_build / "libbti.so", bti_build / "prog"]
    hugified = tmp_path / "hug" / "libbti.so"
    hugified.parent.mkdir()
    hugify("transform", bti_build / "libbti.so", "-o", hugified, "--mode", "shift")
    real.append(hugified)
    real += sorted(p for p in Path("/usr/bin").iterdir() if p.is_file() and not p.is_symlink())[:40]
    corners = []
    for name, (note, opts, _) in CORNERS.items():
        _note_elf(tmp_path / name, note, **opts)
        corners.append(tmp_path / name)
    out = subprocess.run([reader, *real, *corners], capture_output=True, text=True, check=True).stdout
    said = dict(line.rsplit(" ", 1) for line in out.splitlines())
    compared = 0
    for f in real:
        if said[str(f)] == "unreadable":
            continue
        assert int(said[str(f)]) == _readelf_bti(f), f
        compared += 1
    assert compared >= 20
    assert [int(said[str(tmp_path / n)]) for n in CORNERS] == [want for _, _, want in CORNERS.values()]
    # Each flavour as the compiler marks it, and hugify's rewrite keeps the marking.
    assert [int(said[str(tmp_path / f"lib-{f}.so")]) for f in ("standard", "bti", "pac-ret", "none")] == [1, 1, 0, 0]
    assert said[str(hugified)] == said[str(bti_build / "libbti.so")] == "1"


#: dlopens a library and asks the runtime's proof (runtime/hp_map.c) whether its code
#: segment is mapped from its file, with the protections the audit library asks with
#: (runtime/audit.c: PROT_READ | PROT_EXEC | hp_bti_prot, or-ed with argv[2] here), by
#: PROCMAP_QUERY where the kernel has it and by reading /proc/self/maps.
PROOF = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "hp_bti.h"
#include "hp_map.h"

int main(int argc, char **argv) {
    struct link_map *map = dlopen(argv[1], RTLD_NOW);
    unsigned phnum;
    struct hp_ctx c;
    if (argc != 3 || !map)
        return 2;
    hp_ctx_init(&c, 2 << 20);
    const Elf64_Phdr *ph = hp_mapped_phdrs(&c, map->l_addr, &phnum);
    if (!ph)
        return 3;
    int bti = hp_bti_prot(ph, phnum, map->l_addr);
    int prot = PROT_READ | PROT_EXEC | bti | (int)strtol(argv[2], 0, 0);
    for (unsigned i = 0; i < phnum; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_X) || !ph[i].p_filesz)
            continue;
        uint64_t page = 4096, skew = ph[i].p_vaddr % page, len = (ph[i].p_filesz + skew + page - 1) / page * page;
        uintptr_t at = map->l_addr + ph[i].p_vaddr - skew;
        for (int text = 0; text < 2; text++) {
            struct hp_file_id file;
            int fd = -1;
            c.procmap = text ? 0 : -1;
            int range = hp_range_maps_file(&c, at, len, ph[i].p_offset - skew, prot, &file);
            int proof = hp_prove_object_file(&c, at, len, ph[i].p_offset - skew, prot, &fd, argv[1], &file);
            int rwonly = hp_range_maps_file(&c, at, len, ph[i].p_offset - skew, PROT_READ | PROT_WRITE, &file);
            printf("%s bti %#x range %d proof %d rw %d\n", text ? "text" : "query", bti, range, proof, rwonly);
            hp_ctx_release(&c);
        }
        return 0;
    }
    return 4;
}
"""


def _proof(cc: str, tmp_path: Path, lib: Path, extra: int, runner: list[str] | None = None) -> list[str]:
    runtime = REPO / "runtime"
    src, exe = tmp_path / f"proof-{cc}.c", tmp_path / f"proof-{cc}"
    src.write_text(PROOF)
    sources = [runtime / f for f in ("hp_base.c", "hp_ctx.c", "hp_elf.c", "hp_map.c", "hp_bti.c")]
    subprocess.run(
        [cc, "-O1", "-Wall", "-Werror", "-D_FILE_OFFSET_BITS=64", f"-I{runtime}", "-o", exe, src, *sources],
        check=True,
    )
    rc, out, err = run_program(exe, args=(str(lib), hex(extra)), runner=runner)
    assert rc == 0, (rc, out, err)
    return out.splitlines()


def test_a_window_with_prot_bti_is_proven_its_files_mapping(bti_build: Path, tmp_path: Path) -> None:
    """The audit library asks whether an object's windows are its file's mapping with the
    protections it will give them, PROT_BTI included where ld.so gave it (arm64). The
    kernel's view of a mapping shows read, write and execute only, so the proof compared
    PROT_READ | PROT_EXEC | PROT_BTI with PROT_READ | PROT_EXEC and found every window of
    a BTI-marked object "not-mapped": in the booted arm64 guest (tests/test_aarch64_boot.py)
    none was repaired or copied. Here a hugified BTI library that Debian 12's arm64 ld.so
    maps with PROT_BTI under qemu-user (BTI enforced), and the same proof on this machine
    with PROT_BTI's bit (asm/mman.h: 0x10) or-ed in, where nothing has that bit; other
    protections (read and write) are still told apart."""
    hugified = tmp_path / "hug" / "libbti.so"
    hugified.parent.mkdir()
    hugify("transform", bti_build / "libbti.so", "-o", hugified, "--mode", "shift")
    arm64 = _proof(CC, tmp_path, hugified, 0, RUNNER)
    assert arm64 == ["query bti 0x10 range 1 proof 1 rw 0", "text bti 0x10 range 1 proof 1 rw 0"], arm64
    host_lib = tmp_path / "libhost.so"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", "-o", host_lib, "-x", "c", "-"],
        input=b"long f(long x) { return x + 1; }\n",
        check=True,
    )
    host = _proof("gcc", tmp_path, host_lib, 0x10)
    assert host == ["query bti 0 range 1 proof 1 rw 0", "text bti 0 range 1 proof 1 rw 0"], host
