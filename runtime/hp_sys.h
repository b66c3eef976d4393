/* Raw Linux system calls for the hugify runtime.
 *
 * The LD_AUDIT library is linked without libc (a libc in the audit namespace would
 * cost a second copy of libc's start-up in every process), so everything the shared
 * core needs goes through these wrappers. They return the kernel's result: a
 * negative errno on failure, never -1 with errno set. */
#ifndef HUGIFY_HP_SYS_H
#define HUGIFY_HP_SYS_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture (Linux 6.5) */
#endif

#if defined(__x86_64__)
static inline long hp_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
static inline long hp_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory", "cc");
    return x0;
}
#else
#error "hugify runtime: add the system call convention of this architecture to hp_sys.h"
#endif

#define HP_SYS(n, a, b, c, d, e, f)                                                          \
    hp_syscall6((long)(n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

/* Files it creates are 0644 (less the umask). */
static inline int hp_open(const char *path, int flags)
{
    return (int)HP_SYS(__NR_openat, AT_FDCWD, path, flags | O_CLOEXEC, 0644, 0, 0);
}
/* The kernel's struct stat is the C library's on x86_64 and aarch64. */
#if defined(__x86_64__)
_Static_assert(sizeof(struct stat) == 144, "the kernel's struct stat");
#elif defined(__aarch64__)
_Static_assert(sizeof(struct stat) == 128, "the kernel's struct stat");
#endif
static inline long hp_fstat(int fd, struct stat *st) { return HP_SYS(__NR_fstat, fd, st, 0, 0, 0, 0); }
static inline long hp_unlink(const char *path) { return HP_SYS(__NR_unlinkat, AT_FDCWD, path, 0, 0, 0, 0); }
static inline long hp_close(int fd) { return HP_SYS(__NR_close, fd, 0, 0, 0, 0, 0); }
static inline long hp_read(int fd, void *buf, size_t n) { return HP_SYS(__NR_read, fd, buf, n, 0, 0, 0); }
static inline long hp_write(int fd, const void *buf, size_t n)
{
    return HP_SYS(__NR_write, fd, buf, n, 0, 0, 0);
}
static inline long hp_pread(int fd, void *buf, size_t n, uint64_t off)
{
    return HP_SYS(__NR_pread64, fd, buf, n, off, 0, 0);
}
static inline void *hp_mmap(void *addr, size_t len, int prot, int flags, int fd, uint64_t off)
{
    return (void *)HP_SYS(__NR_mmap, addr, len, prot, flags, fd, off);
}
static inline int hp_mmap_failed(const void *p) { return (unsigned long)p > -4096UL; }
static inline long hp_munmap(void *addr, size_t len) { return HP_SYS(__NR_munmap, addr, len, 0, 0, 0, 0); }
static inline long hp_madvise(void *addr, size_t len, int advice)
{
    return HP_SYS(__NR_madvise, addr, len, advice, 0, 0, 0);
}
static inline long hp_mincore(void *addr, size_t len, unsigned char *vec)
{
    return HP_SYS(__NR_mincore, addr, len, vec, 0, 0, 0);
}
/* (fd, offset, len, advice) on both x86_64 and aarch64 */
static inline long hp_fadvise(int fd, uint64_t off, uint64_t len, int advice)
{
    return HP_SYS(__NR_fadvise64, fd, off, len, advice, 0, 0);
}
static inline long hp_lseek(int fd, long off, int whence)
{
    return HP_SYS(__NR_lseek, fd, off, whence, 0, 0, 0);
}
static inline long hp_nanosleep(long ns)
{
    struct {
        long sec, nsec;
    } ts = {ns / 1000000000L, ns % 1000000000L};
    return HP_SYS(__NR_nanosleep, &ts, 0, 0, 0, 0, 0);
}
static inline long hp_fdatasync(int fd) { return HP_SYS(__NR_fdatasync, fd, 0, 0, 0, 0, 0); }
/* Only f_type is read; the buffer is at least the kernel's struct statfs (120 bytes). */
static inline long hp_fstatfs_type(int fd, long *type)
{
    long buf[16];
    long rc = HP_SYS(__NR_fstatfs, fd, buf, 0, 0, 0, 0);
    *type = buf[0];
    return rc;
}
/* f_flags of the open descriptor's filesystem (ST_RDONLY: mounted read-only); the same
 * struct statfs on x86_64 and arm64, f_flags its eleventh word. */
#define HP_ST_RDONLY 1L
static inline long hp_fstatfs_flags(int fd, long *flags)
{
    long buf[16];
    long rc = HP_SYS(__NR_fstatfs, fd, buf, 0, 0, 0, 0);
    *flags = buf[10];
    return rc;
}
/* Only f_type, as hp_fstatfs_type, of the filesystem holding `path`. */
static inline long hp_statfs_type(const char *path, long *type)
{
    long buf[16];
    long rc = HP_SYS(__NR_statfs, path, buf, 0, 0, 0, 0);
    *type = buf[0];
    return rc;
}
static inline void *hp_mremap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr)
{
    return (void *)HP_SYS(__NR_mremap, old, old_len, new_len, flags, new_addr, 0);
}
/* Relative to a directory descriptor (the runtime directory's records); renameat2
 * with no flags: aarch64 has no plain renameat. */
static inline int hp_openat(int dirfd, const char *name, int flags, int mode)
{
    return (int)HP_SYS(__NR_openat, dirfd, name, flags | O_CLOEXEC, mode, 0, 0);
}
static inline long hp_unlinkat(int dirfd, const char *name)
{
    return HP_SYS(__NR_unlinkat, dirfd, name, 0, 0, 0, 0);
}
static inline long hp_renameat(int dirfd, const char *from, const char *to)
{
    return HP_SYS(__NR_renameat2, dirfd, from, dirfd, to, 0, 0);
}
static inline long hp_mkdir(const char *path, int mode) { return HP_SYS(__NR_mkdirat, AT_FDCWD, path, mode, 0, 0, 0); }
static inline long hp_geteuid(void) { return HP_SYS(__NR_geteuid, 0, 0, 0, 0, 0, 0); }

/* struct statx (include/uapi/linux/stat.h, Linux 4.11): the same layout on every
 * architecture, unlike struct stat. */
struct hp_statx_time {
    int64_t sec;
    uint32_t nsec;
    int32_t reserved;
};
struct hp_statx {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, pad1;
    uint64_t ino, size, blocks, attributes_mask;
    struct hp_statx_time atime, btime, ctime, mtime;
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t spare[14];
};
#define HP_STATX_BASIC 0x7ffU /* STATX_BASIC_STATS */
#define HP_AT_EMPTY_PATH 0x1000
/* Of the open descriptor fd (path NULL), or of the file at path. */
static inline long hp_statx(int fd, const char *path, struct hp_statx *st)
{
    return path ? HP_SYS(__NR_statx, AT_FDCWD, path, 0, HP_STATX_BASIC, st, 0)
                : HP_SYS(__NR_statx, fd, "", HP_AT_EMPTY_PATH, HP_STATX_BASIC, st, 0);
}
static inline long hp_fchmod(int fd, int mode) { return HP_SYS(__NR_fchmod, fd, mode, 0, 0, 0, 0); }
/* The kernel release ("6.12.117+deb13-amd64"): the third field of struct utsname. */
static inline long hp_uname_release(char out[65])
{
    char u[6 * 65];
    long rc = HP_SYS(__NR_uname, u, 0, 0, 0, 0, 0);
    for (int i = 0; i < 65; i++)
        out[i] = rc == 0 ? u[2 * 65 + i] : 0;
    out[64] = 0;
    return rc;
}
/* Bytes this thread has read from storage (getrusage(RUSAGE_THREAD) ru_inblock, in
 * 512-byte blocks: the task's I/O accounting), or -1. Linux's struct rusage: two
 * struct timevals, then 14 longs of which ru_inblock is the eighth. */
static inline long hp_thread_read_bytes(void)
{
    long ru[4 + 14];
    if (HP_SYS(__NR_getrusage, 1 /* RUSAGE_THREAD */, ru, 0, 0, 0, 0) != 0)
        return -1;
    return ru[4 + 7] * 512;
}
static inline long hp_prctl(int option) { return HP_SYS(__NR_prctl, option, 0, 0, 0, 0, 0); }
static inline long hp_getpid(void) { return HP_SYS(__NR_getpid, 0, 0, 0, 0, 0, 0); }
static inline long hp_ioctl(int fd, unsigned long req, void *arg)
{
    return HP_SYS(__NR_ioctl, fd, req, arg, 0, 0, 0);
}

struct hp_cachestat_range {
    uint64_t off, len;
};
struct hp_cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static inline long hp_cachestat_call(int fd, struct hp_cachestat_range *r, struct hp_cachestat *cs)
{
    return HP_SYS(__NR_cachestat, fd, r, cs, 0, 0, 0);
}

#endif
