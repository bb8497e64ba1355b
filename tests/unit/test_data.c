/* test_data.c - llm.c token files: header validation with its messages, batches in order (against
 * a copy of llm.c's DataLoader arithmetic) and shuffled, and resuming from a saved position. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "util.h"

static char dir[64];
static char path[128];

static void setup(void)
{
    strcpy(dir, "/tmp/ptc-test-data-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

TestSuite(data, .init = setup, .fini = teardown);

/* Writes a raw token file: the given header fields, then n tokens (count may differ from n). */
static void write_raw(int32_t magic, int32_t version, int32_t count, const uint16_t *tok, size_t n)
{
    int32_t header[256] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(header, sizeof header, 1, f);
    fwrite(tok, 2, n, f);
    fclose(f);
}

/* Tokens 0, 1, 2, ... so a token's value is its position. */
static void write_counting(size_t n)
{
    uint16_t *t = ptc_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint16_t)i;
    char err[256];
    cr_assert_eq(ptrt_data_write(path, t, n, err, sizeof err), 0, "%s", err);
    free(t);
}

static void expect_open_error(int vocab, const char *want)
{
    char err[256] = "";
    ptrt_data *d = ptrt_data_open(path, vocab, err, sizeof err);
    cr_assert_null(d);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert(strstr(err, path), "message '%s' does not name the file", err);
}

Test(data, write_then_open)
{
    uint16_t t[5] = {7, 0, 255, 1000, 3};
    char err[256];
    cr_assert_eq(ptrt_data_write(path, t, 5, err, sizeof err), 0, "%s", err);
    ptrt_data *d = ptrt_data_open(path, 1001, err, sizeof err);
    cr_assert(d, "%s", err);
    cr_assert_eq(ptrt_data_ntokens(d), 5);
    for (size_t i = 0; i < 5; i++)
        cr_assert_eq(ptrt_data_token(d, i), t[i]);
    ptrt_data_close(d);
    /* the layout on disk is exactly llm.c's */
    size_t len;
    char *raw = ptc_read_file(path, &len);
    cr_assert_eq(len, 1024 + 10);
    int32_t h[3];
    memcpy(h, raw, sizeof h);
    cr_assert(h[0] == 20240520 && h[1] == 1 && h[2] == 5);
    cr_assert_eq((unsigned char)raw[1024 + 6], 1000 & 0xff);
    cr_assert_eq((unsigned char)raw[1024 + 7], 1000 >> 8);
    free(raw);
}

Test(data, bad_magic)
{
    uint16_t t[4] = {0};
    write_raw(1234, 1, 4, t, 4);
    expect_open_error(256, "bad magic number 1234");
}

Test(data, bad_version)
{
    uint16_t t[4] = {0};
    write_raw(20240520, 2, 4, t, 4);
    expect_open_error(256, "unsupported version 2");
}

Test(data, truncated)
{
    uint16_t t[500] = {0};
    write_raw(20240520, 1, 600, t, 500);
    expect_open_error(256, "file has 1000 bytes of tokens, header says 600 tokens (1200 bytes)");
}

Test(data, trailing_bytes)
{
    uint16_t t[10] = {0};
    write_raw(20240520, 1, 8, t, 10);
    expect_open_error(256, "file has 20 bytes of tokens, header says 8 tokens");
}

Test(data, shorter_than_header)
{
    FILE *f = fopen(path, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    expect_open_error(256, "too short for the 1024-byte header");
}

Test(data, missing_file)
{
    expect_open_error(256, "cannot open");
}

Test(data, token_above_vocab)
{
    uint16_t t[40];
    for (int i = 0; i < 40; i++)
        t[i] = (uint16_t)(i % 200);
    t[17] = 300;
    t[30] = 400;
    write_raw(20240520, 1, 40, t, 40);
    expect_open_error(256, "token 300 at position 17 is not below the vocabulary size 256");
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err); /* 0: no vocabulary check */
    cr_assert(d, "%s", err);
    ptrt_data_close(d);
}

/* Inputs are checked against the embedding's rows, targets against cross_entropy's classes: a
 * model may embed 256 ids and predict only 100 classes (or the other way round). */
Test(data, ids_checked_by_their_role)
{
    uint16_t t[40];
    for (int i = 0; i < 40; i++)
        t[i] = (uint16_t)(i % 50);
    t[17] = 150;
    write_raw(20240520, 1, 40, t, 40);
    char err[256] = "";
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d, "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 256, 256, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 256, 100, err, sizeof err), -1);
    cr_assert(strstr(err, "token 150 at position 17 is not below 100, the classes of the "
                          "cross_entropy it is a target of"),
              "%s", err);
    cr_assert(strstr(err, path), "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 100, 256, err, sizeof err), -1);
    cr_assert(strstr(err, "token 150 at position 17 is not below 100, the rows of the embedding"),
              "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 0, 0, err, sizeof err), 0, "0: not checked");
    ptrt_data_close(d);

    /* the first token is never a target, the last never an input */
    t[17] = 5;
    t[0] = 150;
    t[39] = 160;
    write_raw(20240520, 1, 40, t, 40);
    d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d, "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 151, 100, err, sizeof err), -1);
    cr_assert(strstr(err, "token 160 at position 39 is not below 100, the classes"), "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 100, 161, err, sizeof err), -1);
    cr_assert(strstr(err, "token 150 at position 0 is not below 100, the rows"), "%s", err);
    cr_assert_eq(ptrt_data_check_ids(d, 151, 161, err, sizeof err), 0, "%s", err);
    ptrt_data_close(d);
}

Test(data, too_small_for_a_batch)
{
    write_counting(16);
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d);
    cr_assert_eq(ptrt_data_configure(d, 2, 8, false, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "16 tokens are too few for one batch of 2 x 8 (needs 17 tokens)"), "%s",
              err);
    cr_assert_eq(ptrt_data_configure(d, 0, 8, false, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "must be positive"), "%s", err);
    cr_assert_eq(ptrt_data_configure(d, 3, 5, false, 0, err, sizeof err), 0, "%s", err);
    ptrt_data_close(d);
}

/* llm.c's DataLoader, reduced to its arithmetic for one process: a batch is the B*T+1 tokens at
 * current_position; the position advances by B*T and goes back to 0 when the next batch would run
 * past the end. */
static size_t llmc_batch(size_t *pos, size_t ntok, size_t B, size_t T)
{
    if (*pos + B * T + 1 > ntok)
        *pos = 0;
    size_t start = *pos;
    *pos += B * T;
    return start;
}

Test(data, in_order_matches_llmc_and_wraps)
{
    const size_t N = 1000, B = 3, T = 7;
    write_counting(N);
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d, "%s", err);
    cr_assert_eq(ptrt_data_configure(d, B, T, false, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ptrt_data_batches_per_epoch(d), (N - 1) / (B * T));
    int32_t in[21], tg[21];
    size_t pos = 0;
    for (int k = 0; k < 200; k++) { /* over four epochs */
        size_t start = llmc_batch(&pos, N, B, T);
        ptrt_data_next_batch(d, in, tg);
        for (size_t i = 0; i < B * T; i++) {
            cr_assert_eq(in[i], (int32_t)(start + i), "batch %d elem %zu", k, i);
            cr_assert_eq(tg[i], (int32_t)(start + i + 1));
        }
    }
    cr_assert_eq(ptrt_data_position(d), 200);
    cr_assert_eq(ptrt_data_epoch(d), 200 / ((N - 1) / (B * T)));
    ptrt_data_close(d);
}

Test(data, exact_fit_wraps_to_start)
{
    write_counting(2 * 4 * 2 + 1); /* exactly two batches of 2 x 4 */
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d);
    cr_assert_eq(ptrt_data_configure(d, 2, 4, false, 0, err, sizeof err), 0);
    int32_t in[8], tg[8];
    int firsts[4];
    for (int k = 0; k < 4; k++) {
        ptrt_data_next_batch(d, in, tg);
        firsts[k] = in[0];
        cr_assert_eq(tg[7], in[7] + 1);
    }
    cr_assert(firsts[0] == 0 && firsts[1] == 8 && firsts[2] == 0 && firsts[3] == 8);
    ptrt_data_close(d);
}

/* Reads nb batches of a shuffled loader; each row's first input identifies its window. */
static void read_starts(ptrt_data *d, int nb, int B, int T, int32_t *starts)
{
    int32_t *in = ptc_xmalloc(sizeof(int32_t) * (size_t)(B * T));
    int32_t *tg = ptc_xmalloc(sizeof(int32_t) * (size_t)(B * T));
    for (int k = 0; k < nb; k++) {
        ptrt_data_next_batch(d, in, tg);
        for (int b = 0; b < B; b++) {
            starts[k * B + b] = in[b * T];
            cr_assert_eq(in[b * T] % T, 0, "windows start every T tokens");
            for (int t = 0; t < T; t++) {
                cr_assert_eq(in[b * T + t], in[b * T] + t, "a row is contiguous");
                cr_assert_eq(tg[b * T + t], in[b * T + t] + 1, "targets are inputs shifted");
            }
        }
    }
    free(in);
    free(tg);
}

static ptrt_data *open_shuffled(int B, int T, uint64_t seed)
{
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d, "%s", err);
    cr_assert_eq(ptrt_data_configure(d, B, T, true, seed, err, sizeof err), 0, "%s", err);
    return d;
}

Test(data, shuffled_is_a_permutation_per_epoch)
{
    const int B = 4, T = 8, N = 8 * 64 + 1; /* 64 windows, 16 batches per epoch */
    write_counting(N);
    ptrt_data *d = open_shuffled(B, T, 42);
    cr_assert_eq(ptrt_data_batches_per_epoch(d), 16);
    int32_t s[2 * 64];
    read_starts(d, 32, B, T, s);
    for (int e = 0; e < 2; e++) {
        bool seen[64] = {false};
        for (int i = 0; i < 64; i++) {
            int w = s[e * 64 + i] / T;
            cr_assert(!seen[w], "window %d twice in epoch %d", w, e);
            seen[w] = true;
        }
    }
    cr_assert(memcmp(s, s + 64, 64 * sizeof *s) != 0, "epochs must be reshuffled");
    bool sorted = true;
    for (int i = 1; i < 64; i++)
        sorted = sorted && s[i] > s[i - 1];
    cr_assert(!sorted, "a shuffled epoch should not be in order");
    ptrt_data_close(d);
}

Test(data, shuffled_deterministic_per_seed)
{
    const int B = 2, T = 5;
    write_counting(5 * 50 + 3);
    int32_t a[200], b[200], c[200];
    ptrt_data *d = open_shuffled(B, T, 7);
    read_starts(d, 100, B, T, a);
    ptrt_data_close(d);
    d = open_shuffled(B, T, 7);
    read_starts(d, 100, B, T, b);
    ptrt_data_close(d);
    d = open_shuffled(B, T, 8);
    read_starts(d, 100, B, T, c);
    ptrt_data_close(d);
    cr_assert(memcmp(a, b, sizeof a) == 0, "same seed, same batches");
    cr_assert(memcmp(a, c, sizeof a) != 0, "another seed, other batches");
}

/* A run that stops after some batches and resumes from the saved position reads exactly what an
 * uninterrupted run reads, across epoch boundaries, in both orders. */
static void check_resume(bool shuffle)
{
    const int B = 3, T = 4;
    write_counting(4 * 40 + 1); /* 40 windows, 13 batches per epoch */
    char err[256];
    ptrt_data *whole = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert_eq(ptrt_data_configure(whole, B, T, shuffle, 99, err, sizeof err), 0);
    int32_t ref[60 * 12], got[60 * 12], tg[12];
    for (int k = 0; k < 60; k++)
        ptrt_data_next_batch(whole, ref + k * 12, tg);
    for (int stop = 0; stop < 60; stop += 7) {
        ptrt_data *first = ptrt_data_open(path, 0, err, sizeof err);
        cr_assert_eq(ptrt_data_configure(first, B, T, shuffle, 99, err, sizeof err), 0);
        for (int k = 0; k < stop; k++)
            ptrt_data_next_batch(first, got, tg);
        uint64_t saved = ptrt_data_position(first);
        ptrt_data_close(first);
        ptrt_data *resumed = ptrt_data_open(path, 0, err, sizeof err);
        cr_assert_eq(ptrt_data_configure(resumed, B, T, shuffle, 99, err, sizeof err), 0);
        ptrt_data_seek(resumed, saved);
        for (int k = stop; k < 60; k++)
            ptrt_data_next_batch(resumed, got + k * 12, tg);
        cr_assert(memcmp(got + stop * 12, ref + stop * 12, sizeof(int32_t) * 12 * (60 - stop)) == 0,
                  "resume after %d batches (shuffle %d) diverged", stop, shuffle);
        ptrt_data_close(resumed);
    }
    ptrt_data_close(whole);
}

Test(data, resume_in_order)
{
    check_resume(false);
}

Test(data, resume_shuffled)
{
    check_resume(true);
}

Test(data, seek_back_repeats)
{
    write_counting(4 * 40 + 1);
    ptrt_data *d = open_shuffled(2, 4, 5);
    int32_t a[8], b[8], tg[8];
    ptrt_data_seek(d, 31);
    ptrt_data_next_batch(d, a, tg);
    ptrt_data_seek(d, 3);
    ptrt_data_next_batch(d, b, tg);
    ptrt_data_seek(d, 31);
    ptrt_data_next_batch(d, b, tg);
    cr_assert(memcmp(a, b, sizeof a) == 0);
    cr_assert_eq(ptrt_data_position(d), 32);
    ptrt_data_close(d);
}

Test(data, write_to_missing_directory)
{
    uint16_t t[2] = {1, 2};
    char err[256];
    cr_assert_eq(ptrt_data_write("/nonexistent-ptc-dir/x.bin", t, 2, err, sizeof err), -1);
    cr_assert(strstr(err, "/nonexistent-ptc-dir/x.bin") && strstr(err, "cannot create"), "%s", err);
}

Test(data, write_replaces_atomically)
{
    write_counting(100);
    write_counting(50);
    char err[256];
    ptrt_data *d = ptrt_data_open(path, 0, err, sizeof err);
    cr_assert(d);
    cr_assert_eq(ptrt_data_ntokens(d), 50);
    ptrt_data_close(d);
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    cr_assert_neq(access(tmp, F_OK), 0, "no temporary file is left behind");
}
