/* Shared core of the hugify runtime; see hp_core.h. */
#include "hp_core.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "hp_sys.h"

/* PAGEMAP_SCAN (Linux 6.7, include/uapi/linux/fs.h); Debian 12's headers predate it. */
struct hp_page_region {
    uint64_t start, end, categories;
};
struct hp_pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define HP_PAGEMAP_SCAN _IOWR('f', 16, struct hp_pm_scan_arg)
#define HP_PAGE_IS_HUGE (1UL << 6)

#if defined(__x86_64__)
#define HP_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HP_MACHINE EM_AARCH64
#endif

size_t hp_strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

void hp_memzero(void *p, size_t n)
{
    volatile unsigned char *b = p; /* volatile: keeps the compiler from calling memset */
    while (n--)
        *b++ = 0;
}

void hp_ctx_init(struct hp_ctx *c, uint64_t hp)
{
    c->hp = hp;
    c->pagemap_fd = -1;
    c->scan = -1;
    c->cachestat = -1;
    c->aware = 0;
    c->smaps = 0;
    c->prepare = 0;
    c->prepared = 0;
}

void hp_ctx_release(struct hp_ctx *c)
{
    if (c->pagemap_fd >= 0)
        hp_close(c->pagemap_fd);
    c->pagemap_fd = -1;
}

int hp_elf_ok(const Elf64_Ehdr *eh)
{
    const unsigned char *id = eh->e_ident;
    if (id[EI_MAG0] != ELFMAG0 || id[EI_MAG1] != ELFMAG1 || id[EI_MAG2] != ELFMAG2 || id[EI_MAG3] != ELFMAG3)
        return -1;
    if (id[EI_CLASS] != ELFCLASS64 || id[EI_DATA] != ELFDATA2LSB || eh->e_machine != HP_MACHINE)
        return -1;
    if (eh->e_type != ET_DYN && eh->e_type != ET_EXEC)
        return -1;
    if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 || eh->e_phnum > 512)
        return -1;
    return 0;
}

int hp_exec_ranges(const Elf64_Phdr *ph, unsigned phnum, int fixed, uint64_t hp, struct hp_range *out, int max)
{
    int n = 0;
    for (unsigned i = 0; i < phnum && n < max; i++) {
        const Elf64_Phdr *p = &ph[i];
        if (p->p_type != PT_LOAD || !(p->p_flags & PF_X) || p->p_filesz == 0)
            continue;
        /* A smaller p_align: the loader would not put a PIE or library at a 2 MiB-aligned
         * address. An ET_EXEC goes to its link-time address whatever p_align says. */
        if (!fixed && p->p_align < hp)
            continue;
        /* Offset and address must agree modulo the huge-page size, or no window of
         * the file can ever be one PMD of the process. */
        if ((p->p_vaddr - p->p_offset) & (hp - 1))
            continue;
        uint64_t start = (p->p_offset + hp - 1) & ~(hp - 1);
        uint64_t end = (p->p_offset + p->p_filesz) & ~(hp - 1);
        if (end <= start || p->p_offset + p->p_filesz < p->p_offset || p->p_vaddr + p->p_filesz < p->p_vaddr)
            continue;
        out[n].off = start;
        out[n].vaddr = p->p_vaddr + (start - p->p_offset);
        out[n].len = end - start;
        out[n].readable = (p->p_flags & PF_R) != 0;
        n++;
    }
    return n;
}

static void touch(const char *p) { (void)*(const volatile char *)p; }

/* Pages of [off, off + len) of fd in the page cache; -1 if unknown. */
static long cached_pages(struct hp_ctx *c, int fd, uint64_t off, uint64_t len, char *window)
{
    if (c->cachestat != 0) {
        struct hp_cachestat_range r = {off, len};
        struct hp_cachestat cs;
        long rc = hp_cachestat_call(fd, &r, &cs);
        if (rc == 0) {
            c->cachestat = 1;
            return (long)cs.nr_cache;
        }
        if (rc == -ENOSYS || rc == -EPERM)
            c->cachestat = 0;
    }
    if (window) {
        /* mincore on a file mapping reports page-cache residency, mapped or not. */
        unsigned char vec[512];
        long total = 0;
        for (uint64_t o = 0; o < len; o += sizeof vec * HP_PAGE) {
            uint64_t chunk = len - o < sizeof vec * HP_PAGE ? len - o : sizeof vec * HP_PAGE;
            if (hp_mincore(window + o, chunk, vec) != 0)
                return -1;
            for (uint64_t i = 0; i < chunk / HP_PAGE; i++)
                total += vec[i] & 1;
        }
        return total;
    }
    return -1;
}

static int starts_with(const char *s, const char *prefix)
{
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

int hp_each_line(const char *path, int (*each)(const char *line, void *arg), void *arg)
{
    char buf[4096], line[4096 + 128];
    size_t ll = 0;
    int stop = 0;
    int fd = hp_open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    while (!stop) {
        long n = hp_read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long i = 0; i < n && !stop; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1)
                    line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            stop = each(line, arg);
        }
    }
    hp_close(fd);
    return stop;
}

const char *hp_maps_range(const char *line, uint64_t *start, uint64_t *end)
{
    const char *p = line;
    int d;
    *start = *end = 0;
    if (hexval(*p) < 0)
        return 0;
    while ((d = hexval(*p)) >= 0)
        *start = *start * 16 + (uint64_t)d, p++;
    if (*p++ != '-' || hexval(*p) < 0)
        return 0;
    while ((d = hexval(*p)) >= 0)
        *end = *end * 16 + (uint64_t)d, p++;
    return p;
}

struct pmd_query {
    uint64_t addr, len;
    int inside;
    long bytes;
};

static int pmd_line(const char *line, void *arg)
{
    struct pmd_query *q = arg;
    if (!q->inside) {
        uint64_t start, end;
        if (!hp_maps_range(line, &start, &end) || start != q->addr)
            return 0;
        q->inside = 1;
        return end - start != q->len; /* the window is not a VMA of its own */
    }
    if (starts_with(line, "FilePmdMapped:")) {
        const char *v = line + 14;
        long kb = 0;
        while (*v == ' ')
            v++;
        while (*v >= '0' && *v <= '9')
            kb = kb * 10 + (*v++ - '0');
        q->bytes = kb * 1024;
        return 1;
    }
    return starts_with(line, "VmFlags:");
}

/* The FilePmdMapped bytes of the VMA that is exactly [addr, addr + len), from
 * /proc/self/smaps; -1 if there is no such VMA or smaps cannot be read. Used where
 * PAGEMAP_SCAN is missing (Linux < 6.7) and every window is a VMA of its own. */
static long smaps_pmd_bytes(uintptr_t addr, uint64_t len)
{
    struct pmd_query q = {addr, len, 0, -1};
    hp_each_line("/proc/self/smaps", pmd_line, &q);
    return q.bytes;
}

/* huge[i] = 1 if window `first + i` is mapped by one PMD; returns 0, or -1 if the
 * kernel gives no way to tell. */
static int verify(struct hp_ctx *c, char *map, uint64_t stride, uint64_t first, uint64_t count,
                  unsigned char *huge)
{
    for (uint64_t i = 0; i < count; i++)
        huge[i] = 0;
    if (c->scan != 0) {
        if (c->pagemap_fd < 0)
            c->pagemap_fd = hp_open("/proc/self/pagemap", O_RDONLY);
        if (c->pagemap_fd >= 0) {
            uintptr_t lo = (uintptr_t)(map + first * stride);
            uintptr_t hi = (uintptr_t)(map + (first + count - 1) * stride) + c->hp;
            struct hp_page_region regs[32];
            for (;;) {
                struct hp_pm_scan_arg arg;
                hp_memzero(&arg, sizeof arg);
                arg.size = sizeof arg;
                arg.start = lo;
                arg.end = hi;
                arg.vec = (uintptr_t)regs;
                arg.vec_len = sizeof regs / sizeof regs[0];
                arg.category_anyof_mask = HP_PAGE_IS_HUGE;
                arg.return_mask = HP_PAGE_IS_HUGE;
                long n = hp_ioctl(c->pagemap_fd, HP_PAGEMAP_SCAN, &arg);
                if (n < 0) {
                    if (n == -ENOTTY || n == -EINVAL || n == -ENOSYS || n == -EPERM)
                        c->scan = 0;
                    break;
                }
                c->scan = 1;
                for (long r = 0; r < n; r++)
                    for (uint64_t i = 0; i < count; i++) {
                        uintptr_t w = (uintptr_t)(map + (first + i) * stride);
                        if (regs[r].start <= w && regs[r].end >= w + c->hp)
                            huge[i] = 1;
                    }
                if ((uint64_t)n < arg.vec_len || arg.walk_end >= hi)
                    return 0;
                lo = arg.walk_end;
            }
            if (c->scan == 1)
                return 0;
        }
    }
    /* Fallback: smaps, for windows that are VMAs of their own. */
    if (!c->smaps)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        long b = smaps_pmd_bytes((uintptr_t)(map + (first + i) * stride), c->hp);
        if (b < 0)
            return -1;
        huge[i] = (uint64_t)b >= c->hp;
    }
    return 0;
}

int hp_scan_works(struct hp_ctx *c)
{
    if (c->scan < 0) {
        static char probe[HP_PAGE];
        unsigned char huge;
        probe[0] = 1;
        /* One window's worth of a page we own: the answer does not matter, only
         * whether the kernel knows the ioctl. */
        struct hp_ctx t = *c;
        t.hp = HP_PAGE;
        t.smaps = 0;
        verify(&t, (char *)((uintptr_t)probe & ~(uintptr_t)(HP_PAGE - 1)), HP_PAGE, 0, 1, &huge);
        c->scan = t.scan == 1;
        c->pagemap_fd = t.pagemap_fd;
    }
    return c->scan == 1;
}

#define CHUNK 64

static int prepared(struct hp_ctx *c)
{
    if (c->prepared == 0)
        c->prepared = c->prepare && c->prepare(c) != 0 ? -1 : 1;
    return c->prepared > 0;
}

/* Opens the target's file and learns its size; 0 if usable. */
static int file_ready(struct hp_target *t)
{
    if (t->fd < 0) {
        if (t->open_file)
            t->open_file(t);
        else if (t->path)
            t->fd = hp_open(t->path, O_RDONLY);
        if (t->fd < 0)
            return -1;
        t->own_fd = 1;
    }
    if (t->size < 0)
        t->size = hp_lseek(t->fd, 0, 2 /* SEEK_END */);
    return t->size >= 0 ? 0 : -1;
}

static void advise(struct hp_target *t)
{
    if (t->advise) {
        hp_madvise(t->advise, t->advise_len, MADV_HUGEPAGE);
        t->advise = 0;
    }
}

void hp_settle(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st)
{
    uint64_t hp = c->hp;
    /* Later faults of this mapping (after memory pressure evicted it) read 2 MiB folios
     * too, unless the kernel does that for executable mappings by itself. */
    if (t->advise && prepared(c) && !c->aware)
        advise(t);
    for (uint64_t first = 0; first < t->nwin; first += CHUNK) {
        uint64_t count = t->nwin - first < CHUNK ? t->nwin - first : CHUNK;
        unsigned char cold[CHUNK], huge[CHUNK], touched[CHUNK];
        st->windows += (uint32_t)count;
        for (uint64_t i = 0; i < count; i++) {
            char *w = t->map + (first + i) * t->stride;
            uint64_t woff = t->off + (first + i) * hp;
            unsigned char v = 0;
            /* Cheap: is the first page of the window cached at all? A cached page is
             * inside the file, so faulting it is safe without knowing the file size. */
            cold[i] = hp_mincore(w, HP_PAGE, &v) == 0 && !(v & 1);
            touched[i] = 0;
            if (cold[i]) {
                if (!prepared(c) || c->aware)
                    continue; /* left alone, or to the kernel's own PMD exec readahead */
                if (file_ready(t) != 0 || woff + hp > (uint64_t)t->size)
                    continue; /* a truncated file: faulting past its end would SIGBUS */
                advise(t);
            }
            touch(w);
            touched[i] = 1;
        }
        if (verify(c, t->map, t->stride, first, count, huge) != 0) {
            for (uint64_t i = 0; i < count; i++)
                if (touched[i])
                    st->unverified++;
                else
                    st->skipped++;
            continue;
        }
        for (uint64_t i = 0; i < count; i++) {
            char *w = t->map + (first + i) * t->stride;
            uint64_t woff = t->off + (first + i) * hp;
            if (!touched[i]) {
                st->skipped++;
                continue;
            }
            if (huge[i]) {
                st->huge++;
                st->loaded += cold[i];
                continue;
            }
            if (!prepared(c)) {
                st->skipped++;
                continue;
            }
            if (!t->zap_ok) { /* e.g. ld.so's own code, running */
                st->busy++;
                continue;
            }
            if (file_ready(t) != 0) {
                st->failed++;
                continue;
            }
            /* Small folios: drop our own page-table entries, evict what nobody else
             * maps, and read the window in again through the MADV_HUGEPAGE mapping. */
            advise(t);
            hp_madvise(w, hp, MADV_DONTNEED);
            hp_fadvise(t->fd, woff, hp, 4 /* POSIX_FADV_DONTNEED */);
            long left = cached_pages(c, t->fd, woff, hp, w);
            if (left != 0) {
                st->busy++;
                continue;
            }
            touch(w);
            unsigned char again = 0;
            if (verify(c, t->map, t->stride, first + i, 1, &again) == 0 && again) {
                st->huge++;
                if (cold[i])
                    st->loaded++;
                else
                    st->repaired++;
            } else {
                st->failed++;
            }
        }
    }
    if (t->own_fd && t->fd >= 0) {
        hp_close(t->fd);
        t->fd = -1;
        t->own_fd = 0;
    }
}

struct hp_verdict hp_read_verdict(const char *dir)
{
    struct hp_verdict v = {0, 0, 0};
    char path[4096], rec[128], boot[64];
    size_t n = hp_strlen(dir);
    static const char name[] = "/kernel-exec-pmd";
    if (n + sizeof name > sizeof path)
        return v;
    for (size_t i = 0; i < n; i++)
        path[i] = dir[i];
    for (size_t i = 0; i < sizeof name; i++)
        path[n + i] = name[i];
    int fd = hp_open(path, O_RDONLY);
    if (fd < 0)
        return v;
    long r = hp_read(fd, rec, sizeof rec - 1);
    hp_close(fd);
    fd = hp_open("/proc/sys/kernel/random/boot_id", O_RDONLY);
    if (fd < 0)
        return v;
    long b = hp_read(fd, boot, sizeof boot - 1);
    hp_close(fd);
    /* "<boot id, 36 characters> <0|1|-> <mode>\n" */
    if (r < 40 || b < 36 || rec[36] != ' ' || rec[38] != ' ')
        return v;
    rec[r] = 0;
    for (int i = 0; i < 36; i++)
        if (rec[i] != boot[i])
            return v;
    v.valid = 1;
    v.aware = rec[37] == '1';
    v.thp_never = rec[39] == 'n' && rec[40] == 'e' && rec[41] == 'v';
    return v;
}
