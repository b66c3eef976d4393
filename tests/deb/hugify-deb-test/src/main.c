/* hugify debhelper test program: calls generated code (over 1 MiB of it) and its library. */
#include <stdio.h>

extern long exe_dispatch(long);
extern long lib_entry(long);

int main(int argc, char **argv) {
    (void)argv;
    long a = exe_dispatch(argc);
    long b = lib_entry(a); /* main-calls-lib */
    printf("hugify-deb-test: %ld %ld\n", a, b);
    return 0;
}
