/* hugify rpm test program: calls generated code (over 1 MiB of it) and the library. */
#include <stdio.h>

extern long exe_dispatch(long);
extern long lib_entry(long);

int main(int argc, char **argv) {
    (void)argv;
    long a = exe_dispatch(argc);
    long b = lib_entry(a); /* main-calls-lib */
    printf("hugify-test: %ld %ld\n", a, b);
    return 0;
}
