/* safetensors.c - the safetensors reader (a strict parser for exactly the header's JSON subset,
 * then checks of every offset against the file) and the atomic, checksummed writer. See
 * safetensors.h.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader and writer assume a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
#define PTRT_ST_ROW_(name, size) {#name, size},
    PTRT_ST_DTYPES(PTRT_ST_ROW_)
#undef PTRT_ST_ROW_
};

const char *ptrt_st_dtype_name(ptrt_st_dtype dt)
{
    PTC_ASSERT(dt >= 0 && dt < PTRT_ST_NDTYPES);
    return dtypes[dt].name;
}

size_t ptrt_st_dtype_size(ptrt_st_dtype dt)
{
    PTC_ASSERT(dt >= 0 && dt < PTRT_ST_NDTYPES);
    return dtypes[dt].size;
}

typedef struct meta_entry {
    const char *key, *value;
} meta_entry;

struct ptrt_st_file {
    const char *name;
    ptc_arena *arena; /* names, keys, values */
    const unsigned char *buf;
    size_t n;
    void *map; /* owned mapping (ptrt_st_open), or NULL */
    ptrt_st_tensor *t;
    int nt, capt;
    const ptrt_st_tensor **by_name; /* into t, sorted by name */
    meta_entry *meta;
    int nmeta, capmeta;
    bool checksummed;
};

/* ---- the header's JSON ------------------------------------------------------------------------
 * header  = ws '{' ws [ member (ws ',' ws member)* ] ws '}' ws
 * member  = string ws ':' ws (metadata if the key is "__metadata__", else tensor)
 * metadata = '{' [ string ':' string (',' string ':' string)* ] '}'
 * tensor  = '{' field (',' field)* '}'   with fields "dtype": string, "shape": ints,
 *           "data_offsets": ints (two), each exactly once
 * ints    = '[' [ integer (',' integer)* ] ']'
 * Strings are JSON strings (escapes, \u with surrogate pairs, valid UTF-8, no NUL). Integers have
 * no fraction or exponent. Nothing else is accepted. */

typedef struct jp {
    const unsigned char *s;
    size_t n, i;
    const char *fname;
    char *err;
    size_t errn;
    char *tmp; /* decoded string */
    size_t tmpcap;
} jp;

__attribute__((format(printf, 2, 3))) static int jp_fail(jp *p, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ptc_fmt(p->err, p->errn, "%s: bad header at byte %zu: %s", p->fname, p->i + 8, msg);
    return -1;
}

static void jp_ws(jp *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int jp_expect(jp *p, char c, const char *what)
{
    jp_ws(p);
    if (p->i >= p->n)
        return jp_fail(p, "unexpected end of header, expected %s", what);
    if (p->s[p->i] != (unsigned char)c) {
        unsigned char b = p->s[p->i];
        if (b >= 0x20 && b < 0x7f)
            return jp_fail(p, "expected %s, found '%c'", what, b);
        return jp_fail(p, "expected %s, found byte 0x%02x", what, b);
    }
    p->i++;
    return 0;
}

/* Whether the next non-blank byte is c (consumed when it is). */
static bool jp_accept(jp *p, char c)
{
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == (unsigned char)c) {
        p->i++;
        return true;
    }
    return false;
}

static void jp_put(jp *p, size_t len, unsigned char c)
{
    if (len + 1 >= p->tmpcap) {
        p->tmpcap = p->tmpcap ? 2 * p->tmpcap : 64;
        p->tmp = ptc_xrealloc(p->tmp, p->tmpcap);
    }
    p->tmp[len] = (char)c;
}

/* Length of the valid UTF-8 sequence at s (at most avail bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    size_t len;
    unsigned min, cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    if (avail < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

static size_t put_utf8(jp *p, size_t len, unsigned cp)
{
    if (cp < 0x80) {
        jp_put(p, len++, (unsigned char)cp);
    } else if (cp < 0x800) {
        jp_put(p, len++, (unsigned char)(0xc0 | cp >> 6));
        jp_put(p, len++, (unsigned char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        jp_put(p, len++, (unsigned char)(0xe0 | cp >> 12));
        jp_put(p, len++, (unsigned char)(0x80 | (cp >> 6 & 0x3f)));
        jp_put(p, len++, (unsigned char)(0x80 | (cp & 0x3f)));
    } else {
        jp_put(p, len++, (unsigned char)(0xf0 | cp >> 18));
        jp_put(p, len++, (unsigned char)(0x80 | (cp >> 12 & 0x3f)));
        jp_put(p, len++, (unsigned char)(0x80 | (cp >> 6 & 0x3f)));
        jp_put(p, len++, (unsigned char)(0x80 | (cp & 0x3f)));
    }
    return len;
}

/* Four hex digits after "\u"; -1 when they are not. */
static long jp_hex4(jp *p)
{
    if (p->n - p->i < 4)
        return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int c = p->s[p->i + k], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'f')
            d = (c | 32) - 'a' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    p->i += 4;
    return v;
}

/* The escape after a backslash (p->i at the byte after it); appends its bytes. */
static int jp_escape(jp *p, size_t *len)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (p->i >= p->n)
        return jp_fail(p, "unterminated string");
    unsigned char c = p->s[p->i++];
    const char *k = c ? strchr(from, c) : NULL;
    if (k) {
        jp_put(p, (*len)++, (unsigned char)to[k - from]);
        return 0;
    }
    if (c != 'u') {
        p->i--;
        return jp_fail(p, "invalid escape in string");
    }
    long cp = jp_hex4(p);
    if (cp < 0)
        return jp_fail(p, "\\u must be followed by four hex digits");
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return jp_fail(p, "unpaired low surrogate in \\u escape");
    if (cp >= 0xd800 && cp <= 0xdbff) {
        long lo = -1;
        if (p->n - p->i >= 2 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            p->i += 2;
            lo = jp_hex4(p);
        }
        if (lo < 0xdc00 || lo > 0xdfff)
            return jp_fail(p, "high surrogate not followed by a low surrogate");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    if (cp == 0)
        return jp_fail(p, "\\u0000 is not allowed in names");
    *len = put_utf8(p, *len, (unsigned)cp);
    return 0;
}

/* A string into p->tmp (NUL-terminated); *out_len gets its length. */
static int jp_string(jp *p, size_t *out_len)
{
    if (jp_expect(p, '"', "a string") != 0)
        return -1;
    size_t len = 0;
    for (;;) {
        if (p->i >= p->n)
            return jp_fail(p, "unterminated string");
        unsigned char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20)
            return jp_fail(p, "control character 0x%02x in string", c);
        if (c == '\\') {
            p->i++;
            if (jp_escape(p, &len) != 0)
                return -1;
            continue;
        }
        size_t u = utf8_len(p->s + p->i, p->n - p->i);
        if (u == 0)
            return jp_fail(p, "invalid UTF-8 in string");
        for (size_t k = 0; k < u; k++)
            jp_put(p, len++, p->s[p->i++]);
    }
    jp_put(p, len, 0);
    *out_len = len;
    return 0;
}

static int jp_int(jp *p, int64_t *out)
{
    jp_ws(p);
    size_t start = p->i;
    bool neg = p->i < p->n && p->s[p->i] == '-';
    if (neg)
        p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return jp_fail(p, "expected an integer");
    if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
        return jp_fail(p, "leading zero in integer");
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = p->s[p->i] - '0';
        if (v > (UINT64_C(9223372036854775808) - d) / 10) {
            p->i = start;
            return jp_fail(p, "integer out of range");
        }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return jp_fail(p, "expected an integer, found a fraction or exponent");
    if (!neg && v > INT64_MAX) {
        p->i = start;
        return jp_fail(p, "integer out of range");
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

/* '[' integers ']' into out (at most max of them). */
static int jp_ints(jp *p, int64_t *out, int max, int *count, const char *what)
{
    if (jp_expect(p, '[', "'[' (an array of integers)") != 0)
        return -1;
    *count = 0;
    if (jp_accept(p, ']'))
        return 0;
    do {
        if (*count == max)
            return jp_fail(p, "%s has more than %d entries", what, max);
        if (jp_int(p, &out[(*count)++]) != 0)
            return -1;
    } while (jp_accept(p, ','));
    return jp_expect(p, ']', "',' or ']'");
}

static const char *jp_strdup(jp *p, ptc_arena *a, size_t len)
{
    return ptc_arena_strndup(a, p->tmp, len);
}

static int jp_metadata(jp *p, ptrt_st_file *f)
{
    if (jp_expect(p, '{', "'{' (the __metadata__ object)") != 0)
        return -1;
    if (jp_accept(p, '}'))
        return 0;
    do {
        size_t len;
        if (jp_string(p, &len) != 0)
            return -1;
        const char *key = jp_strdup(p, f->arena, len);
        if (jp_expect(p, ':', "':'") != 0 || jp_string(p, &len) != 0)
            return -1;
        PTC_GROW(f->meta, f->capmeta, f->nmeta);
        f->meta[f->nmeta].key = key;
        f->meta[f->nmeta++].value = jp_strdup(p, f->arena, len);
    } while (jp_accept(p, ','));
    return jp_expect(p, '}', "',' or '}'");
}

static int parse_dtype(jp *p, ptrt_st_dtype *dt)
{
    size_t len, at;
    jp_ws(p);
    at = p->i;
    if (jp_string(p, &len) != 0)
        return -1;
    for (int k = 0; k < PTRT_ST_NDTYPES; k++)
        if (strcmp(p->tmp, dtypes[k].name) == 0) {
            *dt = (ptrt_st_dtype)k;
            return 0;
        }
    p->i = at;
    return jp_fail(p, "unknown dtype '%.40s'", p->tmp);
}

/* One tensor entry: the three fields in any order, each once. */
static int jp_tensor(jp *p, ptrt_st_tensor *t)
{
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    bool seen[3] = {false, false, false};
    int64_t offs[2];
    int noffs = 0;
    if (jp_expect(p, '{', "'{' (a tensor entry)") != 0)
        return -1;
    do {
        size_t len, at;
        jp_ws(p);
        at = p->i;
        if (jp_string(p, &len) != 0)
            return -1;
        int k = 0;
        while (k < 3 && strcmp(p->tmp, fields[k]) != 0)
            k++;
        if (k == 3 || seen[k]) {
            p->i = at;
            return jp_fail(p, "%s field '%.40s' in tensor '%.80s'",
                           k == 3 ? "unknown" : "duplicate", p->tmp, t->name);
        }
        seen[k] = true;
        if (jp_expect(p, ':', "':'") != 0)
            return -1;
        int rc = k == 0   ? parse_dtype(p, &t->dtype)
                 : k == 1 ? jp_ints(p, t->shape, PTRT_ST_MAXDIM, &t->ndim, "shape")
                          : jp_ints(p, offs, 2, &noffs, "data_offsets");
        if (rc != 0)
            return -1;
    } while (jp_accept(p, ','));
    if (jp_expect(p, '}', "',' or '}'") != 0)
        return -1;
    for (int k = 0; k < 3; k++)
        if (!seen[k])
            return jp_fail(p, "tensor '%.80s' has no \"%s\"", t->name, fields[k]);
    if (noffs != 2)
        return jp_fail(p, "tensor '%.80s': data_offsets must be [begin, end]", t->name);
    if (offs[0] < 0 || offs[1] < offs[0])
        return jp_fail(p, "tensor '%.80s': bad data_offsets [%" PRId64 ", %" PRId64 "]", t->name,
                       offs[0], offs[1]);
    t->data = (const void *)(uintptr_t)offs[0]; /* an offset until the data section is known */
    t->nbytes = (size_t)(offs[1] - offs[0]);
    return 0;
}

static int jp_header(jp *p, ptrt_st_file *f)
{
    bool seen_meta = false;
    if (jp_expect(p, '{', "'{' at the start of the header") != 0)
        return -1;
    if (!jp_accept(p, '}')) {
        do {
            size_t len, at;
            jp_ws(p);
            at = p->i;
            if (jp_string(p, &len) != 0 || jp_expect(p, ':', "':'") != 0)
                return -1;
            if (strcmp(p->tmp, "__metadata__") == 0) {
                if (seen_meta) {
                    p->i = at;
                    return jp_fail(p, "duplicate __metadata__");
                }
                seen_meta = true;
                if (jp_metadata(p, f) != 0)
                    return -1;
                continue;
            }
            PTC_GROW(f->t, f->capt, f->nt);
            ptrt_st_tensor *t = &f->t[f->nt++];
            t->name = jp_strdup(p, f->arena, len);
            if (jp_tensor(p, t) != 0)
                return -1;
        } while (jp_accept(p, ','));
        if (jp_expect(p, '}', "',' or '}'") != 0)
            return -1;
    }
    jp_ws(p);
    if (p->i != p->n)
        return jp_fail(p, "unexpected bytes after the header object");
    return 0;
}

/* ---- checks after parsing ---- */

static int cmp_offset(const void *a, const void *b)
{
    const ptrt_st_tensor *x = a, *y = b;
    uintptr_t bx = (uintptr_t)x->data, by = (uintptr_t)y->data;
    if (bx != by)
        return bx < by ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const ptrt_st_tensor *const *)a)->name,
                  (*(const ptrt_st_tensor *const *)b)->name);
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? "," : "", shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Shape and dtype must account for exactly the bytes the offsets give. */
static int check_sizes(ptrt_st_file *f, size_t datan, char *err, size_t errn)
{
    for (int i = 0; i < f->nt; i++) {
        ptrt_st_tensor *t = &f->t[i];
        int64_t numel = 1, nbytes;
        char sh[200];
        fmt_shape(sh, sizeof sh, t->ndim, t->shape);
        for (int d = 0; d < t->ndim; d++)
            if (!ptc_mul_ok(numel, t->shape[d], &numel)) {
                ptc_fmt(err, errn, "%s: tensor '%s' has a bad shape %s", f->name, t->name, sh);
                return -1;
            }
        size_t begin = (size_t)(uintptr_t)t->data;
        if (!ptc_mul_ok(numel, (int64_t)dtypes[t->dtype].size, &nbytes) ||
            (uint64_t)nbytes != t->nbytes) {
            ptc_fmt(err, errn, "%s: tensor '%s': shape %s of %s does not match its %zu bytes",
                    f->name, t->name, sh, dtypes[t->dtype].name, t->nbytes);
            return -1;
        }
        if (begin > datan || t->nbytes > datan - begin) {
            ptc_fmt(err, errn,
                    "%s: tensor '%s': data_offsets [%zu, %zu] lie outside the %zu-byte data "
                    "section (truncated file?)",
                    f->name, t->name, begin, begin + t->nbytes, datan);
            return -1;
        }
        t->numel = numel;
    }
    return 0;
}

/* Tensors sorted by offset must tile the data section exactly: no overlap, no gap, no tail. */
static int check_tiling(ptrt_st_file *f, size_t datan, char *err, size_t errn)
{
    if (f->nt > 1)
        qsort(f->t, (size_t)f->nt, sizeof *f->t, cmp_offset);
    size_t at = 0;
    for (int i = 0; i < f->nt; i++) {
        size_t begin = (size_t)(uintptr_t)f->t[i].data;
        if (begin < at) {
            ptc_fmt(err, errn, "%s: tensor '%s' overlaps tensor '%s'", f->name, f->t[i].name,
                    f->t[i - 1].name);
            return -1;
        }
        if (begin > at) {
            ptc_fmt(err, errn, "%s: %zu unused bytes before tensor '%s'", f->name, begin - at,
                    f->t[i].name);
            return -1;
        }
        at = begin + f->t[i].nbytes;
    }
    if (at != datan) {
        ptc_fmt(err, errn, "%s: %zu bytes after the last tensor", f->name, datan - at);
        return -1;
    }
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names and keys are checked for repeats by sorting, so a hostile header with a million entries
 * costs n log n, not n^2. */
static int check_meta_keys(ptrt_st_file *f, char *err, size_t errn)
{
    if (f->nmeta < 2)
        return 0;
    const char **keys = ptc_xmalloc(sizeof *keys * (size_t)f->nmeta);
    for (int i = 0; i < f->nmeta; i++)
        keys[i] = f->meta[i].key;
    qsort(keys, (size_t)f->nmeta, sizeof *keys, cmp_key);
    int rc = 0;
    for (int i = 1; i < f->nmeta && rc == 0; i++)
        if (strcmp(keys[i], keys[i - 1]) == 0) {
            ptc_fmt(err, errn, "%s: duplicate metadata key '%.80s'", f->name, keys[i]);
            rc = -1;
        }
    free(keys);
    return rc;
}

static int check_names(ptrt_st_file *f, char *err, size_t errn)
{
    f->by_name = ptc_xmalloc((size_t)(f->nt ? f->nt : 1) * sizeof *f->by_name);
    for (int i = 0; i < f->nt; i++)
        f->by_name[i] = &f->t[i];
    if (f->nt > 1)
        qsort(f->by_name, (size_t)f->nt, sizeof *f->by_name, cmp_name);
    for (int i = 1; i < f->nt; i++)
        if (strcmp(f->by_name[i]->name, f->by_name[i - 1]->name) == 0) {
            ptc_fmt(err, errn, "%s: tensor '%s' appears twice", f->name, f->by_name[i]->name);
            return -1;
        }
    return 0;
}

/* The checksum covers the data section and then, in a fixed encoding, every header entry that gives
 * it meaning (metadata in header order without the checksum itself, tensors in offset order), so a
 * damaged dtype, shape or step is caught as surely as damaged data. */
static void hash_meta(ptc_hash64_state *h, const char *key, const char *value)
{
    ptc_hash64_update(h, "M", 1);
    ptc_hash64_update(h, key, strlen(key) + 1);
    ptc_hash64_update(h, value, strlen(value) + 1);
}

static void hash_tensor(ptc_hash64_state *h, const char *name, ptrt_st_dtype dt, int ndim,
                        const int64_t *shape, uint64_t begin, uint64_t end)
{
    unsigned char b[8 * (PTRT_ST_MAXDIM + 3)];
    uint64_t v[PTRT_ST_MAXDIM + 3];
    int nv = 0;
    v[nv++] = (uint64_t)ndim;
    for (int d = 0; d < ndim; d++)
        v[nv++] = (uint64_t)shape[d];
    v[nv++] = begin;
    v[nv++] = end;
    for (int i = 0; i < nv; i++)
        for (int k = 0; k < 8; k++)
            b[8 * i + k] = (unsigned char)(v[i] >> (8 * k));
    ptc_hash64_update(h, "T", 1);
    ptc_hash64_update(h, name, strlen(name) + 1);
    ptc_hash64_update(h, dtypes[dt].name, strlen(dtypes[dt].name) + 1);
    ptc_hash64_update(h, b, 8 * (size_t)nv);
}

static bool is_lower_hex(const char *s)
{
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

static int check_checksum(ptrt_st_file *f, const unsigned char *data, size_t datan, char *err,
                          size_t errn)
{
    const char *v = ptrt_st_meta(f, PTRT_ST_CHECKSUM_KEY);
    for (int i = 0; !v && i < f->nmeta; i++)
        if (strncmp(f->meta[i].key, "ptc.", 4) == 0) { /* ptc wrote it: the key itself is hit */
            ptc_fmt(err, errn, "%s: has ptc metadata but no %s (file corrupted?)", f->name,
                    PTRT_ST_CHECKSUM_KEY);
            return -1;
        }
    if (!v)
        return 0;
    char *end;
    if (strncmp(v, "xxh64:", 6) != 0 || strlen(v) != 22) {
        ptc_fmt(err, errn, "%s: unrecognised %s \"%.40s\" (expected xxh64:<16 hex digits>)",
                f->name, PTRT_ST_CHECKSUM_KEY, v);
        return -1;
    }
    errno = 0;
    unsigned long long want = strtoull(v + 6, &end, 16);
    if (*end || errno || !is_lower_hex(v + 6)) {
        ptc_fmt(err, errn, "%s: malformed %s \"%.40s\"", f->name, PTRT_ST_CHECKSUM_KEY, v);
        return -1;
    }
    ptc_hash64_state h;
    ptc_hash64_init(&h, 0);
    ptc_hash64_update(&h, data, datan);
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, PTRT_ST_CHECKSUM_KEY) != 0)
            hash_meta(&h, f->meta[i].key, f->meta[i].value);
    for (int i = 0; i < f->nt; i++) {
        const ptrt_st_tensor *t = f->by_name[i];
        uint64_t begin = (uintptr_t)t->data; /* still an offset here */
        hash_tensor(&h, t->name, t->dtype, t->ndim, t->shape, begin, begin + t->nbytes);
    }
    if (ptc_hash64_final(&h) != want) {
        ptc_fmt(err, errn, "%s: checksum mismatch (file corrupted?)", f->name);
        return -1;
    }
    f->checksummed = true;
    return 0;
}

static int st_load(ptrt_st_file *f, char *err, size_t errn)
{
    if (f->n < 8) {
        ptc_fmt(err, errn, "%s: file has %zu bytes, too short for the 8-byte header length",
                f->name, f->n);
        return -1;
    }
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--)
        hn = hn << 8 | f->buf[k];
    if (hn > PTRT_ST_MAX_HEADER || hn > f->n - 8) {
        ptc_fmt(err, errn, "%s: header length %" PRIu64 " is larger than %s (%zu bytes)", f->name,
                hn, hn > PTRT_ST_MAX_HEADER ? "the 100 MB limit" : "the rest of the file",
                hn > PTRT_ST_MAX_HEADER ? (size_t)PTRT_ST_MAX_HEADER : f->n - 8);
        return -1;
    }
    jp p = {.s = f->buf + 8, .n = (size_t)hn, .fname = f->name, .err = err, .errn = errn};
    int rc = jp_header(&p, f);
    free(p.tmp);
    if (rc != 0)
        return -1;
    const unsigned char *data = f->buf + 8 + hn;
    size_t datan = f->n - 8 - (size_t)hn;
    if (check_meta_keys(f, err, errn) != 0 || check_sizes(f, datan, err, errn) != 0 ||
        check_tiling(f, datan, err, errn) != 0 || check_names(f, err, errn) != 0 ||
        check_checksum(f, data, datan, err, errn) != 0)
        return -1;
    for (int i = 0; i < f->nt; i++)
        f->t[i].data = data + (uintptr_t)f->t[i].data;
    return 0;
}

ptrt_st_file *ptrt_st_parse(const char *name, const void *buf, size_t n, char *err, size_t errn)
{
    ptrt_st_file *f = ptc_xcalloc(1, sizeof *f);
    f->arena = ptc_arena_new();
    f->name = ptc_arena_strdup(f->arena, name);
    f->buf = buf;
    f->n = n;
    if (st_load(f, err, errn) != 0) {
        ptrt_st_close(f);
        return NULL;
    }
    return f;
}

ptrt_st_file *ptrt_st_open(const char *path, char *err, size_t errn)
{
    size_t n;
    int fd = ptc_file_open_regular(path, &n, err, errn);
    if (fd < 0)
        return NULL;
    void *map = NULL;
    if (n > 0) {
        map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            ptc_fmt(err, errn, "%s: mmap failed: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);
    ptrt_st_file *f = ptrt_st_parse(path, map ? map : "", n, err, errn);
    if (!f) {
        if (map)
            munmap(map, n);
        return NULL;
    }
    f->map = map;
    return f;
}

void ptrt_st_close(ptrt_st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->n);
    free(f->t);
    free(f->by_name);
    free(f->meta);
    ptc_arena_free(f->arena);
    free(f);
}

int ptrt_st_ntensors(const ptrt_st_file *f)
{
    return f->nt;
}

const ptrt_st_tensor *ptrt_st_tensor_at(const ptrt_st_file *f, int i)
{
    PTC_ASSERT(i >= 0 && i < f->nt);
    return &f->t[i];
}

const ptrt_st_tensor *ptrt_st_find(const ptrt_st_file *f, const char *name)
{
    int lo = 0, hi = f->nt;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int ptrt_st_nmeta(const ptrt_st_file *f)
{
    return f->nmeta;
}

const char *ptrt_st_meta_key(const ptrt_st_file *f, int i)
{
    PTC_ASSERT(i >= 0 && i < f->nmeta);
    return f->meta[i].key;
}

const char *ptrt_st_meta_value(const ptrt_st_file *f, int i)
{
    PTC_ASSERT(i >= 0 && i < f->nmeta);
    return f->meta[i].value;
}

const char *ptrt_st_meta(const ptrt_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

bool ptrt_st_checksummed(const ptrt_st_file *f)
{
    return f->checksummed;
}

/* ---- conversions ---- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | man << 13;
    } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

int ptrt_st_to_f32(const ptrt_st_tensor *t, float *out, char *err, size_t errn)
{
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case PTRT_ST_F32: memcpy(out, p, n * 4); return 0;
    case PTRT_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
        }
        return 0;
    case PTRT_ST_F16:
    case PTRT_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (t->dtype == PTRT_ST_F16) {
                out[i] = half_to_float(h);
            } else {
                uint32_t bits = (uint32_t)h << 16;
                memcpy(&out[i], &bits, 4);
            }
        }
        return 0;
    default:
        ptc_fmt(err, errn, "tensor '%s' is %s, not a floating-point tensor", t->name,
                dtypes[t->dtype].name);
        return -1;
    }
}

int ptrt_st_to_i64(const ptrt_st_tensor *t, int64_t *out, char *err, size_t errn)
{
    const unsigned char *p = t->data;
    size_t sz = dtypes[t->dtype].size;
    bool is_signed = t->dtype == PTRT_ST_I8 || t->dtype == PTRT_ST_I16 || t->dtype == PTRT_ST_I32 ||
                     t->dtype == PTRT_ST_I64;
    bool is_unsigned = t->dtype == PTRT_ST_BOOL || t->dtype == PTRT_ST_U8 ||
                       t->dtype == PTRT_ST_U16 || t->dtype == PTRT_ST_U32 ||
                       t->dtype == PTRT_ST_U64;
    if (!is_signed && !is_unsigned) {
        ptc_fmt(err, errn, "tensor '%s' is %s, not an integer tensor", t->name,
                dtypes[t->dtype].name);
        return -1;
    }
    for (size_t i = 0; i < (size_t)t->numel; i++) {
        uint64_t v = 0;
        for (size_t k = sz; k-- > 0;)
            v = v << 8 | p[i * sz + k];
        if (is_signed && sz < 8 && (v >> (8 * sz - 1)) & 1)
            v |= ~UINT64_C(0) << (8 * sz); /* sign-extend */
        if (is_unsigned && v > INT64_MAX) {
            ptc_fmt(err, errn, "tensor '%s': element %zu does not fit int64", t->name, i);
            return -1;
        }
        out[i] = (int64_t)v;
    }
    return 0;
}

/* ---- writing ---- */

typedef struct wtensor {
    char *name;
    ptrt_st_dtype dtype;
    int ndim; /* as given: checked in ptrt_st_save */
    int64_t shape[PTRT_ST_MAXDIM];
    const void *data;
} wtensor;

struct ptrt_st_writer {
    wtensor *t;
    int nt, capt;
    char **meta; /* key, value, key, value, ... */
    int nmeta, capmeta;
};

ptrt_st_writer *ptrt_st_writer_new(void)
{
    return ptc_xcalloc(1, sizeof(ptrt_st_writer));
}

void ptrt_st_writer_free(ptrt_st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->nt; i++)
        free(w->t[i].name);
    for (int i = 0; i < w->nmeta; i++)
        free(w->meta[i]);
    free(w->t);
    free(w->meta);
    free(w);
}

void ptrt_st_add(ptrt_st_writer *w, const char *name, ptrt_st_dtype dt, int ndim,
                 const int64_t *shape, const void *data)
{
    PTC_ASSERT(dt >= 0 && dt < PTRT_ST_NDTYPES);
    PTC_GROW(w->t, w->capt, w->nt);
    wtensor *t = &w->t[w->nt++];
    t->name = ptc_xstrdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim && d < PTRT_ST_MAXDIM; d++)
        t->shape[d] = shape[d];
    t->data = data;
}

void ptrt_st_add_meta(ptrt_st_writer *w, const char *key, const char *value)
{
    PTC_GROW(w->meta, w->capmeta, w->nmeta + 1);
    w->meta[w->nmeta++] = ptc_xstrdup(key);
    w->meta[w->nmeta++] = ptc_xstrdup(value);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > b->cap)
            b->cap *= 2;
        b->p = ptc_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    PTC_ASSERT(n >= 0 && (size_t)n < sizeof tmp);
    sb_add(b, tmp, (size_t)n);
}

static void sb_put(void *b, const char *p, size_t n)
{
    sb_add(b, p, n);
}

/* A JSON string; s must be valid UTF-8 (checked by writer_check). */
static void sb_json_string(sbuf *b, const char *s)
{
    ptc_json_quote(s, sb_put, b);
}

static bool valid_utf8(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t u = utf8_len((const unsigned char *)s + i, n - i);
        if (u == 0)
            return false;
        i += u;
    }
    return true;
}

/* The first repeated string among n, or NULL. */
static const char *find_duplicate(const char **s, int n)
{
    qsort(s, (size_t)n, sizeof *s, cmp_key);
    for (int i = 1; i < n; i++)
        if (strcmp(s[i], s[i - 1]) == 0)
            return s[i];
    return NULL;
}

/* Everything a reader would refuse is refused here, before a byte is written. */
static int writer_check(const ptrt_st_writer *w, const char *path, char *err, size_t errn)
{
    for (int i = 0; i < w->nt; i++) {
        const wtensor *t = &w->t[i];
        int64_t n = (int64_t)dtypes[t->dtype].size;
        const char *bad = NULL;
        if (!valid_utf8(t->name))
            bad = "has a name that is not valid UTF-8";
        else if (strcmp(t->name, "__metadata__") == 0)
            bad = "has a reserved name";
        else if (t->ndim < 0 || t->ndim > PTRT_ST_MAXDIM)
            bad = "has more dimensions than the reader accepts";
        for (int d = 0; !bad && d < t->ndim; d++)
            if (!ptc_mul_ok(n, t->shape[d], &n))
                bad = "has a negative or too large dimension";
        if (bad) {
            ptc_fmt(err, errn, "%s: tensor '%s' %s", path, t->name, bad);
            return -1;
        }
    }
    const char **names = ptc_xmalloc((size_t)(w->nt + w->nmeta / 2 + 1) * sizeof *names);
    for (int i = 0; i < w->nt; i++)
        names[i] = w->t[i].name;
    const char *dup = find_duplicate(names, w->nt);
    int nkeys = 0;
    for (int i = 0; !dup && i < w->nmeta; i += 2) {
        if (!valid_utf8(w->meta[i]) || !valid_utf8(w->meta[i + 1]) ||
            strcmp(w->meta[i], PTRT_ST_CHECKSUM_KEY) == 0) {
            ptc_fmt(err, errn, "%s: metadata key '%s' is reserved or not valid UTF-8", path,
                    w->meta[i]);
            free(names);
            return -1;
        }
        names[nkeys++] = w->meta[i];
    }
    const char *dupkey = dup ? NULL : find_duplicate(names, nkeys);
    if (dup || dupkey)
        ptc_fmt(err, errn, "%s: %s '%s' added twice", path, dup ? "tensor" : "metadata key",
                dup ? dup : dupkey);
    free(names);
    return dup || dupkey ? -1 : 0;
}

static size_t wtensor_bytes(const wtensor *t)
{
    size_t n = dtypes[t->dtype].size;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

typedef struct wentry {
    const wtensor *t;
    uint64_t begin;
} wentry;

static int cmp_wentry(const void *a, const void *b)
{
    return strcmp(((const wentry *)a)->t->name, ((const wentry *)b)->t->name);
}

/* The checksum of what ptrt_st_save writes (see hash_tensor). */
static uint64_t writer_checksum(const ptrt_st_writer *w)
{
    ptc_hash64_state h;
    ptc_hash64_init(&h, 0);
    for (int i = 0; i < w->nt; i++)
        ptc_hash64_update(&h, w->t[i].data, wtensor_bytes(&w->t[i]));
    for (int i = 0; i < w->nmeta; i += 2)
        hash_meta(&h, w->meta[i], w->meta[i + 1]);
    wentry *e = ptc_xmalloc(sizeof *e * (size_t)(w->nt ? w->nt : 1));
    uint64_t at = 0;
    for (int i = 0; i < w->nt; i++) {
        e[i] = (wentry){&w->t[i], at};
        at += wtensor_bytes(&w->t[i]);
    }
    if (w->nt > 1)
        qsort(e, (size_t)w->nt, sizeof *e, cmp_wentry);
    for (int i = 0; i < w->nt; i++) {
        const wtensor *t = e[i].t;
        hash_tensor(&h, t->name, t->dtype, t->ndim, t->shape, e[i].begin,
                    e[i].begin + wtensor_bytes(t));
    }
    free(e);
    return ptc_hash64_final(&h);
}

/* The header JSON, padded with spaces to a multiple of 8 bytes. */
static void build_header(const ptrt_st_writer *w, uint64_t checksum, sbuf *b)
{
    sb_add(b, "{\"__metadata__\":{", 17);
    for (int i = 0; i < w->nmeta; i += 2) {
        sb_json_string(b, w->meta[i]);
        sb_add(b, ":", 1);
        sb_json_string(b, w->meta[i + 1]);
        sb_add(b, ",", 1);
    }
    sb_printf(b, "\"%s\":\"xxh64:%016" PRIx64 "\"}", PTRT_ST_CHECKSUM_KEY, checksum);
    uint64_t at = 0;
    for (int i = 0; i < w->nt; i++) {
        const wtensor *t = &w->t[i];
        uint64_t end = at + wtensor_bytes(t);
        sb_add(b, ",", 1);
        sb_json_string(b, t->name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[t->dtype].name);
        for (int d = 0; d < t->ndim; d++)
            sb_printf(b, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_printf(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, end);
        at = end;
    }
    sb_add(b, "}", 1);
    while (b->n % 8)
        sb_add(b, " ", 1);
}

int ptrt_st_save(const ptrt_st_writer *w, const char *path, char *err, size_t errn)
{
    if (writer_check(w, path, err, errn) != 0)
        return -1;
    sbuf hdr = {0};
    build_header(w, writer_checksum(w), &hdr);
    if (hdr.n > PTRT_ST_MAX_HEADER) {
        ptc_fmt(err, errn, "%s: header of %zu bytes exceeds the format's limit", path, hdr.n);
        free(hdr.p);
        return -1;
    }
    unsigned char len[8];
    for (int k = 0; k < 8; k++)
        len[k] = (unsigned char)((uint64_t)hdr.n >> (8 * k));
    ptc_file_file f;
    if (ptc_file_create(&f, path, err, errn) != 0) {
        free(hdr.p);
        return -1;
    }
    int rc = ptc_file_write(&f, len, 8, err, errn);
    if (rc == 0)
        rc = ptc_file_write(&f, hdr.p, hdr.n, err, errn);
    for (int i = 0; rc == 0 && i < w->nt; i++)
        rc = ptc_file_write(&f, w->t[i].data, wtensor_bytes(&w->t[i]), err, errn);
    free(hdr.p);
    if (rc != 0) {
        ptc_file_abort(&f);
        return -1;
    }
    return ptc_file_commit(&f, err, errn);
}
