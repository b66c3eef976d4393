/* The anonymous-copy mode; see hp_anon.h and docs/runtime.md. */
#include "hp_anon.h"

#include <elf.h>
#include <errno.h>
#include <sys/mman.h>

#include "hp_sys.h"
#include "hp_verdict.h"

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif
#define HP_MREMAP_MAYMOVE 1
#define HP_MREMAP_FIXED 2
#define HP_ANON_NAME_MAX 79 /* the kernel's limit is 80 bytes with the NUL */

/* --- small output helpers (no libc) --- */

struct out {
    char buf[8192];
    size_t n;
    int fd;
};

static void out_flush(struct out *o)
{
    if (o->n && o->fd >= 0)
        hp_write(o->fd, o->buf, o->n);
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

static int has_prefix(const char *s, const char *prefix)
{
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t k = 0;
    for (; src[k] && k + 1 < cap; k++)
        dst[k] = src[k];
    dst[k] = 0;
}

/* --- settings --- */

struct env_values {
    char anonymous[16];
    int anonymous_set;
    char debug[8];
    char perf_map[8];
    char force_smaps[8];
    char runtime_dir[512];
};

static void env_entry(const char *e, struct env_values *v)
{
    if (has_prefix(e, HP_ANON_ENV "=")) {
        copy_str(v->anonymous, sizeof v->anonymous, e + sizeof HP_ANON_ENV);
        v->anonymous_set = 1;
    } else if (has_prefix(e, "HUGIFY_DEBUG=")) {
        copy_str(v->debug, sizeof v->debug, e + 13);
    } else if (has_prefix(e, "HUGIFY_FORCE_SMAPS=")) {
        copy_str(v->force_smaps, sizeof v->force_smaps, e + 19);
    } else if (has_prefix(e, "HUGIFY_PERF_MAP=")) {
        copy_str(v->perf_map, sizeof v->perf_map, e + 16);
    } else if (has_prefix(e, "HUGIFY_RUNTIME_DIR=")) {
        copy_str(v->runtime_dir, sizeof v->runtime_dir, e + 19);
    }
}

/* The process's initial environment (what execve gave it): ld.so's audit namespace has
 * no environ of its own, and /proc/self/environ is that block. */
static void read_environ(struct env_values *v)
{
    char buf[4096], entry[1024];
    size_t el = 0;
    int fd = hp_open("/proc/self/environ", O_RDONLY);
    if (fd < 0)
        return;
    for (;;) {
        long n = hp_read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long i = 0; i < n; i++) {
            if (buf[i]) {
                if (el < sizeof entry - 1)
                    entry[el++] = buf[i];
                continue;
            }
            entry[el] = 0;
            el = 0;
            env_entry(entry, v);
        }
    }
    hp_close(fd);
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
    read_environ(&v);
    s->debug = v.debug[0] && !str_eq(v.debug, "0");
    s->no_perf_map = str_eq(v.perf_map, "0");
    s->force_smaps = v.force_smaps[0] && !str_eq(v.force_smaps, "0");
    copy_str(s->runtime_dir, sizeof s->runtime_dir, v.runtime_dir[0] ? v.runtime_dir : "/run/hugify");
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
static enum anon_why copy_window(struct hp_ctx *c, char *w, int prot, const char *vma_name, long *err)
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
        /* Named where the kernel allows it (CONFIG_ANON_VMA_NAME): smaps, `hugify status`
         * and the tests find the copies by it. */
        HP_SYS(__NR_prctl, PR_SET_VMA, PR_SET_VMA_ANON_NAME, a, hp, vma_name, 0);
        /* The first write faults in a whole huge page (MADV_HUGEPAGE), or one small page
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

/* "hugify:PATH", cut to the kernel's limit from the left (the file name matters most),
 * with the characters the kernel refuses in VMA names replaced by '?'. */
static void vma_name_of(const char *path, char *out)
{
    static const char prefix[] = "hugify:";
    size_t n = 0, pl = hp_strlen(path);
    for (const char *p = prefix; *p; p++)
        out[n++] = *p;
    size_t room = HP_ANON_NAME_MAX - n;
    const char *from = pl > room ? path + pl - room : path;
    for (; *from; from++) {
        char ch = *from;
        out[n++] = ch < 0x20 || ch > 0x7e || ch == '\\' || ch == '`' || ch == '$' || ch == '[' || ch == ']' ? '?' : ch;
    }
    out[n] = 0;
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
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && name[0] == 'G' && name[1] == 'N' &&
                name[2] == 'U' && nh->n_descsz >= 2 && nh->n_descsz <= 64) {
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
                copy_str(path + n, cap - n, ".debug");
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

/* perf resolves samples in anonymous executable memory through /tmp/perf-PID.map. The
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
        char name[40];
        size_t n = 0;
        static const char pre[] = "/tmp/perf-";
        for (const char *p = pre; *p; p++)
            name[n++] = *p;
        /* The first object of a process starts the file afresh: a map left by an earlier
         * process with the same PID would name the wrong code. (A forked child that
         * dlopens a hugified library starts its own.) */
        static long written_by;
        long pid = HP_SYS(__NR_getpid, 0, 0, 0, 0, 0, 0);
        int fresh = written_by != pid ? O_TRUNC : 0;
        written_by = pid;
        o.n = 0;
        o.fd = -1;
        out_num(&o, (uint64_t)pid, 10);
        out_str(&o, ".map");
        for (size_t k = 0; k < o.n; k++)
            name[n++] = o.buf[k];
        name[n] = 0;
        o.n = 0;
        /* O_NOFOLLOW: /tmp is shared; a symlink planted there is not followed. */
        o.fd = (int)HP_SYS(__NR_openat, AT_FDCWD, name, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | fresh,
                           0644,
                           0, 0);
        if (o.fd >= 0) {
            perf_symbols(&o, from, symtab, r, hp, copied);
            out_flush(&o);
            hp_close(o.fd);
        }
    }
    elf_unmap(&dbg);
    elf_unmap(&f);
}

/* --- one range --- */

static void debug_line(const struct hp_anon_range *r, const char *path, uint64_t copied, uint64_t first_bad,
                       enum anon_why why, long err)
{
    static struct out o;
    o.n = 0;
    o.fd = 2;
    /* One line per range, easy to match: "hugify-audit: anonymous PATH: C/N windows copied"
     * and, if not all, the first window left on its file mapping and why. */
    out_str(&o, "hugify-audit: anonymous ");
    out_str(&o, path);
    out_str(&o, ": ");
    out_num(&o, copied, 10);
    out_str(&o, "/");
    out_num(&o, r->nwin, 10);
    out_str(&o, " windows copied");
    if (copied < r->nwin) {
        out_str(&o, ", window ");
        out_num(&o, first_bad, 10);
        out_str(&o, " ");
        out_str(&o, why_text[why]);
        if (err) {
            out_str(&o, " (errno ");
            out_num(&o, (uint64_t)err, 10);
            out_str(&o, ")");
        }
        out_str(&o, why == WHY_NOT_NEEDED ? ": file-backed" : ": file mapping kept");
    }
    out_str(&o, "\n");
    out_flush(&o);
}

uint64_t hp_anon_copy(struct hp_ctx *c, const struct hp_anon_settings *s, const struct hp_anon_range *r, int fd,
                      const char *path)
{
    uint64_t hp = c->hp, copied = 0, first_bad = 0;
    enum anon_why first_why = WHY_COPIED;
    long first_err = 0;
    static unsigned char done[4096];
    static char real[4096];
    char vma_name[HP_ANON_NAME_MAX + 1];
    if (s->mode == HP_ANON_OFF || r->nwin == 0)
        return 0;
    if (str_eq(path, "/proc/self/exe") && self_exe(real, sizeof real) > 0)
        path = real;
    vma_name_of(path, vma_name);
    uintptr_t self = (uintptr_t)&hp_anon_copy;
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
        else if (self >= (uintptr_t)w && self < (uintptr_t)w + hp)
            why = WHY_SELF;
        else
            why = copy_window(c, w, r->prot, vma_name, &err);
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
    if (copied && !s->no_perf_map) {
        int own = fd < 0;
        if (own)
            fd = hp_open(path, O_RDONLY);
        if (fd >= 0) {
            write_perf_map(fd, r, hp, done);
            if (own)
                hp_close(fd);
        }
    }
    if (s->debug)
        debug_line(r, path, copied, first_bad, first_why, first_err);
    return copied;
}
