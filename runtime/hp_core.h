/* The part of the hugify runtime shared by hugify-run, libhugify-audit.so and
 * libhugify-engine.so (`hugify prefetch`/`status`):
 * recognising a hugified object from its program headers, and getting the
 * 2 MiB windows of its code into the page cache as 2 MiB folios.
 *
 * It uses only the raw system calls of hp_sys.h, so that the audit library can be
 * linked without libc. See docs/runtime-reference.md for the method. */
#ifndef HUGIFY_HP_CORE_H
#define HUGIFY_HP_CORE_H

#include <elf.h>
#include <stddef.h>
#include <stdint.h>

#define HP_DEFAULT_SIZE (2UL << 20)
#define HP_PAGE 4096UL /* smallest base page; only used to size probes */
#define HP_MAX_FS 8 /* filesystems one process keeps what it learnt of (hp_verdict.h) */
/* The per-boot records of what gives no large folios, in the runtime directory:
 * "no-large-folios-MAJOR:MINOR" (a filesystem) holding "BOOT-ID FS-MAGIC\n" and
 * "no-large-folios-MAJOR:MINOR-INODE" (a file) holding "BOOT-ID FS-MAGIC CTIME SIZE\n"
 * (magic in hex, ctime as SECONDS.NANOSECONDS); hp_verdict.h. */
#define HP_NO_LARGE_FOLIOS_PREFIX "no-large-folios-"

/* The whole huge-page windows of one executable PT_LOAD: file offset and link-time
 * address of the first window (both multiples of the huge-page size) and the length
 * (a multiple of it). */
struct hp_range {
    uint64_t off, vaddr, len;
    int readable; /* PF_R: the code can be read to fault it in */
};

/* One region of PAGEMAP_SCAN's answer (Linux 6.7, include/uapi/linux/fs.h). */
struct hp_page_region {
    uint64_t start, end, categories;
};

/* A file as /proc/self/maps names it: the device of the inode's superblock and the
 * inode number (hp_map.h). */
struct hp_file_id {
    uint64_t inode; /* 0: not a file */
    uint32_t dev_major, dev_minor;
};

/* The state of one window after hp_settle: the one set of states of the runtime and of
 * `hugify prefetch`/`hugify status` (which report them by the names of
 * libhugify-engine.so); docs/runtime-reference.md "Window states". */
enum hp_state {
    HP_HUGE,        /* one 2 MiB folio already */
    HP_LOADED,      /* was not cached; read in as one 2 MiB folio */
    HP_REPAIRED,    /* was in small folios; evicted and read in again as one */
    HP_KERNEL,      /* not cached; left to the kernel's own PMD exec readahead */
    HP_BUSY,        /* small folios that could not be evicted */
    HP_FAILED,      /* evicted and read in again, still small folios */
    HP_UNSUPPORTED, /* the file's filesystem gives it no 2 MiB folios */
    HP_COLD,        /* not cached, and left so */
    HP_SMALL,       /* cached in small folios, and left so */
    HP_UNVERIFIED,  /* read in, but the kernel gives no way to tell how */
    HP_NSTATES
};

/* Why a window is in its state, where there is more than one way to get there. */
enum hp_why {
    HP_WHY_NONE,
    HP_WHY_LOADER,          /* busy: the caller's running code (ld.so's own), never zapped */
    HP_WHY_NOT_EVICTED,     /* busy: pages left after eviction (mapped, dirty or locked) */
    HP_WHY_MEMORY_FS,       /* unsupported: tmpfs/ramfs/hugetlbfs keep pages only in memory */
    HP_WHY_NO_LARGE_FOLIOS, /* unsupported: free 2 MiB blocks, yet read in as small folios */
    HP_WHY_FRAGMENTED,      /* failed: no free 2 MiB block the page cache could take (hp_memory_room) */
    HP_WHY_NO_FILE,         /* failed or cold: the file cannot be opened */
    HP_WHY_THP_OFF,         /* cold or small: transparent huge pages are off */
    HP_WHY_TRUNCATED,       /* cold: the window ends beyond the end of the file */
    HP_WHY_BUDGET,          /* cold or small: the run's budget of bytes to read is spent */
    HP_WHY_REPLACED,        /* cold or small: the file at the object's path is not the inode
                             * the caller maps (replaced since, e.g. by a package upgrade),
                             * or that cannot be proven: nothing of it is mapped in */
    HP_WHY_NOT_MAPPED,      /* cold or small: the caller does not map the window from the
                             * object's file at its offset (another load overlaps it): left
                             * as it is, not touched */
    HP_WHY_FILE_NO_LARGE_FOLIOS, /* unsupported: this file was read in small, nothing in the way */
    HP_WHY_KERNEL_VERSION,  /* unsupported: the kernel's version says its filesystem gives none */
    HP_WHY_CGROUP_LIMIT,    /* failed: small, and the memory cgroup was near its limit */
    HP_WHY_NO_HUGE_PAGE,    /* failed: small, and the process got no 2 MiB page of its own either */
    HP_WHY_MADVISE_REFUSED, /* cold or small: MADV_HUGEPAGE refused to the process (seccomp) */
    HP_WHY_NOT_OWNER,       /* small: the process may not see what is cached, and knows no better */
    HP_WHY_READ_MEANWHILE,  /* busy: read in again small, but not wholly by this process (another
                             * read pages of it between the eviction and the fault) */
    HP_NWHY
};

struct hp_window {
    uint8_t state, why; /* enum hp_state, enum hp_why */
    uint32_t pages;     /* busy: pages left in the page cache after eviction */
};

/* How many windows of one object ended in each state. */
struct hp_stats {
    uint32_t windows;
    uint32_t n[HP_NSTATES];
    uint32_t why[HP_NWHY]; /* windows per reason (HP_WHY_NONE: those without one) */
};

/* What one process learnt of one filesystem (hp_verdict.h). */
struct hp_fs_note {
    uint32_t major, minor; /* st_dev */
    long magic;            /* statfs f_type; -1 not asked yet */
    int8_t large;          /* 1 gives 2 MiB folios (a window was seen in one), -1 gives none, 0 not known */
    uint8_t source;        /* why, when large < 0: HP_WHY_NO_LARGE_FOLIOS or HP_WHY_KERNEL_VERSION */
    uint8_t looked;        /* its record was looked for */
    uint8_t recorded;      /* a record of this boot says it gives none (dropped when contradicted) */
    uint64_t small_ino;    /* a file of it read in small with nothing in the way: a second file makes it
                            * the filesystem's verdict */
};

struct hp_ctx {
    uint64_t hp;     /* huge-page (PMD) size */
    int pagemap_fd;  /* /proc/self/pagemap, opened on first use; -1 closed */
    int maps_fd;     /* /proc/self/maps for PROCMAP_QUERY (hp_map.h), opened on first use; -1 closed */
    int procmap;     /* PROCMAP_QUERY works: 1 yes, 0 no (read the text), -1 not tried */
    int scan;        /* PAGEMAP_SCAN works: 1 yes, 0 no, -1 not tried */
    int cachestat;   /* cachestat(2) works: 1 yes, 0 no, -1 not tried */
    int aware;       /* the kernel reads executable mappings as PMD folios by itself: 1 yes,
                      * 0 no, -1 not known (then probed on the first cold window) */
    int aware_recorded; /* `aware` 1 came from a record: checked once against a cold window */
    int aware_checked;  /* that check was made */
    int measure;     /* read nothing in: cold windows stay cold, small ones small */
    int smaps;       /* without PAGEMAP_SCAN, verify windows that are VMAs of their own
                      * from /proc/self/smaps (small processes only) */
    /* Called once, before the first window is read or repaired (never when every
     * window is in place already): sets `aware`; returns 0 to go on, -1 to leave the
     * page cache alone (transparent huge pages disabled). NULL: nothing to check. */
    int (*prepare)(struct hp_ctx *c);
    int prepared; /* 0 not yet, 1 go on, -1 leave alone */
    /* Where the per-boot records are kept (/run/hugify; NULL: nowhere): the kernel
     * verdict, and what gives no large folios, so that no later caller of this boot
     * (the service, hugify-run, the audit library in every process) evicts or reads a
     * window for it again (hp_verdict.h). */
    const char *rundir;
    int rundir_fd;      /* rundir, opened and checked; -1 not open */
    int rundir_state;   /* 0 not looked at, 1 honoured (rundir_fd), -1 missing, -2 not to be honoured */
    int may_record;     /* -1 not known yet, 0 no, 1 this process writes records */
    int thorough;       /* windows seen huge drop the records of their files too (prefetch, status) */
    int kernel_version; /* major * 1000 + minor; 0 not read yet, -1 unknown */
    long euid;          /* the process's effective uid; -1 not asked yet */
    int64_t budget;             /* bytes this run may still read in (cold or repaired
                                 * windows); negative: no bound */
    uint32_t nfs;
    struct hp_fs_note fs[HP_MAX_FS];
};

/* The windows of one object and its file. */
struct hp_target {
    char *map;       /* window i is mapped (readable) at map + i * stride, hp-aligned */
    uint64_t stride;
    uint64_t nwin;
    uint64_t off;    /* file offset of window 0; window i at off + i * hp, */
    const uint64_t *offs; /* or, if not NULL, at offs[i] */
    int fd;          /* the file, or -1: opened with open_file (or path) when needed */
    long size;       /* file size, or -1: found out when the file is opened */
    const char *path;
    int (*open_file)(struct hp_target *t); /* optional; sets fd (and may set size) */
    /* ld_mapped: the windows are the process's own mapping of the object (ld.so made
     * it, for the audit library), not one the caller made from `fd`. A descriptor the
     * core opens for them (open_file, path) is used only once they are proven to be one
     * file's bytes at their offsets and the descriptor that very file (hp_map.h). A
     * caller that mapped the windows from `fd` itself leaves it 0. */
    int ld_mapped;
    /* 0 not asked yet, 1 proven (`mapped` names the file), 2 not: left alone, none of
     * them touched (the caller sets 2 when it knows: another load overlaps them) */
    int map_proof;
    int file_proof;  /* the same for the descriptor the core opened */
    struct hp_file_id mapped;
    char *advise;    /* range to mark MADV_HUGEPAGE before any window is read; NULL: done */
    size_t advise_len;
    int zap_ok;      /* the caller's mapping of a window may be replaced (repair) */
    int (*zap_check)(void); /* optional: asked once, before the first replacement; 0 forbids it */
    int prot;        /* protections of the caller's mapping (0: PROT_READ), PROT_BTI
                      * included where it has it (hp_bti.h): a repaired window keeps them */
    int random;      /* the caller's mapping carries MADV_RANDOM */
    int loaded_read; /* this thread read from storage while the object was being loaded
                      * (the audit library: ld.so's reads and faults before la_objopen),
                      * so small folios in its windows may be its own readahead's */
    int own_fd;      /* set when the core opened fd (it closes it) */
    int memfs;       /* 0 not known yet, 1 on a memory filesystem, 2 not */
    int advised;     /* MADV_HUGEPAGE on the windows: 0 not asked yet, 1 accepted, -1 refused */
    /* The file's identity and what is known of it (hp_verdict.c). */
    int ident;       /* 0 not looked at, 1 known (below), -1 cannot be */
    int knowable;    /* the kernel tells this process which of its pages are cached */
    int fs;          /* its filesystem's entry in the context's notes, or -1 */
    uint64_t ino, fsize;
    int64_t ctime_sec;
    uint32_t ctime_nsec;
    int file_looked; /* its record was looked for */
    int file_none;   /* 1: it gets no large folios (seen, or recorded) */
    int file_recorded; /* a record of this boot says so (dropped when contradicted) */
    struct hp_window *report; /* optional: window i's state goes to report[i] */
};

void hp_ctx_init(struct hp_ctx *c, uint64_t hp);
/* Closes the pagemap and maps descriptors (the audit library does so whenever the link
 * map is consistent, so that the program never sees a descriptor it did not open). */
void hp_ctx_release(struct hp_ctx *c);

/* Whether PAGEMAP_SCAN (Linux 6.7) can tell PMD-mapped windows apart; without it
 * windows are verified from /proc/self/smaps and must each be a VMA of their own. */
int hp_scan_works(struct hp_ctx *c);

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

/* One PAGEMAP_SCAN over [start, end) of the open /proc/PID/pagemap `pagemap_fd` (of
 * any process): up to n regions whose pages have a category of `anyof`, with their
 * categories masked by `report`, go to out; *walk_end is where the walk stopped (a
 * full `out` stops it early). Returns how many regions, or -errno. */
long hp_page_regions(int pagemap_fd, uint64_t start, uint64_t end, uint64_t anyof, uint64_t report,
                     struct hp_page_region *out, uint64_t n, uint64_t *walk_end);

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

/* Whether transparent huge pages may be used (c->prepare, called once): 0 when the
 * administrator set them to never. */
int hp_thp_allowed(struct hp_ctx *c);

/* Whether some zone has a free block of memory of a huge page or more (/proc/buddyinfo):
 * where it has none, a huge page asked for comes as small pages (fragmented memory). */
int hp_free_huge_blocks(struct hp_ctx *c);
/* Whether a /proc/buddyinfo line is of a zone other than ZONE_DMA with a free block of
 * 2^order pages or more. */
int hp_buddy_block(const char *line, unsigned order);

/* Whether cachestat(2) (Linux 6.5) works. */
int hp_cachestat_works(struct hp_ctx *c);

/* Settles the windows of `t` (the state machine of docs/runtime-reference.md): faults each (an
 * uncached window is read through the MADV_HUGEPAGE mapping as one 2 MiB folio),
 * checks which are PMD-mapped, and evicts and reads again those held in small folios
 * that nobody else maps. When every window is in place it costs a mincore(2) and a
 * fault per window and one PAGEMAP_SCAN. With c->measure it only looks. Adds each
 * window's state to `st` (and t->report). */
void hp_settle(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st);

/* Called, where set, between a check that a window holds nothing in the page cache and
 * the fault that reads it (the kernel probe's, and repair's): the tests make a racing
 * reader there (hp_engine_set_fault_hook). */
extern void (*hp_fault_hook)(int fd, uint64_t off);

/* What `hugify prefetch` recorded in c->rundir/kernel-exec-pmd for the current boot
 * (honoured only as hp_verdict.h says): "BOOT-ID AWARE THP", AWARE 1 if the kernel reads
 * executable mappings as PMD folios by itself (0 no, - not known), THP the
 * transparent_hugepage/enabled mode. */
struct hp_verdict {
    int valid; /* a record of this boot was found */
    int aware;
    int thp_never;
};
struct hp_verdict hp_read_verdict(struct hp_ctx *c);

/* This boot's id (/proc/sys/kernel/random/boot_id), 36 characters and a NUL; 0 or -1. */
int hp_boot_id(char out[37]);
/* dir + "/" + name (+ suffix) into out; 0, or -1 if it does not fit. */
int hp_join(char *out, size_t cap, const char *dir, const char *name, const char *suffix);
/* Pages of [off, off + len) of fd in the page cache (cachestat, else mincore of the
 * unfaulted `window` mapping it, if not NULL); -1 if unknown. */
long hp_cached_pages(struct hp_ctx *c, int fd, uint64_t off, uint64_t len, char *window);

/* Small helpers, usable without libc. */
size_t hp_strlen(const char *s);
void hp_memzero(void *p, size_t n);
/* Writes v in `base` (10 or 16) at out (up to 20 characters, no NUL); returns how many. */
size_t hp_put_num(char *out, uint64_t v, unsigned base);

/* Whether `s` starts with `prefix`. */
int hp_starts_with(const char *s, const char *prefix);
/* Copies `src` into `dst` of `cap` bytes, cut to fit, NUL-terminated. */
void hp_copy_str(char *dst, size_t cap, const char *src);

/* Calls each(record, arg) for every record of the file at `path` that ends in the
 * byte `end` (passed NUL-terminated, cut at 4 KiB); stops at the first non-zero
 * return and returns it; 0 at the end of the file, -1 if it cannot be opened. For
 * the short files of /proc: hp_each_line reads lines, and records ending in 0 are
 * the entries of /proc/self/environ (the process's initial environment, which
 * ld.so's audit namespace has no environ variable for). */
int hp_each_record(const char *path, char end, int (*each)(const char *record, void *arg), void *arg);
int hp_each_line(const char *path, int (*each)(const char *line, void *arg), void *arg);
/* The same over the open descriptor fd (not closed). */
int hp_each_line_fd(int fd, int (*each)(const char *line, void *arg), void *arg);

/* The "start-end" address range heading a /proc/PID/maps or smaps line: the rest of
 * the line after it, or 0 if the line does not start with one. */
const char *hp_maps_range(const char *line, uint64_t *start, uint64_t *end);

#endif
