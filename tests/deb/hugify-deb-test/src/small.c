/* hugify debhelper test: a program far below the 1 MiB threshold. */
#include <stdio.h>

int main(void) {
    puts("hugify-deb-small");
    return 0;
}
