/* What the compiler may call in the libraries linked without libc (the audit and
 * record libraries): structure copies and initialisers become memset and memcpy. */
#include <stddef.h>

void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);

__attribute__((visibility("hidden"))) void *memset(void *d, int c, size_t n)
{
    unsigned char *p = d;
    while (n--)
        *p++ = (unsigned char)c;
    return d;
}

__attribute__((visibility("hidden"))) void *memcpy(void *d, const void *s, size_t n)
{
    unsigned char *p = d;
    const unsigned char *q = s;
    while (n--)
        *p++ = *q++;
    return d;
}
