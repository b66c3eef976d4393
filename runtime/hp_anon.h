/* The anonymous-copy mode of the hugify runtime (docs/runtime-reference.md, "Anonymous copies").
 *
 * Where the filesystem gives a file no 2 MiB folios (hp_settle's HP_UNSUPPORTED), the
 * audit library can copy each whole window of a hugified object into a 2 MiB anonymous
 * huge page and put the copy in place of the file mapping, at the same address with the
 * same protections. Opt-in per program; every failure leaves the file mapping in place.
 *
 * Like hp_core it uses only the raw system calls of hp_sys.h (the audit library has no
 * libc). */
#ifndef HUGIFY_HP_ANON_H
#define HUGIFY_HP_ANON_H

#include <stdint.h>

#include "hp_core.h"

enum hp_anon_mode {
    HP_ANON_OFF,         /* the default: file mappings only */
    HP_ANON_UNSUPPORTED, /* copy the windows hp_settle left HP_UNSUPPORTED */
    HP_ANON_ALWAYS,      /* copy every window (forced; for testing and for the bold) */
};

/* The environment variable the audit library reads (hugify-run --anonymous sets it):
 * "always" forces, "0"/"off"/"" turns the mode off (also against the policy), anything
 * else copies only where the file-backed way is unsupported. */
#define HP_ANON_ENV "HUGIFY_ANONYMOUS"
/* The record `hugify prefetch` writes in the runtime directory from the policy key
 * [runtime] anonymous: one absolute (real) program path per line; '#' starts a comment. */
#define HP_ANON_RECORD "anonymous"

struct hp_anon_settings {
    int mode;  /* enum hp_anon_mode */
    int debug; /* HUGIFY_DEBUG: one line per object on stderr */
    int perf_map; /* HUGIFY_PERF_MAP=1: /tmp/perf-PID.map, for perf attached later */
    int force_smaps; /* HUGIFY_FORCE_SMAPS=1: check copies from smaps, as before Linux 6.7 */
    char runtime_dir[512]; /* HUGIFY_RUNTIME_DIR, else /run/hugify: the per-boot records */
    int shared_off; /* HUGIFY_SHARED=0 or off: no window mapped from root's shared copies (hp_shared.h) */
};

/* The settings of this process: HUGIFY_ANONYMOUS, HUGIFY_DEBUG, HUGIFY_PERF_MAP, HUGIFY_SHARED,
 * HUGIFY_FORCE_SMAPS and HUGIFY_RUNTIME_DIR from
 * /proc/self/environ, else the program's entry in $HUGIFY_RUNTIME_DIR/anonymous
 * (default /run/hugify). Costs one read of environ (and of the record if the variable
 * is not set); called once per process, at its first hugified object. */
void hp_anon_read_settings(struct hp_anon_settings *s);

/* One executable range of whole windows of a mapped object. */
struct hp_anon_range {
    char *at;        /* run-time address of window 0 (hp-aligned) */
    uint64_t nwin;
    uint64_t off;    /* file offset of window 0 */
    uint64_t vaddr;  /* link-time address of window 0: symbols are placed relative to it */
    int prot;        /* the segment's protections (PROT_*; PROT_BTI where ld.so set it, hp_bti.h) */
    const struct hp_window *states; /* hp_settle's state of each window; NULL: not known */
};

/* Copies the windows of `r` that the mode selects into anonymous 2 MiB pages and puts
 * them in place; with HUGIFY_PERF_MAP=1, adds their symbols to /tmp/perf-PID.map. `fd`
 * is the object's file (-1: opened from `path`; it is closed again), used only if it is
 * proven to be the inode mapped at r->at (hp_map.h; else no window is copied:
 * "replaced"), for its size (no window past its end is copied: "beyond-eof") and its
 * symbols; `path` names it (in the debug line; "/proc/self/exe" is resolved). The copies
 * carry no VMA name (perf would take a named one for a file). Returns the
 * number of windows copied. Never fails the caller: whatever goes wrong leaves that window
 * on its file mapping, and HUGIFY_DEBUG gets one line per range saying what happened. */
uint64_t hp_anon_copy(struct hp_ctx *c, const struct hp_anon_settings *s, const struct hp_anon_range *r,
                      int fd, const char *path);

struct link_map;

/* At the end of each load (la_activity LA_ACT_CONSISTENT; `head`: the namespace's first
 * object): once this process has a perf map, hooks the C library's fork() so that a
 * forked child gets /tmp/perf-CHILD.map, a link to its parent's (atfork child handler). */
void hp_anon_loaded(const struct link_map *head);

#endif
