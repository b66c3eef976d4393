/* The bottom layer of the hugify runtime: what every file above calls and that calls
 * nothing of theirs. Text and numbers, the lines and records of a short file (/proc,
 * /sys), the address range heading a /proc/PID/maps line, this boot's id, and the PMD
 * size the kernel reports.
 *
 * It uses only the raw system calls of hp_sys.h, so that the audit library can be
 * linked without libc. The layers above it are listed in README.md (Layout of the
 * source). */
#ifndef HUGIFY_HP_BASE_H
#define HUGIFY_HP_BASE_H

#include <stddef.h>
#include <stdint.h>

/* The huge-page size where the kernel does not say (hp_pmd_size): a PMD on x86-64 and
 * on arm64 with 4 KiB pages, and the smallest PMD of any kernel the runtime runs on (arm64
 * with 16 or 64 KiB pages has 32 or 512 MiB ones): whole windows of any PMD size are
 * whole windows of this size too. */
#define HP_DEFAULT_SIZE (2UL << 20)
#define HP_PAGE 4096UL /* smallest base page; only used to size probes */

size_t hp_strlen(const char *s);
void hp_memzero(void *p, size_t n);
/* Writes v in `base` (10 or 16) at out (up to 20 characters, no NUL); returns how many. */
size_t hp_put_num(char *out, uint64_t v, unsigned base);
/* The value of a lower-case hexadecimal digit, or -1. */
int hp_hex_digit(char ch);

/* Whether `s` starts with `prefix`. */
int hp_starts_with(const char *s, const char *prefix);
/* Copies `src` into `dst` of `cap` bytes, cut to fit, NUL-terminated. */
void hp_copy_str(char *dst, size_t cap, const char *src);
/* dir + "/" + name (+ suffix) into out; 0, or -1 if it does not fit. */
int hp_join(char *out, size_t cap, const char *dir, const char *name, const char *suffix);

/* Calls each(record, arg) for every record of the file at `path` that ends in the
 * byte `end` (passed NUL-terminated, cut at 4 KiB); stops at the first non-zero
 * return and returns it; 0 at the end of the file, -1 if it cannot be opened. For
 * the short files of /proc: hp_each_line reads lines, and records ending in 0 are
 * the entries of /proc/self/environ (the process's initial environment, which
 * ld.so's audit namespace has no environ variable for). */
int hp_each_record(const char *path, char end, int (*each)(const char *record, void *arg), void *arg);
int hp_each_line(const char *path, int (*each)(const char *line, void *arg), void *arg);
/* The same over the open descriptor fd (not closed). */
int hp_each_line_fd(int fd, int (*each)(const char *line, void *arg), void *arg);

/* The "start-end" address range heading a /proc/PID/maps or smaps line: the rest of
 * the line after it, or 0 if the line does not start with one. */
const char *hp_maps_range(const char *line, uint64_t *start, uint64_t *end);

/* This boot's id (/proc/sys/kernel/random/boot_id), 36 characters and a NUL; 0 or -1. */
int hp_boot_id(char out[37]);

/* The PMD size the kernel maps huge pages with (transparent_hugepage/hpage_pmd_size),
 * read each time it is asked (hugify-run and the audit library ask once per process,
 * as `hugify prefetch` does); HP_DEFAULT_SIZE where the file cannot be read
 * or says no size (a kernel without THP). */
uint64_t hp_pmd_size(void);

#endif
