/* The shared mode: mapping windows from root's shared copies; see hp_shared.h and
 * docs/runtime-reference.md, "Shared copies". */
#include "hp_shared.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "hp_base.h"
#include "hp_map.h"
#include "hp_sys.h"

#define TMPFS_MAGIC 0x01021994L
#define HP_MREMAP_MAYMOVE 1
#define HP_MREMAP_FIXED 2

/* Why windows were not mapped from a copy: the token of the debug line (reason ids of
 * the core's table, core/src/error.rs, where `hugify explain` should know them). */
enum shared_why {
    S_MAPPED,
    S_NOT_NEEDED, /* file-backed huge pages work for the window: not unsupported */
    S_OFF,        /* HUGIFY_SHARED=0 */
    S_NO_COPY,    /* root keeps no copy of this inode (none made yet, dropped, another version) */
    S_UNTRUSTED,  /* a directory, the record or the copy is not root's alone, a link, or not on tmpfs */
    S_STALE,      /* the original's size or times differ from the record's: written since the copy */
    S_CHANGED,    /* the copy is not the one root sealed: other inode, size or change time */
    S_NOT_MAPPED, /* the windows are not one file's bytes at their offsets */
    S_REPLACED,   /* the file at the object's path is not the inode mapped (or not proven) */
    S_NOT_HUGE,   /* the copy's window, mapped, is not one PMD */
    S_UNVERIFIED, /* the kernel gives no way to tell */
    S_MMAP,
    S_MREMAP,
    S_LOADER, /* ld.so's own running code: never replaced */
    S_TRACED, /* a debugger's breakpoints are in the file mapping: the copy would drop them */
};

static const char *const why_text[] = {
    [S_MAPPED] = "mapped",
    [S_NOT_NEEDED] = "not-needed",
    [S_OFF] = "off",
    [S_NO_COPY] = "no-copy",
    [S_UNTRUSTED] = "copy-untrusted",
    [S_STALE] = "copy-stale",
    [S_CHANGED] = "copy-changed",
    [S_NOT_MAPPED] = "not-mapped",
    [S_REPLACED] = "replaced",
    [S_NOT_HUGE] = "shmem-not-huge",
    [S_UNVERIFIED] = "unverified",
    [S_MMAP] = "mmap",
    [S_MREMAP] = "mremap",
    [S_LOADER] = "loader",
    [S_TRACED] = "traced",
};

/* What root wrote with a copy (hp_shared.h). */
struct record {
    uint64_t major, minor, inode, size, copy_inode;
    int64_t mtime_ns, ctime_ns, copy_ctime_ns;
    char name[256];
};

static int64_t ns(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec; }

/* Root's alone: owned by root, writable by nobody else; of the type asked for (a
 * directory, or a regular file with one link: no hard link from elsewhere). */
static int roots_alone(int fd, int dir, struct stat *st)
{
    if (hp_fstat(fd, st) != 0 || st->st_uid != 0 || (st->st_mode & (S_IWGRP | S_IWOTH)))
        return 0;
    return dir ? S_ISDIR(st->st_mode) : S_ISREG(st->st_mode) && st->st_nlink == 1;
}

static int on_tmpfs(int fd)
{
    long type = 0;
    return hp_fstatfs_type(fd, &type) == 0 && type == TMPFS_MAGIC;
}

/* A decimal number at *p, then one space; advances *p. 0, or -1. */
static int field(const char **p, uint64_t *v)
{
    const char *q = *p;
    *v = 0;
    if (*q < '0' || *q > '9')
        return -1;
    while (*q >= '0' && *q <= '9') {
        if (*v > (UINT64_MAX - 9) / 10)
            return -1;
        *v = *v * 10 + (uint64_t)(*q++ - '0');
    }
    if (*q++ != ' ')
        return -1;
    *p = q;
    return 0;
}

/* Parses the record's first line; 0, or -1 if it is not one of this format. */
static int parse_record(const char *text, struct record *rec)
{
    static const char magic[] = HP_SHARED_MAGIC " ";
    if (!hp_starts_with(text, magic))
        return -1;
    const char *p = text + sizeof magic - 1;
    uint64_t v[8];
    for (int k = 0; k < 8; k++)
        if (field(&p, &v[k]) != 0)
            return -1;
    rec->major = v[0], rec->minor = v[1], rec->inode = v[2], rec->size = v[3];
    rec->mtime_ns = (int64_t)v[4], rec->ctime_ns = (int64_t)v[5];
    rec->copy_inode = v[6], rec->copy_ctime_ns = (int64_t)v[7];
    for (int k = 0; k < 64; k++, p++) /* the SHA-256 root computed (its business: not checked here) */
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return -1;
    if (*p++ != ' ')
        return -1;
    size_t n = 0;
    for (; *p && *p != '\n'; p++) {
        if (*p == '/' || n + 1 >= sizeof rec->name)
            return -1;
        rec->name[n++] = *p;
    }
    rec->name[n] = 0;
    if (*p != '\n' || n == 0 || (rec->name[0] == '.' && (n == 1 || (n == 2 && rec->name[1] == '.'))))
        return -1;
    return 0;
}

/* "MAJOR:MINOR:INODE" */
static void key_name(char *out, const struct hp_file_id *f)
{
    size_t n = hp_put_num(out, f->dev_major, 10);
    out[n++] = ':';
    n += hp_put_num(out + n, f->dev_minor, 10);
    out[n++] = ':';
    n += hp_put_num(out + n, f->inode, 10);
    out[n] = 0;
}

/* Opens the copy of the file mapped at r's windows from the shared directory, after
 * every check of hp_shared.h but the windows' own; fills `rec`. What costs least is asked
 * first: where root keeps no copy (most objects, most systems) it costs a failed open, or
 * one more and a mapping lookup. `*fd` is the object's file, or -1: opened from `path`
 * (the caller closes it). Returns the copy's descriptor, or -1 with *why. */
static int open_copy(struct hp_ctx *c, const char *rundir, const struct hp_shared_range *r, int *fd, const char *path,
                     struct record *rec, char *key, enum shared_why *why)
{
    struct stat st;
    struct hp_file_id file;
    char text[4096 + 512];
    int run = -1, dir = -1, obj = -1, rfd = -1, copy = -1;
    *why = S_NO_COPY;
    run = hp_open(rundir, O_RDONLY | O_DIRECTORY);
    if (run < 0)
        goto out; /* no runtime directory: no copies on this system */
    dir = hp_openat(run, HP_SHARED_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    if (dir < 0)
        goto out;
    *why = S_UNTRUSTED;
    if (!roots_alone(run, 1, &st) || !roots_alone(dir, 1, &st) || !on_tmpfs(dir))
        goto out;
    /* The windows are one file's bytes at their offsets, and which file: the key. */
    *why = S_NOT_MAPPED;
    if (hp_range_maps_file(c, (uintptr_t)r->at, r->nwin * c->hp, r->off, r->prot, &file) != 1)
        goto out;
    key_name(key, &file);
    obj = hp_openat(dir, key, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
    if (obj < 0) {
        *why = obj == -ENOENT ? S_NO_COPY : S_UNTRUSTED; /* ELOOP: a symbolic link */
        goto out;
    }
    /* The object's file, to compare with the record: that very inode. */
    *why = S_REPLACED;
    if (*fd < 0 && path)
        *fd = hp_open(path, O_RDONLY);
    if (*fd < 0 || hp_fd_is_file(c, *fd, &file) != 1)
        goto out;
    rfd = hp_openat(obj, HP_SHARED_RECORD, O_RDONLY | O_NOFOLLOW, 0);
    if (rfd < 0 || !roots_alone(obj, 1, &st) || !roots_alone(rfd, 0, &st)) {
        *why = rfd == -ENOENT ? S_NO_COPY : S_UNTRUSTED;
        goto out;
    }
    long n = hp_read(rfd, text, sizeof text - 1);
    text[n > 0 ? n : 0] = 0;
    if (n <= 0 || parse_record(text, rec) != 0 || rec->major != file.dev_major || rec->minor != file.dev_minor ||
        rec->inode != file.inode) {
        *why = S_UNTRUSTED;
        goto out;
    }
    /* The original as it is now against the record: written since the copy, it is another
     * file's bytes (dpkg and rpm rename a new version over the path, which is another
     * inode and finds no record; this is a write in place). */
    *why = S_STALE;
    if (hp_fstat(*fd, &st) != 0 || (uint64_t)st.st_size != rec->size || ns(&st.st_mtim) != rec->mtime_ns ||
        ns(&st.st_ctim) != rec->ctime_ns)
        goto out;
    copy = hp_openat(obj, rec->name, O_RDONLY | O_NOFOLLOW, 0);
    if (copy < 0) {
        *why = copy == -ENOENT ? S_NO_COPY : S_UNTRUSTED;
        goto out;
    }
    *why = S_UNTRUSTED;
    if (!roots_alone(copy, 0, &st) || !on_tmpfs(copy))
        goto out;
    /* Sealed by root: any write to the copy since changes its change time, which nobody
     * can set back. */
    *why = S_CHANGED;
    if ((uint64_t)st.st_ino != rec->copy_inode || ns(&st.st_ctim) != rec->copy_ctime_ns ||
        (uint64_t)st.st_size != rec->size)
        goto out;
    *why = S_MAPPED;
out:
    for (int *d = (int[]){run, dir, obj, rfd}, k = 0; k < 4; k++)
        if (d[k] >= 0)
            hp_close(d[k]);
    if (*why != S_MAPPED && copy >= 0) {
        hp_close(copy);
        copy = -1;
    }
    return copy;
}

/* Whether the two windows hold the same bytes. */
static int same_bytes(const char *a, const char *b, uint64_t n)
{
    const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
    for (uint64_t i = 0; i < n / 8; i++)
        if (x[i] != y[i])
            return 0;
    return 1;
}

/* Maps window `w` (file offset `woff`) from the copy: aside first, checked to be one PMD
 * (and, under a debugger, to hold the window's bytes: no breakpoint written into it),
 * then moved over the window with one mremap, which replaces it whole or not at all. */
static enum shared_why map_window(struct hp_ctx *c, char *w, uint64_t woff, int prot, int copy, int traced,
                                  long *err)
{
    uint64_t hp = c->hp;
    enum shared_why why = S_MAPPED;
    char *res = hp_mmap(0, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_mmap_failed(res)) {
        *err = -(long)res;
        return S_MMAP;
    }
    char *aside = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    void *p = hp_mmap(aside, hp, prot, MAP_PRIVATE | MAP_FIXED, copy, woff);
    if (hp_mmap_failed(p)) {
        *err = -(long)p;
        why = S_MMAP;
    } else {
        (void)*(const volatile char *)aside; /* in memory already: maps it, reads nothing */
        int pmd = hp_window_is_pmd(c, aside, "ShmemPmdMapped:");
        if (pmd != 1)
            why = pmd < 0 ? S_UNVERIFIED : S_NOT_HUGE;
        else if (traced && (!(prot & PROT_READ) || !same_bytes(aside, w, hp)))
            why = S_TRACED;
        else {
            long rc = (long)hp_mremap(aside, hp, hp, HP_MREMAP_MAYMOVE | HP_MREMAP_FIXED, w);
            if (rc != (long)w) {
                *err = rc < 0 ? -rc : 0;
                why = S_MREMAP;
            }
        }
    }
    hp_munmap(res, 2 * hp); /* what is left: the reservation, and the copy if not moved */
    return why;
}

#define BATCH 64

/* Maps the `n` adjacent windows from `w` on (file offset `woff`) from the copy at once:
 * one mapping aside, one PAGEMAP_SCAN, one mremap, where every window is one PMD (the
 * common case: a few system calls for an object whatever its size). 1 done; 0 nothing
 * replaced (a window is not huge, the kernel cannot tell them apart, or a call failed):
 * the caller goes window by window. */
static int map_batch(struct hp_ctx *c, char *w, uint64_t n, uint64_t woff, int prot, int copy)
{
    uint64_t hp = c->hp, len = n * hp;
    unsigned char huge[BATCH];
    int done = 0;
    char *res = hp_mmap(0, len + hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_mmap_failed(res))
        return 0;
    char *aside = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    if (!hp_mmap_failed(hp_mmap(aside, len, prot, MAP_PRIVATE | MAP_FIXED, copy, woff))) {
        for (uint64_t i = 0; i < n; i++)
            (void)*(const volatile char *)(aside + i * hp);
        int all = hp_windows_are_pmd(c, aside, n, huge) == 0;
        for (uint64_t i = 0; all && i < n; i++)
            all = huge[i];
        done = all && (long)hp_mremap(aside, len, len, HP_MREMAP_MAYMOVE | HP_MREMAP_FIXED, w) == (long)w;
    }
    hp_munmap(res, len + hp);
    return done;
}

static void debug_line(const char *rundir, const char *key, const struct record *rec, const char *path,
                       uint64_t nwin, uint64_t mapped, uint64_t first_bad, enum shared_why why, long err)
{
    static char b[2 * 4096 + 512];
    size_t n = 0;
    const char *parts[] = {"hugify-audit: shared ", path, ": "};
    for (unsigned k = 0; k < 3; k++)
        for (const char *p = parts[k]; *p && n < 4096 + 64; p++)
            b[n++] = *p;
    n += hp_put_num(b + n, mapped, 10);
    b[n++] = '/';
    n += hp_put_num(b + n, nwin, 10);
    const char *tail[] = {" windows mapped", mapped ? " from " : "", mapped ? rundir : "", mapped ? "/" : "",
                          mapped ? HP_SHARED_DIR "/" : "", mapped ? key : "", mapped ? "/" : "",
                          mapped ? rec->name : ""};
    for (unsigned k = 0; k < sizeof tail / sizeof tail[0]; k++)
        for (const char *p = tail[k]; *p && n < 2 * 4096; p++)
            b[n++] = *p;
    if (mapped < nwin) {
        const char *w[] = {", window "};
        for (const char *p = w[0]; *p; p++)
            b[n++] = *p;
        n += hp_put_num(b + n, first_bad, 10);
        b[n++] = ' ';
        for (const char *p = why_text[why]; *p; p++)
            b[n++] = *p;
        if (err) {
            for (const char *p = " (errno "; *p; p++)
                b[n++] = *p;
            n += hp_put_num(b + n, (uint64_t)err, 10);
            b[n++] = ')';
        }
        for (const char *p = why == S_NOT_NEEDED ? ": file-backed" : ": file mapping kept"; *p; p++)
            b[n++] = *p;
    }
    b[n++] = '\n';
    hp_write(2, b, n);
}

uint64_t hp_shared_map(struct hp_ctx *c, const char *rundir, int off, int debug, struct hp_shared_range *r, int fd,
                       const char *path)
{
    uint64_t hp = c->hp, mapped = 0, first_bad = 0, wanted = 0;
    enum shared_why first_why = S_MAPPED, why = S_MAPPED;
    long first_err = 0;
    struct record rec;
    char key[64];
    int own = fd < 0, copy = -1;
    for (uint64_t i = 0; r->states && i < r->nwin; i++)
        wanted += r->states[i].state == HP_UNSUPPORTED;
    if (!wanted)
        return 0; /* file-backed huge pages work (or nothing is known): not this mode's */
    rec.name[0] = 0;
    key[0] = 0;
    if (off)
        why = S_OFF;
    else
        copy = open_copy(c, rundir, r, &fd, own ? path : 0, &rec, key, &why);
    /* Every window wanted and nothing in the way: in batches. What is left (a window
     * the batch could not take, a debugger, ld.so's code) goes window by window below. */
    int batch = why == S_MAPPED && wanted == r->nwin && !r->traced &&
                !(r->keep >= (uintptr_t)r->at && r->keep - (uintptr_t)r->at < r->nwin * hp) && r->off + r->nwin * hp <= rec.size;
    for (uint64_t i = 0; batch && i < r->nwin; i += BATCH) {
        uint64_t n = r->nwin - i < BATCH ? r->nwin - i : BATCH;
        if (map_batch(c, r->at + i * hp, n, r->off + i * hp, r->prot, copy))
            for (uint64_t k = i; k < i + n; k++)
                r->states[k].state = HP_HUGE, r->states[k].why = HP_WHY_NONE, mapped++;
    }
    for (uint64_t i = 0; i < r->nwin; i++) {
        char *w = r->at + i * hp;
        if (batch && r->states[i].state == HP_HUGE)
            continue; /* mapped in its batch */
        uint64_t woff = r->off + i * hp;
        enum shared_why wwhy = why;
        long err = 0;
        if (r->states[i].state != HP_UNSUPPORTED)
            wwhy = S_NOT_NEEDED;
        else if (wwhy == S_MAPPED && woff + hp > rec.size)
            wwhy = S_CHANGED; /* cannot be: the record's size is the original's */
        else if (wwhy == S_MAPPED && r->keep >= (uintptr_t)w && r->keep < (uintptr_t)w + hp)
            wwhy = S_LOADER;
        else if (wwhy == S_MAPPED)
            wwhy = map_window(c, w, woff, r->prot, copy, r->traced, &err);
        if (wwhy == S_MAPPED) {
            mapped++;
            r->states[i].state = HP_HUGE;
            r->states[i].why = HP_WHY_NONE;
        } else if (first_why == S_MAPPED) {
            first_bad = i, first_why = wwhy, first_err = err;
        }
    }
    if (copy >= 0)
        hp_close(copy);
    if (own && fd >= 0)
        hp_close(fd);
    if (debug)
        debug_line(rundir, key, &rec, path, r->nwin, mapped, first_bad, first_why, first_err);
    return mapped;
}
