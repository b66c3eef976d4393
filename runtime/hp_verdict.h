/* What the hugify runtime knows of whether a file can be held in 2 MiB folios, and the
 * records it keeps of that for the boot (docs/runtime-reference.md, "Filesystems without large
 * folios" and "The runtime directory").
 *
 * Knowledge has three sources, strongest first: what this process saw (a window in a
 * 2 MiB folio; a window it read in again itself, small, with nothing in its way), the
 * records root kept in the runtime directory this boot, and a hint from the kernel's
 * version and the filesystem's type, used only by a process that cannot keep records.
 * A record is written only on evidence that the filesystem (or the file) refuses, never
 * from the process's circumstances or another process's reads (hp_core.c repair: the
 * read that came small was this thread's, of a window nothing else had cached), and is
 * dropped by the first window seen in a 2 MiB folio; only root writes records, and only
 * records root wrote in a root-owned directory that nobody else may write are honoured.
 *
 * Like every layer of the runtime, raw system calls only (hp_sys.h). */
#ifndef HUGIFY_HP_VERDICT_H
#define HUGIFY_HP_VERDICT_H

#include <stddef.h>

#include "hp_ctx.h"

/* The per-boot records of what gives no large folios, in the runtime directory:
 * "no-large-folios-MAJOR:MINOR" (a filesystem) holding "BOOT-ID FS-MAGIC\n" and
 * "no-large-folios-MAJOR:MINOR-INODE" (a file) holding "BOOT-ID FS-MAGIC CTIME SIZE\n"
 * (magic in hex, ctime as SECONDS.NANOSECONDS). */
#define HP_NO_LARGE_FOLIOS_PREFIX "no-large-folios-"
/* The record of the kernel verdict (written by `hugify prefetch`, hugify/rundir.py). */
#define HP_KERNEL_RECORD "kernel-exec-pmd"
/* Room a memory cgroup must have below its limit for a small read to say anything about
 * the filesystem, in huge pages. */
#define HP_CGROUP_ROOM 4

/* Opens record `name` of the runtime directory `dir` for reading, only if it is to be
 * honoured: `dir` a directory owned by root that neither group nor others may write,
 * the record a regular file owned by root that neither group nor others may write,
 * neither reached through a symlink at its last component. A descriptor, or -1. */
int hp_record_open_in(const char *dir, const char *name);
/* The same in c->rundir, whose checked descriptor the context keeps until released. */
int hp_record_open(struct hp_ctx *c, const char *name);
/* Whether this process writes records: root, with a runtime directory that passes the
 * checks above (made, mode 0755, when it is missing) on a filesystem mounted writable. */
int hp_may_record(struct hp_ctx *c);
/* Whether this process would keep a record it wrote, making nothing: hp_may_record, or a
 * runtime directory missing where hp_may_record would make one (its parent a directory on
 * a filesystem mounted writable). */
int hp_could_record(struct hp_ctx *c);
/* Replaces record `name` with `text` (n bytes): a new file made with
 * O_CREAT|O_EXCL|O_NOFOLLOW beside it and renamed over it, both relative to the
 * directory's descriptor, so a symlink planted at either name is replaced, never
 * followed. Only where hp_may_record. 0 written, -1 not. */
int hp_record_write(struct hp_ctx *c, const char *name, const char *text, size_t n);
/* Removes record `name` (a contradicted verdict). Only where hp_may_record. 0 done (or
 * there was none), -1 not. */
int hp_record_drop(struct hp_ctx *c, const char *name);

/* What `hugify prefetch` recorded in c->rundir/kernel-exec-pmd for the current boot
 * (honoured only as said above): "BOOT-ID AWARE THP", AWARE 1 if the kernel reads
 * executable mappings as PMD folios by itself (0 no, - not known), THP the
 * transparent_hugepage/enabled mode. */
struct hp_verdict {
    int valid; /* a record of this boot was found */
    int aware;
    int thp_never;
};
struct hp_verdict hp_read_verdict(struct hp_ctx *c);

/* Why nothing is to be read or evicted for t's windows, by what is known of its file and
 * filesystem: HP_WHY_NONE (go ahead: nothing known against it), HP_WHY_NO_LARGE_FOLIOS
 * (the filesystem gives none: evidence or record), HP_WHY_FILE_NO_LARGE_FOLIOS (this
 * file gets none), HP_WHY_KERNEL_VERSION (the hint, for a process that cannot keep
 * records: not hp_may_record). Looks the records up once per filesystem and file. */
enum hp_why hp_known_none(struct hp_ctx *c, struct hp_target *t);
/* Whether this kernel's version says t's filesystem gives no large folios (the hint's
 * rule, hp_large_folios_since): a small read there is no one's doing but the kernel's. */
int hp_kernel_rules_out(struct hp_ctx *c, struct hp_target *t);
/* Whether the kernel tells this process which pages of t's file are cached: to the
 * file's owner, root (CAP_FOWNER) or a process that may write it (cachestat(2) refuses
 * others, mincore(2) says every page is). 1 also where the file cannot be looked at. */
int hp_residency_knowable(struct hp_ctx *c, struct hp_target *t);
/* Whether t's filesystem was seen giving 2 MiB folios in this process. */
int hp_known_large(struct hp_ctx *c, struct hp_target *t);
/* A window of t was seen in a 2 MiB folio: its filesystem gives large folios. Drops
 * what contradicts it: the filesystem's record (and the file's, with c->thorough). */
void hp_saw_large(struct hp_ctx *c, struct hp_target *t);
/* Windows of t came in small folios from reads that were this process's own, with
 * nothing in its way (hp_core.c repair says when: the caller makes sure). Returns the
 * file's verdict HP_WHY_FILE_NO_LARGE_FOLIOS, or HP_WHY_NO_LARGE_FOLIOS when a second
 * file of the same filesystem did the same in this process (then the filesystem's);
 * recorded where hp_may_record. */
enum hp_why hp_small_read(struct hp_ctx *c, struct hp_target *t);
/* Whether some zone has a free block of memory of a huge page or more (/proc/buddyinfo):
 * where it has none, a huge page asked for comes as small pages (fragmented memory). */
int hp_free_huge_blocks(struct hp_ctx *c);
/* Whether a /proc/buddyinfo line is of a zone other than ZONE_DMA with a free block of
 * 2^order pages or more. */
int hp_buddy_block(const char *line, unsigned order);
/* Whether the page cache could have a 2 MiB folio now, as it asks for one (no retries:
 * a free 2 MiB block in a zone above its min watermark and reserve, /proc/zoneinfo and
 * /proc/buddyinfo), and the process's memory cgroup and those above it have room:
 * HP_WHY_NONE, HP_WHY_FRAGMENTED or HP_WHY_CGROUP_LIMIT. Sampled before and after a read
 * whose small folios are to say something about the file. */
enum hp_why hp_memory_room(struct hp_ctx *c);
/* hp_memory_room, then HP_WHY_NO_HUGE_PAGE where an anonymous MADV_HUGEPAGE page of the
 * process's own comes small (a memory policy, a cpuset). */
enum hp_why hp_circumstances(struct hp_ctx *c);

/* Since which Linux version a filesystem type (statfs f_type) gives regular files large
 * folios, as major * 1000 + minor; 0: in none of the kernels hugify knows (btrfs: only
 * under CONFIG_BTRFS_EXPERIMENTAL, which Debian does not set); -1: no opinion. The one
 * table of it: hugify status asks the engine (hp_engine_large_folios_since). */
int hp_large_folios_since(long magic);
/* This kernel's version, major * 1000 + minor (uname), or -1. */
int hp_kernel_version(struct hp_ctx *c);

#endif
