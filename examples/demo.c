/* The bundled example: a program with a few MiB of generated code, enough for its
 * code to span several 2 MiB huge pages. `make demo` builds it, shows hugify's plan,
 * rewrites it, checks that the rewritten program prints the same thing, and shows
 * that its code is then mapped with huge pages, and how long each takes.
 *
 *   demo                   runs every generated function once, prints a checksum
 *   demo ROUNDS            then calls them all ROUNDS times more, in a scattered order
 *                          (each call on another page of code: what huge pages help)
 *   demo --code-mapping    also prints how its own code is mapped (/proc/self/smaps) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FUNCS
#define FUNCS 4500 /* how many functions tools/demo generated */
#endif
/* Coprime to FUNCS: the scattered order visits every function once per round. */
#define STRIDE 2311

extern long exe_dispatch(long);
extern long (*const exe_table[])(long);

/* Sums Rss and FilePmdMapped over the executable mappings of this program's file. */
static void print_code_mapping(void)
{
    char exe[4096], line[4096 + 128];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    FILE *f = fopen("/proc/self/smaps", "r");
    if (n <= 0 || !f) {
        puts("code mapping: /proc/self/smaps cannot be read");
        return;
    }
    exe[n] = 0;
    long rss = 0, pmd = 0, v;
    int mine = 0;
    while (fgets(line, sizeof line, f)) {
        char perms[8], path[4096];
        if (sscanf(line, "%*x-%*x %7s %*x %*s %*u %4095s", perms, path) == 2)
            mine = perms[2] == 'x' && !strcmp(path, exe);
        else if (mine && sscanf(line, "Rss: %ld kB", &v) == 1)
            rss += v;
        else if (mine && sscanf(line, "FilePmdMapped: %ld kB", &v) == 1)
            pmd += v;
    }
    fclose(f);
    printf("code resident %ld kB, of which %ld kB mapped with 2 MiB pages (FilePmdMapped)\n", rss, pmd);
}

int main(int argc, char **argv)
{
    const char *arg = argc > 1 ? argv[1] : "";
    long sum = exe_dispatch(1), rounds = atol(arg);
    for (long r = 0; r < rounds; r++)
        for (long i = 0; i < FUNCS; i++)
            sum = sum * 31 + exe_table[i * STRIDE % FUNCS](sum + i);
    printf("checksum of the generated code: %ld\n", sum);
    if (!strcmp(arg, "--code-mapping"))
        print_code_mapping();
    return 0;
}
