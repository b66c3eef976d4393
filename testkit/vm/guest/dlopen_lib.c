/* Loads the test package's hugified library with dlopen (not as a DT_NEEDED) and runs
 * its entry point: the kernel-matrix guest runs it under the audit library, which
 * must act on objects loaded this way too. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    long (*entry)(long) = (long (*)(long))dlsym(h, "lib_entry");
    if (!entry) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    printf("lib_entry: %ld\n", entry(1));
    return 0;
}
