/* Preloaded into every program the kernel-matrix guest runs (testkit/vm/guest/guest_driver.py):
 * when the process exits, it touches one byte of every 2 MiB of each executable file
 * mapping (so each window is faulted once and smaps shows how the page cache holds
 * it), then appends one JSON line to $HUGIFY_PROBE_OUT with the size, FilePmdMapped and
 * ShmemPmdMapped (a shared copy's, on tmpfs) of each executable file mapping, and the
 * size and AnonHugePages of each executable
 * anonymous one (the runtime's anonymous copies; path "" or "[anon:...]"), read from
 * the process's own /proc/self/smaps. With HUGIFY_PROBE_HOLD=N it first sleeps N seconds
 * with the mappings in place, as a long-running program would hold them: long enough for
 * khugepaged's passes (every scan_sleep_millisecs, 10 s by default) to reach it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void touch_code(void) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[4096];
    if (!m)
        return;
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[0] == 'r' && perms[2] == 'x' &&
            strchr(line, '/'))
            for (unsigned long a = (lo + 0x1fffff) & ~0x1fffffUL; a < hi; a += 0x200000)
                (void)*(volatile char *)a;
    }
    fclose(m);
}

__attribute__((destructor)) static void report(void) {
    const char *out = getenv("HUGIFY_PROBE_OUT");
    const char *hold = getenv("HUGIFY_PROBE_HOLD");
    if (!out)
        return;
    if (hold)
        sleep((unsigned)atoi(hold));
    touch_code();
    FILE *s = fopen("/proc/self/smaps", "r");
    FILE *o = fopen(out, "a");
    if (!s || !o)
        return;
    char line[4096], path[4096] = "";
    unsigned long size = 0, shmem = 0;
    int exec = 0, anon = 0, first = 1;
    fprintf(o, "{\"pid\": %d, \"maps\": [", (int)getpid());
    while (fgets(line, sizeof line, s)) {
        unsigned long lo, hi, kb;
        char perms[8];
        int off = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) == 3 && off > 0) {
            char *p = line + off;
            p[strcspn(p, "\n")] = 0;
            exec = perms[2] == 'x' && p[0] == '/';
            anon = perms[2] == 'x' && (p[0] == 0 || strncmp(p, "[anon:", 6) == 0);
            snprintf(path, sizeof path, "%s", p);
            size = hi - lo;
            shmem = 0;
        } else if (exec && sscanf(line, "ShmemPmdMapped: %lu kB", &kb) == 1) {
            shmem = kb * 1024; /* smaps says it before FilePmdMapped */
        } else if (exec && sscanf(line, "FilePmdMapped: %lu kB", &kb) == 1) {
            fprintf(o, "%s{\"path\": \"%s\", \"size\": %lu, \"pmd\": %lu, \"shmem\": %lu}", first ? "" : ", ", path,
                    size, kb * 1024, shmem);
            first = 0;
        } else if (anon && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            fprintf(o, "%s{\"anon\": \"%s\", \"size\": %lu, \"pmd\": %lu}", first ? "" : ", ", path, size, kb * 1024);
            first = 0;
        }
    }
    fprintf(o, "]}\n");
    fclose(o);
    fclose(s);
}
