/* hugify-run PROGRAM [ARGS...]
 *
 * Gets the code of PROGRAM and of every shared library it will load (its DT_NEEDED
 * closure, resolved as ld.so resolves it) into the page cache as 2 MiB folios, then
 * executes PROGRAM with libhugify-audit.so in LD_AUDIT, so that libraries opened
 * later with dlopen() are handled too. Prefetching is best effort: whatever happens,
 * PROGRAM is executed; only a PROGRAM that cannot be found or executed is an error.
 *
 * The audit library is the installed one for an installed hugify-run (its real path in
 * the BINDIR it was built for); any other hugify-run (a build tree, a copy) takes the
 * libhugify-audit.so in its own directory if there is one, else the installed one. An
 * installed hugify-run never loads a library that merely lies beside it in /usr/bin.
 *
 * --anonymous[=always] sets HUGIFY_ANONYMOUS for the audit library's anonymous-copy
 * mode (hp_anon.h).
 *
 * Environment: HUGIFY_DEBUG=1 reports per object on stderr; HUGIFY_AUDIT_LIB
 * overrides the audit library (empty: do not set LD_AUDIT); HUGIFY_RUNTIME_DIR
 * overrides /run/hugify (where `hugify prefetch` records the kernel verdict);
 * HUGIFY_FORCE_SMAPS=1 verifies from /proc/self/smaps as on kernels without
 * PAGEMAP_SCAN (before 6.7), so that the tests cover that path on any kernel.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "build-config.h"
#include "hp_base.h"
#include "hp_core.h"
#include "hp_elf.h"
#include "hp_map.h"
#include "hp_verdict.h"

/* ld.so.cache entry flags: FLAG_ELF_LIBC6 and the architecture's library flag. */
#if defined(__x86_64__)
#define HUGIFY_CACHE_FLAGS 0x0303
#elif defined(__aarch64__)
#define HUGIFY_CACHE_FLAGS 0x0a03
#endif
#define HUGIFY_CACHE_FLAG_MASK 0xffff

#define MAX_OBJECTS 1024
#define MAX_NEEDED 256

struct object {
    char *path;
    char *origin; /* directory for $ORIGIN, computed when first needed */
    char *rpath;  /* DT_RPATH (ignored when DT_RUNPATH exists, as ld.so does) */
    char *runpath;
    int parent; /* the object that needed it; -1 for the program and preloads' loader */
    int nodeflib;
};

static struct object objs[MAX_OBJECTS];
static int nobjs;
static struct {
    dev_t dev;
    ino_t ino;
} seen[MAX_OBJECTS];
static int nseen;
static char *names[MAX_OBJECTS]; /* needed names already resolved */
static int nnames;

static struct hp_ctx ctx;
static int debug;
static uint64_t stride;
static const char *ld_library_path;

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("hugify-run: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d) {
        say("out of memory");
        exit(1);
    }
    return d;
}

static char *dir_of(const char *path)
{
    char *d;
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return xstrdup(".");
        size_t n = strlen(cwd) + strlen(path) + 2;
        d = malloc(n);
        if (!d)
            return xstrdup(".");
        snprintf(d, n, "%s/%s", cwd, path);
    } else {
        d = xstrdup(path);
    }
    char *slash = strrchr(d, '/');
    if (slash == d)
        slash[1] = 0;
    else if (slash)
        *slash = 0;
    return d;
}

/* $ORIGIN of object i: the directory of the program's real path (as ld.so takes it
 * from /proc/self/exe), or of the path a library was found at. */
static const char *origin_of(int i)
{
    if (i < 0)
        return "";
    if (!objs[i].origin) {
        char real[PATH_MAX];
        objs[i].origin = i == 0 && realpath(objs[i].path, real) ? dir_of(real) : dir_of(objs[i].path);
    }
    return objs[i].origin;
}

/* Expands $ORIGIN, $LIB and $PLATFORM (also in ${...} form) like ld.so; `owner` is
 * the object whose $ORIGIN applies. */
static int expand(const char *in, size_t len, int owner, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        const char *val = NULL;
        size_t skip = 0;
        if (in[i] == '$') {
            static const struct {
                const char *name;
                const char *value;
            } tok[] = {{"ORIGIN", NULL}, {"LIB", HUGIFY_DST_LIB}, {"PLATFORM", HUGIFY_DST_PLATFORM}};
            for (size_t t = 0; t < sizeof tok / sizeof tok[0] && !val; t++) {
                size_t tl = strlen(tok[t].name);
                if (i + 1 + tl <= len && !strncmp(in + i + 1, tok[t].name, tl)) {
                    val = tok[t].value ? tok[t].value : origin_of(owner);
                    skip = 1 + tl;
                } else if (i + 3 + tl <= len && in[i + 1] == '{' && !strncmp(in + i + 2, tok[t].name, tl) &&
                           in[i + 2 + tl] == '}') {
                    val = tok[t].value ? tok[t].value : origin_of(owner);
                    skip = 3 + tl;
                }
            }
        }
        if (val) {
            size_t vl = strlen(val);
            if (o + vl >= cap)
                return -1;
            memcpy(out + o, val, vl);
            o += vl;
            i += skip;
        } else {
            if (o + 1 >= cap)
                return -1;
            out[o++] = in[i++];
        }
    }
    out[o] = 0;
    return 0;
}

/* The first page of the file open_elf() opened last. */
static union {
    Elf64_Ehdr eh;
    unsigned char bytes[4096];
} head;
static ssize_t head_len;

/* Opens `path` if it is an ELF file ld.so would accept for this process, and reads
 * its first page into `head`. */
static int open_elf(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    /* No readahead for the metadata reads: it would put pages of the code windows
     * into the cache as small folios before they are prefetched. */
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    head_len = pread(fd, head.bytes, sizeof head.bytes, 0);
    if (head_len < (ssize_t)sizeof head.eh || hp_elf_ok(&head.eh) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Tries NAME in each directory of a colon-separated list. */
static int search_list(const char *list, int owner, const char *name, char *found, size_t cap)
{
    for (const char *p = list; p && *p;) {
        const char *end = p + strcspn(p, ":;");
        char dir[PATH_MAX];
        if (end > p && expand(p, (size_t)(end - p), owner, dir, sizeof dir) == 0) {
            if ((size_t)snprintf(found, cap, "%s/%s", dir, name) < cap) {
                int fd = open_elf(found);
                if (fd >= 0)
                    return fd;
            }
        }
        p = *end ? end + 1 : end;
    }
    return -1;
}

/* --- /etc/ld.so.cache (glibc's "new" format, with or without the old prefix) --- */

struct cache_entry {
    int32_t flags;
    uint32_t key, value, osversion;
    uint64_t hwcap;
};

static const char *cache;
static size_t cache_size;
static size_t cache_base; /* offset of the new-format header; string offsets are relative to it */
static uint32_t cache_n;

static void cache_open(void)
{
    static int tried;
    if (tried)
        return;
    tried = 1;
    int fd = open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 48) {
        close(fd);
        return;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    const char *c = m;
    size_t base = 0;
    if (!memcmp(c, "ld.so-1.7.0", 11)) {
        uint32_t old_n;
        memcpy(&old_n, c + 12, 4);
        base = (16 + (size_t)old_n * 12 + 7) & ~(size_t)7;
    }
    if (base + 48 > (size_t)st.st_size || memcmp(c + base, "glibc-ld.so.cache1.1", 20)) {
        munmap(m, (size_t)st.st_size);
        return;
    }
    memcpy(&cache_n, c + base + 20, 4);
    if (base + 48 + (uint64_t)cache_n * sizeof(struct cache_entry) > (uint64_t)st.st_size) {
        munmap(m, (size_t)st.st_size);
        return;
    }
    cache = c;
    cache_size = (size_t)st.st_size;
    cache_base = base;
}

static const char *cache_str(uint32_t off)
{
    size_t at = cache_base + off;
    if (at >= cache_size || !memchr(cache + at, 0, cache_size - at))
        return NULL;
    return cache + at;
}

static int search_cache(const char *name, char *found, size_t cap)
{
    cache_open();
    if (!cache)
        return -1;
    const struct cache_entry *e = (const void *)(cache + cache_base + 48);
    for (uint32_t i = 0; i < cache_n; i++) {
        if ((e[i].flags & HUGIFY_CACHE_FLAG_MASK) != HUGIFY_CACHE_FLAGS || e[i].hwcap != 0)
            continue;
        const char *k = cache_str(e[i].key), *v = cache_str(e[i].value);
        if (k && v && !strcmp(k, name) && strlen(v) < cap) {
            strcpy(found, v);
            int fd = open_elf(found);
            if (fd >= 0)
                return fd;
        }
    }
    return -1;
}

/* Resolves a DT_NEEDED (or LD_PRELOAD) name for the object `loader` the way ld.so
 * does: RPATH chain (when the loader has no RUNPATH), LD_LIBRARY_PATH, RUNPATH,
 * ld.so.cache, system directories. glibc-hwcaps subdirectories are not searched;
 * the audit library catches what ld.so loads from there. */
static int resolve(const char *name, int loader, char *found, size_t cap)
{
    const struct object *l = &objs[loader];
    if (strchr(name, '/')) {
        if (expand(name, strlen(name), loader, found, cap) != 0)
            return -1;
        return open_elf(found);
    }
    int fd = -1;
    if (!l->runpath) {
        int did_main = 0;
        for (int o = loader; o >= 0 && fd < 0; o = objs[o].parent) {
            if (objs[o].rpath)
                fd = search_list(objs[o].rpath, o, name, found, cap);
            did_main |= o == 0;
        }
        if (fd < 0 && !did_main && objs[0].rpath)
            fd = search_list(objs[0].rpath, 0, name, found, cap);
    }
    if (fd < 0 && ld_library_path)
        fd = search_list(ld_library_path, 0, name, found, cap);
    if (fd < 0 && l->runpath)
        fd = search_list(l->runpath, loader, name, found, cap);
    if (fd < 0 && !l->nodeflib)
        fd = search_cache(name, found, cap);
    if (fd < 0 && !l->nodeflib)
        fd = search_list(HUGIFY_SYSTEM_DIRS, -1, name, found, cap);
    return fd;
}

/* --- reading one object ---
 *
 * Everything read of a file is bounded by what was read: the file is any file a search
 * found, and the program runs whatever hugify-run makes of it (ld.so refuses what it
 * cannot load). fuzz/runtime/readers.c runs these functions under libFuzzer and ASan. */

/* A string of at most `max` bytes at `off`, or NULL (unreadable, or longer than a path). */
static char *read_string(int fd, uint64_t off, uint64_t max)
{
    char buf[PATH_MAX + 1];
    size_t want = max < sizeof buf - 1 ? (size_t)max : sizeof buf - 1;
    if (off > (uint64_t)INT64_MAX)
        return NULL;
    ssize_t n = pread(fd, buf, want, (off_t)off);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    if (strlen(buf) == (size_t)n && (uint64_t)n == want && want < max)
        return NULL; /* longer than a path can be */
    return xstrdup(buf);
}

static int vaddr_to_off(const Elf64_Phdr *ph, unsigned phnum, uint64_t vaddr, uint64_t *off)
{
    for (unsigned i = 0; i < phnum; i++)
        if (ph[i].p_type == PT_LOAD && vaddr >= ph[i].p_vaddr && vaddr - ph[i].p_vaddr < ph[i].p_filesz) {
            if (__builtin_add_overflow(ph[i].p_offset, vaddr - ph[i].p_vaddr, off))
                return -1;
            return 0;
        }
    return -1;
}

/* The program headers of the file open as fd, whose first page open_elf() read into
 * `head` (hp_elf_ok accepted it: at most 512 entries), into out; 0, or -1 if the table
 * is not inside the file. */
static int read_phdrs(int fd, Elf64_Phdr *out, unsigned *phnum)
{
    const Elf64_Ehdr *eh = &head.eh;
    size_t size = (size_t)eh->e_phnum * sizeof(Elf64_Phdr);
    uint64_t end;
    if (__builtin_add_overflow(eh->e_phoff, size, &end) || end > (uint64_t)INT64_MAX)
        return -1;
    if (end <= (uint64_t)head_len)
        memcpy(out, head.bytes + eh->e_phoff, size);
    else if (pread(fd, out, size, (off_t)eh->e_phoff) != (ssize_t)size)
        return -1;
    *phnum = eh->e_phnum;
    return 0;
}

/* Whether the windows of r lie inside a file of `size` bytes (a truncated file's would
 * fault when touched). */
static int range_in_file(const struct hp_range *r, uint64_t size)
{
    return r->off <= size && r->len <= size - r->off;
}

/* What an object needs loaded with it, from its PT_INTERP and PT_DYNAMIC. */
struct deps {
    char *interp;  /* the program's PT_INTERP (is_main only) */
    char *rpath, *runpath;
    char *needed[MAX_NEEDED];
    int nneeded;
    int nodeflib;
};

static void free_deps(struct deps *d)
{
    free(d->interp);
    free(d->rpath);
    free(d->runpath);
    for (int k = 0; k < d->nneeded; k++)
        free(d->needed[k]);
    memset(d, 0, sizeof *d);
}

/* Reads the dependencies of the object open as fd into d (zeroed first; free_deps frees
 * them): whatever cannot be read is left out. */
static void read_deps(int fd, const Elf64_Phdr *ph, unsigned phnum, int is_main, struct deps *d)
{
    memset(d, 0, sizeof *d);
    const Elf64_Phdr *dyn = NULL, *interp = NULL;
    for (unsigned k = 0; k < phnum; k++) {
        if (ph[k].p_type == PT_DYNAMIC)
            dyn = &ph[k];
        else if (ph[k].p_type == PT_INTERP)
            interp = &ph[k];
    }
    if (is_main && interp && interp->p_filesz > 1 && interp->p_filesz < PATH_MAX &&
        interp->p_offset <= (uint64_t)INT64_MAX) {
        char ip[PATH_MAX];
        if (pread(fd, ip, interp->p_filesz, (off_t)interp->p_offset) == (ssize_t)interp->p_filesz) {
            ip[interp->p_filesz - 1] = 0;
            d->interp = xstrdup(ip);
        }
    }
    if (!dyn || dyn->p_filesz == 0 || dyn->p_filesz > 65536 || dyn->p_offset > (uint64_t)INT64_MAX)
        return;
    Elf64_Dyn *dt = malloc(dyn->p_filesz);
    if (!dt || pread(fd, dt, dyn->p_filesz, (off_t)dyn->p_offset) != (ssize_t)dyn->p_filesz) {
        free(dt);
        return;
    }
    size_t nd = dyn->p_filesz / sizeof *dt;
    uint64_t strtab = 0, strsz = 0, rpath = UINT64_MAX, runpath = UINT64_MAX;
    uint64_t needed[MAX_NEEDED];
    int nneeded = 0;
    for (size_t k = 0; k < nd && dt[k].d_tag != DT_NULL; k++) {
        switch (dt[k].d_tag) {
        case DT_NEEDED:
            if (nneeded < MAX_NEEDED)
                needed[nneeded++] = dt[k].d_un.d_val;
            break;
        case DT_STRTAB:
            strtab = dt[k].d_un.d_ptr;
            break;
        case DT_STRSZ:
            strsz = dt[k].d_un.d_val;
            break;
        case DT_RPATH:
            rpath = dt[k].d_un.d_val;
            break;
        case DT_RUNPATH:
            runpath = dt[k].d_un.d_val;
            break;
        case DT_FLAGS_1:
            d->nodeflib = (dt[k].d_un.d_val & DF_1_NODEFLIB) != 0;
            break;
        }
    }
    free(dt);
    uint64_t stroff, at;
    if (vaddr_to_off(ph, phnum, strtab, &stroff) != 0)
        return;
    if (runpath < strsz && !__builtin_add_overflow(stroff, runpath, &at))
        d->runpath = read_string(fd, at, strsz - runpath);
    else if (rpath < strsz && !__builtin_add_overflow(stroff, rpath, &at))
        d->rpath = read_string(fd, at, strsz - rpath);
    for (int k = 0; k < nneeded; k++) {
        char *name;
        if (needed[k] < strsz && !__builtin_add_overflow(stroff, needed[k], &at) &&
            (name = read_string(fd, at, strsz - needed[k])) != NULL)
            d->needed[d->nneeded++] = name;
    }
}

static const char *runtime_dir;

static void prefetch(int fd, const char *path, const struct hp_range *r, uint64_t size, struct hp_stats *st)
{
    if (!stride) { /* first hugified object: find out what this kernel offers */
        ctx.aware = ctx.aware_recorded = hp_read_verdict(&ctx).aware;
        stride = hp_scan_works(&ctx) ? ctx.hp : 2 * ctx.hp;
    }
    uint64_t hp = ctx.hp, nwin = r->len / hp;
    if (!range_in_file(r, size))
        return; /* truncated file: touching it would fault */
    size_t span = (size_t)((nwin - 1) * stride + hp + hp);
    char *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return;
    char *base = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int ok = 1;
    /* With PAGEMAP_SCAN one mapping serves all windows; without it each window gets a
     * VMA of its own so that smaps can tell them apart. */
    uint64_t per = stride == hp ? nwin : 1;
    for (uint64_t i = 0; i < nwin && ok; i += per) {
        char *w = base + i * stride;
        if (mmap(w, per * hp, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, (off_t)(r->off + i * hp)) == MAP_FAILED)
            ok = 0;
        else /* a fault reads just the window (hp_settle marks it MADV_HUGEPAGE if it reads) */
            madvise(w, per * hp, MADV_RANDOM);
    }
    if (ok) {
        /* The windows are mapped from fd: remapping them from it maps the same inode. */
        struct hp_target t = {.map = base, .stride = stride, .nwin = nwin, .off = r->off, .fd = fd,
                              .size = (long)size, .path = path, .zap_ok = 1,
                              .prot = PROT_READ, .random = 1, .advise = base,
                              .advise_len = (size_t)((nwin - 1) * stride + hp)};
        hp_settle(&ctx, &t, st);
    }
    munmap(res, span);
}

/* Whether the file is not a regular file, or was already handled (by inode). */
static int skip_file(int fd, struct stat *st)
{
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode))
        return 1;
    for (int i = 0; i < nseen; i++)
        if (seen[i].dev == st->st_dev && seen[i].ino == st->st_ino)
            return 1;
    if (nseen < MAX_OBJECTS) {
        seen[nseen].dev = st->st_dev;
        seen[nseen].ino = st->st_ino;
        nseen++;
    }
    return 0;
}

static void add_needed(const char *name, int loader);

/* Prefetches object i (open as fd, first page in `head`, size from st) and queues
 * what it needs. */
static void process(int i, int fd, const struct stat *st)
{
    struct object *o = &objs[i];
    static Elf64_Phdr ph[512]; /* hp_elf_ok's limit */
    unsigned phnum;
    if (read_phdrs(fd, ph, &phnum) != 0)
        return;
    struct hp_range range;
    unsigned next = 0;
    int nr = 0;
    struct hp_stats stats = {0};
    for (; hp_exec_range(ph, phnum, head.eh.e_type == ET_EXEC, ctx.hp, &next, &range); nr++)
        prefetch(fd, o->path, &range, (uint64_t)st->st_size, &stats);
    if (debug && nr)
        /* The states of docs/runtime-reference.md, summed: "skipped" are the windows not read in;
         * "unsupported" ones cannot be huge on this filesystem, "failed" ones could. */
        say("%s: %u windows: %u huge (%u loaded, %u repaired), %u busy, %u failed, %u unsupported, %u skipped, "
            "%u unverified",
            o->path, stats.windows, stats.n[HP_HUGE] + stats.n[HP_LOADED] + stats.n[HP_REPAIRED],
            stats.n[HP_LOADED], stats.n[HP_REPAIRED], stats.n[HP_BUSY], stats.n[HP_FAILED], stats.n[HP_UNSUPPORTED],
            stats.n[HP_KERNEL] + stats.n[HP_COLD] + stats.n[HP_SMALL], stats.n[HP_UNVERIFIED]);

    /* Dependencies: read before any of them is processed (which reads its own into the
     * same static buffers). */
    struct deps d;
    read_deps(fd, ph, phnum, i == 0, &d);
    o->nodeflib = d.nodeflib;
    o->runpath = d.runpath;
    o->rpath = d.rpath;
    d.runpath = d.rpath = NULL;
    if (d.interp)
        add_needed(d.interp, 0);
    for (int k = 0; k < d.nneeded; k++)
        add_needed(d.needed[k], i);
    free_deps(&d);
}

static void add_needed(const char *name, int loader)
{
    for (int k = 0; k < nnames; k++)
        if (!strcmp(names[k], name))
            return;
    if (nobjs >= MAX_OBJECTS || nnames >= MAX_OBJECTS)
        return;
    names[nnames++] = xstrdup(name);
    char found[PATH_MAX];
    int fd = resolve(name, loader, found, sizeof found);
    if (fd < 0) {
        if (debug)
            say("%s: not found (needed by %s)", name, objs[loader].path);
        return;
    }
    struct stat st;
    if (skip_file(fd, &st)) {
        close(fd);
        return;
    }
    int i = nobjs++;
    objs[i].path = xstrdup(found);
    objs[i].parent = loader;
    process(i, fd, &st);
    close(fd);
}

static char *find_program(const char *name)
{
    if (strchr(name, '/'))
        return xstrdup(name);
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *end = strchrnul(p, ':');
        char cand[PATH_MAX];
        size_t dl = (size_t)(end - p);
        if (dl == 0) /* an empty entry is the current directory */
            snprintf(cand, sizeof cand, "%s", name);
        else
            snprintf(cand, sizeof cand, "%.*s/%s", (int)dl, p, name);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
            return xstrdup(cand);
        if (!*end)
            break;
        p = end + 1;
    }
    return NULL;
}

static int thp_never(void)
{
    char buf[128];
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1; /* no THP in this kernel */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    return strstr(buf, "[never]") != NULL;
}

/* The installed audit library for an installed hugify-run; for another one, the
 * library beside its real path if there is one, else the installed one. */
static const char *audit_library(void)
{
    static char beside[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 1);
    if (n > 0) {
        beside[n] = 0;
        char *slash = strrchr(beside, '/');
        static const char name[] = "libhugify-audit.so";
        char bindir[PATH_MAX];
        if (slash && realpath(HUGIFY_BIN_DIR, bindir)) {
            *slash = 0;
            int installed = strcmp(beside, bindir) == 0;
            *slash = '/';
            if (installed)
                return HUGIFY_AUDIT_PATH;
        }
        if (slash && (size_t)(slash + 1 - beside) + sizeof name <= sizeof beside) {
            memcpy(slash + 1, name, sizeof name);
            if (access(beside, R_OK) == 0)
                return beside;
        }
    }
    return HUGIFY_AUDIT_PATH;
}

static void usage(FILE *f)
{
    fputs("usage: hugify-run [--anonymous[=always]] [--] PROGRAM [ARGS...]\n"
          "Loads the code of PROGRAM and of the shared libraries it will load into the page cache\n"
          "as 2 MiB huge pages, then runs PROGRAM with the hugify audit library (LD_AUDIT).\n"
          "--anonymous: where the filesystem gives no 2 MiB folios, the audit library copies the code\n"
          "windows into anonymous huge pages (=always: every window); sets HUGIFY_ANONYMOUS.\n"
          "With it, HUGIFY_PERF_MAP=1 has the program and the children it forks write /tmp/perf-PID.map,\n"
          "which perf attached later (-p PID, perf top) names the copies by (left when they exit).\n"
          "Environment: HUGIFY_DEBUG=1 reports what was done; HUGIFY_AUDIT_LIB=PATH (empty: none; default:\n"
          HUGIFY_AUDIT_PATH " for hugify-run installed in " HUGIFY_BIN_DIR ";\n"
          "elsewhere, libhugify-audit.so in hugify-run's own directory if it is there, else the former).\n",
          f);
}

int main(int argc, char **argv)
{
    int a = 1;
    if (a < argc && !strcmp(argv[a], "--help")) {
        usage(stdout);
        return 0;
    }
    if (a < argc && !strcmp(argv[a], "--version")) {
        puts("hugify-run " HUGIFY_VERSION);
        return 0;
    }
    /* The anonymous-copy mode (hp_anon.h): the audit library reads the variable. */
    if (a < argc && (!strcmp(argv[a], "--anonymous") || !strcmp(argv[a], "--anonymous=always"))) {
        setenv("HUGIFY_ANONYMOUS", argv[a][11] ? "always" : "1", 1);
        a++;
    }
    if (a < argc && !strcmp(argv[a], "--"))
        a++;
    else if (a < argc && argv[a][0] == '-') {
        say("unknown option %s", argv[a]);
        usage(stderr);
        return 2;
    }
    if (a >= argc) {
        usage(stderr);
        return 2;
    }
    double t0 = now_us();
    const char *dbg = getenv("HUGIFY_DEBUG");
    debug = dbg && *dbg && strcmp(dbg, "0");
    char *prog = find_program(argv[a]);
    if (!prog) {
        say("%s: command not found", argv[a]);
        return 127;
    }

    if (!thp_never()) {
        hp_ctx_init(&ctx, hp_pmd_size());
        ctx.smaps = 1; /* a small process: smaps is cheap where PAGEMAP_SCAN is missing */
        ctx.thorough = 1; /* it maps whole files' windows: their records are looked at too */
        const char *force_smaps = getenv("HUGIFY_FORCE_SMAPS");
        if (force_smaps && *force_smaps && strcmp(force_smaps, "0"))
            ctx.scan = 0, ctx.procmap = 0; /* nor PROCMAP_QUERY (6.11): /proc/self/maps read */
        const char *rd = getenv("HUGIFY_RUNTIME_DIR");
        runtime_dir = rd && *rd ? rd : "/run/hugify";
        ctx.rundir = runtime_dir;
        ld_library_path = getenv("LD_LIBRARY_PATH");
        int fd = open_elf(prog);
        struct stat st;
        if (fd >= 0 && !skip_file(fd, &st)) {
            objs[0].path = prog;
            objs[0].parent = -1;
            nobjs = 1;
            process(0, fd, &st);
        }
        if (fd >= 0)
            close(fd);
        if (nobjs) {
            /* Preloaded libraries are searched as needed by the program. */
            const char *pre = getenv("LD_PRELOAD");
            if (pre) {
                char *copy = xstrdup(pre);
                for (char *save = NULL, *t = strtok_r(copy, " :", &save); t; t = strtok_r(NULL, " :", &save))
                    add_needed(t, 0);
                free(copy);
            }
        }
        hp_ctx_release(&ctx);
        if (debug)
            say("%d objects in %.0f us", nobjs, now_us() - t0);
    } else if (debug) {
        say("transparent huge pages are disabled (never); nothing prefetched");
    }

    const char *audit = getenv("HUGIFY_AUDIT_LIB");
    if (!audit)
        audit = audit_library();
    if (*audit) {
        const char *cur = getenv("LD_AUDIT");
        if (!cur || !*cur) {
            setenv("LD_AUDIT", audit, 1);
        } else if (!strstr(cur, audit)) {
            size_t n = strlen(cur) + strlen(audit) + 2;
            char *v = malloc(n);
            if (v) {
                snprintf(v, n, "%s:%s", cur, audit);
                setenv("LD_AUDIT", v, 1);
            }
        }
    }
    execv(prog, argv + a);
    int e = errno;
    say("%s: %s", argv[a], strerror(e));
    return e == ENOENT ? 127 : 126;
}
