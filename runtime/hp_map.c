/* What the process maps; see hp_map.h. */
#include "hp_map.h"

#include <errno.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

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

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* A number in `base` (10 or 16) at *p, advancing it; -1 if there is none. */
static int number(const char **p, unsigned base, uint64_t *v)
{
    int d, any = 0;
    *v = 0;
    while ((d = hex_digit(**p)) >= 0 && (unsigned)d < base)
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
