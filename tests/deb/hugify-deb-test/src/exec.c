/* hugify debhelper test: a program that is not position-independent (an ET_EXEC at
 * its fixed address), calling over 2 MiB of generated code. */
#include <stdio.h>

extern long fix_dispatch(long);

int main(int argc, char **argv) {
    (void)argv;
    long a = fix_dispatch(argc); /* exec-calls-generated */
    printf("hugify-deb-exec: %ld\n", a);
    return 0;
}
