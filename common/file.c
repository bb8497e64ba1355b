/* file.c - atomic file replacement and XXH64 (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static void io_reset(ptc_file_file *f)
{
    free(f->path);
    free(f->tmp);
    f->fd = -1;
    f->path = f->tmp = NULL;
}

int ptc_file_create(ptc_file_file *f, const char *path, char *err, size_t errn)
{
    size_t n = strlen(path) + 32;
    f->path = ptc_xstrdup(path);
    f->tmp = ptc_xmalloc(n);
    snprintf(f->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        ptc_fmt(err, errn, "%s: cannot create temporary file %s: %s", path, f->tmp,
                strerror(errno));
        io_reset(f);
        return -1;
    }
    return 0;
}

int ptc_file_write(ptc_file_file *f, const void *p, size_t n, char *err, size_t errn)
{
    const unsigned char *b = p;
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t w = write(f->fd, b, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            ptc_fmt(err, errn, "%s: write failed: %s", f->tmp,
                    w < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

void ptc_file_abort(ptc_file_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (f->tmp)
        unlink(f->tmp);
    io_reset(f);
}

/* fsyncs the directory holding path, so a rename into it survives a crash. Filesystems that cannot
 * sync a directory answer EINVAL; there is nothing more to do on them. */
static int sync_dir(const char *path, char *err, size_t errn)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? ptc_xmalloc((size_t)(slash - path) + 2) : ptc_xstrdup(".");
    if (slash) {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len);
        dir[len] = 0;
    }
    int rc = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
        ptc_fmt(err, errn, "%s: written, but syncing directory %s failed: %s", path, dir,
                strerror(errno));
        rc = -1;
    }
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

int ptc_file_commit(ptc_file_file *f, char *err, size_t errn)
{
    const char *what = NULL;
    if (fsync(f->fd) != 0)
        what = "fsync";
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0 && !what)
        what = "close";
    if (!what && rename(f->tmp, f->path) != 0)
        what = "rename";
    if (what) {
        ptc_fmt(err, errn, "%s: %s of %s failed: %s", f->path, what, f->tmp, strerror(errno));
        ptc_file_abort(f);
        return -1;
    }
    int rc = sync_dir(f->path, err, errn);
    io_reset(f);
    return rc;
}

int ptc_file_write_file(const char *path, const void *p, size_t n, char *err, size_t errn)
{
    ptc_file_file f;
    if (ptc_file_create(&f, path, err, errn) != 0)
        return -1;
    if (ptc_file_write(&f, p, n, err, errn) != 0) {
        ptc_file_abort(&f);
        return -1;
    }
    return ptc_file_commit(&f, err, errn);
}

/* ---- XXH64 ---------------------------------------------------------------------------------- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t rd32(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t xround(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    return rotl(acc, 31) * P1;
}

static uint64_t merge(uint64_t acc, uint64_t v)
{
    acc ^= xround(0, v);
    return acc * P1 + P4;
}

void ptc_hash64_init(ptc_hash64_state *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
}

static void stripe(uint64_t v[4], const unsigned char *p)
{
    v[0] = xround(v[0], rd64(p));
    v[1] = xround(v[1], rd64(p + 8));
    v[2] = xround(v[2], rd64(p + 16));
    v[3] = xround(v[3], rd64(p + 24));
}

void ptc_hash64_update(ptc_hash64_state *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->total += n;
    if (s->nbuf + n < 32) {
        if (n)
            memcpy(s->buf + s->nbuf, p, n);
        s->nbuf += n;
        return;
    }
    if (s->nbuf) {
        size_t fill = 32 - s->nbuf;
        memcpy(s->buf + s->nbuf, p, fill);
        stripe(s->v, s->buf);
        p += fill;
        n -= fill;
        s->nbuf = 0;
    }
    uint64_t v[4] = {s->v[0], s->v[1], s->v[2], s->v[3]};
    for (; n >= 32; p += 32, n -= 32)
        stripe(v, p);
    memcpy(s->v, v, sizeof v);
    if (n)
        memcpy(s->buf, p, n);
    s->nbuf = n;
}

uint64_t ptc_hash64_final(const ptc_hash64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        const uint64_t *v = s->v;
        h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge(h, v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    const unsigned char *p = s->buf;
    size_t n = s->nbuf;
    for (; n >= 8; p += 8, n -= 8)
        h = rotl(h ^ xround(0, rd64(p)), 27) * P1 + P4;
    if (n >= 4) {
        h = rotl(h ^ rd32(p) * P1, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--)
        h = rotl(h ^ *p * P5, 11) * P1;
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t ptc_hash64(const void *p, size_t n, uint64_t seed)
{
    ptc_hash64_state s;
    ptc_hash64_init(&s, seed);
    ptc_hash64_update(&s, p, n);
    return ptc_hash64_final(&s);
}

int ptc_file_open_regular(const char *path, size_t *size, char *err, size_t errn)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ptc_fmt(err, errn, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ptc_fmt(err, errn, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    *size = (size_t)st.st_size;
    return fd;
}
