/* The bottom layer of the hugify runtime; see hp_base.h. */
#include "hp_base.h"

#include "hp_sys.h"

size_t hp_strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

void hp_memzero(void *p, size_t n)
{
    volatile unsigned char *b = p; /* volatile: keeps the compiler from calling memset */
    while (n--)
        *b++ = 0;
}

size_t hp_put_num(char *out, uint64_t v, unsigned base)
{
    char d[24];
    size_t k = 0, n = 0;
    do {
        d[k++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    while (k)
        out[n++] = d[--k];
    return n;
}

int hp_hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

int hp_starts_with(const char *s, const char *prefix)
{
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

void hp_copy_str(char *dst, size_t cap, const char *src)
{
    size_t k = 0;
    for (; src[k] && k + 1 < cap; k++)
        dst[k] = src[k];
    dst[k] = 0;
}

int hp_join(char *out, size_t cap, const char *dir, const char *name, const char *suffix)
{
    size_t n = 0;
    for (const char *parts[] = {dir, "/", name, suffix}, **p = parts; p < parts + 4; p++)
        for (const char *q = *p; q && *q; q++) {
            if (n + 1 >= cap)
                return -1;
            out[n++] = *q;
        }
    out[n] = 0;
    return 0;
}

/* The records of the open descriptor fd that end in the byte `end` (hp_each_record). */
static int each_record_fd(int fd, char end, int (*each)(const char *record, void *arg), void *arg)
{
    char buf[4096], line[4096 + 128];
    size_t ll = 0;
    int stop = 0;
    while (!stop) {
        long n = hp_read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long i = 0; i < n && !stop; i++) {
            if (buf[i] != end) {
                if (ll < sizeof line - 1)
                    line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            stop = each(line, arg);
        }
    }
    return stop;
}

int hp_each_record(const char *path, char end, int (*each)(const char *record, void *arg), void *arg)
{
    int fd = hp_open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int stop = each_record_fd(fd, end, each, arg);
    hp_close(fd);
    return stop;
}

int hp_each_line_fd(int fd, int (*each)(const char *line, void *arg), void *arg)
{
    return each_record_fd(fd, '\n', each, arg);
}

int hp_each_line(const char *path, int (*each)(const char *line, void *arg), void *arg)
{
    return hp_each_record(path, '\n', each, arg);
}

const char *hp_maps_range(const char *line, uint64_t *start, uint64_t *end)
{
    const char *p = line;
    int d;
    *start = *end = 0;
    if (hp_hex_digit(*p) < 0)
        return 0;
    while ((d = hp_hex_digit(*p)) >= 0)
        *start = *start * 16 + (uint64_t)d, p++;
    if (*p++ != '-' || hp_hex_digit(*p) < 0)
        return 0;
    while ((d = hp_hex_digit(*p)) >= 0)
        *end = *end * 16 + (uint64_t)d, p++;
    return p;
}

int hp_boot_id(char out[37])
{
    int fd = hp_open("/proc/sys/kernel/random/boot_id", O_RDONLY);
    if (fd < 0)
        return -1;
    long b = hp_read(fd, out, 36);
    hp_close(fd);
    out[b == 36 ? 36 : 0] = 0;
    return b == 36 ? 0 : -1;
}

uint64_t hp_pmd_size(void)
{
    char buf[64];
    uint64_t v = 0;
    int fd = hp_open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", O_RDONLY);
    long n = fd >= 0 ? hp_read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        hp_close(fd);
    /* A decimal number, blanks before it (as strtoull reads one). */
    long i = 0;
    while (i < n && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n'))
        i++;
    for (; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
        v = v * 10 + (uint64_t)(buf[i] - '0');
    return v ? v : HP_DEFAULT_SIZE;
}
