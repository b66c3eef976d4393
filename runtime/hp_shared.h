/* The shared mode of the hugify runtime (docs/runtime-reference.md, "Shared copies").
 *
 * Where the filesystem gives a file no 2 MiB folios (hp_settle's HP_UNSUPPORTED), root
 * (`hugify prefetch`: the boot service, the package triggers, the timer) keeps one copy
 * of the whole file on a tmpfs mounted with huge=within_size, written at its final size,
 * so that the copy's 2 MiB windows are shared-memory huge pages. The audit library maps
 * each unsupported window of a hugified object from that copy, at the same address and
 * file offset with the same protections, in place of the file mapping: every process of
 * the machine shares the copy's huge pages, and tools that read the mapped file (perf's
 * build-id, core dumps' file notes) read an identical ELF file.
 *
 * A copy is used only after proving, for each object:
 *   - the process maps the windows from one file, which is the inode the record names
 *     (device and inode as /proc/self/maps says them: the record's key);
 *   - that file, opened by the object's name and proven to be that very inode (hp_map.h),
 *     has the size, modification and change times (ns) the record says: it has not been
 *     written since root copied it;
 *   - the runtime directory, the copies' directory, the object's directory, the record
 *     and the copy are root's alone (owned by root, not writable by group or others;
 *     no symbolic link followed below the runtime directory); the copy is a regular file
 *     with one link, on tmpfs, of the original's size, and the inode and change time root
 *     sealed it with (any write to it since changes its change time);
 *   - each window of the copy, mapped aside, is one PMD (shared-memory huge pages may be
 *     refused: shmem_enabled "deny", a tmpfs without huge=, a split).
 * Otherwise nothing is replaced, and HUGIFY_DEBUG gets one line saying why. The runtime
 * never writes a copy.
 *
 * Layout, in the runtime directory (HUGIFY_RUNTIME_DIR, else /run/hugify):
 *   shared/                          the tmpfs (root, 0755, nosuid, nodev, huge=within_size)
 *   shared/MAJOR:MINOR:INODE/        one directory per original (root, 0755)
 *   shared/MAJOR:MINOR:INODE/record  the record (HP_SHARED_MAGIC, fields below)
 *   shared/MAJOR:MINOR:INODE/NAME    the copy, named as the original is (perf shows it)
 * The record is one line of space-separated fields, then the original's path:
 *   "hugify-shared-1 MAJOR MINOR INODE SIZE MTIME_NS CTIME_NS COPY_INODE COPY_CTIME_NS
 *    SHA256 NAME\nPATH\n"
 * (hugify/shared.py writes it; tests/test_runtime_shared.py holds the two to one format.)
 *
 * Like hp_core, raw system calls only (hp_sys.h). */
#ifndef HUGIFY_HP_SHARED_H
#define HUGIFY_HP_SHARED_H

#include <stdint.h>

#include "hp_core.h"

#define HP_SHARED_DIR "shared"
#define HP_SHARED_RECORD "record"
#define HP_SHARED_MAGIC "hugify-shared-1"
/* The environment variable that turns the mode off for one process ("0" or "off"). */
#define HP_SHARED_ENV "HUGIFY_SHARED"

/* One executable range of whole windows of a mapped object. */
struct hp_shared_range {
    char *at;       /* run-time address of window 0 (hp-aligned) */
    uint64_t nwin;
    uint64_t off;   /* file offset of window 0 */
    int prot;       /* the segment's protections (PROT_*; PROT_BTI where ld.so set it) */
    /* hp_settle's state of each window: those HP_UNSUPPORTED are mapped from the copy,
     * and become HP_HUGE (so that the anonymous mode leaves them). NULL: none is. */
    struct hp_window *states;
    uintptr_t keep; /* an address whose window is never replaced (ld.so's running code) */
    int traced;     /* a debugger is attached: it may have written breakpoints into the
                     * windows already (into the program before ld.so ran, into a library
                     * when ld.so announced it, before la_objopen), so a window is replaced
                     * only if its bytes are the copy's */
};

/* Maps the unsupported windows of `r` from root's shared copy of the object's file, where
 * everything above is proven. `fd` is the object's file (-1: opened from `path`; closed
 * again), used only if proven to be the inode mapped at r->at; `path` names it in the
 * debug line. `rundir` is the runtime directory; `off` nonzero: the mode is off for this
 * process. Returns the number of windows mapped from the copy. Never fails the caller:
 * whatever goes wrong leaves the windows on their file mapping, and `debug` gets one line
 * per range that had windows to map ("hugify-audit: shared PATH: M/N windows mapped
 * from COPY", else the first window left alone and why). */
uint64_t hp_shared_map(struct hp_ctx *c, const char *rundir, int off, int debug, struct hp_shared_range *r, int fd,
                       const char *path);

#endif
