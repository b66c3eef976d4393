/* What the process maps, for the hugify runtime: the mapping at an address and the file
 * behind it, whether a descriptor holds the very file a mapping maps, the program
 * headers of an object ld.so mapped, and whether windows are mapped by one PMD each.
 * The runtime replaces mappings of code (repair) and copies them (anonymous mode): what
 * it puts there must come from the inode the process mapped, never from another file
 * that now has the object's path (a package upgrade renames the new version over it at
 * any moment), and what it reads of a mapped object must lie inside what is mapped.
 *
 * Like every layer of the runtime, raw system calls only (hp_sys.h): the audit library
 * has no libc. */
#ifndef HUGIFY_HP_MAP_H
#define HUGIFY_HP_MAP_H

#include <elf.h>
#include <stdint.h>

#include "hp_ctx.h"

/* One mapping (VMA) of the process. Device and inode are the kernel's view of the
 * mapped file (/proc/self/maps: the inode's superblock device), which differs from
 * fstat(2)'s on btrfs (a device per subvolume) and is the same for any two mappings. */
struct hp_vma {
    uint64_t start, end; /* [start, end) */
    uint64_t offset;     /* file offset mapped at start */
    struct hp_file_id file; /* inode 0: not a file mapping */
    int prot;            /* PROT_READ, PROT_WRITE, PROT_EXEC */
};

/* The mapping that holds `addr`: 0; -ENOENT if none does; -1 if the kernel does not say
 * (no /proc). PROCMAP_QUERY on /proc/self/maps (Linux 6.11; its descriptor is kept in
 * c->maps_fd until hp_ctx_release), else one read of /proc/self/maps. */
int hp_vma_at(struct hp_ctx *c, uintptr_t addr, struct hp_vma *out);

/* Whether the mappings at `a` and `b` map the same file at the same offset (device,
 * inode and offset): 1 yes, 0 no (another file or offset, or not a file mapping), -1
 * the kernel does not say. */
int hp_same_file_mapped(struct hp_ctx *c, uintptr_t a, uintptr_t b);

/* Whether [at, at + len) is mapped from one file with protections `prot` (PROT_READ,
 * PROT_WRITE and PROT_EXEC are compared; other bits, such as the PROT_BTI a window
 * keeps on arm64, are not: the kernel's view does not show them), with file offset
 * `off` at `at` and on from there (several mappings of it, such as a window repaired in
 * place, count as one): 1 yes, and *file names it; 0 no (unmapped, other protections,
 * another file or offset in between: a load of a malformed object overlapping
 * another); -1 not known. */
int hp_range_maps_file(struct hp_ctx *c, uintptr_t at, uint64_t len, uint64_t off, int prot,
                       struct hp_file_id *file);

/* Whether the open descriptor `fd` holds `file`: 1 proven, 0 another file, -1 not known.
 * One page of fd is mapped aside (never faulted) and looked up like any mapping: the
 * same view of device and inode on both sides, on every filesystem (fstat's device
 * differs from /proc/self/maps' on btrfs). */
int hp_fd_is_file(struct hp_ctx *c, int fd, const struct hp_file_id *file);

/* The file behind an object's windows, for a copy or map made from it: the windows
 * [at, at + len) must be one file's bytes from file offset `off` on, with protections
 * `prot` (hp_range_maps_file; *file names it), and the descriptor *fd (opened from `path`
 * when it is -1: the caller closes it) that very inode (hp_fd_is_file). Returns 1 proven;
 * 0 the windows are not one file's mapping ("not-mapped"); -1 the descriptor is not
 * proven to be the inode mapped, or cannot be opened ("replaced"). */
int hp_prove_object_file(struct hp_ctx *c, uintptr_t at, uint64_t len, uint64_t off, int prot, int *fd,
                         const char *path, struct hp_file_id *file);

/* The program headers of an ELF object whose file offset 0 ld.so mapped at `base`
 * (l_addr of a PIE or library whose first PT_LOAD starts at address 0), read in place,
 * wherever e_phoff puts them inside the object's first PT_LOAD, and never outside what
 * is mapped readable from the object's file at `base`: NULL if the header is not usable
 * (hp_elf_ok), the table is misaligned, overflows, or does not lie inside that first
 * load and that mapping. Costs a mincore(2) when the table is in the first page, and
 * one hp_vma_at when it is further in (hugified lld output: a rodata-first shift puts it
 * past the moved sections). `c` is needed only for the latter. */
const Elf64_Phdr *hp_mapped_phdrs(struct hp_ctx *c, uintptr_t base, unsigned *phnum);

/* One region of PAGEMAP_SCAN's answer (Linux 6.7, include/uapi/linux/fs.h). */
struct hp_page_region {
    uint64_t start, end, categories;
};

/* Whether PAGEMAP_SCAN (Linux 6.7) can tell PMD-mapped windows apart; without it
 * windows are verified from /proc/self/smaps and must each be a VMA of their own. */
int hp_scan_works(struct hp_ctx *c);

/* One PAGEMAP_SCAN over [start, end) of the open /proc/PID/pagemap `pagemap_fd` (of
 * any process): up to n regions whose pages have a category of `anyof`, with their
 * categories masked by `report`, go to out; *walk_end is where the walk stopped (a
 * full `out` stops it early). Returns how many regions, or -errno. */
long hp_page_regions(int pagemap_fd, uint64_t start, uint64_t end, uint64_t anyof, uint64_t report,
                     struct hp_page_region *out, uint64_t n, uint64_t *walk_end);

/* Whether each of the `count` windows at map + (first + i) * stride (hp-aligned, c->hp
 * long) is mapped by one PMD: huge[i]; 0, or -1 where the kernel gives no way to tell.
 * PAGEMAP_SCAN (one ioctl on /proc/self/pagemap, kept in c->pagemap_fd until
 * hp_ctx_release); without it, where c->smaps, the `smaps_key` field of /proc/self/smaps
 * ("FilePmdMapped:", "AnonHugePages:", "ShmemPmdMapped:") of windows that are VMAs of
 * their own. */
int hp_pmd_mapped(struct hp_ctx *c, const char *smaps_key, char *map, uint64_t stride, uint64_t first,
                  uint64_t count, unsigned char *huge);
/* Whether the anonymous window at `w` (hp-aligned, one VMA of its own) is mapped by one
 * PMD: 1 yes, 0 no, -1 the kernel gives no way to tell. PAGEMAP_SCAN, else the VMA's
 * AnonHugePages in /proc/self/smaps. For the anonymous-copy mode (hp_anon.h). */
int hp_anon_window_is_pmd(struct hp_ctx *c, char *w);
/* The same for any window that is a VMA of its own, with the smaps field that counts its
 * PMD mappings where PAGEMAP_SCAN is missing ("ShmemPmdMapped:" for a shared copy). */
int hp_window_is_pmd(struct hp_ctx *c, char *w, const char *smaps_key);
/* Whether each of the `n` windows from `at` on (hp-aligned, adjacent, in one VMA) is
 * mapped by one PMD: huge[i]; 0, or -1 where only PAGEMAP_SCAN could tell (then ask
 * hp_window_is_pmd of windows that are VMAs of their own). */
int hp_windows_are_pmd(struct hp_ctx *c, char *at, uint64_t n, unsigned char *huge);

#endif
