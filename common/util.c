/* util.c - arena, checked arithmetic and the always-on assert (see util.h). */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ptc_assert_fail(const char *file, int line, const char *cond)
{
    fprintf(stderr, "%s:%d: internal error: assertion failed: %s\n", file, line, cond);
    abort();
}

void *ptc_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "ptc: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void *ptc_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "ptc: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

void *ptc_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "ptc: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return q;
}

char *ptc_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(ptc_xmalloc(n), s, n);
}

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

struct ptc_arena {
    chunk *head;
};

ptc_arena *ptc_arena_new(void)
{
    return ptc_xcalloc(1, sizeof(ptc_arena));
}

void ptc_arena_free(ptc_arena *a)
{
    if (!a)
        return;
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

void *ptc_arena_alloc(ptc_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        chunk *c = ptc_xmalloc(sizeof(chunk) + cap);
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

char *ptc_arena_strndup(ptc_arena *a, const char *s, size_t n)
{
    char *p = ptc_arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *ptc_arena_strdup(ptc_arena *a, const char *s)
{
    return ptc_arena_strndup(a, s, strlen(s));
}

char *ptc_arena_printf(ptc_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = ptc_arena_alloc(a, (size_t)n + 1);
    vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

bool ptc_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return false;
    if (a != 0 && b > INT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

char *ptc_fmt(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return buf;
}

char *ptc_read_file_max(const char *path, size_t max, size_t *len)
{
    /* O_NONBLOCK: a FIFO without a writer must not hang the open; cleared once it is open */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    if (!(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
        close(fd);
        errno = S_ISDIR(st.st_mode) ? EISDIR : ENODEV;
        return NULL;
    }
    if (max > SIZE_MAX / 4)
        max = SIZE_MAX / 4;
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) {
        close(fd);
        errno = EFBIG;
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    /* a regular file's size is known: room for it and one byte more, whose read sees the end */
    size_t cap = S_ISREG(st.st_mode) && (uint64_t)st.st_size <= max ? (size_t)st.st_size + 2 : 4096;
    size_t n = 0;
    char *buf = ptc_xmalloc(cap);
    int saved = 0;
    for (;;) {
        if (n + 1 >= cap) {
            if (n > max)
                break;
            cap *= 2;
            buf = ptc_xrealloc(buf, cap);
        }
        size_t want = cap - n - 1;
        if (want > max + 1 - n) /* read one byte past max to know it is exceeded */
            want = max + 1 - n;
        ssize_t r = read(fd, buf + n, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            saved = errno;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n > max)
            break;
    }
    close(fd);
    if (saved || n > max) {
        free(buf);
        errno = saved ? saved : EFBIG;
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

void ptc_json_quote(const char *s, void (*put)(void *ctx, const char *p, size_t n), void *ctx)
{
    put(ctx, "\"", 1);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(ctx, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            put(ctx, e, 6);
        } else {
            put(ctx, s, 1);
        }
    }
    put(ctx, "\"", 1);
}

char *ptc_read_file(const char *path, size_t *len)
{
    return ptc_read_file_max(path, (size_t)1 << 40, len);
}

/* The leftmost occurrence of p[0..m) in s[0..n), or -1; fail has room for m entries. */
static ptrdiff_t kmp_find(const char *s, size_t n, const char *p, size_t m, size_t *fail)
{
    if (m == 0)
        return 0;
    fail[0] = 0;
    for (size_t i = 1, k = 0; i < m; i++) {
        while (k && p[i] != p[k])
            k = fail[k - 1];
        k += p[i] == p[k];
        fail[i] = k;
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        while (k && s[i] != p[k])
            k = fail[k - 1];
        k += s[i] == p[k];
        if (k == m)
            return (ptrdiff_t)(i + 1 - m);
    }
    return -1;
}

bool ptc_glob_match(const char *pattern, const char *name)
{
    const char *first_star = strchr(pattern, '*');
    if (!first_star)
        return strcmp(pattern, name) == 0;
    const char *last_star = strrchr(pattern, '*');
    size_t n = strlen(name), head = (size_t)(first_star - pattern), tail = strlen(last_star + 1);
    /* the piece before the first star is a prefix, the one after the last star a suffix */
    if (head + tail > n || strncmp(name, pattern, head) != 0 ||
        strcmp(name + n - tail, last_star + 1) != 0)
        return false;
    size_t pos = head, end = n - tail, small[256];
    size_t plen = (size_t)(last_star - first_star);
    size_t *fail = plen <= 256 ? small : ptc_xmalloc(plen * sizeof *fail);
    bool ok = true;
    for (const char *p = first_star + 1; ok && p < last_star;) {
        const char *star = strchr(p, '*');
        size_t m = (size_t)(star - p);
        ptrdiff_t at = kmp_find(name + pos, end - pos, p, m, fail);
        ok = at >= 0;
        pos += ok ? (size_t)at + m : 0;
        p = star + 1;
    }
    if (fail != small)
        free(fail);
    return ok;
}

/* Levenshtein distance with letter case ignored; -1 when either is longer than 64 bytes. */
static int distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[65];
    if (la > 64 || lb > 64)
        return -1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (tolower((unsigned char)a[i - 1]) !=
                                            tolower((unsigned char)b[j - 1]));
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

const char *ptc_similar(const char *name, const char *const *cands, int n)
{
    /* distances doubled, so that a name that differs in case only (0) ranks first, at 1 */
    int limit = 2 * (int)(strlen(name) / 3), best = limit + 1;
    const char *found = NULL;
    for (int i = 0; i < n; i++) {
        if (strcmp(name, cands[i]) == 0)
            continue;
        int d = distance(name, cands[i]);
        if (d < 0)
            continue;
        d = d ? 2 * d : 1;
        if (d < best) {
            best = d;
            found = cands[i];
        }
    }
    return found;
}
