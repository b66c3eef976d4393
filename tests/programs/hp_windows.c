/* Prints the huge-page windows the C runtime (runtime/hp_core.c) finds in each file
 * named on the command line, one "PATH OFFSET LENGTH" line per run, so that
 * tests/test_windows_table.py can hold them against the core's. */
#include <elf.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "hp_core.h"

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        static unsigned char head[65536];
        int fd = open(argv[i], O_RDONLY);
        ssize_t n = fd < 0 ? -1 : pread(fd, head, sizeof head, 0);
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *)head;
        if (fd >= 0)
            close(fd);
        if (n < (ssize_t)sizeof *eh || hp_elf_ok(eh) != 0 || eh->e_phoff + eh->e_phnum * sizeof(Elf64_Phdr) > (size_t)n) {
            printf("%s unreadable\n", argv[i]);
            continue;
        }
        struct hp_range r[HP_MAX_RANGES];
        int nr = hp_exec_ranges((const Elf64_Phdr *)(head + eh->e_phoff), eh->e_phnum, eh->e_type == ET_EXEC,
                                HP_DEFAULT_SIZE, r, HP_MAX_RANGES);
        for (int k = 0; k < nr; k++)
            printf("%s %" PRIu64 " %" PRIu64 "\n", argv[i], r[k].off, r[k].len);
    }
    return 0;
}
