/* data.c - llm.c token files and batches from them (see data.h for the format and the order). */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "util.h"

struct ptrt_data {
    char *path;
    const unsigned char *map; /* the whole file */
    size_t mapn;
    const unsigned char *tok; /* map + 1024: little-endian uint16 */
    size_t ntok;
    /* batch layout, set by ptrt_data_configure */
    int B, T;
    bool shuffle;
    uint64_t seed;
    uint64_t nwin, per_epoch; /* windows, batches per epoch */
    uint64_t pos;             /* batches served */
    uint32_t *perm;           /* window order of epoch perm_epoch (shuffle only) */
    uint64_t perm_epoch;
    bool perm_valid;
};

static uint32_t rd32le(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32le(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint16_t ptrt_data_token(const ptrt_data *d, size_t i)
{
    return (uint16_t)(d->tok[2 * i] | d->tok[2 * i + 1] << 8);
}

size_t ptrt_data_ntokens(const ptrt_data *d)
{
    return d->ntok;
}

/* Checks the header and the size against it; the message says which number disagrees. */
static int check_header(const char *path, const unsigned char *h, size_t size, char *err,
                        size_t errn)
{
    int32_t magic = (int32_t)rd32le(h), version = (int32_t)rd32le(h + 4);
    int32_t n = (int32_t)rd32le(h + 8);
    if (magic != PTRT_DATA_MAGIC) {
        ptc_fmt(err, errn, "%s: bad magic number %d (expected %d): not an llm.c token file", path,
                magic, PTRT_DATA_MAGIC);
        return -1;
    }
    if (version != PTRT_DATA_VERSION) {
        ptc_fmt(err, errn, "%s: unsupported version %d (expected %d: uint16 tokens)", path, version,
                PTRT_DATA_VERSION);
        return -1;
    }
    if (n < 0) {
        ptc_fmt(err, errn, "%s: header says %d tokens", path, n);
        return -1;
    }
    size_t have = size - PTRT_DATA_HEADER_BYTES;
    if (have != 2 * (size_t)n) {
        ptc_fmt(err, errn, "%s: file has %zu bytes of tokens, header says %d tokens (%zu bytes)%s",
                path, have, n, 2 * (size_t)n, have < 2 * (size_t)n ? ": truncated?" : "");
        return -1;
    }
    return 0;
}

static int check_vocab(const ptrt_data *d, int vocab, char *err, size_t errn)
{
    if (vocab <= 0 || vocab > 65535)
        return 0;
    for (size_t i = 0; i < d->ntok; i++) {
        uint16_t t = ptrt_data_token(d, i);
        if (t >= vocab) {
            ptc_fmt(err, errn, "%s: token %u at position %zu is not below the vocabulary size %d",
                    d->path, (unsigned)t, i, vocab);
            return -1;
        }
    }
    return 0;
}

int ptrt_data_check_ids(const ptrt_data *d, int64_t input_bound, int64_t target_bound, char *err,
                        size_t errn)
{
    for (size_t i = 0; i < d->ntok; i++) {
        uint16_t t = ptrt_data_token(d, i);
        if (input_bound > 0 && i + 1 < d->ntok && t >= input_bound) {
            ptc_fmt(err, errn,
                    "%s: token %u at position %zu is not below %lld, the rows of the embedding "
                    "that reads it",
                    d->path, (unsigned)t, i, (long long)input_bound);
            return -1;
        }
        if (target_bound > 0 && i > 0 && t >= target_bound) {
            ptc_fmt(err, errn,
                    "%s: token %u at position %zu is not below %lld, the classes of the "
                    "cross_entropy it is a target of",
                    d->path, (unsigned)t, i, (long long)target_bound);
            return -1;
        }
    }
    return 0;
}

ptrt_data *ptrt_data_open(const char *path, int vocab, char *err, size_t errn)
{
    size_t size;
    int fd = ptc_file_open_regular(path, &size, err, errn);
    if (fd < 0)
        return NULL;
    if (size < PTRT_DATA_HEADER_BYTES) {
        ptc_fmt(err, errn, "%s: file has %zu bytes, too short for the %d-byte header", path, size,
                PTRT_DATA_HEADER_BYTES);
        close(fd);
        return NULL;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        ptc_fmt(err, errn, "%s: mmap failed: %s", path, strerror(errno));
        return NULL;
    }
    ptrt_data *d = ptc_xcalloc(1, sizeof *d);
    d->path = ptc_xstrdup(path);
    d->map = map;
    d->mapn = size;
    d->tok = d->map + PTRT_DATA_HEADER_BYTES;
    d->ntok = (size - PTRT_DATA_HEADER_BYTES) / 2;
    if (check_header(path, d->map, size, err, errn) != 0 || check_vocab(d, vocab, err, errn) != 0) {
        ptrt_data_close(d);
        return NULL;
    }
    return d;
}

void ptrt_data_close(ptrt_data *d)
{
    if (!d)
        return;
    munmap((void *)d->map, d->mapn);
    free(d->perm);
    free(d->path);
    free(d);
}

int ptrt_data_configure(ptrt_data *d, int B, int T, bool shuffle, uint64_t seed, char *err,
                        size_t errn)
{
    if (B <= 0 || T <= 0) {
        ptc_fmt(err, errn, "%s: batch size %d and sequence length %d must be positive", d->path, B,
                T);
        return -1;
    }
    uint64_t need = (uint64_t)B * (uint64_t)T + 1;
    if (d->ntok < need) {
        ptc_fmt(err, errn,
                "%s: %zu tokens are too few for one batch of %d x %d (needs %llu tokens)", d->path,
                d->ntok, B, T, (unsigned long long)need);
        return -1;
    }
    d->B = B;
    d->T = T;
    d->shuffle = shuffle;
    d->seed = seed;
    d->nwin = (d->ntok - 1) / (uint64_t)T;
    d->per_epoch = d->nwin / (uint64_t)B;
    d->pos = 0;
    free(d->perm);
    d->perm = shuffle ? ptc_xmalloc(d->nwin * sizeof *d->perm) : NULL;
    d->perm_valid = false;
    return 0;
}

/* splitmix64: a small, well-mixed generator; its whole state is one word. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t below(uint64_t *s, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do
        r = splitmix64(s);
    while (r >= limit);
    return r % n;
}

/* The window order of one epoch: Fisher-Yates driven by a generator keyed on (seed, epoch) alone,
 * so any epoch can be rebuilt directly after a seek. */
static void shuffle_epoch(ptrt_data *d, uint64_t epoch)
{
    uint64_t key[2] = {d->seed, epoch};
    uint64_t s = ptc_hash64(key, sizeof key, 0x70746364617461ULL);
    for (uint64_t i = 0; i < d->nwin; i++)
        d->perm[i] = (uint32_t)i;
    for (uint64_t i = d->nwin - 1; i > 0; i--) {
        uint64_t j = below(&s, i + 1);
        uint32_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
    d->perm_valid = true;
}

void ptrt_data_next_batch(ptrt_data *d, int32_t *inputs, int32_t *targets)
{
    ptrt_data_next_rows(d, 0, d->B, inputs, targets);
}

void ptrt_data_next_rows(ptrt_data *d, int row0, int row1, int32_t *inputs, int32_t *targets)
{
    PTC_ASSERT(d->B > 0 && d->per_epoch > 0 && 0 <= row0 && row0 <= row1 && row1 <= d->B);
    uint64_t epoch = d->pos / d->per_epoch, k = d->pos % d->per_epoch;
    if (d->shuffle && (!d->perm_valid || d->perm_epoch != epoch))
        shuffle_epoch(d, epoch);
    size_t T = (size_t)d->T;
    for (size_t b = (size_t)row0; b < (size_t)row1; b++) {
        uint64_t w = k * (uint64_t)d->B + b;
        if (d->shuffle)
            w = d->perm[w];
        size_t start = (size_t)w * T;
        PTC_ASSERT(start + T < d->ntok);
        for (size_t t = 0; t < T; t++) {
            inputs[b * T + t] = ptrt_data_token(d, start + t);
            targets[b * T + t] = ptrt_data_token(d, start + t + 1);
        }
    }
    d->pos++;
}

uint64_t ptrt_data_position(const ptrt_data *d)
{
    return d->pos;
}

void ptrt_data_seek(ptrt_data *d, uint64_t position)
{
    d->pos = position;
}

uint64_t ptrt_data_batches_per_epoch(const ptrt_data *d)
{
    return d->per_epoch;
}

uint64_t ptrt_data_epoch(const ptrt_data *d)
{
    return d->per_epoch ? d->pos / d->per_epoch : 0;
}

int ptrt_data_write(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errn)
{
    if (n > INT32_MAX) {
        ptc_fmt(err, errn, "%s: %zu tokens do not fit the header's int32 count", path, n);
        return -1;
    }
    unsigned char header[PTRT_DATA_HEADER_BYTES] = {0};
    wr32le(header, PTRT_DATA_MAGIC);
    wr32le(header + 4, PTRT_DATA_VERSION);
    wr32le(header + 8, (uint32_t)n);
    ptc_file_file f;
    if (ptc_file_create(&f, path, err, errn) != 0)
        return -1;
    int rc = ptc_file_write(&f, header, sizeof header, err, errn);
    unsigned char buf[8192];
    for (size_t i = 0; rc == 0 && i < n;) {
        size_t m = 0;
        for (; i < n && m < sizeof buf; i++, m += 2) {
            buf[m] = (unsigned char)(tokens[i] & 0xff);
            buf[m + 1] = (unsigned char)(tokens[i] >> 8);
        }
        rc = ptc_file_write(&f, buf, m, err, errn);
    }
    if (rc != 0) {
        ptc_file_abort(&f);
        return -1;
    }
    return ptc_file_commit(&f, err, errn);
}
