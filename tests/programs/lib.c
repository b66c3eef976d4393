/* Shared library of the test program: global-dynamic TLS, IFUNC, a constructor,
 * and a large generated body. */
#include <stdio.h>
#include <stdlib.h>

extern long lib_dispatch(long);

__thread long lib_tls = 100;
static int ready;

__attribute__((constructor)) static void lib_init(void) { ready = 42; }

long lib_compute(long x) { return lib_dispatch(x) + lib_tls + ready; }
void *lib_compute_address(void) { return (void *)lib_compute; }

static long plus1(long x) { return x + 1; }
static long plus2(long x) { return x + 2; }
/* IFUNC resolvers run while the loader relocates: they call nothing. */
static const volatile int use_plus2 = 0;
static long (*pick(void))(long) { return use_plus2 ? plus2 : plus1; }
long lib_ifunc(long) __attribute__((ifunc("pick")));
