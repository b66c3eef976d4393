/* Whether this arm64 machine enforces BTI, so that a window's VmFlags "bt" means
 * something (testkit/vm/guest/aarch64_driver.py): code without a landing pad ("mov x0, #42;
 * ret") is called through a function pointer from a page mapped PROT_EXEC|PROT_BTI and
 * from one mapped PROT_EXEC alone, each in a child process. Prints one JSON object:
 * what ended each child ("exit N" with the value the call returned, or "signal N"). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PROT_BTI
#define PROT_BTI 0x10
#endif

static void call_without_landing_pad(int prot, char *out, size_t cap) {
    static const unsigned code[] = {0xd2800540 /* mov x0, #42 */, 0xd65f03c0 /* ret */};
    unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        snprintf(out, cap, "mmap failed");
        return;
    }
    memcpy(page, code, sizeof code);
    __builtin___clear_cache((char *)page, (char *)page + sizeof code);
    if (mprotect(page, 4096, prot) != 0) {
        snprintf(out, cap, "mprotect failed");
        return;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        long (*fn)(void) = (long (*)(void))(void *)page;
        _exit((int)fn());
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFSIGNALED(status))
        snprintf(out, cap, "signal %d", WTERMSIG(status));
    else
        snprintf(out, cap, "exit %d", WEXITSTATUS(status));
}

int main(void) {
    char guarded[64], plain[64];
    call_without_landing_pad(PROT_READ | PROT_EXEC | PROT_BTI, guarded, sizeof guarded);
    call_without_landing_pad(PROT_READ | PROT_EXEC, plain, sizeof plain);
    printf("{\"bti_page\": \"%s\", \"plain_page\": \"%s\", \"sigill\": %d}\n", guarded, plain, SIGILL);
    return 0;
}
