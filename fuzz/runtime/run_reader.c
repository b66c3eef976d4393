/* libFuzzer target `run-reader` (bench/fuzz.py builds it with clang -fsanitize=fuzzer,address):
 * hugify-run's reader of an object it found (runtime/hugify-run.c: the first page and its
 * ELF header, read_phdrs, the window rule over them, range_in_file, read_deps), on the
 * input as the file. hugify-run.c is compiled into this target whole, with its main
 * renamed, so that the target runs its static functions as they are. */
#define _GNU_SOURCE
#include <sys/mman.h>

#define main hugify_run_main
#include "hugify-run.c"
#undef main

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) {
        fd = memfd_create("run-reader", MFD_CLOEXEC);
        if (fd < 0)
            abort();
        hp_ctx_init(&ctx, HP_DEFAULT_SIZE);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        abort();
    /* open_elf()'s reads, on the descriptor. */
    head_len = pread(fd, head.bytes, sizeof head.bytes, 0);
    if (head_len < (ssize_t)sizeof head.eh || hp_elf_ok(&head.eh) != 0)
        return 0;
    static Elf64_Phdr ph[512];
    unsigned phnum;
    if (read_phdrs(fd, ph, &phnum) != 0)
        return 0;
    struct hp_range r;
    unsigned next = 0;
    volatile int fits = 0;
    while (hp_exec_range(ph, phnum, head.eh.e_type == ET_EXEC, ctx.hp, &next, &r))
        fits += range_in_file(&r, size);
    struct deps d;
    read_deps(fd, ph, phnum, 1, &d);
    free_deps(&d);
    return 0;
}
