/* The settle engine of the hugify runtime, shared by hugify-run, libhugify-audit.so and
 * libhugify-engine.so (`hugify prefetch`/`status`): getting the whole huge-page windows
 * of a hugified object's code into the page cache as 2 MiB folios and mapped by PMDs
 * (hp_settle), with the states it leaves each window in.
 *
 * It uses only the raw system calls of hp_sys.h, so that the audit library can be
 * linked without libc. See docs/runtime-reference.md for the method. */
#ifndef HUGIFY_HP_CORE_H
#define HUGIFY_HP_CORE_H

#include <stdint.h>

#include "hp_ctx.h"

/* The state of one window after hp_settle: the one set of states of the runtime and of
 * `hugify prefetch`/`hugify status` (which report them by the names of
 * libhugify-engine.so); docs/runtime-reference.md "Window states". */
enum hp_state {
    HP_HUGE,        /* one 2 MiB folio already */
    HP_LOADED,      /* was not cached; read in as one 2 MiB folio */
    HP_REPAIRED,    /* was in small folios; evicted and read in again as one */
    HP_KERNEL,      /* not cached; left to the kernel's own PMD exec readahead */
    HP_BUSY,        /* small folios that could not be evicted */
    HP_FAILED,      /* evicted and read in again, still small folios */
    HP_UNSUPPORTED, /* the file's filesystem gives it no 2 MiB folios */
    HP_COLD,        /* not cached, and left so */
    HP_SMALL,       /* cached in small folios, and left so */
    HP_UNVERIFIED,  /* read in, but the kernel gives no way to tell how */
    HP_NSTATES
};

struct hp_window {
    uint8_t state, why; /* enum hp_state, enum hp_why */
    uint32_t pages;     /* busy: pages left in the page cache after eviction */
};

/* How many windows of one object ended in each state. */
struct hp_stats {
    uint32_t windows;
    uint32_t n[HP_NSTATES];
    uint32_t why[HP_NWHY]; /* windows per reason (HP_WHY_NONE: those without one) */
};

/* Whether transparent huge pages may be used (c->prepare, called once): 0 when the
 * administrator set them to never. */
int hp_thp_allowed(struct hp_ctx *c);

/* Whether cachestat(2) (Linux 6.5) works. */
int hp_cachestat_works(struct hp_ctx *c);

/* Settles the windows of `t` (the state machine of docs/runtime-reference.md): faults each (an
 * uncached window is read through the MADV_HUGEPAGE mapping as one 2 MiB folio),
 * checks which are PMD-mapped, and evicts and reads again those held in small folios
 * that nobody else maps. When every window is in place it costs a mincore(2) and a
 * fault per window and one PAGEMAP_SCAN. With c->measure it only looks. Adds each
 * window's state to `st` (and t->report). */
void hp_settle(struct hp_ctx *c, struct hp_target *t, struct hp_stats *st);

/* Called, where set, between a check that a window holds nothing in the page cache and
 * the fault that reads it (the kernel probe's, and repair's): the tests make a racing
 * reader there (hp_engine_set_fault_hook). */
extern void (*hp_fault_hook)(int fd, uint64_t off);

/* Pages of [off, off + len) of fd in the page cache (cachestat, else mincore of the
 * unfaulted `window` mapping it, if not NULL); -1 if unknown. */
long hp_cached_pages(struct hp_ctx *c, int fd, uint64_t off, uint64_t len, char *window);

#endif
