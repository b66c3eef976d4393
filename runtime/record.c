/* libhugify-record.so — the LD_AUDIT library of `hugify try`'s first run.
 *
 * Every object ld.so loads into a process (the program, its libraries, what it
 * dlopens later), in every process that inherits LD_AUDIT, is appended as one line
 * "PID<TAB>PATH<LF>" to the file named by HUGIFY_RECORD in the process's initial
 * environment (hugify/trial/discover.py reads it). The program is named by
 * /proc/self/exe, a library by the name ld.so found it under (a relative one after
 * the working directory). The file is opened for each line and closed again, so the
 * program never sees a descriptor it did not open; a line is one write(2) to a file
 * opened O_APPEND, so the lines of concurrent processes do not mix.
 *
 * Nothing else is done: la_objopen returns 0, so no symbol binding is audited. Like
 * the audit library it is linked without libc (hp_sys.h). What it cannot see: static
 * programs (no ld.so), setuid and setgid ones (ld.so ignores LD_AUDIT for them), and
 * processes started with an environment that drops LD_AUDIT. */
#define _GNU_SOURCE
#include <link.h>

#include "hp_base.h"
#include "hp_sys.h"

#define EXPORT __attribute__((visibility("default")))
#define RECORD_ENV "HUGIFY_RECORD="

static char record[4096]; /* the file named by HUGIFY_RECORD */
static int looked;        /* the environment was read */

static int record_entry(const char *entry, void *arg)
{
    (void)arg;
    if (!hp_starts_with(entry, RECORD_ENV))
        return 0;
    hp_copy_str(record, sizeof record, entry + sizeof RECORD_ENV - 1);
    return 1;
}

static void put(char *line, size_t *n, size_t cap, const char *s)
{
    while (*s && *n < cap)
        line[(*n)++] = *s++;
}

EXPORT unsigned int la_version(unsigned int version)
{
    return version;
}

EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    (void)lmid;
    (void)cookie;
    if (!looked) {
        looked = 1;
        hp_each_record("/proc/self/environ", 0, record_entry, 0);
    }
    if (!record[0])
        return 0;
    char line[8300], path[4096];
    size_t n = hp_put_num(line, (uint64_t)hp_getpid(), 10), cap = sizeof line - 1;
    line[n++] = '\t';
    const char *name = map->l_name;
    if (!name || !name[0]) { /* the program */
        long len = HP_SYS(__NR_readlinkat, AT_FDCWD, "/proc/self/exe", path, sizeof path - 1, 0, 0);
        if (len <= 0)
            return 0;
        path[len] = 0;
        name = path;
    } else if (name[0] != '/') {
        const char *slash = name;
        while (*slash && *slash != '/')
            slash++;
        if (!*slash)
            return 0; /* the vDSO: ld.so names every file it found with a directory */
        /* found through a relative directory: after the working directory */
        if (HP_SYS(__NR_getcwd, path, sizeof path, 0, 0, 0, 0) <= 0)
            return 0;
        put(line, &n, cap, path);
        put(line, &n, cap, "/");
    }
    put(line, &n, cap, name);
    if (n == cap)
        return 0; /* a name this long is no file hugify try could use */
    line[n++] = '\n';
    int fd = hp_open(record, O_WRONLY | O_APPEND);
    if (fd >= 0) {
        hp_write(fd, line, n);
        hp_close(fd);
    }
    return 0;
}
