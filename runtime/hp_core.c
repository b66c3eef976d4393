/* The settle engine of the hugify runtime; see hp_core.h. */
#include "hp_core.h"

#include <errno.h>
#include <sys/mman.h>

#include "hp_base.h"
#include "hp_map.h"
#include "hp_sys.h"
#include "hp_verdict.h"

static void touch(const char *p) { (void)*(const volatile char *)p; }

long hp_cached_pages(struct hp_ctx *c, int fd, uint64_t off, uint64_t len, char *window)
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

/* Whether each of `count` windows from window `first` of the target's mapping is mapped
 * by one PMD (hp_pmd_mapped, with a file mapping's smaps field). */
static int verify(struct hp_ctx *c, char *map, uint64_t stride, uint64_t first, uint64_t count,
                  unsigned char *huge)
{
    return hp_pmd_mapped(c, "FilePmdMapped:", map, stride, first, count, huge);
}

#define CHUNK 64

/* Whether huge pages may be made at all (asked once, before the first window is read
 * or repaired): not in a process with prctl(PR_SET_THP_DISABLE), whose reads come in
 * small folios on any filesystem (taken for "no large folios", that would be recorded
 * for the filesystem and stop every other process too), nor where the caller's
 * `prepare` says no (THP "never"). */
static int prepared(struct hp_ctx *c)
{
    if (c->prepared == 0)
        c->prepared = hp_prctl(42 /* PR_GET_THP_DISABLE */) == 1 || (c->prepare && c->prepare(c) != 0) ? -1 : 1;
    return c->prepared > 0;
}

int hp_thp_allowed(struct hp_ctx *c) { return prepared(c); }

/* Whether windows ld.so mapped (t->ld_mapped) are all one file's bytes at their
 * offsets, with the load's protections, and which file: proven once, when a file the
 * core opens for them is to be checked against it (the caller has made sure that no
 * other load of the object overlaps them before any is touched: t->map_proof 2). */
static int mapping_proven(struct hp_ctx *c, struct hp_target *t)
{
    if (!t->ld_mapped)
        return 1;
    if (!t->map_proof) {
        int one_file = t->stride == c->hp && !t->offs &&
                       hp_range_maps_file(c, (uintptr_t)t->map, t->nwin * c->hp, t->off, t->prot, &t->mapped) == 1;
        t->map_proof = one_file ? 1 : 2;
    }
    return t->map_proof == 1;
}

/* Opens the target's file if it is not open; 0 if it is. Enough to stat it (which
 * filesystem it is on, as the object's path says): nothing is read or mapped from it. */
static int file_open(struct hp_target *t)
{
    if (t->fd >= 0)
        return 0;
    if (t->file_proof == 2)
        return -1;
    if (t->open_file)
        t->open_file(t);
    else if (t->path)
        t->fd = hp_open(t->path, O_RDONLY);
    if (t->fd < 0)
        return -1;
    t->own_fd = 1;
    return 0;
}

/* Opens the target's file and learns its size; 0 if usable. A file the core opens by
 * name for windows ld.so mapped is used only if it is the inode mapped there: ld.so
 * opened the object by the same name earlier, and a package upgrade may have renamed
 * another version over it since (its windows then stay as mapped, HP_WHY_REPLACED). */
static int file_ready(struct hp_ctx *c, struct hp_target *t)
{
    if (file_open(t) != 0)
        return -1;
    if (t->own_fd && t->ld_mapped && t->file_proof == 0) {
        t->file_proof = mapping_proven(c, t) && hp_fd_is_file(c, t->fd, &t->mapped) == 1 ? 1 : 2;
        if (t->file_proof == 2) {
            hp_close(t->fd);
            t->fd = -1;
            t->own_fd = 0;
            return -1;
        }
    }
    if (t->size < 0)
        t->size = hp_lseek(t->fd, 0, 2 /* SEEK_END */);
    return t->size >= 0 ? 0 : -1;
}

/* Why file_ready failed: the file could not be opened, the windows are not one file's
 * mapping, or the file is not the one mapped. */
static enum hp_why file_problem(const struct hp_target *t)
{
    return t->map_proof == 2 ? HP_WHY_NOT_MAPPED : t->file_proof == 2 ? HP_WHY_REPLACED : HP_WHY_NO_FILE;
}

/* Closes the target's file if the core opened it. */
static void release_file(struct hp_target *t)
{
    if (t->own_fd && t->fd >= 0) {
        hp_close(t->fd);
        t->fd = -1;
        t->own_fd = 0;
    }
}

/* Marks the caller's mapping MADV_HUGEPAGE (once); whether the kernel took it (a
 * seccomp filter may refuse it: then no read can give a 2 MiB folio, and a window read
 * in small says nothing about the file). */
static int advise(struct hp_target *t)
{
    if (t->advise) {
        t->advised = hp_madvise(t->advise, t->advise_len, MADV_HUGEPAGE) == 0 ? 1 : -1;
        t->advise = 0;
    }
    return t->advised >= 0;
}

int hp_cachestat_works(struct hp_ctx *c)
{
    if (c->cachestat < 0) {
        int fd = hp_open("/proc/self/exe", O_RDONLY);
        if (fd >= 0) {
            hp_cached_pages(c, fd, 0, HP_PAGE, 0);
            hp_close(fd);
        }
    }
    return c->cachestat == 1;
}

/* Dirty or under-writeback pages in [off, off + len) (0 where cachestat is missing). */
static int dirty(struct hp_ctx *c, int fd, uint64_t off, uint64_t len)
{
    struct hp_cachestat_range r = {off, len};
    struct hp_cachestat cs;
    return c->cachestat == 1 && hp_cachestat_call(fd, &r, &cs) == 0 && cs.nr_dirty + cs.nr_writeback > 0;
}

/* tmpfs, ramfs or hugetlbfs: pages live only in memory, eviction cannot re-read them. */
static int memory_fs(struct hp_target *t)
{
    if (!t->memfs) {
        long type = 0;
        t->memfs = 2;
        if (hp_fstatfs_type(t->fd, &type) == 0 &&
            (type == 0x01021994 /* TMPFS_MAGIC */ || type == (long)0x858458f6 /* RAMFS_MAGIC */ ||
             type == (long)0x958458f6 /* HUGETLBFS_MAGIC */))
            t->memfs = 1;
    }
    return t->memfs == 1;
}

/* Maps the uncached window at `woff` the way the ELF loader maps code (PROT_EXEC, no
 * madvise), faults it, and checks whether the kernel made it one PMD by itself: 1 yes,
 * 0 no, -1 no answer (e.g. a noexec mount). It asks about the fault alone (PMD exec
 * readahead), checked right after it: khugepaged's collapse of file-backed code (Linux
 * 7.2 on, THP `always`) comes seconds later, only to processes that keep the window
 * mapped, and is no reason to leave a cold window unread (docs/runtime-reference.md, "What the
 * kernel does by itself"). Only a window the probe itself reads in tells: one that
 * another process is reading meanwhile (through MADV_HUGEPAGE: one 2 MiB folio) would
 * show that process's doing, so a window with any page cached when the probe maps it
 * gives no answer. */
void (*hp_fault_hook)(int fd, uint64_t off);

static int probe_exec(struct hp_ctx *c, int fd, uint64_t woff)
{
    uint64_t hp = c->hp;
    char *res = hp_mmap(0, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_mmap_failed(res))
        return -1;
    char *w = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int aware = -1;
    if (!hp_mmap_failed(hp_mmap(w, hp, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, woff)) &&
        hp_cached_pages(c, fd, woff, hp, w) == 0) {
        unsigned char huge = 0;
        int smaps = c->smaps;
        if (hp_fault_hook)
            hp_fault_hook(fd, woff);
        touch(w);
        c->smaps = 1; /* a VMA of its own */
        if (verify(c, w, hp, 0, 1, &huge) == 0)
            aware = huge;
        c->smaps = smaps;
    }
    hp_munmap(res, 2 * hp);
    return aware;
}

static uint64_t window_off(const struct hp_target *t, uint64_t i, uint64_t hp)
{
    return t->offs ? t->offs[i] : t->off + i * hp;
}

static int first_page_cold(const struct hp_target *t, uint64_t i)
{
    unsigned char v = 0;
    return hp_mincore(t->map + i * t->stride, HP_PAGE, &v) == 0 && !(v & 1);
}

/* Probes the kernel verdict on the first cold window: where it is not known, and where
 * it came from a record saying "yes" (checked once per process: a record never stands
 * against what a process sees). A new "yes" counts only when seen twice, the window
 * evicted in between (a race with another reader would have to happen twice); a "no"
 * drops the record only when nothing in the process's way explains it (a memory cgroup
 * at its limit gives small folios to the kernel's own readahead too). On a "no", the
 * small folios the probe read are evicted again (the fault's readaround may have
 * reached the next window too). */
static void probe_verdict(struct hp_ctx *c, struct hp_target *t)
{
    for (uint64_t i = 0; i < t->nwin; i++) {
        uint64_t woff = window_off(t, i, c->hp);
        if (!first_page_cold(t, i))
            continue;
        if (file_ready(c, t) != 0 || woff + c->hp > (uint64_t)t->size)
            return;
        int next_cold = i + 1 < t->nwin && first_page_cold(t, i + 1);
        int checking = c->aware_recorded && !c->aware_checked;
        int seen = probe_exec(c, t->fd, woff);
        if (seen == 1 && !checking) {
            hp_fadvise(t->fd, woff, c->hp, 4 /* POSIX_FADV_DONTNEED */);
            seen = probe_exec(c, t->fd, woff); /* no answer if it could not be evicted */
        }
        if (seen == 0) {
            hp_fadvise(t->fd, woff, c->hp, 4 /* POSIX_FADV_DONTNEED */);
            if (next_cold)
                hp_fadvise(t->fd, window_off(t, i + 1, c->hp), c->hp, 4);
        }
        if (!checking)
            c->aware = seen;
        else {
            c->aware_checked = 1;
            if (seen == 0 && hp_circumstances(c) == HP_WHY_NONE) {
                c->aware = 0;
                c->aware_recorded = 0;
                hp_record_drop(c, HP_KERNEL_RECORD);
            }
        }
        return;
    }
}

static void set_state(struct hp_target *t, struct hp_stats *st, uint64_t i, enum hp_state s, enum hp_why why,
                      long pages)
{
    st->n[s]++;
    st->why[why]++;
    if (t->report) {
        t->report[i].state = (uint8_t)s;
        t->report[i].why = (uint8_t)why;
        t->report[i].pages = pages > 0 ? (uint32_t)pages : 0;
    }
}

/* Replaces the caller's mapping of window i by a fresh, unfaulted mapping of the same
 * file range, with the same protections and advice. MADV_DONTNEED would drop the
 * page-table entries but keep the page table (before Linux 6.14, CONFIG_PT_RECLAIM), and
 * a 2 MiB folio read in under a PMD that points to a page table is mapped by 512 PTEs:
 * the window would read in huge for every other process and small for this one. The
 * new mapping is made aside and moved over the window with one mremap, which either
 * replaces it whole (freeing its page table) or leaves it as it was. Returns 0; -1 if
 * the new mapping could not be made or moved; -2, nothing changed, if it would not map
 * the inode and offset the window maps. */
static int remap_window(struct hp_ctx *c, struct hp_target *t, char *w, uint64_t woff)
{
    uint64_t hp = c->hp;
    char *res = hp_mmap(0, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (hp_mmap_failed(res))
        return -1;
    char *aside = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
    int ok = !hp_mmap_failed(hp_mmap(aside, hp, t->prot ? t->prot : PROT_READ, MAP_PRIVATE | MAP_FIXED, t->fd, woff));
    /* What is moved over the window must be the inode and offset the window maps. */
    if (ok && hp_same_file_mapped(c, (uintptr_t)aside, (uintptr_t)w) != 1)
        ok = -1;
    if (ok > 0) {
        if (hp_madvise(aside, hp, MADV_HUGEPAGE) != 0)
            t->advised = -1;
        if (t->random)
            hp_madvise(aside, hp, MADV_RANDOM);
        ok = !hp_mmap_failed(hp_mremap(aside, hp, hp, 1 /* MREMAP_MAYMOVE */ | 2 /* MREMAP_FIXED */, w));
    }
    hp_munmap(res, 2 * hp); /* what is left of the reservation */
    return ok > 0 ? 0 : ok < 0 ? -2 : -1;
}

/* Waits until the reads of the window at `woff` that are in flight are done: pages under
 * read are locked, and eviction passes them by. A fault waits for its page: each page of
 * an aside mapping is faulted (fault-around maps cached neighbours at once). A page is
 * unlocked before the read's last reference to it is dropped, and a referenced page is
 * not evicted either: the caller tries again for a few milliseconds. */
static void wait_for_reads(struct hp_ctx *c, int fd, uint64_t woff)
{
    char *m = hp_mmap(0, c->hp, PROT_READ, MAP_PRIVATE, fd, woff);
    if (hp_mmap_failed(m))
        return;
    hp_madvise(m, c->hp, MADV_RANDOM); /* no readahead beyond what is cached */
    unsigned char vec[512];
    for (uint64_t o = 0; o < c->hp; o += sizeof vec * HP_PAGE) {
        uint64_t chunk = c->hp - o < sizeof vec * HP_PAGE ? c->hp - o : sizeof vec * HP_PAGE;
        if (hp_mincore(m + o, chunk, vec) != 0)
            break;
        for (uint64_t i = 0; i < chunk / HP_PAGE; i++)
            if (vec[i] & 1)
                touch(m + o + i * HP_PAGE); /* only cached pages: nothing is read in */
    }
    hp_munmap(m, c->hp);
}

static long read_in(struct hp_ctx *c, struct hp_target *t, uint64_t i);
static void read_again(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i, int cold, int own);

/* Reads of a window repair makes at most: where others' reads (or reads still in flight)
 * keep a read from being the process's own, it tries again after a pause. */
#define HP_READ_TRIES 3

/* Takes one window's worth from the run's budget of bytes to read; 0 if it is spent. */
static int spend(struct hp_ctx *c)
{
    if (c->budget < 0)
        return 1;
    if ((uint64_t)c->budget < c->hp)
        return 0;
    c->budget -= (int64_t)c->hp;
    return 1;
}

/* Evicts window i (held in small folios, or read in small just now: `cold`; by `own`
 * reads that were this process's own, read_again) and reads it in again as one 2 MiB
 * folio. */
static void repair(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i, int cold, int own)
{
    if (t->zap_ok && t->zap_check)
        t->zap_ok = t->zap_check(), t->zap_check = 0;
    /* A file in memory only has nothing to evict and read again, whoever maps it: that
     * is said before whether this caller may replace its mapping (a traced process's
     * windows on tmpfs are unsupported, as anyone's, not busy: the shared copies and the
     * anonymous mode go by it). */
    enum hp_why none = hp_known_none(c, t); /* e.g. found on an earlier window of the file */
    enum hp_why why = none != HP_WHY_NONE ? none
                      : file_ready(c, t) != 0 ? file_problem(t)
                      : memory_fs(t) ? HP_WHY_MEMORY_FS
                      : !t->zap_ok ? HP_WHY_LOADER /* e.g. ld.so's own code, running */
                      : !advise(t) ? HP_WHY_MADVISE_REFUSED
                      : !cold && !spend(c) ? HP_WHY_BUDGET /* a cold one was paid for when read */
                                        : HP_WHY_NONE;
    if (why != HP_WHY_NONE) {
        set_state(t, st, i,
                  why == HP_WHY_LOADER    ? HP_BUSY
                  : why == HP_WHY_NO_FILE ? HP_FAILED
                  : why == HP_WHY_BUDGET || why == HP_WHY_MADVISE_REFUSED || why == HP_WHY_REPLACED ||
                          why == HP_WHY_NOT_MAPPED
                      ? HP_SMALL
                                          : HP_UNSUPPORTED,
                  why, 0);
        return;
    }
    read_again(c, t, st, i, cold, own);
}

/* Repair's reads: a fresh mapping of the window, write back what was just written (a
 * package upgrade: dirty pages are not evicted), evict what nobody else maps, and read
 * the window in again through the MADV_HUGEPAGE mapping; says what that came to, and
 * concludes what it shows of the file.
 *
 * Small folios say something about the file only where they are this process's own
 * doing: its read of a window of which nothing was cached at the fault (another
 * process's read of one page between the eviction and the fault is enough to keep the
 * 2 MiB folio out: the rest comes small), which its thread's I/O accounting shows it
 * read whole (another process's pages, or reads of its own still in flight that
 * eviction passed by and mincore does not show, would leave less), with room in memory
 * for a 2 MiB folio as the page cache asks for one before the read and after it. Where
 * the kernel's version says the filesystem gives none anyway, that is confirmed
 * already (and compression, btrfs's, reads less than the window). A verdict this
 * process records for the boot takes two such reads, the window evicted in between. */
static void read_again(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i, int cold, int own)
{
    uint64_t hp = c->hp, woff = window_off(t, i, hp);
    char *w = t->map + i * t->stride;
    int corroborated = hp_kernel_rules_out(c, t);
    int needed = hp_could_record(c) && !corroborated ? 2 : 1;
    for (int attempt = 0;; attempt++) {
        int remapped = remap_window(c, t, w, woff); /* (drops the small pages mapped there) */
        if (remapped == -2) {
            set_state(t, st, i, HP_SMALL, HP_WHY_REPLACED, 0);
            return;
        }
        if (remapped != 0)
            hp_madvise(w, hp, MADV_DONTNEED); /* the best left: at least the entries go */
        if (t->advised < 0) { /* the fresh mapping's MADV_HUGEPAGE was refused */
            set_state(t, st, i, HP_SMALL, HP_WHY_MADVISE_REFUSED, 0);
            return;
        }
        if (dirty(c, t->fd, woff, hp))
            hp_fdatasync(t->fd);
        hp_fadvise(t->fd, woff, hp, 4 /* POSIX_FADV_DONTNEED */);
        long left = hp_cached_pages(c, t->fd, woff, hp, w);
        if (left > 0 && (cold || attempt)) { /* read by this process just now: its readahead may not be done */
            wait_for_reads(c, t->fd, woff);
            for (int tries = 0; tries < 10 && left > 0; tries++) {
                if (tries)
                    hp_nanosleep(1000000);
                hp_fadvise(t->fd, woff, hp, 4 /* POSIX_FADV_DONTNEED */);
                left = hp_cached_pages(c, t->fd, woff, hp, w);
            }
        }
        if (left != 0) { /* unknown (-1): assume nothing left the cache */
            set_state(t, st, i, HP_BUSY, HP_WHY_NOT_EVICTED, left > 0 ? left : (long)(hp / HP_PAGE));
            return;
        }
        enum hp_why before = hp_memory_room(c);
        if (hp_fault_hook)
            hp_fault_hook(t->fd, woff);
        long got = read_in(c, t, i);
        unsigned char again = 0;
        if (verify(c, t->map, t->stride, i, 1, &again) != 0) {
            set_state(t, st, i, HP_UNVERIFIED, HP_WHY_NONE, 0);
            return;
        }
        if (again) {
            set_state(t, st, i, cold ? HP_LOADED : HP_REPAIRED, HP_WHY_NONE, 0);
            hp_saw_large(c, t);
            return;
        }
        if (got < (long)hp && !corroborated) {
            /* Not this read's alone: tried again after a pause (reads in flight end), up to
             * HP_READ_TRIES reads; where nothing was counted the kernel keeps no I/O
             * accounting, and no try can tell. */
            if (got > 0 && attempt + 1 < HP_READ_TRIES) {
                hp_nanosleep(1000000L << attempt);
                continue;
            }
            set_state(t, st, i, HP_BUSY, HP_WHY_READ_MEANWHILE, 0);
            return;
        }
        enum hp_why room = before != HP_WHY_NONE ? before : hp_circumstances(c);
        if (room != HP_WHY_NONE) {
            set_state(t, st, i, HP_FAILED, room, 0);
            return;
        }
        if (++own >= needed || attempt + 1 >= HP_READ_TRIES)
            break;
    }
    /* Nothing of it was cached, nothing maps it, the mapping asked for a PMD folio and the
     * kernel accepted, this process read it whole: what the process's circumstances do
     * not explain, the file (or its filesystem) did. Fewer own reads than a record takes
     * (the tries spent on reads of others) conclude nothing. */
    enum hp_why why = own >= needed ? hp_small_read(c, t) : HP_WHY_READ_MEANWHILE;
    set_state(t, st, i,
              why == HP_WHY_FILE_NO_LARGE_FOLIOS || why == HP_WHY_NO_LARGE_FOLIOS ? HP_UNSUPPORTED : HP_BUSY, why,
              0);
}

/* What a window needs after the first look. */
enum { NEED_NOTHING, NEED_COLD, NEED_SMALL, NEED_UNVERIFIED, NEED_UNKNOWN };

/* The first look, which reads nothing in: each window whose first page is cached (when
 * measuring: each wholly cached one) is faulted and checked; those huge are done. Where
 * the process may not tell what is cached (`knowable` 0), nothing is looked at: every
 * window is left NEED_UNKNOWN (a fault of a cold one before MADV_HUGEPAGE would read it in
 * small folios). */
static void look(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t first, uint64_t count,
                 int knowable, unsigned char *need)
{
    uint64_t hp = c->hp;
    unsigned char touched[CHUNK], huge[CHUNK];
    int any = 0;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t i = first + k, woff = window_off(t, i, hp);
        char *w = t->map + i * t->stride;
        touched[k] = 0;
        need[k] = NEED_NOTHING;
        if (c->measure) {
            /* Faulting a window not wholly cached would read the rest in. */
            long n = file_ready(c, t) == 0 ? hp_cached_pages(c, t->fd, woff, hp, w) : -1;
            if (n == (long)(hp / HP_PAGE))
                touched[k] = 1;
            else
                need[k] = n == 0 ? NEED_COLD : NEED_SMALL;
        } else if (!knowable) {
            need[k] = NEED_UNKNOWN;
        } else if (first_page_cold(t, i)) {
            need[k] = NEED_COLD;
        } else {
            touched[k] = 1; /* a cached page is inside the file: faulting it is safe */
        }
        if (touched[k])
            touch(w), any = 1;
    }
    if (!any)
        return;
    int verified = verify(c, t->map, t->stride, first, count, huge) == 0;
    for (uint64_t k = 0; k < count; k++) {
        if (!touched[k])
            continue;
        if (!verified)
            need[k] = NEED_UNVERIFIED;
        else if (!huge[k])
            need[k] = NEED_SMALL;
        else {
            set_state(t, st, first + k, HP_HUGE, HP_WHY_NONE, 0);
            hp_saw_large(c, t);
        }
    }
}

/* Reads window i in through a fresh mapping of the target's own descriptor (PROT_READ,
 * MADV_HUGEPAGE, MADV_RANDOM: one PMD-order folio, nothing beyond) where the caller's
 * mapping is the program's own (t->random 0): a first fault there can come in small
 * folios where a mapping of the runtime's own gets one 2 MiB folio (seen on Linux 7.3
 * with ext4, for the program's and its libraries' windows alike). The caller's mapping
 * is faulted afterwards, onto what is cached. Returns the bytes this thread read from
 * storage meanwhile (0 none), or -1 cannot tell: a window with pages read just now was
 * not wholly cached, whatever the process may see of the cache; one read whole by it
 * was not read by anyone else either. */
static long read_in(struct hp_ctx *c, struct hp_target *t, uint64_t i)
{
    uint64_t hp = c->hp;
    long before = hp_thread_read_bytes(), after = -2;
    if (!t->random && file_ready(c, t) == 0) {
        char *res = hp_mmap(0, 2 * hp, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (!hp_mmap_failed(res)) {
            char *aside = (char *)(((uintptr_t)res + hp - 1) & ~(uintptr_t)(hp - 1));
            if (!hp_mmap_failed(hp_mmap(aside, hp, PROT_READ, MAP_PRIVATE | MAP_FIXED, t->fd, window_off(t, i, hp)))) {
                if (hp_madvise(aside, hp, MADV_HUGEPAGE) != 0)
                    t->advised = -1;
                hp_madvise(aside, hp, MADV_RANDOM);
                touch(aside);
                after = hp_thread_read_bytes(); /* the window's read: not the caller's readahead past it */
            }
            hp_munmap(res, 2 * hp);
        }
    }
    touch(t->map + i * t->stride);
    if (after == -2)
        after = hp_thread_read_bytes();
    return before < 0 || after < 0 ? -1 : after - before;
}

/* Whether window i, read in just now, is one 2 MiB folio; if not, evicted and read once
 * more (repair), to be sure; `own`: that read was the process's own (read_again). */
static void settle_read(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i, int verified,
                        int huge, int own)
{
    if (!verified)
        set_state(t, st, i, HP_UNVERIFIED, HP_WHY_NONE, 0);
    else if (huge) {
        set_state(t, st, i, HP_LOADED, HP_WHY_NONE, 0);
        hp_saw_large(c, t);
    } else
        repair(c, t, st, i, 1, own);
}

/* Window i came small from a read this process made whole (its thread's I/O accounting:
 * nothing of the window was cached, nor read by another meanwhile), with room for a 2 MiB
 * folio before the read: with room after it too, and a 2 MiB page of the process's own
 * granted, it is the file's doing (hp_small_read: kept in memory, by a process that
 * cannot see the cache), else the process's circumstances (failed). */
static void small_own_read(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i)
{
    enum hp_why why = hp_circumstances(c);
    if (why == HP_WHY_NONE)
        why = hp_small_read(c, t);
    set_state(t, st, i, why == HP_WHY_FILE_NO_LARGE_FOLIOS || why == HP_WHY_NO_LARGE_FOLIOS ? HP_UNSUPPORTED : HP_FAILED,
              why, 0);
}

/* A window of a file whose cached pages the process may not see (NEED_UNKNOWN), faulted
 * through the MADV_HUGEPAGE mapping (reading it if it was cold): huge, or small. Small
 * on a memory filesystem (tmpfs without huge pages), it is unsupported, as for any
 * process. Small from a read of its own that covered the window (`whole`), it says what
 * the file gives (small_own_read): reading it again would give the same. Small
 * elsewhere, it is evicted and faulted again only where a window of the
 * same filesystem was seen in a 2 MiB folio already, or where this process read part of
 * it just now, or read from storage while ld.so loaded the object (`fresh`): the process
 * cannot make sure an eviction worked, and where the filesystem gives none a window
 * found cached small would be read again at every start; one that was not
 * wholly cached is read again at most once (the next start finds it cached). That is
 * the case of a cold start through the audit library: ld.so's own faults on the
 * object's other loads (its dynamic section, its relocations) read around them before
 * la_objopen, into the window next to them, and a PMD-order folio cannot be made over
 * a range that holds small ones (seen on Linux 6.18 with a 2560 KiB readahead and 7.3,
 * on ext4, for a program and a library of one window each). */
static void settle_unknown(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t i, int verified,
                           int huge, int fresh, int whole)
{
    uint64_t woff = window_off(t, i, c->hp);
    char *w = t->map + i * t->stride;
    unsigned char again = 0;
    int remapped = 0;
    enum hp_why none = HP_WHY_NONE;
    if (!verified)
        set_state(t, st, i, HP_UNVERIFIED, HP_WHY_NONE, 0);
    else if (huge) {
        set_state(t, st, i, HP_HUGE, HP_WHY_NONE, 0);
        hp_saw_large(c, t);
    } else if (file_ready(c, t) == 0 && memory_fs(t))
        /* Its filesystem's type, which anyone may ask, says it all: nothing to evict or
         * read again, whatever is cached (all of it, in memory), as repair() says for a
         * process that sees the cache. `unsupported`, so that root's shared copies and
         * the anonymous mode take the window over for any user. */
        set_state(t, st, i, HP_UNSUPPORTED, HP_WHY_MEMORY_FS, 0);
    else if ((none = hp_known_none(c, t)) != HP_WHY_NONE) /* found on an earlier window */
        set_state(t, st, i, HP_UNSUPPORTED, none, 0);
    else if (whole)
        small_own_read(c, t, st, i);
    else if (!hp_known_large(c, t) && !fresh)
        set_state(t, st, i, HP_SMALL, HP_WHY_NOT_OWNER, 0);
    else if (!t->zap_ok || (t->zap_check && !(t->zap_ok = t->zap_check(), t->zap_check = 0, t->zap_ok)))
        set_state(t, st, i, HP_BUSY, HP_WHY_LOADER, 0);
    else if (file_ready(c, t) != 0 && file_problem(t) != HP_WHY_NO_FILE)
        set_state(t, st, i, HP_SMALL, file_problem(t), 0); /* not the file mapped: left alone */
    else if (file_ready(c, t) != 0 || (remapped = remap_window(c, t, w, woff)) == -1 || t->advised < 0)
        set_state(t, st, i, HP_SMALL, HP_WHY_NOT_OWNER, 0);
    else if (remapped == -2)
        set_state(t, st, i, HP_SMALL, HP_WHY_REPLACED, 0);
    else {
        if (fresh) /* its reads may be in flight yet, and eviction passes them by */
            wait_for_reads(c, t->fd, woff);
        hp_fadvise(t->fd, woff, c->hp, 4 /* POSIX_FADV_DONTNEED */);
        enum hp_why before = hp_memory_room(c);
        long got = read_in(c, t, i);
        if (verify(c, t->map, t->stride, i, 1, &again) != 0)
            set_state(t, st, i, HP_UNVERIFIED, HP_WHY_NONE, 0);
        else if (again)
            set_state(t, st, i, fresh ? HP_LOADED : HP_REPAIRED, HP_WHY_NONE, 0);
        else if (got >= (long)c->hp && before == HP_WHY_NONE) /* evicted whole, read whole: its own */
            small_own_read(c, t, st, i);
        else /* not evicted (mapped elsewhere), or read in part by another: cannot tell */
            set_state(t, st, i, HP_BUSY, HP_WHY_NOT_EVICTED, (long)(c->hp / HP_PAGE));
    }
}

/* The windows the first look left: nothing is read or evicted where what is known of
 * the file says it gets no 2 MiB folios (hp_verdict.h); otherwise cold windows are read
 * through the MADV_HUGEPAGE mapping (or left to the kernel, by its verdict) and small
 * ones evicted and read again. Until a window of the filesystem is seen in a 2 MiB
 * folio, cold windows are read one at a time: on a filesystem without large folios the
 * first one settles it, and the rest are not read at all. */
static void work(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st, uint64_t first, uint64_t count,
                 unsigned char *need)
{
    uint64_t hp = c->hp;
    int go = c->measure || prepared(c);
    unsigned char read[CHUNK], huge[CHUNK], fresh[CHUNK], whole[CHUNK];
    int any = 0, probed = 0, sampled = 0;
    enum hp_why room = HP_WHY_NONE;
    for (uint64_t k = 0; k < count; k++) {
        uint64_t i = first + k, woff = window_off(t, i, hp);
        int cold = need[k] == NEED_COLD;
        read[k] = fresh[k] = whole[k] = 0;
        if (need[k] == NEED_NOTHING)
            continue;
        enum hp_why none = go ? hp_known_none(c, t) : HP_WHY_NONE;
        if (none != HP_WHY_NONE)
            set_state(t, st, i, HP_UNSUPPORTED, none, 0); /* what every process gets there */
        else if (need[k] == NEED_UNVERIFIED)
            set_state(t, st, i, HP_UNVERIFIED, HP_WHY_NONE, 0);
        else if (c->measure)
            set_state(t, st, i, cold ? HP_COLD : HP_SMALL, HP_WHY_NONE, 0);
        else if (!go)
            set_state(t, st, i, cold ? HP_COLD : HP_SMALL, HP_WHY_THP_OFF, 0);
        else if (need[k] == NEED_SMALL)
            repair(c, t, st, i, 0, 0);
        else if (need[k] == NEED_UNKNOWN) {
            if (file_ready(c, t) != 0)
                set_state(t, st, i, HP_COLD, file_problem(t), 0);
            else if (woff + hp > (uint64_t)t->size) /* faulting past the end would SIGBUS */
                set_state(t, st, i, HP_COLD, HP_WHY_TRUNCATED, 0);
            else if (c->aware <= 0 && !advise(t))
                set_state(t, st, i, HP_SMALL, HP_WHY_MADVISE_REFUSED, 0);
            else {
                /* Room for a 2 MiB folio before the reads, for what a small one would say
                 * (until the filesystem is seen giving them, once per object). */
                if (!sampled && !hp_known_large(c, t))
                    room = hp_memory_room(c), sampled = 1;
                long got = read_in(c, t, i);
                /* hugify-run's mapping (t->random) is read ahead of everything else */
                fresh[k] = (got > 0 && !t->random) || t->loaded_read;
                whole[k] = sampled && room == HP_WHY_NONE && got >= (long)hp;
                read[k] = 1, any = 1;
            }
        } else {
            if (!probed && (c->aware < 0 || (c->aware_recorded && !c->aware_checked)))
                probe_verdict(c, t), probed = 1;
            if (c->aware > 0)
                set_state(t, st, i, HP_KERNEL, HP_WHY_NONE, 0);
            else if (file_ready(c, t) != 0)
                set_state(t, st, i, HP_COLD, file_problem(t), 0);
            else if (woff + hp > (uint64_t)t->size) /* faulting past the end would SIGBUS */
                set_state(t, st, i, HP_COLD, HP_WHY_TRUNCATED, 0);
            else if (!advise(t))
                set_state(t, st, i, HP_COLD, HP_WHY_MADVISE_REFUSED, 0);
            else if (!spend(c))
                set_state(t, st, i, HP_COLD, HP_WHY_BUDGET, 0);
            else if (hp_known_large(c, t))
                read_in(c, t, i), read[k] = 1, any = 1; /* checked together below */
            else {
                /* The filesystem not seen giving 2 MiB folios yet: one window at a time, and
                 * what a small one shows of the file is kept (read_again's rule). */
                unsigned char one = 0;
                enum hp_why before = hp_memory_room(c);
                long cached = hp_cached_pages(c, t->fd, woff, hp, t->map + i * t->stride);
                long got = read_in(c, t, i);
                int verified = verify(c, t->map, t->stride, i, 1, &one) == 0;
                int own = verified && !one && cached == 0 && before == HP_WHY_NONE &&
                          (got >= (long)hp || hp_kernel_rules_out(c, t)) && hp_circumstances(c) == HP_WHY_NONE;
                settle_read(c, t, st, i, verified, one, own);
            }
        }
    }
    if (!any)
        return;
    int verified = verify(c, t->map, t->stride, first, count, huge) == 0;
    for (uint64_t k = 0; k < count; k++)
        if (read[k] && need[k] == NEED_UNKNOWN)
            settle_unknown(c, t, st, first + k, verified, huge[k], fresh[k], whole[k]);
        else if (read[k])
            settle_read(c, t, st, first + k, verified, huge[k], 0);
}

void hp_settle(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st)
{
    if (t->map_proof == 2) { /* the caller knows the windows are not the file's bytes */
        st->windows += (uint32_t)t->nwin;
        for (uint64_t i = 0; i < t->nwin; i++)
            set_state(t, st, i, HP_COLD, HP_WHY_NOT_MAPPED, 0);
        release_file(t);
        return;
    }
    int all_huge = 1;
    /* Which pages of the file are cached the kernel tells only the file's owner, root or
     * a writer (cachestat refuses, mincore says every page is): another user's process
     * cannot tell a cold window, nor whether an eviction worked. */
    int knowable = hp_residency_knowable(c, t);
    for (uint64_t first = 0; first < t->nwin; first += CHUNK) {
        uint64_t count = t->nwin - first < CHUNK ? t->nwin - first : CHUNK;
        unsigned char need[CHUNK];
        int left = 0;
        st->windows += (uint32_t)count;
        look(c, t, st, first, count, knowable, need);
        for (uint64_t k = 0; k < count; k++)
            left |= need[k] != NEED_NOTHING;
        if (left)
            work(c, t, st, first, count, need), all_huge = 0;
    }
    /* Where every window was in place: later faults of this mapping (after memory
     * pressure evicted it) read 2 MiB folios too, unless the kernel does that for
     * executable mappings by itself. */
    if (all_huge && !c->measure && t->advise && prepared(c) && c->aware <= 0)
        advise(t);
    release_file(t);
}

