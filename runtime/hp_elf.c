/* What an ELF file's headers say to the runtime; see hp_elf.h. */
#include "hp_elf.h"

#if defined(__x86_64__)
#define HP_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HP_MACHINE EM_AARCH64
#endif

int hp_elf_ok(const Elf64_Ehdr *eh)
{
    const unsigned char *id = eh->e_ident;
    if (id[EI_MAG0] != ELFMAG0 || id[EI_MAG1] != ELFMAG1 || id[EI_MAG2] != ELFMAG2 || id[EI_MAG3] != ELFMAG3)
        return -1;
    if (id[EI_CLASS] != ELFCLASS64 || id[EI_DATA] != ELFDATA2LSB || eh->e_machine != HP_MACHINE)
        return -1;
    if (eh->e_type != ET_DYN && eh->e_type != ET_EXEC)
        return -1;
    if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 || eh->e_phnum > 512)
        return -1;
    return 0;
}

int hp_exec_range(const Elf64_Phdr *ph, unsigned phnum, int fixed, uint64_t hp, unsigned *next, struct hp_range *out)
{
    /* core/src/windows.rs huge_windows() and huge_placed(), step for step: windows are
     * rounded on the address, overflow skips the load, no cap on the number of runs. */
    while (*next < phnum) {
        const Elf64_Phdr *p = &ph[(*next)++];
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_X))
            continue;
        uint64_t start = p->p_vaddr, end;
        if (start % hp && __builtin_add_overflow(start, hp - start % hp, &start))
            continue;
        if (__builtin_add_overflow(p->p_vaddr, p->p_filesz, &end))
            continue;
        end -= end % hp;
        /* A PIE or library is put at a huge-page-aligned base only if its loads ask for
         * one; an ET_EXEC goes to its link-time addresses whatever p_align says. Offset
         * and address must agree modulo hp, or no window can ever be one PMD. */
        if (!(fixed || p->p_align >= hp) || (p->p_vaddr - p->p_offset) % hp != 0 || end <= start)
            continue;
        out->off = p->p_offset + (start - p->p_vaddr);
        out->vaddr = start;
        out->len = end - start;
        out->readable = (p->p_flags & PF_R) != 0;
        return 1;
    }
    return 0;
}
