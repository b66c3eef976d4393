/* libFuzzer target `audit-phdrs` (bench/fuzz.py builds it with clang -fsanitize=fuzzer,address):
 * the audit library's reader of a mapped object's program headers (runtime/hp_map.c,
 * hp_mapped_phdrs) and the window rule over what it accepts (hp_elf.c, hp_exec_range).
 *
 * The input is an ELF file, mapped as ld.so maps an object's first load: from file
 * offset 0 at a page-aligned base, as long as the file's own first PT_LOAD says (all of
 * the input if its table cannot be read), and followed by a PROT_NONE page, as ld.so
 * leaves the gap to the next load. A read outside that mapping faults, and the target
 * fails; so does a table the reader accepts outside it. Both ways of looking up the
 * mapping are run: PROCMAP_QUERY (Linux 6.11) and the text of /proc/self/maps. */
#define _GNU_SOURCE
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hp_base.h"
#include "hp_elf.h"
#include "hp_map.h"

#define PAGE 4096UL

static size_t page_up(uint64_t n) { return (size_t)((n + PAGE - 1) & ~(PAGE - 1)); }

/* How far ld.so would map the first load of the input: its first PT_LOAD's file bytes,
 * read from `data` with every bound checked here (the reader under test must not need
 * this: it sees only memory). */
static size_t first_load_length(const uint8_t *data, size_t size)
{
    Elf64_Ehdr eh;
    if (size < sizeof eh)
        return size;
    memcpy(&eh, data, sizeof eh);
    for (uint64_t i = 0; i < eh.e_phnum && eh.e_phentsize == sizeof(Elf64_Phdr); i++) {
        Elf64_Phdr ph;
        uint64_t at = eh.e_phoff + i * sizeof ph;
        if (eh.e_phoff > size || at > size || size - at < sizeof ph)
            break;
        memcpy(&ph, data + at, sizeof ph);
        if (ph.p_type == PT_LOAD)
            return ph.p_offset == 0 && ph.p_filesz > 0 && ph.p_filesz < size ? (size_t)ph.p_filesz : size;
    }
    return size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static struct hp_ctx c;
    if (fd < 0) {
        fd = memfd_create("audit-phdrs", MFD_CLOEXEC);
        assert(fd >= 0);
        hp_ctx_init(&c, HP_DEFAULT_SIZE);
    }
    if (size == 0)
        return 0;
    assert(ftruncate(fd, 0) == 0 && pwrite(fd, data, size, 0) == (ssize_t)size);
    size_t len = page_up(first_load_length(data, size));
    char *res = mmap(NULL, len + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert(res != MAP_FAILED);
    uintptr_t base = (uintptr_t)res + PAGE; /* PROT_NONE on both sides */
    assert(mmap((void *)base, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) != MAP_FAILED);
    c.procmap = size & 1 ? -1 : 0; /* odd sizes: PROCMAP_QUERY where it works; even: the text */
    unsigned phnum = 0;
    const Elf64_Phdr *ph = hp_mapped_phdrs(&c, base, &phnum);
    if (ph) {
        assert((uintptr_t)ph >= base && phnum > 0 && phnum <= 512);
        assert((uintptr_t)(ph + phnum) <= base + len);
        /* What the audit library then reads: every entry, and the windows they give. */
        volatile uint64_t seen = 0;
        for (unsigned i = 0; i < phnum; i++)
            seen += ph[i].p_type + ph[i].p_vaddr + ph[i].p_memsz + ph[i].p_flags;
        struct hp_range r;
        unsigned next = 0;
        while (hp_exec_range(ph, phnum, 0, HP_DEFAULT_SIZE, &next, &r)) {
            assert(r.len > 0 && r.len % HP_DEFAULT_SIZE == 0 && r.vaddr % HP_DEFAULT_SIZE == 0);
            seen += r.off;
        }
    }
    munmap(res, len + 2 * PAGE);
    hp_ctx_release(&c);
    return 0;
}
