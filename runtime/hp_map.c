/* What the process maps; see hp_map.h. */
#include "hp_map.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "hp_base.h"
#include "hp_elf.h"
#include "hp_sys.h"

/* PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h); Debian 12's headers predate it. */
struct hp_procmap_query {
    uint64_t size, query_flags, query_addr;
    uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
    uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
    uint64_t vma_name_addr, build_id_addr;
};
#define HP_PROCMAP_QUERY _IOWR('f', 17, struct hp_procmap_query)
#define HP_PROCMAP_VMA_READABLE 0x01
#define HP_PROCMAP_VMA_WRITABLE 0x02
#define HP_PROCMAP_VMA_EXECUTABLE 0x04

static int query(struct hp_ctx *c, uintptr_t addr, struct hp_vma *out)
{
    struct hp_procmap_query q;
    hp_memzero(&q, sizeof q);
    q.size = sizeof q;
    q.query_addr = addr; /* query_flags 0: the VMA that covers addr, or ENOENT */
    long rc = hp_ioctl(c->maps_fd, HP_PROCMAP_QUERY, &q);
    if (rc != 0)
        return (int)rc;
    out->start = q.vma_start;
    out->end = q.vma_end;
    out->offset = q.vma_offset;
    out->file.inode = q.inode;
    out->file.dev_major = q.dev_major;
    out->file.dev_minor = q.dev_minor;
    out->prot = (q.vma_flags & HP_PROCMAP_VMA_READABLE ? PROT_READ : 0) |
                (q.vma_flags & HP_PROCMAP_VMA_WRITABLE ? PROT_WRITE : 0) |
                (q.vma_flags & HP_PROCMAP_VMA_EXECUTABLE ? PROT_EXEC : 0);
    return 0;
}

/* A number in `base` (10 or 16) at *p, advancing it; -1 if there is none. */
static int number(const char **p, unsigned base, uint64_t *v)
{
    int d, any = 0;
    *v = 0;
    while ((d = hp_hex_digit(**p)) >= 0 && (unsigned)d < base)
        *v = *v * base + (uint64_t)d, (*p)++, any = 1;
    return any ? 0 : -1;
}

/* The text of /proc/self/maps, for kernels without PROCMAP_QUERY: up to two addresses
 * looked up in one read. */
struct maps_query {
    uintptr_t addr[2];
    struct hp_vma *out[2];
    int n, found;
};

static int maps_line(const char *line, void *arg)
{
    struct maps_query *q = arg;
    uint64_t lo, hi, off, major, minor, inode;
    const char *p = hp_maps_range(line, &lo, &hi);
    int hit = 0;
    for (int k = 0; p && k < q->n; k++)
        hit |= q->addr[k] >= lo && q->addr[k] < hi;
    if (!hit)
        return 0;
    /* " r-xp 00001000 fe:01 1234   /path" */
    while (*p == ' ')
        p++;
    if (!p[0] || !p[1] || !p[2])
        return -1;
    int prot = (p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) | (p[2] == 'x' ? PROT_EXEC : 0);
    while (*p && *p != ' ')
        p++;
    while (*p == ' ')
        p++;
    if (number(&p, 16, &off) != 0 || *p++ != ' ' || number(&p, 16, &major) != 0 || *p++ != ':' ||
        number(&p, 16, &minor) != 0 || *p++ != ' ' || number(&p, 10, &inode) != 0)
        return -1;
    for (int k = 0; k < q->n; k++) {
        if (q->addr[k] < lo || q->addr[k] >= hi)
            continue;
        struct hp_vma *v = q->out[k];
        v->start = lo;
        v->end = hi;
        v->offset = off;
        v->file.inode = inode;
        v->file.dev_major = (uint32_t)major;
        v->file.dev_minor = (uint32_t)minor;
        v->prot = prot;
        q->found++;
    }
    return q->found == q->n;
}

/* The VMAs holding each of n (1 or 2) addresses: 0; -ENOENT if an address is not
 * mapped; -1 if the kernel does not say. */
static int vmas_at(struct hp_ctx *c, const uintptr_t *addr, int n, struct hp_vma *out)
{
    if (c->procmap != 0) {
        if (c->maps_fd < 0)
            c->maps_fd = hp_open("/proc/self/maps", O_RDONLY);
        if (c->maps_fd < 0)
            return -1;
        int rc = 0;
        for (int k = 0; k < n && rc == 0; k++)
            rc = query(c, addr[k], &out[k]);
        if (rc == 0 || rc == -ENOENT) {
            c->procmap = 1;
            return rc;
        }
        if (rc != -ENOTTY && rc != -EINVAL && rc != -ENOSYS)
            return -1;
        c->procmap = 0; /* before Linux 6.11: the text */
        hp_close(c->maps_fd);
        c->maps_fd = -1;
    }
    struct maps_query q = {{addr[0], n > 1 ? addr[1] : 0}, {&out[0], &out[1]}, n, 0};
    int rc = hp_each_line("/proc/self/maps", maps_line, &q);
    return rc == 1 ? 0 : rc == 0 ? -ENOENT : -1;
}

int hp_vma_at(struct hp_ctx *c, uintptr_t addr, struct hp_vma *out) { return vmas_at(c, &addr, 1, out); }

static int same_file(const struct hp_file_id *a, const struct hp_file_id *b)
{
    return a->inode != 0 && a->inode == b->inode && a->dev_major == b->dev_major && a->dev_minor == b->dev_minor;
}

int hp_same_file_mapped(struct hp_ctx *c, uintptr_t a, uintptr_t b)
{
    uintptr_t addr[2] = {a, b};
    struct hp_vma v[2];
    if (vmas_at(c, addr, 2, v) != 0)
        return -1;
    return same_file(&v[0].file, &v[1].file) && v[0].offset + (a - v[0].start) == v[1].offset + (b - v[1].start);
}

int hp_range_maps_file(struct hp_ctx *c, uintptr_t at, uint64_t len, uint64_t off, int prot,
                       struct hp_file_id *file)
{
    uintptr_t a = at, end;
    /* The kernel's view of a mapping (PROCMAP_QUERY's flags, the text's perms) has read,
     * write and execute only: the caller's PROT_BTI (arm64, hp_bti.h), which ld.so gave
     * the mapping, is not in it and does not make it another mapping. */
    int rwx = prot & (PROT_READ | PROT_WRITE | PROT_EXEC);
    if (__builtin_add_overflow(at, len, &end))
        return 0;
    while (a < end) {
        struct hp_vma v;
        int rc = hp_vma_at(c, a, &v);
        if (rc != 0)
            return rc == -ENOENT ? 0 : -1;
        if (v.prot != rwx || !v.file.inode || (a > at && !same_file(&v.file, file)) ||
            v.offset + (a - v.start) != off + (a - at))
            return 0;
        *file = v.file;
        a = v.end;
    }
    return 1;
}

int hp_fd_is_file(struct hp_ctx *c, int fd, const struct hp_file_id *file)
{
    struct hp_vma v;
    /* Mapping it costs no read: the page is never touched. */
    void *p = hp_mmap(0, HP_PAGE, PROT_READ, MAP_PRIVATE, fd, 0);
    if (hp_mmap_failed(p))
        return -1;
    int rc = hp_vma_at(c, (uintptr_t)p, &v);
    hp_munmap(p, HP_PAGE);
    return rc != 0 ? -1 : same_file(&v.file, file);
}

int hp_prove_object_file(struct hp_ctx *c, uintptr_t at, uint64_t len, uint64_t off, int prot, int *fd,
                         const char *path, struct hp_file_id *file)
{
    if (hp_range_maps_file(c, at, len, off, prot, file) != 1)
        return 0;
    if (*fd < 0 && path)
        *fd = hp_open(path, O_RDONLY);
    return *fd >= 0 && hp_fd_is_file(c, *fd, file) == 1 ? 1 : -1;
}

const Elf64_Phdr *hp_mapped_phdrs(struct hp_ctx *c, uintptr_t base, unsigned *phnum)
{
    unsigned char resident;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
    uint64_t end;
    *phnum = 0;
    if (base == 0 || base % HP_PAGE || hp_mincore((void *)base, HP_PAGE, &resident) != 0)
        return 0; /* not mapped: the object's first PT_LOAD does not start at address 0 */
    if (hp_elf_ok(eh) != 0 || eh->e_phoff % sizeof(uint64_t) != 0 ||
        __builtin_add_overflow(eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr), &end))
        return 0;
    if (end > HP_PAGE) {
        /* Past the first page, which the header's being there proves mapped: only inside
         * the readable mapping of the object's file that starts at base with offset 0
         * (ld.so maps the first load there, the rest after it, and the gaps PROT_NONE). */
        struct hp_vma v;
        if (!c || hp_vma_at(c, base, &v) != 0 || !v.file.inode || !(v.prot & PROT_READ) || v.start != base ||
            v.offset != 0 || end > v.end - base)
            return 0;
    }
    const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
    /* Inside the first PT_LOAD's file bytes, which are what is mapped there (ld.so's
     * l_map_start). A table anywhere else may hold anything: the mapping there is not
     * the file's bytes at e_phoff. */
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        uint64_t load_end;
        if (ph[i].p_type != PT_LOAD)
            continue;
        if (ph[i].p_vaddr != ph[i].p_offset || ph[i].p_offset > eh->e_phoff ||
            __builtin_add_overflow(ph[i].p_offset, ph[i].p_filesz, &load_end) || end > load_end)
            return 0;
        *phnum = eh->e_phnum;
        return ph;
    }
    return 0;
}

/* --- whether windows are mapped by PMDs ---------------------------------------------- */

/* PAGEMAP_SCAN (Linux 6.7, include/uapi/linux/fs.h); Debian 12's headers predate it. */
struct hp_pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define HP_PAGEMAP_SCAN _IOWR('f', 16, struct hp_pm_scan_arg)
#define HP_PAGE_IS_HUGE (1UL << 6)

long hp_page_regions(int pagemap_fd, uint64_t start, uint64_t end, uint64_t anyof, uint64_t report,
                     struct hp_page_region *out, uint64_t n, uint64_t *walk_end)
{
    struct hp_pm_scan_arg arg;
    hp_memzero(&arg, sizeof arg);
    arg.size = sizeof arg;
    arg.start = start;
    arg.end = end;
    arg.vec = (uintptr_t)out;
    arg.vec_len = n;
    arg.category_anyof_mask = anyof;
    arg.return_mask = report;
    long got = hp_ioctl(pagemap_fd, HP_PAGEMAP_SCAN, &arg);
    *walk_end = arg.walk_end;
    return got;
}

struct pmd_query {
    uintptr_t first;   /* address of the first window */
    uint64_t stride, len, count;
    const char *key;   /* "FilePmdMapped:" or "AnonHugePages:" */
    long cur;          /* the window whose VMA the lines are about, or -1 */
    uint64_t seen;     /* windows found as VMAs of their own */
    unsigned char *huge;
};

static int pmd_line(const char *line, void *arg)
{
    struct pmd_query *q = arg;
    uint64_t start, end;
    if (hp_maps_range(line, &start, &end)) {
        uint64_t k = (start - q->first) / q->stride;
        q->cur = -1;
        if (start >= q->first && k < q->count && start == q->first + k * q->stride && end - start == q->len)
            q->cur = (long)k;
        return 0;
    }
    if (q->cur >= 0 && hp_starts_with(line, q->key)) {
        const char *v = line + hp_strlen(q->key);
        long kb = 0;
        while (*v == ' ')
            v++;
        while (*v >= '0' && *v <= '9')
            kb = kb * 10 + (*v++ - '0');
        q->huge[q->cur] = (uint64_t)kb * 1024 >= q->len;
        q->cur = -1;
        return ++q->seen == q->count; /* all found: stop reading */
    }
    return 0;
}

/* huge[i] from the `key` bytes (FilePmdMapped, AnonHugePages) of the VMA that is exactly
 * window i, in one read of /proc/self/smaps; -1 if a window is no VMA of its own or smaps
 * cannot be read. Used where PAGEMAP_SCAN is missing (Linux < 6.7). */
static int smaps_pmd(const char *key, uintptr_t first, uint64_t stride, uint64_t len, uint64_t count,
                     unsigned char *huge)
{
    struct pmd_query q = {first, stride, len, count, key, -1, 0, huge};
    hp_each_line("/proc/self/smaps", pmd_line, &q);
    return q.seen == q.count ? 0 : -1;
}

int hp_pmd_mapped(struct hp_ctx *c, const char *smaps_key, char *map, uint64_t stride, uint64_t first,
                  uint64_t count, unsigned char *huge)
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
                uint64_t walk_end, room = sizeof regs / sizeof regs[0];
                long n =
                    hp_page_regions(c->pagemap_fd, lo, hi, HP_PAGE_IS_HUGE, HP_PAGE_IS_HUGE, regs, room, &walk_end);
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
                if ((uint64_t)n < room || walk_end >= hi)
                    return 0;
                lo = walk_end;
            }
            if (c->scan == 1)
                return 0;
        }
    }
    /* Fallback: smaps, for windows that are VMAs of their own. */
    if (!c->smaps)
        return -1;
    return smaps_pmd(smaps_key, (uintptr_t)(map + first * stride), stride, c->hp, count, huge);
}

int hp_window_is_pmd(struct hp_ctx *c, char *w, const char *smaps_key)
{
    unsigned char huge = 0;
    int smaps = c->smaps;
    c->smaps = 1; /* the caller's window is a VMA of its own */
    int rc = hp_pmd_mapped(c, smaps_key, w, c->hp, 0, 1, &huge);
    c->smaps = smaps;
    return rc == 0 ? huge : -1;
}

int hp_anon_window_is_pmd(struct hp_ctx *c, char *w) { return hp_window_is_pmd(c, w, "AnonHugePages:"); }

int hp_windows_are_pmd(struct hp_ctx *c, char *at, uint64_t n, unsigned char *huge)
{
    int smaps = c->smaps;
    c->smaps = 0; /* one VMA for all: smaps cannot tell its windows apart */
    int rc = hp_pmd_mapped(c, "", at, c->hp, 0, n, huge);
    c->smaps = smaps;
    return rc;
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
        hp_pmd_mapped(&t, "FilePmdMapped:", (char *)((uintptr_t)probe & ~(uintptr_t)(HP_PAGE - 1)), HP_PAGE, 0, 1, &huge);
        c->scan = t.scan == 1;
        c->pagemap_fd = t.pagemap_fd;
    }
    return c->scan == 1;
}
