/* hugify debhelper test: the same kind of program linked by lld (clang -fuse-ld=lld),
 * whose hugified output has its program header table grown in place at e_phoff: it calls
 * its generated code, its library (DT_NEEDED, found through RUNPATH $ORIGIN) and, given a
 * path, a plugin it opens with dlopen. */
#include <dlfcn.h>
#include <stdio.h>

extern long lldx_dispatch(long);
extern long lld_lib_entry(long);

int main(int argc, char **argv) {
    long a = lldx_dispatch(argc);
    long b = lld_lib_entry(a);
    long c = 0;
    if (argc > 1) {
        void *h = dlopen(argv[1], RTLD_NOW);
        long (*entry)(long) = h ? (long (*)(long))dlsym(h, "lld_plugin_entry") : 0;
        if (!entry) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        c = entry(b);
    }
    printf("hugify-deb-test-lld: %ld %ld %ld\n", a, b, c);
    return 0;
}
