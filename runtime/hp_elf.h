/* What an ELF file's headers say to the hugify runtime: whether the header is one of
 * this machine's, and the whole huge-page windows of its executable loads (the core's
 * rule, core/src/windows.rs). Reads nothing itself: the callers bring the headers
 * (hugify-run from the file, the audit library from what ld.so mapped). */
#ifndef HUGIFY_HP_ELF_H
#define HUGIFY_HP_ELF_H

#include <elf.h>
#include <stdint.h>

/* The whole huge-page windows of one executable PT_LOAD: file offset and link-time
 * address of the first window (both multiples of the huge-page size) and the length
 * (a multiple of it). */
struct hp_range {
    uint64_t off, vaddr, len;
    int readable; /* PF_R: the code can be read to fault it in */
};

/* Checks an ELF header for this machine's class and architecture; 0 if usable. */
int hp_elf_ok(const Elf64_Ehdr *eh);
/* The next run of whole huge-page windows among the program headers, from index
 * *next on (start at 0): fills `out`, advances *next, returns 1; 0 when there is none
 * left. The rule is the core's (core/src/windows.rs huge_windows), step for step, so
 * that the runtime and the CLI agree on every file (tests/test_as_is.py holds the two
 * against each other over a table of files): an executable PT_LOAD whose file offset
 * and address agree modulo hp, placed at an hp-aligned address (`fixed`: an ET_EXEC,
 * at its link-time addresses; otherwise p_align >= hp), spanning at least one whole hp
 * window of file bytes. */
int hp_exec_range(const Elf64_Phdr *ph, unsigned phnum, int fixed, uint64_t hp, unsigned *next, struct hp_range *out);

#endif
