/* Test program: exercises every structure the rewriter repairs, and prints
 * results that change if any of them is wrong. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef WITH_SDT
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
unsigned short hugify_tick_semaphore __attribute__((unused)) __attribute__((section(".probes")));
#endif

extern long exe_dispatch(long);
extern long lib_compute(long);
extern void *lib_compute_address(void);
extern long lib_ifunc(long);
extern __thread long lib_tls;

static __thread long exe_tls = 5;
static int events[8];
static int nevents;

__attribute__((constructor)) static void early(void) { events[nevents++] = 1; }
__attribute__((constructor(200))) static void earlier(void) { events[nevents++] = 2; }
__attribute__((destructor)) static void late(void) { printf("destructor ran\n"); }

static long times3(long x) { return x * 3; }
static long times5(long x) { return x * 5; }
/* IFUNC resolvers run while the loader relocates (before libc is initialised in a
 * static-pie, before lazy PLT slots are usable under lld): they call nothing. */
static const volatile int use_times5 = 0;
static long (*pick_multiplier(void))(long) { return use_times5 ? times5 : times3; }
long multiply(long) __attribute__((ifunc("pick_multiplier")));

static const char *const greek[] = {"alpha", "beta", "gamma", "delta"};

/* Debuggers must show the same backtrace, arguments and locals here after the rewrite. */
static int __attribute__((noinline)) crash_here(int depth, const char *why) {
    int local = depth * 3;
    volatile int *nowhere = 0;
    printf("crashing: %s %d\n", why, local);
    fflush(stdout);
    return *nowhere + local;
}

static void *thread_main(void *arg) {
    lib_tls += (long)arg;
    exe_tls += 1;
    return (void *)(lib_tls * 100 + exe_tls);
}

int main(int argc, char **argv) {
    (void)argv;
    if (getenv("HUGIFY_TEST_CRASH"))
        return crash_here(argc + 4, "requested");
    long acc = exe_dispatch(argc);
    printf("generated code: %ld\n", acc);
    printf("library: %ld\n", lib_compute(7));
    printf("constructors: %d %d (%d)\n", events[0], events[1], nevents);
    printf("ifunc: exe %ld lib %ld\n", multiply(7), lib_ifunc(7));
    printf("strings: %s %s %zu\n", greek[0], greek[3], strlen(greek[2]));
    long (*fp)(long) = lib_compute;
    printf("function pointer equality: %d\n", (void *)fp == lib_compute_address());
    pthread_t t;
    void *ret;
    pthread_create(&t, NULL, thread_main, (void *)3);
    pthread_join(t, &ret);
    printf("tls: main %ld %ld thread %ld\n", lib_tls, exe_tls, (long)ret);
#ifdef WITH_SDT
    if (hugify_tick_semaphore)
        printf("probe enabled\n");
    STAP_PROBE1(hugify, tick, acc);
#endif
#ifndef STATIC
    void *h = dlopen("libhug.so", RTLD_NOW);
    if (!h) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    long (*viadl)(long) = (long (*)(long))dlsym(h, "lib_compute");
    printf("dlopen: %ld same %d\n", viadl(9), (void *)viadl == lib_compute_address());
#endif
    return 0;
}
