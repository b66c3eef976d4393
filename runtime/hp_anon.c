/* The anonymous-copy mode; see hp_anon.h and docs/runtime-reference.md. */
#include "hp_anon.h"

#include <elf.h>
#include <errno.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "hp_base.h"
#include "hp_elf.h"
#include "hp_map.h"
#include "hp_shared.h"
#include "hp_sys.h"
#include "hp_verdict.h"

#define HP_MREMAP_MAYMOVE 1
#define HP_MREMAP_FIXED 2

/* --- small output helpers (no libc) --- */

struct out {
    char buf[8192];
    size_t n;
    int fd;
    long err; /* the errno of the first write that failed (ENOSPC for a short one) */
};

static void out_flush(struct out *o)
{
    for (size_t done = 0; done < o->n && o->fd >= 0 && !o->err;) {
        long w = hp_write(o->fd, o->buf + done, o->n - done);
        if (w <= 0)
            o->err = w < 0 ? -w : ENOSPC;
        else
            done += (size_t)w;
    }
    o->n = 0;
}

static void out_str(struct out *o, const char *s)
{
    for (; *s; s++) {
        if (o->n == sizeof o->buf)
            out_flush(o);
        o->buf[o->n++] = *s;
    }
}

static void out_num(struct out *o, uint64_t v, unsigned base)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    char s[25];
    int n = 0;
    while (k)
        s[n++] = d[--k];
    s[n] = 0;
    out_str(o, s);
}

static int str_eq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* The buffer of a debug line on stderr, empty. */
static struct out *stderr_out(void)
{
    static struct out o;
    o.n = 0;
    o.fd = 2;
    o.err = 0;
    return &o;
}

/* --- settings --- */

struct env_values {
    char anonymous[16];
    int anonymous_set;
    char debug[8];
    char perf_map[8];
    char shared[8];
    char force_smaps[8];
    char runtime_dir[512];
};

static int env_entry(const char *e, void *arg)
{
    struct env_values *v = arg;
    if (hp_starts_with(e, HP_ANON_ENV "=")) {
        hp_copy_str(v->anonymous, sizeof v->anonymous, e + sizeof HP_ANON_ENV);
        v->anonymous_set = 1;
    } else if (hp_starts_with(e, "HUGIFY_DEBUG=")) {
        hp_copy_str(v->debug, sizeof v->debug, e + 13);
    } else if (hp_starts_with(e, "HUGIFY_FORCE_SMAPS=")) {
        hp_copy_str(v->force_smaps, sizeof v->force_smaps, e + 19);
    } else if (hp_starts_with(e, "HUGIFY_PERF_MAP=")) {
        hp_copy_str(v->perf_map, sizeof v->perf_map, e + 16);
    } else if (hp_starts_with(e, HP_SHARED_ENV "=")) {
        hp_copy_str(v->shared, sizeof v->shared, e + sizeof HP_SHARED_ENV);
    } else if (hp_starts_with(e, "HUGIFY_RUNTIME_DIR=")) {
        hp_copy_str(v->runtime_dir, sizeof v->runtime_dir, e + 19);
    }
    return 0;
}

static long self_exe(char *out, size_t cap)
{
    long n = HP_SYS(__NR_readlinkat, AT_FDCWD, "/proc/self/exe", out, cap - 1, 0, 0);
    out[n > 0 ? n : 0] = 0;
    return n;
}

static int record_line(const char *line, void *arg)
{
    return line[0] == '/' && str_eq(line, (const char *)arg);
}

void hp_anon_read_settings(struct hp_anon_settings *s)
{
    struct env_values v;
    hp_memzero(&v, sizeof v);
    hp_each_record("/proc/self/environ", 0, env_entry, &v);
    s->debug = v.debug[0] && !str_eq(v.debug, "0");
    s->perf_map = v.perf_map[0] && !str_eq(v.perf_map, "0") && !str_eq(v.perf_map, "off");
    s->force_smaps = v.force_smaps[0] && !str_eq(v.force_smaps, "0");
    s->shared_off = str_eq(v.shared, "0") || str_eq(v.shared, "off");
    hp_copy_str(s->runtime_dir, sizeof s->runtime_dir, v.runtime_dir[0] ? v.runtime_dir : "/run/hugify");
    s->mode = HP_ANON_OFF;
    if (v.anonymous_set) {
        if (str_eq(v.anonymous, "always"))
            s->mode = HP_ANON_ALWAYS;
        else if (v.anonymous[0] && !str_eq(v.anonymous, "0") && !str_eq(v.anonymous, "off"))
            s->mode = HP_ANON_UNSUPPORTED;
        return;
    }
    /* The policy's programs, as `hugify prefetch` recorded them (real paths), honoured
     * as every record is (hp_verdict.h: root's, in root's directory); most systems have
     * none, and the record is then absent. */
    char exe[4096];
    int fd = hp_record_open_in(s->runtime_dir, HP_ANON_RECORD);
    if (fd < 0)
        return;
    if (self_exe(exe, sizeof exe) > 0 && hp_each_line_fd(fd, record_line, exe) == 1)
        s->mode = HP_ANON_UNSUPPORTED;
    hp_close(fd);
}

/* --- the copy of one window --- */

/* Why a window was not copied: the token of the debug line. */
enum anon_why {
    WHY_COPIED,
    WHY_NOT_NEEDED, /* file-backed, and the mode copies only unsupported windows */
    WHY_THP_OFF,    /* transparent huge pages set to never */
    WHY_UNREADABLE, /* the segment is not readable: nothing to copy from */
    WHY_SELF,       /* the window holds this very code */
    WHY_MMAP,       /* no anonymous memory */
    WHY_MADVISE,    /* MADV_HUGEPAGE refused */
    WHY_FRAGMENTED, /* the copy is not one PMD and no 2 MiB block of memory is free */
    WHY_NOT_HUGE,   /* the copy is not one PMD, with free 2 MiB blocks (a memory cgroup's limit...) */
    WHY_UNVERIFIED, /* the kernel gives no way to tell */
    WHY_MPROTECT,
    WHY_MREMAP,
    WHY_NOT_MAPPED, /* the windows are not all one file's bytes at their offsets (overlapping loads) */
    WHY_REPLACED,   /* the file at the path is not the one mapped (or not proven to be) */
    WHY_BEYOND_EOF, /* the window ends past the end of the mapped file: reading it would fault */
};

static const char *const why_text[] = {
    [WHY_COPIED] = "copied",
    [WHY_NOT_NEEDED] = "not-needed",
    [WHY_THP_OFF] = "thp-off",
    [WHY_UNREADABLE] = "unreadable",
    [WHY_SELF] = "self",
    [WHY_MMAP] = "mmap",
    [WHY_MADVISE] = "madvise",
    /* the core's reason id (core/src/error.rs), which `hugify explain` knows */
    [WHY_FRAGMENTED] = "fragmented",
    [WHY_NOT_HUGE] = "not-huge",
    [WHY_UNVERIFIED] = "unverified",
    [WHY_MPROTECT] = "mprotect",
    [WHY_MREMAP] = "mremap",
    /* the core's reason ids */
    [WHY_NOT_MAPPED] = "not-mapped",
    [WHY_REPLACED] = "replaced",
    [WHY_BEYOND_EOF] = "beyond-eof",
};

static void copy_bytes(char *dst, const char *src, uint64_t n)
{
    uint64_t *d = (uint64_t *)dst;
    const uint64_t *s = (const uint64_t *)src;
    for (uint64_t i = 0; i < n / 8; i++)
        d[i] = s[i];
}

/* A fresh hp-aligned anonymous mapping of one huge page, a VMA of its own. */
static char *fresh_huge_area(uint64_t hp)
{
    char *res = hp_mmap(0, 2 * hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hp_mmap_failed(res))
        return 0;
    char *a = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    if (a > res)
        hp_munmap(res, (size_t)(a - res));
    if (a + hp < res + 2 * hp)
        hp_munmap(a + hp, (size_t)(res + 2 * hp - (a + hp)));
    return a;
}

/* Copies window `w` into anonymous memory and moves the copy over it. The copy is
 * checked to be one PMD before anything is replaced; on any failure the copy is
 * unmapped and the file mapping stays. *err gets the failing call's errno. */
static enum anon_why copy_window(struct hp_ctx *c, char *w, int prot, long *err)
{
    uint64_t hp = c->hp;
    char *a = fresh_huge_area(hp);
    if (!a)
        return WHY_MMAP;
    enum anon_why why = WHY_COPIED;
    long rc = hp_madvise(a, hp, MADV_HUGEPAGE);
    if (rc != 0) {
        why = WHY_MADVISE;
    } else {
        /* Never named (prctl PR_SET_VMA_ANON_NAME, where the kernel has
         * CONFIG_ANON_VMA_NAME): perf takes only a nameless anonymous mapping for a JIT's
         * code, which it names from /tmp/perf-PID.map; "[anon:NAME]" in /proc/PID/maps it
         * takes for a file of that name and names nothing in it (tools/perf/util/map.c
         * is_anon_memory, perf 6.1 to 6.12). `hugify status` finds the copies by place.
         *
         * The first write faults in a whole huge page (MADV_HUGEPAGE), or one small page
         * when the kernel has none to give: checked at once, so that a failure costs 4 KiB,
         * not 2 MiB of small pages. The source is the program's own mapping, so what is
         * copied is exactly what it would run (a debugger's breakpoints included). */
        copy_bytes(a, w, 8);
        int pmd = hp_anon_window_is_pmd(c, a);
        if (pmd < 0)
            why = WHY_UNVERIFIED;
        else if (!pmd)
            /* Said apart for the administrator: fragmented memory passes (a later start
             * may get its copies), a limit does not. */
            why = hp_free_huge_blocks(c) ? WHY_NOT_HUGE : WHY_FRAGMENTED;
        else if (copy_bytes(a, w, hp), (pmd = hp_anon_window_is_pmd(c, a)) != 1)
            why = pmd < 0 ? WHY_UNVERIFIED : WHY_NOT_HUGE; /* split meanwhile (khugepaged, reclaim) */
        else if ((rc = HP_SYS(__NR_mprotect, a, hp, prot, 0, 0, 0)) != 0)
            why = WHY_MPROTECT;
        else if ((rc = HP_SYS(__NR_mremap, a, hp, hp, HP_MREMAP_MAYMOVE | HP_MREMAP_FIXED, w, 0)) != (long)w)
            why = WHY_MREMAP;
    }
    if (why != WHY_COPIED) {
        *err = rc < 0 ? -rc : 0;
        hp_munmap(a, hp);
    }
    return why;
}

/* --- perf's map of the copies --- */

struct elf_file {
    const unsigned char *map;
    uint64_t size;
};

static int elf_map(int fd, struct elf_file *f)
{
    long size = hp_lseek(fd, 0, 2 /* SEEK_END */);
    f->map = 0;
    if (size < (long)sizeof(Elf64_Ehdr))
        return -1;
    void *m = hp_mmap(0, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (hp_mmap_failed(m))
        return -1;
    /* Only the headers and symbol tables are read: no readaround into the code. */
    hp_madvise(m, (size_t)size, MADV_RANDOM);
    f->map = m;
    f->size = (uint64_t)size;
    const Elf64_Ehdr *eh = m;
    if (hp_elf_ok(eh) != 0 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
        eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > f->size || eh->e_shoff == 0) {
        hp_munmap(m, (size_t)size);
        f->map = 0;
        return -1;
    }
    return 0;
}

static void elf_unmap(struct elf_file *f)
{
    if (f->map)
        hp_munmap((void *)f->map, (size_t)f->size);
    f->map = 0;
}

static const Elf64_Shdr *section_of_type(const struct elf_file *f, uint32_t type)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f->map;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f->map + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == type && sh[i].sh_link < eh->e_shnum && sh[i].sh_offset + sh[i].sh_size <= f->size &&
            sh[sh[i].sh_link].sh_offset + sh[sh[i].sh_link].sh_size <= f->size && sh[i].sh_size >= sizeof(Elf64_Sym))
            return &sh[i];
    return 0;
}

/* The GNU build-id's debug file, /usr/lib/debug/.build-id/xx/yyyy.debug, in `path`. */
static int debug_file_path(const struct elf_file *f, char *path, size_t cap)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f->map;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f->map + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_NOTE || sh[i].sh_offset + sh[i].sh_size > f->size)
            continue;
        const unsigned char *p = f->map + sh[i].sh_offset, *end = p + sh[i].sh_size;
        while (p + sizeof(Elf64_Nhdr) <= end) {
            const Elf64_Nhdr *nh = (const Elf64_Nhdr *)p;
            const unsigned char *name = p + sizeof *nh, *desc = name + ((nh->n_namesz + 3) & ~3u);
            if (desc + nh->n_descsz > end)
                break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && hp_starts_with((const char *)name, "GNU") &&
                nh->n_descsz >= 2 && nh->n_descsz <= 64) {
                static const char dir[] = "/usr/lib/debug/.build-id/";
                size_t n = 0;
                if (sizeof dir + 2 * nh->n_descsz + 8 > cap)
                    return -1;
                for (const char *d = dir; *d; d++)
                    path[n++] = *d;
                for (uint32_t k = 0; k < nh->n_descsz; k++) {
                    path[n++] = "0123456789abcdef"[desc[k] >> 4];
                    path[n++] = "0123456789abcdef"[desc[k] & 15];
                    if (k == 0)
                        path[n++] = '/';
                }
                hp_copy_str(path + n, cap - n, ".debug");
                return 0;
            }
            p = desc + ((nh->n_descsz + 3) & ~3u);
        }
    }
    return -1;
}

/* Appends "START SIZE NAME" (hex, perf's format: tools/perf/Documentation/jit-interface.txt)
 * for each function of `symtab` that starts in a copied window. */
static void perf_symbols(struct out *o, const struct elf_file *f, const Elf64_Shdr *symtab,
                         const struct hp_anon_range *r, uint64_t hp, const unsigned char *copied)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f->map;
    const Elf64_Shdr *strtab = (const Elf64_Shdr *)(f->map + eh->e_shoff) + symtab->sh_link;
    const Elf64_Sym *sym = (const Elf64_Sym *)(f->map + symtab->sh_offset);
    const char *str = (const char *)f->map + strtab->sh_offset;
    uint64_t nsym = symtab->sh_size / sizeof *sym;
    for (uint64_t i = 0; i < nsym; i++) {
        unsigned type = ELF64_ST_TYPE(sym[i].st_info);
        if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym[i].st_shndx == SHN_UNDEF ||
            sym[i].st_name >= strtab->sh_size || sym[i].st_value < r->vaddr)
            continue;
        uint64_t k = (sym[i].st_value - r->vaddr) / hp;
        if (k >= r->nwin || !copied[k])
            continue;
        const char *name = str + sym[i].st_name;
        size_t len = 0;
        while (sym[i].st_name + len < strtab->sh_size && name[len])
            len++;
        if (!len || sym[i].st_name + len >= strtab->sh_size)
            continue;
        out_num(o, (uint64_t)(uintptr_t)r->at + (sym[i].st_value - r->vaddr), 16);
        out_str(o, " ");
        out_num(o, sym[i].st_size ? sym[i].st_size : 1, 16);
        out_str(o, " ");
        out_str(o, name);
        out_str(o, "\n");
    }
}

/* The map perf reads for anonymous executable memory: /tmp/perf-PID.map of the pid
 * whose /proc/PID/maps shows that memory (tools/perf/util/map.c, map__new). Written
 * only when asked (HUGIFY_PERF_MAP=1): perf launched with the program, or recording
 * the whole system when it starts, names the copies through the files without it (the
 * copy was moved over the window by mremap, of which the kernel tells perf nothing);
 * only perf attached later needs it, and nothing may remove it at exit, since perf
 * report reads it after the process ended. The file is the process's user's own
 * (0600: it gives away the exact addresses of the code, which /proc/PID/maps keeps
 * from other users), created exclusively, never through a name someone else planted,
 * and each addition is written whole or not at all. */
struct perf_map_state {
    long pid; /* the pid whose map this process's copies are named by; 0: none */
    uint64_t dev, ino; /* that file */
    int debug;
};
static struct perf_map_state pm;

static long lstat_at(const char *path, struct stat *st)
{
    return HP_SYS(__NR_newfstatat, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW, 0, 0);
}

static unsigned euid(void) { return (unsigned)HP_SYS(__NR_geteuid, 0, 0, 0, 0, 0, 0); }

static void map_name(char *out, long pid)
{
    static const char pre[] = "/tmp/perf-";
    size_t n = 0;
    for (const char *p = pre; *p; p++)
        out[n++] = *p;
    n += hp_put_num(out + n, (uint64_t)pid, 10);
    hp_copy_str(out + n, 8, ".map");
}

/* "hugify-audit: perf map NAME: WHAT[ (DETAIL[ NUM])]" with HUGIFY_DEBUG. */
static void map_debug(const char *name, const char *what, const char *detail, long num)
{
    if (!pm.debug)
        return;
    struct out *o = stderr_out();
    out_str(o, "hugify-audit: perf map ");
    out_str(o, name);
    out_str(o, ": ");
    out_str(o, what);
    if (detail) {
        out_str(o, " (");
        out_str(o, detail);
        if (num >= 0) {
            out_str(o, " ");
            out_num(o, (uint64_t)num, 10);
        }
        out_str(o, ")");
    }
    out_str(o, "\n");
    out_flush(o);
}

/* Whether what is at `name` is a map of this process's user that may go: a regular
 * file of its own is one left by an earlier process with the same pid (pids are
 * reused), naming other code. Anything else (a symlink, a FIFO, another user's file)
 * is left as it is, and no map is made. 0: nothing there (any more). */
static int clear_stale(const char *name)
{
    struct stat st;
    if (lstat_at(name, &st) != 0)
        return 0;
    if (!S_ISREG(st.st_mode) || st.st_uid != euid()) {
        static const char left[] = "left alone, not this user's regular file";
        const char *kind = S_ISLNK(st.st_mode)    ? "symlink"
                           : S_ISFIFO(st.st_mode) ? "fifo"
                           : S_ISDIR(st.st_mode)  ? "directory"
                           : S_ISSOCK(st.st_mode) ? "socket"
                           : !S_ISREG(st.st_mode) ? "device"
                                                  : 0;
        map_debug(name, left, kind ? kind : "owner", kind ? -1 : (long)st.st_uid);
        return -1;
    }
    long rc = hp_unlink(name);
    return rc == 0 || rc == -ENOENT ? 0 : -1;
}

/* A new map at `name`, 0600 whatever the umask, or -1. */
static int create_exclusive(const char *name)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        long fd = HP_SYS(__NR_openat, AT_FDCWD, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600, 0, 0);
        if (fd >= 0) {
            HP_SYS(__NR_fchmod, fd, 0600, 0, 0, 0, 0);
            return (int)fd;
        }
        if (fd != -EEXIST) {
            map_debug(name, "not created", "errno", -fd);
            return -1;
        }
        if (clear_stale(name) != 0)
            return -1;
    }
    map_debug(name, "not created", "errno", EEXIST);
    return -1;
}

/* Whether the open `fd` is the map this process made (or was linked to at its fork). */
static int is_our_map(int fd, struct stat *st)
{
    return hp_fstat(fd, st) == 0 && S_ISREG(st->st_mode) && st->st_uid == euid() && (uint64_t)st->st_dev == pm.dev &&
           (uint64_t)st->st_ino == pm.ino;
}

static void copy_map(int from, struct out *o)
{
    for (;;) {
        long n = hp_read(from, o->buf, sizeof o->buf);
        if (n <= 0) {
            if (n < 0)
                o->err = -n;
            break;
        }
        o->n = (size_t)n;
        out_flush(o);
        if (o->err)
            break;
    }
    o->n = 0;
}

struct map_file {
    char name[40];
    int created; /* by this call: removed again if the addition fails */
    long size;   /* before this addition: cut back to it if the addition fails */
};

/* Opens this process's map for an addition: o->fd, or -1 (said with HUGIFY_DEBUG). */
static void map_open(struct map_file *m, struct out *o)
{
    long pid = hp_getpid();
    int seed = -1;
    struct stat st;
    map_name(m->name, pid);
    m->created = 0;
    m->size = 0;
    o->fd = -1;
    o->err = 0;
    o->n = 0;
    if (pm.pid == pid) {
        int fd = (int)HP_SYS(__NR_openat, AT_FDCWD, m->name, O_RDWR | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                             0, 0, 0);
        if (fd >= 0 && !is_our_map(fd, &st)) {
            hp_close(fd);
            fd = -1;
        }
        if (fd < 0) {
            map_debug(m->name, "not written", "no longer the file it made", -1);
            pm.pid = 0;
            return;
        }
        if (st.st_nlink == 1) {
            o->fd = fd;
            m->size = st.st_size;
            return;
        }
        /* Shared with a process forked before or after (the fork hook links the
         * child's name to the parent's file): what this process adds is at addresses
         * the other may use for something else. Its own file from here on. */
        seed = fd;
        hp_unlink(m->name);
    } else if (pm.pid) {
        /* A forked child without a map of its own (no fork hook ran: vfork, clone,
         * _Fork): its inherited copies are named by its ancestor's map. */
        char from[40];
        map_name(from, pm.pid);
        seed = (int)HP_SYS(__NR_openat, AT_FDCWD, from, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0, 0, 0);
        if (seed >= 0 && !is_our_map(seed, &st)) {
            hp_close(seed);
            seed = -1;
        }
    }
    int fd = create_exclusive(m->name);
    if (fd >= 0) {
        m->created = 1;
        o->fd = fd;
        if (seed >= 0) {
            hp_lseek(seed, 0, 0 /* SEEK_SET */);
            copy_map(seed, o);
        }
        if (hp_fstat(fd, &st) == 0) {
            pm.pid = pid;
            pm.dev = (uint64_t)st.st_dev;
            pm.ino = (uint64_t)st.st_ino;
        }
    } else {
        pm.pid = 0;
    }
    if (seed >= 0)
        hp_close(seed);
}

/* Ends an addition: on a failed write the file is removed if this addition made it,
 * else cut back to where it was, so that no line of it is left cut. */
static void map_close(struct map_file *m, struct out *o)
{
    out_flush(o);
    if (o->fd < 0)
        return;
    if (o->err) {
        if (m->created) {
            hp_unlink(m->name);
            pm.pid = 0;
        } else {
            HP_SYS(__NR_ftruncate, o->fd, m->size, 0, 0, 0, 0);
        }
        map_debug(m->name, "not written", "errno", o->err);
    }
    hp_close(o->fd);
    o->fd = -1;
}

/* Appends "START SIZE NAME" lines for the functions of the copied windows of `r`. The
 * symbols come from the file's .symtab, else its build-id debug file's, else .dynsym. */
static void write_perf_map(int fd, const struct hp_anon_range *r, uint64_t hp, const unsigned char *copied)
{
    struct elf_file f, dbg = {0, 0};
    if (elf_map(fd, &f) != 0)
        return;
    const struct elf_file *from = &f;
    const Elf64_Shdr *symtab = section_of_type(&f, SHT_SYMTAB);
    char path[200];
    if (!symtab && debug_file_path(&f, path, sizeof path) == 0) {
        int dfd = hp_open(path, O_RDONLY);
        if (dfd >= 0) {
            if (elf_map(dfd, &dbg) == 0 && (symtab = section_of_type(&dbg, SHT_SYMTAB)) != 0)
                from = &dbg;
            hp_close(dfd);
        }
    }
    if (!symtab)
        symtab = section_of_type(&f, SHT_DYNSYM);
    if (symtab) {
        static struct out o; /* 8 KiB: not on ld.so's stack */
        struct map_file m;
        map_open(&m, &o);
        if (o.fd >= 0) {
            perf_symbols(&o, from, symtab, r, hp, copied);
            map_close(&m, &o);
        }
    }
    elf_unmap(&dbg);
    elf_unmap(&f);
}

/* --- forked children --- */

/* perf attached to a forked child reads its copies from /proc/CHILD/maps and looks for
 * /tmp/perf-CHILD.map. The child has the parent's copies at the same addresses, so
 * its map is the parent's file, hard-linked under the child's name at the fork (one
 * system call; a new name, no bytes); the first addition of either makes it a file of
 * its own (map_open). Run by the C library's fork() in the child (its atfork child
 * handler); vfork, posix_spawn and raw clone run none, and exec follows them anyway. */
static void perf_map_after_fork(void)
{
    struct stat st;
    char from[40], to[40];
    long pid = hp_getpid();
    if (!pm.pid || pm.pid == pid)
        return;
    map_name(from, pm.pid);
    map_name(to, pid);
    if (lstat_at(from, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_dev != pm.dev ||
        (uint64_t)st.st_ino != pm.ino)
        return;
    for (int attempt = 0; attempt < 2; attempt++) {
        long rc = HP_SYS(__NR_linkat, AT_FDCWD, from, AT_FDCWD, to, 0, 0);
        if (rc == 0) {
            pm.pid = pid;
            return;
        }
        if (rc != -EEXIST || clear_stale(to) != 0) {
            if (rc != -EEXIST)
                map_debug(to, "not created", "errno", -rc);
            return;
        }
    }
}

static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* The address of the function `name` that a loaded object defines, looked up in its
 * dynamic symbol table through DT_GNU_HASH, as ld.so would; 0 if none. */
static void *dynamic_function(const struct link_map *l, const char *name)
{
    const Elf64_Sym *symtab = 0;
    const char *strtab = 0;
    const uint32_t *gh = 0;
    for (const Elf64_Dyn *d = l->l_ld; d->d_tag != DT_NULL; d++) {
        /* ld.so has relocated these in place, unless the dynamic section is read-only */
        uintptr_t p = d->d_un.d_ptr < l->l_addr ? l->l_addr + d->d_un.d_ptr : d->d_un.d_ptr;
        if (d->d_tag == DT_SYMTAB)
            symtab = (const Elf64_Sym *)p;
        else if (d->d_tag == DT_STRTAB)
            strtab = (const char *)p;
        else if (d->d_tag == DT_GNU_HASH)
            gh = (const uint32_t *)p;
    }
    if (!symtab || !strtab || !gh || gh[0] == 0)
        return 0;
    uint32_t nbuckets = gh[0], symoffset = gh[1], bloom_words = gh[2];
    const uint32_t *buckets = gh + 4 + (size_t)bloom_words * (sizeof(Elf64_Addr) / sizeof(uint32_t));
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name);
    uint32_t i = buckets[h % nbuckets];
    if (i < symoffset)
        return 0;
    for (;; i++) {
        uint32_t h2 = chain[i - symoffset];
        const Elf64_Sym *s = &symtab[i];
        if ((h | 1) == (h2 | 1) && s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            str_eq(strtab + s->st_name, name))
            return (void *)(l->l_addr + s->st_value);
        if (h2 & 1)
            return 0;
    }
}

void hp_anon_loaded(const struct link_map *head)
{
    static int hooked;
    if (hooked || !pm.pid || !head || (head->l_name && head->l_name[0]))
        return; /* no map, or not the program's own namespace (dlmopen) */
    typedef int register_atfork_fn(void (*)(void), void (*)(void), void (*)(void), void *);
    register_atfork_fn *register_atfork = 0;
    for (const struct link_map *l = head; l && !register_atfork; l = l->l_next) {
        const char *n = l->l_name, *base = n;
        for (; n && *n; n++)
            if (*n == '/')
                base = n + 1;
        if (base && str_eq(base, "libc.so.6"))
            register_atfork = (register_atfork_fn *)dynamic_function(l, "__register_atfork");
    }
    /* pthread_atfork() is __register_atfork(..., __dso_handle) in libc_nonshared.a; with
     * no handle, the handler is never unregistered. */
    if (register_atfork && register_atfork(0, 0, perf_map_after_fork, 0) == 0) {
        hooked = 1;
    } else {
        char name[40];
        map_name(name, pm.pid);
        map_debug(name, "none for forked children", "no __register_atfork in the C library", -1);
        hooked = -1;
    }
}

/* --- one range --- */

static void debug_line(const struct hp_anon_range *r, const char *path, uint64_t copied, uint64_t first_bad,
                       enum anon_why why, long err)
{
    struct out *o = stderr_out();
    /* One line per range, easy to match: "hugify-audit: anonymous PATH: C/N windows copied"
     * and, if not all, the first window left on its file mapping and why. */
    out_str(o, "hugify-audit: anonymous ");
    out_str(o, path);
    out_str(o, ": ");
    out_num(o, copied, 10);
    out_str(o, "/");
    out_num(o, r->nwin, 10);
    out_str(o, " windows copied");
    if (copied < r->nwin) {
        out_str(o, ", window ");
        out_num(o, first_bad, 10);
        out_str(o, " ");
        out_str(o, why_text[why]);
        if (err) {
            out_str(o, " (errno ");
            out_num(o, (uint64_t)err, 10);
            out_str(o, ")");
        }
        out_str(o, why == WHY_NOT_NEEDED ? ": file-backed" : ": file mapping kept");
    }
    out_str(o, "\n");
    out_flush(o);
}

/* What the copies read: the windows must be one file's bytes at their offsets (a load of
 * a malformed object overlapping them would fault the copy), and the object's file tells
 * how far that file has bytes (a window past its end would fault too) and names the
 * copied functions, so it must be that very inode, not another version renamed over the
 * path since ld.so opened it. Opened (when the caller gave none) and proven at the
 * first window to copy. */
struct object_file {
    int fd, own;
    int asked;
    enum anon_why why; /* once asked: WHY_COPIED if proven */
    long size;
};

static enum anon_why proven(struct hp_ctx *c, const struct hp_anon_range *r, const char *path,
                            struct object_file *f)
{
    struct hp_file_id file;
    if (f->asked)
        return f->why;
    f->asked = 1;
    int proof = hp_prove_object_file(c, (uintptr_t)r->at, r->nwin * c->hp, r->off, r->prot, &f->fd,
                                     f->own ? path : 0, &file);
    if (proof == 0)
        return (f->why = WHY_NOT_MAPPED);
    f->why = proof > 0 && (f->size = hp_lseek(f->fd, 0, 2 /* SEEK_END */)) >= 0 ? WHY_COPIED : WHY_REPLACED;
    return f->why;
}

uint64_t hp_anon_copy(struct hp_ctx *c, const struct hp_anon_settings *s, const struct hp_anon_range *r, int fd,
                      const char *path)
{
    uint64_t hp = c->hp, copied = 0, first_bad = 0;
    enum anon_why first_why = WHY_COPIED;
    long first_err = 0;
    static unsigned char done[4096];
    static char real[4096];
    if (s->mode == HP_ANON_OFF || r->nwin == 0)
        return 0;
    if (str_eq(path, "/proc/self/exe") && self_exe(real, sizeof real) > 0)
        path = real;
    uintptr_t self = (uintptr_t)&hp_anon_copy;
    struct object_file f = {fd, fd < 0, 0, WHY_COPIED, -1};
    for (uint64_t i = 0; i < r->nwin; i++) {
        char *w = r->at + i * hp;
        enum anon_why why = WHY_COPIED;
        long err = 0;
        if (s->mode == HP_ANON_UNSUPPORTED && (!r->states || r->states[i].state != HP_UNSUPPORTED))
            why = WHY_NOT_NEEDED;
        else if (!hp_thp_allowed(c))
            why = WHY_THP_OFF;
        else if (!(r->prot & PROT_READ))
            why = WHY_UNREADABLE;
        else if ((why = proven(c, r, path, &f)) == WHY_COPIED) {
            if (r->off > (uint64_t)f.size || (uint64_t)f.size - r->off < (i + 1) * hp)
                why = WHY_BEYOND_EOF;
            else if (self >= (uintptr_t)w && self < (uintptr_t)w + hp)
                why = WHY_SELF;
            else
                why = copy_window(c, w, r->prot, &err);
        }
        if (i < sizeof done)
            done[i] = why == WHY_COPIED;
        if (why == WHY_COPIED)
            copied++;
        else if (first_why == WHY_COPIED)
            first_bad = i, first_why = why, first_err = err;
    }
    /* The file's pages of the copied windows are no longer mapped by this process: the
     * kernel may reclaim them like any unmapped page cache. They are not dropped here: the
     * next process started would read them from disk again to copy them. */
    /* The symbols come from the proven file: the inode the copies were made of. */
    if (copied && s->perf_map && f.fd >= 0) {
        pm.debug = s->debug;
        write_perf_map(f.fd, r, hp, done);
    }
    if (f.own && f.fd >= 0)
        hp_close(f.fd);
    if (s->debug)
        debug_line(r, path, copied, first_bad, first_why, first_err);
    return copied;
}
