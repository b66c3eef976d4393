/* libhugify-audit.so — an LD_AUDIT library.
 *
 * On la_objopen of an object whose executable segment spans whole huge-page windows (of
 * the kernel's PMD size: 2 MiB on x86-64) at an aligned address (a hugified object,
 * recognised from its program headers), it marks that mapping MADV_HUGEPAGE, so that
 * faults read PMD-sized folios, faults the windows in (which reads them if they are not
 * cached), and repairs windows that the page cache holds as small folios. la_objopen
 * runs after ld.so has mapped an object and before it relocates or runs any of it.
 *
 * It implements no la_symbind*, and la_objopen returns 0: symbol binding is never
 * audited or changed; la_objsearch returns the name it is given (it only notes how much
 * the thread had read from storage when the search began). It is linked without libc
 * (see hp_sys.h) so that ld.so has to load nothing else into the audit namespace. */
#define _GNU_SOURCE
#include <link.h>
#include <sys/mman.h>

#include "hp_anon.h"
#include "hp_base.h"
#include "hp_bti.h"
#include "hp_core.h"
#include "hp_elf.h"
#include "hp_map.h"
#include "hp_shared.h"
#include "hp_sys.h"
#include "hp_verdict.h"

#define EXPORT __attribute__((visibility("default")))

static struct hp_ctx ctx;
static int ctx_made; /* hp_ctx_init done (at the first object) */
static int ready; /* ctx prepared for settling (at the first hugified object) */
static struct hp_anon_settings anon; /* the anonymous-copy mode (hp_anon.h), read with ctx */
static struct hp_window states[4096]; /* hp_settle's window states, for that mode */

EXPORT unsigned int la_version(unsigned int version)
{
    /* la_objopen and la_activity are the same in every version. */
    return version;
}

/* Once per process, at the first hugified object: are huge pages allowed, and does
 * the kernel read executable mappings as PMD folios by itself? Both come from the
 * record `hugify prefetch` keeps in the runtime directory (/run/hugify) for this boot
 * (reading sysfs costs about 20 us); without one, from sysfs. */
static int prepare(struct hp_ctx *c)
{
    struct hp_verdict v = hp_read_verdict(c);
    if (v.valid) {
        c->aware = v.aware;
        c->aware_recorded = v.aware; /* a "yes" is checked once against a cold window */
        return v.thp_never ? -1 : 0;
    }
    char buf[128];
    int fd = hp_open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY);
    long n = fd >= 0 ? hp_read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        hp_close(fd);
    if (n <= 0)
        return -1; /* no THP in this kernel */
    buf[n] = 0;
    for (long i = 0; i + 7 <= n; i++)
        if (buf[i] == '[' && buf[i + 1] == 'n' && buf[i + 2] == 'e' && buf[i + 3] == 'v')
            return -1; /* "[never]": the administrator turned huge pages off */
    return 0;
}

/* Bytes this thread had read from storage when ld.so began looking for the object being
 * loaded (la_objsearch with the name asked for); 0 for the main program (the count
 * starts at the fork). What ld.so reads between then and la_objopen (the object's
 * headers, and around its faults on the loads it touches) says the file was not wholly
 * cached: a process that may not see the page cache takes it for leave to evict what
 * of the windows came in small folios and read them once more (hp_core.c,
 * settle_unknown). */
static long read_at_search;

EXPORT char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag)
{
    (void)cookie;
    if (flag == LA_SER_ORIG)
        read_at_search = hp_thread_read_bytes();
    return (char *)name;
}

/* The program headers of the main program, from the auxiliary vector. */
static const Elf64_Phdr *main_phdrs(unsigned *phnum)
{
    Elf64_auxv_t aux[64];
    const Elf64_Phdr *ph = 0;
    *phnum = 0;
    int fd = hp_open("/proc/self/auxv", O_RDONLY);
    if (fd < 0)
        return 0;
    long n = hp_read(fd, aux, sizeof aux);
    hp_close(fd);
    for (long i = 0; i < n / (long)sizeof aux[0] && aux[i].a_type != AT_NULL; i++) {
        if (aux[i].a_type == AT_PHDR)
            ph = (const Elf64_Phdr *)aux[i].a_un.a_val;
        else if (aux[i].a_type == AT_PHNUM)
            *phnum = (unsigned)aux[i].a_un.a_val;
    }
    return *phnum ? ph : 0;
}

struct path_query {
    uintptr_t addr;
    char *out;
    size_t cap;
};

static int path_line(const char *line, void *arg)
{
    struct path_query *q = arg;
    uint64_t lo, hi;
    const char *p = hp_maps_range(line, &lo, &hi);
    if (!p || q->addr < lo || q->addr >= hi)
        return 0;
    while (*p && *p != '/')
        p++;
    size_t k = 0;
    for (; p[k] && k < q->cap - 1; k++)
        q->out[k] = p[k];
    q->out[k] = 0;
    if (k == 0 || k >= q->cap - 1)
        return -1;
    /* A file unlinked or renamed over since it was mapped is "PATH (deleted)": the path
     * is what may be opened (and, being another file now, is refused as one). */
    static const char deleted[] = " (deleted)";
    size_t d = sizeof deleted - 1, m = 0;
    while (m < d && k > d && q->out[k - d + m] == deleted[m])
        m++;
    if (m == d)
        q->out[k - d] = 0;
    return 1;
}

/* The path of the file mapped at `addr`, from /proc/self/maps (short at start-up). */
static int mapped_path(uintptr_t addr, char *out, size_t cap)
{
    struct path_query q = {addr, out, cap};
    return hp_each_line("/proc/self/maps", path_line, &q) == 1 ? 0 : -1;
}

static const Elf64_Phdr *main_ph;
static unsigned main_phnum;
static uintptr_t main_at;

/* Opens the main program's file: /proc/self/exe, unless ld.so was run as a command
 * ("ld.so PROGRAM"); then the file mapped where the program is. */
static int open_main_file(const Elf64_Phdr *ph, unsigned phnum, uintptr_t at, char *path, size_t cap)
{
    Elf64_Ehdr eh;
    Elf64_Phdr fph[32];
    int fd = hp_open("/proc/self/exe", O_RDONLY);
    if (fd >= 0 && phnum <= 32 && hp_pread(fd, &eh, sizeof eh, 0) == (long)sizeof eh && hp_elf_ok(&eh) == 0 &&
        eh.e_phnum == phnum && hp_pread(fd, fph, phnum * sizeof *fph, eh.e_phoff) == (long)(phnum * sizeof *fph)) {
        const unsigned char *a = (const void *)fph, *b = (const void *)ph;
        size_t i = 0;
        while (i < phnum * sizeof *fph && a[i] == b[i])
            i++;
        if (i == phnum * sizeof *fph) {
            static const char self[] = "/proc/self/exe";
            for (size_t k = 0; k < sizeof self && k < cap; k++)
                path[k] = self[k];
            return fd;
        }
    }
    if (fd >= 0)
        hp_close(fd);
    if (mapped_path(at, path, cap) != 0)
        return -1;
    return hp_open(path, O_RDONLY);
}

static int open_main(struct hp_target *t)
{
    static char path[4096];
    t->fd = open_main_file(main_ph, main_phnum, main_at, path, sizeof path);
    t->path = path;
    return t->fd;
}

static int dynamic_matches(struct link_map *map, const Elf64_Phdr *ph, unsigned phnum)
{
    for (unsigned i = 0; i < phnum; i++)
        if (ph[i].p_type == PT_DYNAMIC)
            return map->l_addr + ph[i].p_vaddr == (uintptr_t)map->l_ld;
    return 0;
}

static unsigned int objopen(struct link_map *map, uintptr_t caller);

/* "TracerPid:\tN" of /proc/self/status with N other than 0: 1, else 2 (stop reading). */
static int tracer_line(const char *line, void *arg)
{
    static const char key[] = "TracerPid:";
    (void)arg;
    for (size_t k = 0; k + 1 < sizeof key; k++)
        if (line[k] != key[k])
            return 0;
    for (const char *p = line + sizeof key - 1; *p; p++)
        if (*p >= '1' && *p <= '9')
            return 1;
    return 2; /* found, not traced: stop reading */
}

/* Whether no debugger is attached, asked only when a window is about to be repaired in
 * place (reading /proc/self/status costs about 10 us); the answer holds for the process. */
static int not_traced(void)
{
    static int answer = -1;
    if (answer < 0)
        answer = hp_each_line("/proc/self/status", tracer_line, 0) != 1;
    return answer;
}

#ifdef HUGIFY_AUDIT_TIMING
/* Measurement build (make libhugify-audit-timing.so, used by bench/runtime_bench.py):
 * reports the time spent in each la_objopen on stderr as "hugify-audit: US NAME". */
static long now_ns(void)
{
    struct {
        long s, ns;
    } t;
    HP_SYS(__NR_clock_gettime, 1 /* CLOCK_MONOTONIC */, &t, 0, 0, 0, 0);
    return t.s * 1000000000L + t.ns;
}

EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    (void)lmid;
    (void)cookie;
    long t0 = now_ns();
    unsigned int r = objopen(map, (uintptr_t)__builtin_return_address(0));
    long us10 = (now_ns() - t0) / 100;
    char b[512], digits[24];
    int n = 0, k = 0;
    static const char tag[] = "hugify-audit: ";
    for (const char *p = tag; *p; p++)
        b[n++] = *p;
    do {
        digits[k++] = (char)('0' + us10 % 10);
        us10 /= 10;
    } while (us10 || k < 2);
    while (k > 1)
        b[n++] = digits[--k];
    b[n++] = '.';
    b[n++] = digits[0];
    b[n++] = ' ';
    for (const char *p = map->l_name && *map->l_name ? map->l_name : "(main)"; *p && n < 500; p++)
        b[n++] = *p;
    b[n++] = '\n';
    hp_write(2, b, (size_t)n);
    return r;
}
#else
EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    (void)lmid;
    (void)cookie;
    return objopen(map, (uintptr_t)__builtin_return_address(0));
}
#endif

/* Whether another PT_LOAD of the object overlaps the windows of r (a malformed object:
 * ld.so maps the loads in their order, each over what is there, so the windows are then
 * partly another load's, PROT_NONE or data, not the code's file bytes). Checked on the
 * program headers, which say exactly what ld.so mapped, rounded out to the largest page
 * size (64 KiB); the runtime proves the mapping itself (hp_map.h) only when it needs the
 * object's file, and the anonymous mode before it copies. */
static int overlapped(const Elf64_Phdr *ph, unsigned phnum, const struct hp_range *r)
{
    const uint64_t page = 64 << 10;
    int code = -1;
    for (unsigned k = 0; k < phnum; k++) {
        const Elf64_Phdr *p = &ph[k];
        uint64_t end, lo, hi;
        if (p->p_type != PT_LOAD)
            continue;
        if (code < 0 && (p->p_flags & PF_X) && p->p_vaddr <= r->vaddr && r->vaddr - p->p_vaddr <= p->p_filesz &&
            r->len <= p->p_filesz - (r->vaddr - p->p_vaddr)) {
            code = (int)k; /* the load the windows are of (hp_exec_range's) */
            continue;
        }
        if (__builtin_add_overflow(p->p_vaddr, p->p_memsz, &end) || __builtin_add_overflow(end, page - 1, &hi))
            return 1;
        lo = p->p_vaddr & ~(page - 1);
        hi &= ~(page - 1);
        if (lo < r->vaddr + r->len && hi > r->vaddr)
            return 1;
    }
    return code < 0;
}

/* HUGIFY_DEBUG: what hp_settle made of one object's windows, in hugify-run's words:
 * "hugify-audit: PATH: 3 windows: 3 huge (2 loaded, 1 repaired), 0 busy, 0 failed,
 * 0 unsupported, 0 skipped, 0 unverified, 0 replaced, 0 not-mapped": "replaced" are those
 * left as mapped because the file at the object's path is not the inode the process
 * maps, "not-mapped" those the process does not map from the file at their offsets. */
static void debug_settled(const char *path, uintptr_t at, const struct hp_stats *st)
{
    static char b[4096 + 256];
    static char main_path[4096];
    size_t n = 0;
    if (!path) /* the main program: the file mapped there (not ld.so's, when run by it) */
        path = mapped_path(at, main_path, sizeof main_path) == 0 ? main_path : "(main)";
    const struct {
        const char *before;
        uint32_t count;
    } parts[] = {
        {": ", st->windows},
        {" windows: ", st->n[HP_HUGE] + st->n[HP_LOADED] + st->n[HP_REPAIRED]},
        {" huge (", st->n[HP_LOADED]},
        {" loaded, ", st->n[HP_REPAIRED]},
        {" repaired), ", st->n[HP_BUSY]},
        {" busy, ", st->n[HP_FAILED]},
        {" failed, ", st->n[HP_UNSUPPORTED]},
        {" unsupported, ", st->n[HP_KERNEL] + st->n[HP_COLD] + st->n[HP_SMALL]},
        {" skipped, ", st->n[HP_UNVERIFIED]},
        {" unverified, ", st->why[HP_WHY_REPLACED]},
        {" replaced, ", st->why[HP_WHY_NOT_MAPPED]},
        {" not-mapped\n", 0},
    };
    for (const char *p = "hugify-audit: "; *p; p++)
        b[n++] = *p;
    for (const char *p = path; *p && n < 4096; p++)
        b[n++] = *p;
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        for (const char *p = parts[k].before; *p; p++)
            b[n++] = *p;
        if (k + 1 < sizeof parts / sizeof parts[0])
            n += hp_put_num(b + n, parts[k].count, 10);
    }
    hp_write(2, b, n);
}

/* `caller`: an address in ld.so's code, which is running. */
static unsigned int objopen(struct link_map *map, uintptr_t caller)
{
    const char *name = map->l_name;
    int is_main = name == 0 || name[0] == 0;
    unsigned phnum = 0;
    if (!ctx_made) {
        hp_ctx_init(&ctx, HP_DEFAULT_SIZE);
        ctx_made = 1;
    }
    /* The program headers where ld.so mapped them (accepted only if PT_DYNAMIC lands on
     * the link map's l_ld); a non-PIE program's from the auxiliary vector. */
    const Elf64_Phdr *ph =
        is_main && map->l_addr == 0 ? main_phdrs(&phnum) : hp_mapped_phdrs(&ctx, map->l_addr, &phnum);
    if (!ph && is_main)
        ph = main_phdrs(&phnum);
    if (!ph || !dynamic_matches(map, ph, phnum))
        return 0;
    /* Only a non-PIE main program is loaded at address 0 (l_addr): fixed addresses. */
    int fixed = is_main && map->l_addr == 0;
    unsigned next = 0;
    struct hp_range range, *r = &range;
    /* Whole windows of the kernel's PMD size are whole 2 MiB windows too (every PMD
     * size is a multiple of it), so an object without these is left before that size
     * is read: a process that maps no hugified object never reads it. */
    if (!hp_exec_range(ph, phnum, fixed, HP_DEFAULT_SIZE, &next, r))
        return 0; /* not hugified: the common case ends here */
    if (!ready) {
        ctx.hp = hp_pmd_size(); /* once, as hugify-run reads it at its start */
        ctx.prepare = prepare;
        hp_anon_read_settings(&anon);
        ctx.rundir = anon.runtime_dir;
        if (anon.mode != HP_ANON_OFF && anon.force_smaps)
            ctx.scan = 0; /* the copies' check as on kernels without PAGEMAP_SCAN (tests) */
        if (anon.force_smaps)
            ctx.procmap = 0; /* and mappings read from /proc/self/maps, as before Linux 6.11 */
        ready = 1;
    }
    next = 0;
    if (!hp_exec_range(ph, phnum, fixed, ctx.hp, &next, r))
        return 0; /* windows of 2 MiB, none of this kernel's PMD size */

    /* arm64: the replaced windows keep PROT_BTI where ld.so gave it (hp_bti.h). */
    int bti = hp_bti_prot(ph, phnum, map->l_addr);
    long read_now = hp_thread_read_bytes();
    int loaded_read = read_at_search >= 0 && read_now > read_at_search; /* before any window is read */
    do {
        uintptr_t at = map->l_addr + r->vaddr;
        if ((at & (ctx.hp - 1)) || !r->readable)
            continue; /* not aligned at run time (ld.so ignored p_align), or unreadable */
        struct hp_target t;
        hp_memzero(&t, sizeof t);
        t.map = (char *)at;
        t.stride = ctx.hp;
        t.nwin = r->len / ctx.hp;
        t.off = r->off;
        t.fd = -1;
        t.size = -1;
        t.ld_mapped = 1;
        t.path = is_main ? 0 : name;
        if (is_main) {
            main_ph = ph;
            main_phnum = phnum;
            main_at = at;
            t.open_file = open_main;
        }
        /* The whole executable mapping, so that the VMA is not split. */
        int prot = PROT_READ | PROT_EXEC | bti;
        for (unsigned k = 0; k < phnum; k++) {
            const Elf64_Phdr *p = &ph[k];
            if (p->p_type == PT_LOAD && (p->p_flags & PF_X) && p->p_vaddr <= r->vaddr &&
                r->vaddr < p->p_vaddr + p->p_memsz) {
                uintptr_t lo = (map->l_addr + p->p_vaddr) & ~(uintptr_t)(HP_PAGE - 1);
                uintptr_t hi = (map->l_addr + p->p_vaddr + p->p_memsz + HP_PAGE - 1) & ~(uintptr_t)(HP_PAGE - 1);
                t.advise = (char *)lo;
                t.advise_len = hi - lo;
                prot = (p->p_flags & PF_R ? PROT_READ : 0) | (p->p_flags & PF_W ? PROT_WRITE : 0) |
                       (p->p_flags & PF_X ? PROT_EXEC : 0) | bti;
            }
        }
        t.prot = prot;
        if (overlapped(ph, phnum, r))
            t.map_proof = 2; /* not the file's bytes there: nothing of them is touched */
        /* Never under ld.so's feet, nor under a debugger's: replacing the mapping of a
         * window would drop the breakpoints it wrote there (gdb inserts them in the
         * program's code before ld.so runs, and does not write them again). */
        t.zap_ok = !(caller >= at && caller < at + r->len);
        t.loaded_read = loaded_read;
        t.zap_check = not_traced;
        struct hp_stats st;
        hp_memzero(&st, sizeof st);
        /* The window states: where the file-backed way is unsupported, the shared copies
         * and the anonymous mode take over. */
        if (t.nwin <= sizeof states / sizeof states[0])
            t.report = states;
        hp_settle(&ctx, &t, &st);
        if (anon.debug)
            debug_settled(is_main ? 0 : name, at, &st);
        int shared = t.report && st.n[HP_UNSUPPORTED] > 0;
        if (shared || anon.mode != HP_ANON_OFF) {
            static char path[4096], shown[4096];
            int fd = -1;
            if (is_main)
                fd = open_main_file(ph, phnum, at, path, sizeof path);
            if (shared) {
                /* Under a debugger, windows it wrote breakpoints into stay (hp_shared.h). */
                struct hp_shared_range sr = {(char *)at, t.nwin, t.off, prot, t.report, caller, !not_traced()};
                const char *who = !is_main ? name : anon.debug && mapped_path(at, shown, sizeof shown) == 0 ? shown : path;
                hp_shared_map(&ctx, anon.runtime_dir, anon.shared_off, anon.debug, &sr, fd, who);
            }
            if (anon.mode != HP_ANON_OFF) {
                struct hp_anon_range ar = {(char *)at, t.nwin, t.off, r->vaddr, prot, t.report};
                hp_anon_copy(&ctx, &anon, &ar, fd, is_main ? path : name);
            }
            if (fd >= 0)
                hp_close(fd);
        }
    } while (hp_exec_range(ph, phnum, fixed, ctx.hp, &next, r));
    return 0;
}

EXPORT void la_activity(uintptr_t *cookie, unsigned int flag)
{
    /* Loading is over: close /proc/self/pagemap before the program runs again. */
    if (flag == LA_ACT_CONSISTENT && ctx_made) {
        hp_ctx_release(&ctx);
        /* The cookie is the namespace's first link map (ld.so's initial value). The C
         * library is relocated and initialised by now, also at start-up. */
        if (ready > 0)
            hp_anon_loaded((const struct link_map *)*cookie);
    }
}
