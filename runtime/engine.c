/* libhugify-engine.so — hp_core's window state machine for `hugify prefetch` and
 * `hugify status`, which call it through ctypes (hugify/engine.py): the runtime and
 * the CLI settle windows with the same code. Unlike the audit library it may use libc.
 * The ABI is the exported functions below and struct hp_window (hp_core.h). */
#include <errno.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "hp_base.h"
#include "hp_core.h"
#include "hp_map.h"
#include "hp_sys.h"
#include "hp_verdict.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT const char *hp_engine_state_name(unsigned s);
EXPORT const char *hp_engine_why_name(unsigned w);
EXPORT unsigned hp_engine_init(uint64_t hp, unsigned force);
EXPORT int hp_engine_run(int fd, const uint64_t *offs, uint32_t n, int measure, int *aware, struct hp_window *out);
EXPORT int hp_engine_set_runtime_dir(const char *dir);
EXPORT void hp_engine_set_budget(int64_t bytes);
EXPORT int hp_engine_large_folios_since(long magic);
EXPORT long hp_engine_record_read(const char *name, char *buf, size_t cap);
EXPORT int hp_engine_record_write(const char *name, const char *text, size_t n);
EXPORT int hp_engine_record_drop(const char *name);
EXPORT int hp_engine_may_record(void);
EXPORT void hp_engine_set_fault_hook(void (*hook)(int fd, uint64_t off));
EXPORT int hp_engine_file_id(int fd, uint32_t *major, uint32_t *minor, uint64_t *inode);
EXPORT int hp_engine_pmd_windows(int fd, const uint64_t *offs, uint32_t n, int measure, int8_t *out);
EXPORT long hp_engine_page_regions(int pagemap_fd, uint64_t start, uint64_t end, uint64_t anyof, uint64_t report,
                                   struct hp_page_region *out, uint64_t n, uint64_t *walk_end);

/* pagemap_fd, maps_fd and rundir_fd -1: hp_engine_init releases the context first, and a zeroed
 * one would close descriptor 0, the caller's stdin. */
static struct hp_ctx ctx = {.pagemap_fd = -1, .maps_fd = -1, .rundir_fd = -1, .euid = -1};
static char rundir[4096];

/* What hp_engine_init reports about this system and process. */
enum {
    HP_ENGINE_CACHESTAT = 1,     /* cachestat(2) works */
    HP_ENGINE_PAGEMAP_SCAN = 2,  /* PAGEMAP_SCAN works */
    HP_ENGINE_THP_DISABLED = 4,  /* prctl(PR_SET_THP_DISABLE) is in force */
};

static const char *const state_names[HP_NSTATES] = {
    [HP_HUGE] = "huge",     [HP_LOADED] = "loaded", [HP_REPAIRED] = "repaired",       [HP_KERNEL] = "kernel",
    [HP_BUSY] = "busy",     [HP_FAILED] = "failed", [HP_UNSUPPORTED] = "unsupported", [HP_COLD] = "cold",
    [HP_SMALL] = "small",   [HP_UNVERIFIED] = "unverified",
};

/* Reason ids of the core's table (core/src/error.rs), so that `hugify explain` knows them. */
static const char *const why_names[HP_NWHY] = {
    [HP_WHY_NONE] = "",
    [HP_WHY_LOADER] = "loader",
    [HP_WHY_NOT_EVICTED] = "not-evicted",
    [HP_WHY_MEMORY_FS] = "memory-fs",
    [HP_WHY_NO_LARGE_FOLIOS] = "no-large-folios",
    [HP_WHY_FRAGMENTED] = "fragmented",
    [HP_WHY_NO_FILE] = "no-file",
    [HP_WHY_THP_OFF] = "thp-off",
    [HP_WHY_TRUNCATED] = "beyond-eof",
    [HP_WHY_BUDGET] = "budget",
    [HP_WHY_REPLACED] = "replaced",
    [HP_WHY_NOT_MAPPED] = "not-mapped",
    [HP_WHY_FILE_NO_LARGE_FOLIOS] = "file-no-large-folios",
    [HP_WHY_KERNEL_VERSION] = "kernel-version",
    [HP_WHY_CGROUP_LIMIT] = "cgroup-limit",
    [HP_WHY_NO_HUGE_PAGE] = "no-huge-page",
    [HP_WHY_MADVISE_REFUSED] = "madvise-refused",
    [HP_WHY_NOT_OWNER] = "not-owner",
    [HP_WHY_READ_MEANWHILE] = "read-meanwhile",
};

EXPORT const char *hp_engine_state_name(unsigned s) { return s < HP_NSTATES ? state_names[s] : "?"; }

EXPORT const char *hp_engine_why_name(unsigned w) { return w < HP_NWHY ? why_names[w] : "?"; }

/* Sets up the engine for huge pages of `hp` bytes. `force` takes the paths of older
 * kernels, so that the tests cover them on any kernel: HP_ENGINE_CACHESTAT, as without
 * cachestat (Linux < 6.5); HP_ENGINE_PAGEMAP_SCAN, as without PAGEMAP_SCAN (< 6.7), and
 * so without PROCMAP_QUERY (6.11).
 * Returns the HP_ENGINE_* bits of what works. */
EXPORT unsigned hp_engine_init(uint64_t hp, unsigned force)
{
    hp_ctx_release(&ctx);
    hp_ctx_init(&ctx, hp);
    ctx.rundir = rundir[0] ? rundir : 0;
    ctx.smaps = 1; /* each window is a VMA of its own (see hp_engine_run) */
    ctx.thorough = 1; /* a window seen huge drops its file's record too */
    if (force & HP_ENGINE_CACHESTAT)
        ctx.cachestat = 0;
    if (force & HP_ENGINE_PAGEMAP_SCAN)
        ctx.scan = 0, ctx.procmap = 0; /* nor PROCMAP_QUERY (6.11), which came later */
    unsigned bits = 0;
    if (hp_cachestat_works(&ctx))
        bits |= HP_ENGINE_CACHESTAT;
    if (hp_scan_works(&ctx))
        bits |= HP_ENGINE_PAGEMAP_SCAN;
    if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1)
        bits |= HP_ENGINE_THP_DISABLED;
    return bits;
}

/* Where the per-boot records are read and written (hp_ctx.rundir); "" for nowhere.
 * Returns 0, or -ENAMETOOLONG. */
EXPORT int hp_engine_set_runtime_dir(const char *dir)
{
    size_t n = hp_strlen(dir);
    if (n >= sizeof rundir)
        return -ENAMETOOLONG;
    for (size_t i = 0; i <= n; i++)
        rundir[i] = dir[i];
    hp_ctx_release(&ctx); /* the directory's descriptor is of the one before */
    ctx.rundir = n ? rundir : 0;
    return 0;
}

/* Bounds the bytes the following runs may read in (cold windows read, small ones read
 * again), together; windows beyond it stay `cold` or `small` with reason `budget`.
 * Negative: no bound (the default). */
EXPORT void hp_engine_set_budget(int64_t bytes) { ctx.budget = bytes; }

/* The records of the runtime directory, for hugify/rundir.py: read only where they
 * are honoured, written and removed only by root in a directory of root's
 * (hp_verdict.h). Read: the bytes read into buf, or -1 (none, or not honoured). */
EXPORT long hp_engine_record_read(const char *name, char *buf, size_t cap)
{
    int fd = hp_record_open(&ctx, name);
    if (fd < 0)
        return -1;
    long n = hp_read(fd, buf, cap);
    hp_close(fd);
    return n;
}

/* 0 written (replaced whole), -1 not: this process does not write records. */
EXPORT int hp_engine_record_write(const char *name, const char *text, size_t n)
{
    return hp_record_write(&ctx, name, text, n);
}

/* 0 removed (or there was none), -1 not. */
EXPORT int hp_engine_record_drop(const char *name) { return hp_record_drop(&ctx, name); }

/* Whether this process writes records (root, a runtime directory of root's). */
EXPORT int hp_engine_may_record(void) { return hp_may_record(&ctx); }

/* For the tests only: a function called between a check that a window is cold and the
 * fault that reads it, in the kernel probe and in repair (NULL: none, the default). */
EXPORT void hp_engine_set_fault_hook(void (*hook)(int fd, uint64_t off)) { hp_fault_hook = hook; }

/* hp_large_folios_since for hugify status's words on a filesystem without them. */
EXPORT int hp_engine_large_folios_since(long magic) { return hp_large_folios_since(magic); }

/* Settles (`measure` 0) or measures (1: reads nothing in) the windows of the open file
 * `fd` at the file offsets offs[0..n), each a multiple of the huge-page size and inside
 * the file; window i's state goes to out[i]. *aware is the kernel verdict (1, 0, or -1
 * not known: probed on the first cold window, and updated). Returns 0, or -errno if
 * the windows cannot be mapped. */
EXPORT int hp_engine_run(int fd, const uint64_t *offs, uint32_t n, int measure, int *aware, struct hp_window *out)
{
    uint64_t hp = ctx.hp;
    if (n == 0)
        return 0;
    /* Each window a VMA of its own, 2 MiB-aligned, with a gap after it: smaps can tell
     * them apart where PAGEMAP_SCAN is missing. */
    size_t span = (size_t)(2 * (uint64_t)n + 1) * hp;
    char *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return -errno;
    char *base = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        char *w = base + 2 * (uint64_t)i * hp;
        if (mmap(w, hp, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, (off_t)offs[i]) == MAP_FAILED)
            rc = -errno;
        else {
            /* MADV_RANDOM: a fault reads just the window (hp_settle marks the windows
             * MADV_HUGEPAGE before it reads one: a fault then reads a whole PMD folio).
             * Measuring faults only wholly cached windows, yet without MADV_RANDOM a fault
             * on a page marked for readahead would start the kernel's async readahead
             * past the window: `hugify status` would read code in. */
            madvise(w, hp, MADV_RANDOM);
        }
    }
    if (!rc) {
        struct hp_target t = {.map = base, .stride = 2 * hp, .nwin = n, .offs = offs, .fd = fd, .size = -1,
                              .zap_ok = 1, .prot = PROT_READ, .random = 1, .report = out};
        struct hp_stats st = {0};
        if (!measure) {
            t.advise = base;
            t.advise_len = (size_t)(2 * (uint64_t)n - 1) * hp;
        }
        ctx.measure = measure;
        /* A "yes" passed in comes from the record (or this session's probe): checked once
         * per session against a cold window. */
        if (*aware != ctx.aware)
            ctx.aware_recorded = *aware == 1;
        ctx.aware = *aware;
        hp_settle(&ctx, &t, &st);
        *aware = ctx.aware;
    }
    munmap(res, span);
    return rc;
}

/* hp_page_regions for the benchmarks, which watch other processes' page tables
 * (bench/speedup.py): the kernel call stays in hp_core. */
EXPORT long hp_engine_page_regions(int pagemap_fd, uint64_t start, uint64_t end, uint64_t anyof, uint64_t report,
                                   struct hp_page_region *out, uint64_t n, uint64_t *walk_end)
{
    return hp_page_regions(pagemap_fd, start, end, anyof, report, out, n, walk_end);
}

/* The device and inode of the open file `fd` as /proc/self/maps names a mapping of it
 * (the key of a shared copy's record, hp_shared.h: what the audit library sees; fstat's
 * device differs on btrfs). One page is mapped aside, never faulted. 0, or -1. */
EXPORT int hp_engine_file_id(int fd, uint32_t *major, uint32_t *minor, uint64_t *inode)
{
    struct hp_vma v;
    void *p = mmap(NULL, HP_PAGE, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    int rc = hp_vma_at(&ctx, (uintptr_t)p, &v);
    munmap(p, HP_PAGE);
    if (rc != 0 || !v.file.inode)
        return -1;
    *major = v.file.dev_major;
    *minor = v.file.dev_minor;
    *inode = v.file.inode;
    return 0;
}

/* Whether each window of the open file `fd` (a shared copy on tmpfs, in memory) is mapped
 * by one PMD when mapped as the audit library maps it (PROT_READ | PROT_EXEC, private,
 * 2 MiB-aligned): out[i] 1 yes, 0 no, -1 the kernel gives no way to tell. Faulting a page
 * of a tmpfs file reads nothing from a disk; `measure`: a window not wholly in memory
 * (swapped out) is not faulted, and is 0. Returns 0, or -errno if a window cannot be
 * mapped. */
EXPORT int hp_engine_pmd_windows(int fd, const uint64_t *offs, uint32_t n, int measure, int8_t *out)
{
    uint64_t hp = ctx.hp;
    char *res = mmap(NULL, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return -errno;
    char *w = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (mmap(w, hp, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, (off_t)offs[i]) == MAP_FAILED) {
            rc = -errno;
            break;
        }
        unsigned char vec[512];
        int resident = 1;
        if (measure) {
            resident = mincore(w, hp, vec) == 0;
            for (uint64_t k = 0; resident && k < hp / HP_PAGE && k < sizeof vec; k++)
                resident = vec[k] & 1;
        }
        if (resident)
            (void)*(const volatile char *)w;
        out[i] = resident ? (int8_t)hp_window_is_pmd(&ctx, w, "ShmemPmdMapped:") : 0;
        mmap(w, hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    munmap(res, 2 * hp);
    return rc;
}
