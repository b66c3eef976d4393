/* The state the hugify runtime's layers share: the context of one process (struct
 * hp_ctx) and the object whose windows are settled (struct hp_target), with the file
 * identity and the reasons (enum hp_why) they hold. hp_map, hp_verdict and hp_core
 * each keep their part of them; hp_ctx_init and hp_ctx_release set up and release the
 * whole context.
 *
 * Like every layer of the runtime, raw system calls only (hp_sys.h). */
#ifndef HUGIFY_HP_CTX_H
#define HUGIFY_HP_CTX_H

#include <stddef.h>
#include <stdint.h>

struct hp_window;

#define HP_MAX_FS 8 /* filesystems one process keeps what it learnt of (hp_verdict.h) */

/* A file as /proc/self/maps names it: the device of the inode's superblock and the
 * inode number (hp_map.h). */
struct hp_file_id {
    uint64_t inode; /* 0: not a file */
    uint32_t dev_major, dev_minor;
};

/* Why a window is in its state (enum hp_state, hp_core.h), where there is more than one
 * way to get there. */
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
    struct hp_window *report; /* optional: window i's state goes to report[i] (hp_core.h) */
};

void hp_ctx_init(struct hp_ctx *c, uint64_t hp);
/* Closes the descriptors the layers keep open (pagemap, maps, the runtime directory; the
 * audit library does so whenever the link map is consistent, so that the program never
 * sees a descriptor it did not open). */
void hp_ctx_release(struct hp_ctx *c);

#endif
