/* What the runtime knows of large folios, and its records; see hp_verdict.h. */
#include "hp_verdict.h"

#include <errno.h>
#include <sys/mman.h>

#include "hp_base.h"
#include "hp_map.h"
#include "hp_sys.h"

#define HP_S_IFMT 0170000
#define HP_S_IFDIR 0040000
#define HP_S_IFREG 0100000

/* --- the runtime directory and its records ------------------------------------------
 *
 * A record steers every process of the boot (a filesystem's windows are then neither
 * read nor evicted by anyone), so it counts only if no one but root can have made it:
 * the directory is root's and writable by root alone, and so is the record; neither is
 * reached through a symlink at its last component. Root writes a record beside it under
 * a fresh name (O_EXCL|O_NOFOLLOW) and renames it into place, relative to the
 * directory's descriptor: a symlink planted at either name is replaced, never followed.
 * A process that is not root never writes one: what it learns stays in its memory. */

/* Whether the descriptor's file is root's, of type `type`, writable by root alone. */
static int root_only(int fd, unsigned type)
{
    struct hp_statx st;
    return hp_statx(fd, 0, &st) == 0 && st.uid == 0 && (st.mode & HP_S_IFMT) == type && !(st.mode & 022);
}

/* Opens dirfd/name (not through a symlink) if it is root's, of `type`, writable by root
 * alone; -1 otherwise, *rc the open's result. */
static int open_root_only(int dirfd, const char *name, int flags, unsigned type, int *rc)
{
    int fd = hp_openat(dirfd, name, flags | O_NOFOLLOW, 0);
    *rc = fd;
    if (fd >= 0 && !root_only(fd, type)) {
        hp_close(fd);
        fd = -1;
    }
    return fd < 0 ? -1 : fd;
}

static int open_dir(const char *dir, int *missing)
{
    int rc, fd = open_root_only(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY, HP_S_IFDIR, &rc);
    *missing = rc == -ENOENT;
    return fd;
}

static int open_record(int dirfd, const char *name)
{
    int rc;
    return open_root_only(dirfd, name, O_RDONLY | O_NONBLOCK, HP_S_IFREG, &rc);
}

int hp_record_open_in(const char *dir, const char *name)
{
    int missing, dfd = open_dir(dir, &missing);
    if (dfd < 0)
        return -1;
    int fd = open_record(dfd, name);
    hp_close(dfd);
    return fd;
}

/* The runtime directory's checked descriptor, or -1. */
static int rundir(struct hp_ctx *c)
{
    if (c->rundir_state == 0 && c->rundir) {
        int missing;
        c->rundir_fd = open_dir(c->rundir, &missing);
        c->rundir_state = c->rundir_fd >= 0 ? 1 : missing ? -1 : -2;
    }
    return c->rundir_state == 1 ? c->rundir_fd : -1;
}

int hp_record_open(struct hp_ctx *c, const char *name)
{
    int dfd = rundir(c);
    return dfd >= 0 ? open_record(dfd, name) : -1;
}

static long euid(struct hp_ctx *c)
{
    if (c->euid < 0)
        c->euid = hp_geteuid();
    return c->euid;
}

/* Whether the descriptor's filesystem is mounted writable. */
static int writable_fs(int fd)
{
    long flags = 0;
    return hp_fstatfs_flags(fd, &flags) == 0 && !(flags & HP_ST_RDONLY);
}

int hp_may_record(struct hp_ctx *c)
{
    if (c->may_record < 0) {
        c->may_record = 0;
        if (c->rundir && euid(c) == 0) {
            if (rundir(c) < 0 && c->rundir_state == -1 && hp_mkdir(c->rundir, 0755) == 0)
                c->rundir_state = 0; /* made now: open and check it */
            /* A directory on a filesystem mounted read-only (a container's /run) keeps
             * nothing either. */
            c->may_record = rundir(c) >= 0 && writable_fs(c->rundir_fd);
        }
    }
    return c->may_record;
}

int hp_could_record(struct hp_ctx *c)
{
    if (c->may_record >= 0 || !c->rundir || euid(c) != 0)
        return c->may_record > 0;
    if (rundir(c) >= 0)
        return writable_fs(c->rundir_fd);
    if (c->rundir_state != -1)
        return 0; /* not to be honoured: nothing is written there either */
    char parent[1024];
    size_t n = hp_strlen(c->rundir);
    while (n > 1 && c->rundir[n - 1] == '/')
        n--;
    while (n > 0 && c->rundir[n - 1] != '/')
        n--;
    if (n == 0 || n >= sizeof parent)
        return 0;
    hp_copy_str(parent, n + 1, c->rundir); /* up to and with the slash */
    int fd = hp_open(parent, O_RDONLY | O_DIRECTORY);
    int ok = fd >= 0 && writable_fs(fd);
    if (fd >= 0)
        hp_close(fd);
    return ok;
}

int hp_record_write(struct hp_ctx *c, const char *name, const char *text, size_t n)
{
    static unsigned serial;
    if (!hp_may_record(c))
        return -1;
    char tmp[64] = ".tmp-";
    int fd = -EEXIST;
    for (int tries = 0; tries < 16 && fd == -EEXIST; tries++) { /* a name taken: the next one */
        size_t k = 5;
        k += hp_put_num(tmp + k, (uint64_t)hp_getpid(), 10);
        tmp[k++] = '-';
        k += hp_put_num(tmp + k, serial++, 10);
        tmp[k] = 0;
        fd = hp_openat(c->rundir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
    }
    if (fd < 0)
        return -1;
    long w = hp_write(fd, text, n);
    long m = hp_fchmod(fd, 0644); /* whatever the umask: other users' processes read it */
    hp_close(fd);
    if (w == (long)n && m == 0 && hp_renameat(c->rundir_fd, tmp, name) == 0)
        return 0;
    hp_unlinkat(c->rundir_fd, tmp);
    return -1;
}

int hp_record_drop(struct hp_ctx *c, const char *name)
{
    if (!hp_may_record(c))
        return -1;
    long rc = hp_unlinkat(c->rundir_fd, name);
    return rc == 0 || rc == -ENOENT ? 0 : -1;
}

struct hp_verdict hp_read_verdict(struct hp_ctx *c)
{
    struct hp_verdict v = {0, 0, 0};
    char rec[128], boot[37];
    int fd = hp_record_open(c, HP_KERNEL_RECORD);
    if (fd < 0)
        return v;
    long r = hp_read(fd, rec, sizeof rec - 1);
    hp_close(fd);
    /* "<boot id, 36 characters> <0|1|-> <mode>\n" */
    if (r < 40 || rec[36] != ' ' || rec[38] != ' ' || hp_boot_id(boot) != 0)
        return v;
    rec[r] = 0;
    for (int i = 0; i < 36; i++)
        if (rec[i] != boot[i])
            return v;
    v.valid = 1;
    v.aware = rec[37] == '1';
    v.thp_never = hp_starts_with(rec + 39, "nev");
    return v;
}

/* --- what is known of a file and its filesystem ---------------------------------------- */

/* Fills t's identity (device, inode, ctime, size) and its filesystem's entry (one statx;
 * the filesystem's type is asked for when a record or the hint needs it). */
static struct hp_fs_note *identify(struct hp_ctx *c, struct hp_target *t)
{
    if (t->ident == 0) {
        struct hp_statx st;
        t->ident = -1;
        t->fs = -1;
        if (t->fd < 0 && t->open_file && t->open_file(t) >= 0)
            t->own_fd = 1; /* the main program: its path is found with its descriptor */
        if (t->fd >= 0 ? hp_statx(t->fd, 0, &st) != 0 : !t->path || hp_statx(-1, t->path, &st) != 0)
            return 0;
        t->ident = 1;
        t->knowable = euid(c) == 0 || (uint64_t)euid(c) == st.uid;
        t->ino = st.ino;
        t->fsize = st.size;
        t->ctime_sec = st.ctime.sec;
        t->ctime_nsec = st.ctime.nsec;
        for (uint32_t i = 0; i < c->nfs && t->fs < 0; i++)
            if (c->fs[i].major == st.dev_major && c->fs[i].minor == st.dev_minor)
                t->fs = (int)i;
        if (t->fs < 0 && c->nfs < HP_MAX_FS) {
            struct hp_fs_note *n = &c->fs[c->nfs];
            hp_memzero(n, sizeof *n);
            n->major = st.dev_major;
            n->minor = st.dev_minor;
            n->magic = -1;
            t->fs = (int)c->nfs++;
        }
    }
    return t->ident == 1 && t->fs >= 0 ? &c->fs[t->fs] : 0;
}

/* The filesystem's type (statfs f_type), asked of t's file the first time; 0 unknown. */
static long fs_magic(struct hp_fs_note *fs, const struct hp_target *t)
{
    if (fs->magic < 0) {
        long type = 0;
        if (t->fd >= 0 ? hp_fstatfs_type(t->fd, &type) != 0 : !t->path || hp_statfs_type(t->path, &type) != 0)
            type = 0;
        fs->magic = type;
    }
    return fs->magic;
}

/* "no-large-folios-MAJ:MIN", and "-INODE" for the file's record. */
static void record_name(const struct hp_fs_note *fs, const struct hp_target *file, char out[96])
{
    size_t n = 0;
    for (const char *p = HP_NO_LARGE_FOLIOS_PREFIX; *p; p++)
        out[n++] = *p;
    n += hp_put_num(out + n, fs->major, 10);
    out[n++] = ':';
    n += hp_put_num(out + n, fs->minor, 10);
    if (file) {
        out[n++] = '-';
        n += hp_put_num(out + n, file->ino, 10);
    }
    out[n] = 0;
}

/* The record's text: "BOOT-ID MAGIC\n", the file's "BOOT-ID MAGIC CTIME SIZE\n"; t is the
 * file it is about, or the one the filesystem's type is asked of (file NULL). */
static size_t record_text(struct hp_fs_note *fs, const struct hp_target *t, const struct hp_target *file,
                          char out[160])
{
    long magic = fs_magic(fs, t);
    if (!magic || hp_boot_id(out) != 0)
        return 0;
    size_t n = 36;
    out[n++] = ' ';
    n += hp_put_num(out + n, (uint64_t)(unsigned long)magic, 16);
    if (file) {
        out[n++] = ' ';
        n += hp_put_num(out + n, (uint64_t)file->ctime_sec, 10);
        out[n++] = '.';
        n += hp_put_num(out + n, file->ctime_nsec, 10);
        out[n++] = ' ';
        n += hp_put_num(out + n, file->fsize, 10);
    }
    out[n++] = '\n';
    return n;
}

/* Whether the record `name` exists (honoured) and says exactly what this boot's record
 * of fs (or of the file) would: the device number of a filesystem without one of its
 * own (btrfs, tmpfs) can be reused by another after an unmount, an inode number by
 * another file after a package upgrade. */
static int recorded(struct hp_ctx *c, struct hp_fs_note *fs, const struct hp_target *t, const struct hp_target *file)
{
    char name[96], want[160], got[161];
    record_name(fs, file, name);
    int fd = hp_record_open(c, name);
    if (fd < 0)
        return 0; /* the common case: nothing recorded */
    long r = hp_read(fd, got, sizeof got - 1);
    hp_close(fd);
    size_t n = record_text(fs, t, file, want);
    if (!n || r != (long)n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return 0;
    return 1;
}

static void look_up_fs(struct hp_ctx *c, struct hp_fs_note *fs, const struct hp_target *t)
{
    if (fs->looked)
        return;
    fs->looked = 1;
    if (fs->large == 0 && recorded(c, fs, t, 0)) {
        fs->large = -1;
        fs->source = HP_WHY_NO_LARGE_FOLIOS;
        fs->recorded = 1;
    }
}

static void look_up_file(struct hp_ctx *c, struct hp_fs_note *fs, struct hp_target *t)
{
    if (t->file_looked)
        return;
    t->file_looked = 1;
    /* The file's verdict only: the filesystem's is concluded from two files this process
     * read itself (hp_small_read), never from a record of one. */
    if (recorded(c, fs, t, t))
        t->file_none = t->file_recorded = 1;
}

int hp_large_folios_since(long magic)
{
    static const struct {
        long magic;
        int since;
    } table[] = {
        {0x58465342, 5018}, /* XFS */
        {0xEF53, 6016},     /* ext4 */
        {0x9123683E, 0},    /* btrfs */
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].magic == magic)
            return table[i].since;
    return -1;
}

int hp_kernel_version(struct hp_ctx *c)
{
    if (c->kernel_version == 0) {
        char rel[65];
        int major = 0, minor = 0, i = 0;
        c->kernel_version = -1;
        if (hp_uname_release(rel) != 0)
            return -1;
        while (rel[i] >= '0' && rel[i] <= '9')
            major = major * 10 + (rel[i++] - '0');
        if (rel[i++] != '.' || rel[i] < '0' || rel[i] > '9')
            return -1;
        while (rel[i] >= '0' && rel[i] <= '9')
            minor = minor * 10 + (rel[i++] - '0');
        c->kernel_version = major * 1000 + minor;
    }
    return c->kernel_version;
}

/* Whether this kernel's version says fs gives no large folios (hp_large_folios_since). */
static int ruled_out(struct hp_ctx *c, struct hp_fs_note *fs, const struct hp_target *t)
{
    int since = hp_large_folios_since(fs_magic(fs, t)), version = hp_kernel_version(c);
    return since == 0 || (since > 0 && version > 0 && version < since);
}

int hp_kernel_rules_out(struct hp_ctx *c, struct hp_target *t)
{
    struct hp_fs_note *fs = identify(c, t);
    return fs && ruled_out(c, fs, t);
}

enum hp_why hp_known_none(struct hp_ctx *c, struct hp_target *t)
{
    struct hp_fs_note *fs = identify(c, t);
    if (!fs)
        return HP_WHY_NONE; /* nothing known: go ahead */
    look_up_fs(c, fs, t);
    if (fs->large < 0)
        return (enum hp_why)fs->source;
    look_up_file(c, fs, t);
    if (t->file_none)
        return HP_WHY_FILE_NO_LARGE_FOLIOS;
    /* A process that cannot keep what it finds out would find it out again at every
     * start, evicting and reading a window each time: it takes the kernel's version and
     * the filesystem's type for it instead, until a window is seen in a 2 MiB folio.
     * That is every process but root's with a runtime directory it can write, or make
     * (root in a chroot or container without /run, or with /run read-only, keeps
     * nothing). */
    if (fs->large == 0 && !hp_could_record(c) && ruled_out(c, fs, t)) {
        fs->large = -1;
        fs->source = HP_WHY_KERNEL_VERSION;
        return HP_WHY_KERNEL_VERSION;
    }
    return HP_WHY_NONE;
}

int hp_residency_knowable(struct hp_ctx *c, struct hp_target *t)
{
    if (euid(c) == 0)
        return 1; /* CAP_FOWNER, or the owner of root's files */
    identify(c, t);
    return t->ident != 1 || t->knowable;
}

int hp_known_large(struct hp_ctx *c, struct hp_target *t)
{
    struct hp_fs_note *fs = identify(c, t);
    return fs && fs->large > 0;
}

void hp_saw_large(struct hp_ctx *c, struct hp_target *t)
{
    struct hp_fs_note *fs = identify(c, t);
    if (!fs)
        return;
    char name[96];
    if (c->thorough) {
        look_up_fs(c, fs, t);
        look_up_file(c, fs, t);
    }
    if (fs->recorded) {
        record_name(fs, 0, name);
        hp_record_drop(c, name);
        fs->recorded = 0;
    }
    if (t->file_recorded) {
        record_name(fs, t, name);
        hp_record_drop(c, name);
        t->file_recorded = 0;
    }
    fs->large = 1;
    fs->looked = 1; /* a record found later would be contradicted already */
    t->file_none = 0;
    t->file_looked = 1;
}

/* --- the process's circumstances ------------------------------------------------------ */

struct cgroup_query {
    char v1[1024]; /* the memory controller's path (cgroup v1), or "" */
    char v2[1024]; /* the unified hierarchy's path, or "" */
};

/* "ID:CONTROLLERS:PATH": the memory controller's line, or cgroup v2's "0::PATH". */
static int cgroup_line(const char *line, void *arg)
{
    struct cgroup_query *q = arg;
    const char *ctl = line;
    while (*ctl && *ctl != ':')
        ctl++;
    if (!*ctl)
        return 0;
    const char *path = ++ctl;
    while (*path && *path != ':')
        path++;
    if (!*path)
        return 0;
    if (path == ctl && hp_starts_with(line, "0:")) {
        hp_copy_str(q->v2, sizeof q->v2, path + 1);
        return 0;
    }
    for (const char *p = ctl; p < path;) { /* "cpu,memory": one of the comma-separated names */
        const char *e = p;
        while (e < path && *e != ',')
            e++;
        if (e - p == 6 && hp_starts_with(p, "memory")) {
            hp_copy_str(q->v1, sizeof q->v1, path + 1);
            return 1;
        }
        p = e + 1;
    }
    return 0;
}

/* A number from the start of the file at dir/name; "max" (cgroup v2) is UINT64_MAX. */
static int read_u64(const char *dir, const char *name, uint64_t *v)
{
    char path[1200], buf[32];
    if (hp_join(path, sizeof path, dir, name, 0) != 0)
        return -1;
    int fd = hp_open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    long n = hp_read(fd, buf, sizeof buf - 1);
    hp_close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    if (hp_starts_with(buf, "max")) {
        *v = ~0ULL;
        return 0;
    }
    *v = 0;
    for (long i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
        *v = *v * 10 + (uint64_t)(buf[i] - '0');
    return 0;
}

/* Whether the process's memory cgroup and every one above it have room for a few huge
 * pages below their limits (memory.max / memory.current; cgroup v1:
 * memory.limit_in_bytes / memory.usage_in_bytes). Where the files cannot be read (no
 * cgroup filesystem mounted, a chroot) the limit is taken to be none. */
static int cgroup_room(struct hp_ctx *c)
{
    struct cgroup_query q;
    char dir[1200];
    q.v1[0] = q.v2[0] = 0;
    hp_each_line("/proc/self/cgroup", cgroup_line, &q);
    const char *base = q.v1[0] ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
    const char *limit = q.v1[0] ? "memory.limit_in_bytes" : "memory.max";
    const char *usage = q.v1[0] ? "memory.usage_in_bytes" : "memory.current";
    if (hp_join(dir, sizeof dir, base, q.v1[0] ? q.v1 : q.v2, 0) != 0)
        return 1;
    size_t root = hp_strlen(base);
    for (;;) {
        uint64_t max, cur;
        if (read_u64(dir, limit, &max) == 0 && read_u64(dir, usage, &cur) == 0 && max != ~0ULL &&
            max < cur + HP_CGROUP_ROOM * c->hp)
            return 0;
        size_t n = hp_strlen(dir);
        while (n > root && dir[n - 1] == '/')
            n--;
        while (n > root && dir[n - 1] != '/')
            n--;
        if (n <= root)
            return 1;
        dir[n - 1] = 0; /* one level up */
    }
}

/* The control: an anonymous MADV_HUGEPAGE window of the process's own, written once.
 * 1 it is one huge page, 0 it is not, -1 cannot tell. The kernel charges it to the same
 * memory cgroup and allocates it under the same policy, cpuset and watermarks as a
 * folio of the page cache read for the process. */
static int own_huge_page(struct hp_ctx *c)
{
    uint64_t hp = c->hp;
    char *res = hp_mmap(0, 2 * hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_mmap_failed(res))
        return -1;
    char *w = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int got = -1;
    if (hp_madvise(w, hp, MADV_HUGEPAGE) == 0) {
        *(volatile char *)w = 1; /* a VMA of its own (its flags differ from the rest's) */
        got = hp_anon_window_is_pmd(c, w);
    }
    hp_munmap(res, 2 * hp);
    return got;
}

/* --- room for a 2 MiB folio, as the page cache asks for one ---------------------------
 *
 * The page cache allocates a readahead folio with __GFP_NORETRY (readahead_gfp_mask):
 * past the free lists it tries reclaim and compaction once and gives up, where the
 * anonymous MADV_HUGEPAGE page of own_huge_page compacts until it has one. So whether a
 * read could have had its 2 MiB folio is read off the zones as the allocator's first
 * tries see them: some zone above ZONE_DMA (hp_buddy_block) with a free block of 2 MiB or
 * more whose free pages, that block taken, stay above its min watermark and the reserve
 * it keeps against allocations that could use the zones above (__zone_watermark_ok with
 * the page cache's highest zone, ZONE_MOVABLE: the largest of zoneinfo's protection). */

#define MAX_ZONES 32

struct zone_room {
    uint32_t n;
    struct {
        long node;
        char name[16];
        int64_t free, min, reserve;
    } z[MAX_ZONES];
};

/* A number at p (spaces first); *end after it. */
static int64_t number_at(const char *p, const char **end)
{
    int64_t v = 0;
    while (*p == ' ' || *p == '\t' || *p == '(' || *p == ',')
        p++;
    while (*p >= '0' && *p <= '9')
        v = v * 10 + (*p++ - '0');
    *end = p;
    return v;
}

/* "Node N, zone NAME" (zoneinfo and buddyinfo lines start so): the node and the name's
 * start; NULL if the line is not one. */
static const char *zone_of(const char *line, long *node)
{
    const char *p = line;
    if (!hp_starts_with(p, "Node "))
        return 0;
    *node = (long)number_at(p + 5, &p);
    if (!hp_starts_with(p, ", zone"))
        return 0;
    p += 6;
    while (*p == ' ')
        p++;
    return p;
}

static size_t word_len(const char *p)
{
    size_t n = 0;
    while (p[n] && p[n] != ' ' && p[n] != '\t')
        n++;
    return n;
}

static int zoneinfo_line(const char *line, void *arg)
{
    struct zone_room *r = arg;
    long node;
    const char *name = zone_of(line, &node), *p = line, *end;
    if (name) {
        size_t n = word_len(name);
        if (r->n < MAX_ZONES && n < sizeof r->z[0].name) {
            r->z[r->n].node = node;
            for (size_t i = 0; i < n; i++)
                r->z[r->n].name[i] = name[i];
            r->z[r->n].name[n] = 0;
            r->z[r->n].free = r->z[r->n].min = r->z[r->n].reserve = 0;
            r->n++;
        }
        return 0;
    }
    if (!r->n)
        return 0;
    while (*p == ' ')
        p++;
    if (hp_starts_with(p, "pages free "))
        r->z[r->n - 1].free = number_at(p + 11, &end);
    else if (hp_starts_with(p, "min "))
        r->z[r->n - 1].min = number_at(p + 4, &end);
    else if (hp_starts_with(p, "protection: (")) {
        for (p += 12; *p && *p != ')';) {
            int64_t v = number_at(p, &end);
            if (end == p)
                break;
            if (v > r->z[r->n - 1].reserve)
                r->z[r->n - 1].reserve = v;
            p = end;
        }
    }
    return 0;
}

/* A /proc/buddyinfo line: "Node 0, zone Normal N0 N1 …" (free blocks per order). ZONE_DMA
 * (the first 16 MiB) does not count: what its reserve for the zones above leaves of it is
 * no use to huge pages, and blocks stay listed free there when every other zone has none. */
int hp_buddy_block(const char *line, unsigned order)
{
    unsigned field = 0;
    const char *p = line;
    while (*p) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        if (field == 3 && hp_starts_with(p, "DMA") && (p[3] == ' ' || p[3] == '\t'))
            return 0;
        int nonzero = 0;
        for (; *p && *p != ' ' && *p != '\t'; p++)
            nonzero |= *p >= '1' && *p <= '9';
        if (field >= 4 + order && nonzero)
            return 1;
        field++;
    }
    return 0;
}

static int buddy_line(const char *line, void *arg) { return hp_buddy_block(line, *(unsigned *)arg); }

/* A window read in again as small folios while no zone has a free block of a huge page
 * or more says memory is fragmented (hp_verdict.h, hp_circumstances). */
int hp_free_huge_blocks(struct hp_ctx *c)
{
    unsigned order = 0;
    while ((HP_PAGE << order) < c->hp)
        order++;
    return hp_each_line("/proc/buddyinfo", buddy_line, &order) == 1;
}

struct buddy_room {
    const struct zone_room *zones;
    unsigned order; /* of a huge page */
};

/* A buddyinfo line of a zone that has a free block of a huge page or more (buddy_line)
 * and, that block taken, free pages above its min watermark and reserve. */
static int buddy_room_line(const char *line, void *arg)
{
    const struct buddy_room *b = arg;
    long node;
    const char *name = zone_of(line, &node);
    if (!name || !hp_buddy_block(line, b->order))
        return 0;
    size_t n = word_len(name);
    for (uint32_t i = 0; i < b->zones->n; i++) {
        const char *zn = b->zones->z[i].name;
        if (b->zones->z[i].node != node || hp_strlen(zn) != n || !hp_starts_with(name, zn))
            continue;
        return b->zones->z[i].free - ((int64_t)1 << b->order) + 1 > b->zones->z[i].min + b->zones->z[i].reserve;
    }
    return 0;
}

/* Whether the page cache could have a 2 MiB folio now without reclaim or compaction. */
static int page_cache_room(struct hp_ctx *c)
{
    struct zone_room zones;
    struct buddy_room b = {&zones, 0};
    zones.n = 0;
    while ((HP_PAGE << b.order) < c->hp)
        b.order++;
    if (hp_each_line("/proc/zoneinfo", zoneinfo_line, &zones) != 0 || !zones.n)
        return hp_free_huge_blocks(c); /* no zoneinfo (restricted /proc): the blocks alone */
    return hp_each_line("/proc/buddyinfo", buddy_room_line, &b) == 1;
}

enum hp_why hp_memory_room(struct hp_ctx *c)
{
    if (!page_cache_room(c))
        return HP_WHY_FRAGMENTED;
    if (!cgroup_room(c))
        return HP_WHY_CGROUP_LIMIT;
    return HP_WHY_NONE;
}

enum hp_why hp_circumstances(struct hp_ctx *c)
{
    enum hp_why why = hp_memory_room(c);
    if (why == HP_WHY_NONE && own_huge_page(c) != 1)
        why = HP_WHY_NO_HUGE_PAGE;
    return why;
}

enum hp_why hp_small_read(struct hp_ctx *c, struct hp_target *t)
{
    /* The file gave small folios to reads of this process's own (hp_core.c repair). */
    struct hp_fs_note *fs = identify(c, t);
    t->file_none = 1;
    if (!fs)
        return HP_WHY_FILE_NO_LARGE_FOLIOS;
    char name[96], text[160];
    size_t n;
    look_up_fs(c, fs, t);
    if (fs->large == 0 && fs->small_ino && fs->small_ino != t->ino) {
        /* A second file of the filesystem: the filesystem's verdict. */
        fs->large = -1;
        fs->source = HP_WHY_NO_LARGE_FOLIOS;
        record_name(fs, 0, name);
        if ((n = record_text(fs, t, 0, text)) != 0)
            hp_record_write(c, name, text, n);
        return HP_WHY_NO_LARGE_FOLIOS;
    }
    if (fs->large == 0)
        fs->small_ino = t->ino;
    record_name(fs, t, name);
    if ((n = record_text(fs, t, t, text)) != 0)
        hp_record_write(c, name, text, n);
    return HP_WHY_FILE_NO_LARGE_FOLIOS;
}
