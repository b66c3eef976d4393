/* Prints the huge-page windows the C runtime (runtime/hp_elf.c) finds in each file
 * named on the command line, one "PATH OFFSET LENGTH" line per run ("PATH unreadable"
 * when hp_elf_ok rejects the header or the program headers cannot be read), so that
 * tests/test_as_is.py can hold them against the core's. */
#include <elf.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "hp_base.h"
#include "hp_elf.h"

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        Elf64_Ehdr eh;
        static Elf64_Phdr ph[512]; /* hp_elf_ok's limit */
        int fd = open(argv[i], O_RDONLY);
        int ok = fd >= 0 && pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh && hp_elf_ok(&eh) == 0 &&
                 pread(fd, ph, eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff) == (ssize_t)(eh.e_phnum * sizeof *ph);
        if (fd >= 0)
            close(fd);
        if (!ok) {
            printf("%s unreadable\n", argv[i]);
            continue;
        }
        struct hp_range r;
        unsigned next = 0;
        while (hp_exec_range(ph, eh.e_phnum, eh.e_type == ET_EXEC, HP_DEFAULT_SIZE, &next, &r))
            printf("%s %" PRIu64 " %" PRIu64 "\n", argv[i], r.off, r.len);
    }
    return 0;
}
