/* Preloaded into the programs the arm64 guest runs (testkit/vm/guest/aarch64_driver.py): when
 * the process exits, it appends one JSON line to $HUGIFY_PROBE_OUT with every mapping
 * of the process's own /proc/self/smaps: its range, permissions, path, VmFlags (where
 * "bt" says PROT_BTI), FilePmdMapped and AnonHugePages. The host reads which object each
 * window belongs to and how it is held. Unlike probe.c it faults nothing itself: the
 * programs run there call every function of their windows (tests/programs/gen_code.py's
 * dispatchers), so every window has been faulted by the time they exit. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The JSON string of s (paths and flags hold no quotes or backslashes here; anything
 * else outside printable ASCII is dropped). */
static void put_string(FILE *o, const char *s) {
    fputc('"', o);
    for (; *s; s++)
        if (*s >= 0x20 && *s < 0x7f && *s != '"' && *s != '\\')
            fputc(*s, o);
    fputc('"', o);
}

__attribute__((destructor)) static void report(void) {
    const char *out = getenv("HUGIFY_PROBE_OUT");
    if (!out)
        return;
    FILE *s = fopen("/proc/self/smaps", "r");
    FILE *o = fopen(out, "a");
    if (!s || !o)
        return;
    char line[4096];
    int open = 0;
    fprintf(o, "{\"pid\": %d, \"vmas\": [", (int)getpid());
    while (fgets(line, sizeof line, s)) {
        unsigned long lo, hi, kb;
        char perms[8];
        int off = 0;
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) == 3 && off > 0) {
            fprintf(o, "%s{\"start\": %lu, \"end\": %lu, \"perms\": ", open ? "}, " : "", lo, hi);
            put_string(o, perms);
            fputs(", \"path\": ", o);
            put_string(o, line + off);
            open = 1;
        } else if (open && sscanf(line, "FilePmdMapped: %lu kB", &kb) == 1) {
            fprintf(o, ", \"file_pmd\": %lu", kb * 1024);
        } else if (open && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            fprintf(o, ", \"anon_huge\": %lu", kb * 1024);
        } else if (open && strncmp(line, "VmFlags:", 8) == 0) {
            fputs(", \"flags\": ", o);
            put_string(o, line + 8);
        }
    }
    fprintf(o, "%s]}\n", open ? "}" : "");
    fclose(o);
    fclose(s);
}
