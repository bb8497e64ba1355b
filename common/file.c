/* file.c - atomic file replacement, bounded reads and XXH64 (see file.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

static void io_reset(ptc_file_file *f)
{
    free(f->path);
    free(f->tmp);
    f->fd = -1;
    f->path = f->tmp = NULL;
}

const char *ptc_file_kind(unsigned mode)
{
    return S_ISREG(mode)    ? "a regular file"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
                            : "not a regular file";
}

/* How path is written (see file.h): 'n' new or regular, 'd' straight to a device or FIFO, or -1
 * with a message. *st gets path's status when it exists (st->st_mode 0 when it does not). */
static int output_kind(const char *path, struct stat *st, char *err, size_t errn)
{
    memset(st, 0, sizeof *st);
    if (!*path) {
        ptc_fmt(err, errn, "an empty file name");
        return -1;
    }
    if (stat(path, st) != 0) {
        if (errno == ENOENT) /* nothing there (or a dangling link): created */
            return 'n';
        ptc_fmt(err, errn, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st->st_mode))
        return 'n';
    if (S_ISCHR(st->st_mode) || S_ISFIFO(st->st_mode))
        return 'd';
    ptc_fmt(err, errn, "%s: is %s, not a file that can be written", path,
            ptc_file_kind(st->st_mode));
    return -1;
}

int ptc_file_create(ptc_file_file *f, const char *path, char *err, size_t errn)
{
    struct stat st;
    f->fd = -1;
    f->path = f->tmp = NULL;
    int kind = output_kind(path, &st, err, errn);
    if (kind < 0)
        return -1;
    if (kind == 'd') {
        f->fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (f->fd < 0) {
            ptc_fmt(err, errn, "%s: cannot open %s for writing: %s", path,
                    ptc_file_kind(st.st_mode), strerror(errno));
            return -1;
        }
        f->path = ptc_xstrdup(path);
        return 0;
    }
    /* a symbolic link to a regular file: replace its target, keep the link */
    struct stat lst;
    char *real = NULL;
    if (st.st_mode && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
        real = realpath(path, NULL);
    f->path = real ? real : ptc_xstrdup(path);
    size_t n = strlen(f->path) + 32;
    f->tmp = ptc_xmalloc(n);
    snprintf(f->tmp, n, "%s.tmp.%ld", f->path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        ptc_fmt(err, errn, "%s: cannot create temporary file %s: %s", path, f->tmp,
                strerror(errno));
        io_reset(f);
        return -1;
    }
    return 0;
}

int ptc_file_check_output(const char *path, char *err, size_t errn)
{
    struct stat st;
    int kind = output_kind(path, &st, err, errn);
    if (kind < 0)
        return -1;
    if (st.st_mode) /* an existing file or device: writing it is tried when the time comes */
        return 0;
    /* a new file: its directory must exist and take new files */
    const char *slash = strrchr(path, '/');
    char *dir = slash ? ptc_xmalloc((size_t)(slash - path) + 2) : ptc_xstrdup(".");
    if (slash) {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len);
        dir[len] = 0;
    }
    int rc = 0;
    struct stat ds;
    if (stat(dir, &ds) != 0) {
        ptc_fmt(err, errn, "%s: cannot create it in directory %s: %s", path, dir, strerror(errno));
        rc = -1;
    } else if (!S_ISDIR(ds.st_mode)) {
        ptc_fmt(err, errn, "%s: cannot create it: %s is %s, not a directory", path, dir,
                ptc_file_kind(ds.st_mode));
        rc = -1;
    } else if (access(dir, W_OK | X_OK) != 0) {
        ptc_fmt(err, errn, "%s: cannot create it in directory %s: %s", path, dir, strerror(errno));
        rc = -1;
    }
    free(dir);
    return rc;
}

/* A name for path that does not exist yet: its directory resolved, then its last component. NULL
 * when the directory does not resolve either. */
static char *future_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? ptc_xmalloc((size_t)(slash - path) + 2) : ptc_xstrdup(".");
    if (slash) {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len);
        dir[len] = 0;
    }
    char *real = realpath(dir, NULL), *out = NULL;
    free(dir);
    if (real) {
        const char *base = slash ? slash + 1 : path;
        size_t n = strlen(real) + strlen(base) + 2;
        out = ptc_xmalloc(n);
        snprintf(out, n, "%s/%s", real, base);
        free(real);
    }
    return out;
}

bool ptc_file_same(const char *a, const char *b)
{
    if (!a || !b || !*a || !*b)
        return false;
    struct stat sa, sb;
    bool ha = stat(a, &sa) == 0, hb = stat(b, &sb) == 0;
    if (ha && hb)
        return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ha || hb)
        return false;
    char *fa = future_name(a), *fb = future_name(b); /* two outputs still to be made */
    bool same = fa && fb && strcmp(fa, fb) == 0;
    free(fa);
    free(fb);
    return same;
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
            ptc_fmt(err, errn, "%s: write failed: %s", f->tmp ? f->tmp : f->path,
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
    if (f->tmp) /* a device or FIFO (no tmp) is never removed */
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
    if (!f->tmp) { /* a device or FIFO: written straight through; close reports a late error */
        int fd = f->fd, rc = 0;
        f->fd = -1;
        if (close(fd) != 0) {
            ptc_fmt(err, errn, "%s: close failed: %s", f->path, strerror(errno));
            rc = -1;
        }
        io_reset(f);
        return rc;
    }
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

char *ptc_file_cache_dir(const char *sub, char *buf, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        ptc_fmt(buf, n, "%s/ptc%s%s", xdg, *sub ? "/" : "", sub);
    else if (home && *home)
        ptc_fmt(buf, n, "%s/.cache/ptc%s%s", home, *sub ? "/" : "", sub);
    else
        return NULL;
    return ptc_file_mkdirs(buf) ? buf : NULL;
}

bool ptc_file_mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            int rc = mkdir(path, 0755);
            *p = '/';
            if (rc < 0 && errno != EEXIST)
                return false;
        }
    return mkdir(path, 0755) == 0 || errno == EEXIST;
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

int ptc_file_check_stdout(char *err, size_t errn)
{
    int before = errno;
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return 0;
    int e = errno;
    if (!e && (before == ENOSPC || before == EIO || before == EPIPE || before == EBADF ||
               before == EFBIG || before == EDQUOT))
        e = before; /* the write that failed inside an earlier fputs or printf */
    ptc_fmt(err, errn, "%s", e ? strerror(e) : "write error");
    return -1;
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
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below); on a regular
     * file the flag changes nothing */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ptc_fmt(err, errn, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ptc_fmt(err, errn, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        ptc_fmt(err, errn, "%s: not a regular file (it is %s)", path, ptc_file_kind(st.st_mode));
        close(fd);
        return -1;
    }
    *size = (size_t)st.st_size;
    return fd;
}

char *ptc_file_read_all(const char *path, size_t max, size_t *len, char *err, size_t errn)
{
    char *text = ptc_read_file_max(path, max, len);
    if (text)
        return text;
    struct stat st;
    if (errno == ENODEV && stat(path, &st) == 0)
        ptc_fmt(err, errn, "%s: cannot read %s (give a regular file or a pipe)", path,
                ptc_file_kind(st.st_mode));
    else if (errno == EFBIG)
        ptc_fmt(err, errn, "%s: larger than the limit of %zu bytes", path, max);
    else
        ptc_fmt(err, errn, "%s: cannot read: %s", path, strerror(errno));
    return NULL;
}
