/* The bundled example: a program with a few MiB of generated code, enough for its
 * code to span several 2 MiB huge pages. `make demo` builds it, shows hugify's plan,
 * rewrites it, and checks that the rewritten program prints the same thing. */
#include <stdio.h>

extern long exe_dispatch(long);

int main(int argc, char **argv) {
    (void)argv;
    printf("checksum of the generated code: %ld\n", exe_dispatch(argc));
    return 0;
}
