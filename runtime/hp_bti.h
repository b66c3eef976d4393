/* arm64 Branch Target Identification for the windows the runtime replaces.
 *
 * glibc's ld.so maps the executable segments of an object marked BTI-compatible (its
 * PT_GNU_PROPERTY note carries GNU_PROPERTY_AARCH64_FEATURE_1_BTI) with PROT_BTI when
 * the kernel supports BTI (HWCAP2_BTI), before la_objopen; the kernel does the same for
 * ld.so itself and for static programs. On such pages an indirect branch may only land
 * on a BTI instruction. A window the runtime maps afresh (repair) or copies (anonymous
 * mode) gets only the protections it is given, and without PROT_BTI it would silently
 * lose that check; with PROT_BTI on an object that was not marked, its indirect branch
 * targets (no landing pads) would fault. So the window gets PROT_BTI exactly where ld.so
 * gave the object's pages PROT_BTI: this reader takes ld.so's decision again, from the
 * same bytes (the note in the object's mapping) and the same kernel bit.
 *
 * Why not the VMA's own flags: the kernel shows them only in /proc/self/smaps
 * (VmFlags "bt"), a read of every mapping of the process, about a hundred times what
 * the audit library may spend on an object; the note is a few dozen bytes that ld.so
 * has just read from the same mapping. Like hp_core it uses only hp_sys.h. */
#ifndef HUGIFY_HP_BTI_H
#define HUGIFY_HP_BTI_H

#include <elf.h>
#include <stdint.h>

/* Whether the object whose program headers are `ph` and whose link-time address 0 is at
 * `base` is marked BTI-compatible: 1 yes, 0 no. Its PT_GNU_PROPERTY is read in memory at
 * base + p_vaddr, where ld.so read it, and only when it lies inside the file bytes of a
 * readable PT_LOAD; it is parsed as ld.so parses it (ELF64: 8-aligned notes, the first
 * GNU_PROPERTY_AARCH64_FEATURE_1_AND of an NT_GNU_PROPERTY_TYPE_0 "GNU" note, properties
 * in ascending order). Any architecture's file, so that the host's tests can run it. */
int hp_bti_marked(const Elf64_Phdr *ph, unsigned phnum, uintptr_t base);

/* PROT_BTI where ld.so gave the object's executable pages PROT_BTI (marked, and the
 * kernel supports BTI: HWCAP2_BTI in /proc/self/auxv, read once per process), else 0;
 * always 0 on other architectures than arm64. To be or-ed into the protections of every
 * window of the object that the runtime replaces. */
int hp_bti_prot(const Elf64_Phdr *ph, unsigned phnum, uintptr_t base);

#endif
