/* arm64 BTI for replaced windows; see hp_bti.h. */
#include "hp_bti.h"

#include "hp_sys.h"

#define NOTE_ALIGN 8 /* ELF64 property notes; ld.so ignores a PT_GNU_PROPERTY aligned otherwise */

/* Little-endian (hp_elf_ok accepts nothing else), byte by byte: no alignment assumed. */
static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* The feature bits of the first GNU_PROPERTY_AARCH64_FEATURE_1_AND property in the
 * properties of one NT_GNU_PROPERTY_TYPE_0 note (`n` bytes at `p`): 1 and *bits when
 * found, 0 when the note has none, -1 when the note is ill-formed (ld.so then stops
 * reading notes altogether). */
static int feature_1_and(const unsigned char *p, uint64_t n, uint32_t *bits)
{
    uint32_t last = 0;
    uint64_t at = 0;
    while (n - at >= 8) {
        uint32_t type = le32(p + at), size = le32(p + at + 4);
        at += 8;
        if (type < last || size > n - at)
            return -1;
        last = type;
        if (type == GNU_PROPERTY_AARCH64_FEATURE_1_AND) {
            if (size != 4)
                return -1;
            *bits = le32(p + at);
            return 1;
        }
        at += align_up(size, NOTE_ALIGN);
        if (at > n)
            return 0;
    }
    return 0;
}

/* Whether [lo, lo + len) lies inside the file bytes of a readable PT_LOAD. */
static int in_readable_load(const Elf64_Phdr *ph, unsigned phnum, uint64_t lo, uint64_t len)
{
    for (unsigned i = 0; i < phnum; i++) {
        const Elf64_Phdr *p = &ph[i];
        uint64_t end;
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_R) || __builtin_add_overflow(p->p_vaddr, p->p_filesz, &end))
            continue;
        if (lo >= p->p_vaddr && lo <= end && len <= end - lo)
            return 1;
    }
    return 0;
}

int hp_bti_marked(const Elf64_Phdr *ph, unsigned phnum, uintptr_t base)
{
    const Elf64_Phdr *prop = 0;
    for (unsigned i = 0; i < phnum && !prop; i++)
        if (ph[i].p_type == PT_GNU_PROPERTY)
            prop = &ph[i];
    if (!prop || prop->p_align != NOTE_ALIGN || prop->p_memsz > prop->p_filesz ||
        !in_readable_load(ph, phnum, prop->p_vaddr, prop->p_memsz))
        return 0;
    const unsigned char *notes = (const unsigned char *)(base + prop->p_vaddr);
    uint64_t n = prop->p_memsz, at = 0;
    while (at <= n && n - at >= 12) { /* at may pass n by the last note's padding */
        uint32_t namesz = le32(notes + at), descsz = le32(notes + at + 4), type = le32(notes + at + 8);
        uint64_t desc = align_up(at + 12 + namesz, NOTE_ALIGN);
        if (desc > n || descsz > n - desc)
            return 0;
        if (namesz == 4 && type == NT_GNU_PROPERTY_TYPE_0 && notes[at + 12] == 'G' && notes[at + 13] == 'N' &&
            notes[at + 14] == 'U' && notes[at + 15] == 0) {
            uint32_t bits = 0;
            if (descsz < 8 || descsz % 8)
                return 0;
            int found = feature_1_and(notes + desc, descsz, &bits);
            if (found < 0)
                return 0;
            if (found)
                return (bits & GNU_PROPERTY_AARCH64_FEATURE_1_BTI) != 0;
        }
        at = align_up(desc + descsz, NOTE_ALIGN);
    }
    return 0;
}

#if defined(__aarch64__)
#define HP_PROT_BTI 0x10     /* PROT_BTI, asm/mman.h */
#define HP_AT_HWCAP2 26      /* AT_HWCAP2 */
#define HP_HWCAP2_BTI (1UL << 17)

/* Whether the kernel supports BTI for user space: mmap and mprotect refuse PROT_BTI
 * (EINVAL) without it, and ld.so then maps nothing with it. */
static int kernel_bti(void)
{
    static int known = -1;
    if (known < 0) {
        uint64_t aux[2 * 64];
        known = 0;
        int fd = hp_open("/proc/self/auxv", O_RDONLY);
        long n = fd >= 0 ? hp_read(fd, aux, sizeof aux) : -1;
        if (fd >= 0)
            hp_close(fd);
        for (long i = 0; i + 1 < n / 8 && aux[i] != 0 /* AT_NULL */; i += 2)
            if (aux[i] == HP_AT_HWCAP2)
                known = (aux[i + 1] & HP_HWCAP2_BTI) != 0;
    }
    return known;
}

int hp_bti_prot(const Elf64_Phdr *ph, unsigned phnum, uintptr_t base)
{
    return hp_bti_marked(ph, phnum, base) && kernel_bti() ? HP_PROT_BTI : 0;
}
#else
/* No page-granular landing-pad protection elsewhere (x86's IBT is not a page bit). */
int hp_bti_prot(const Elf64_Phdr *ph, unsigned phnum, uintptr_t base)
{
    (void)ph;
    (void)phnum;
    (void)base;
    return 0;
}
#endif
