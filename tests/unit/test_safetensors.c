/* test_safetensors.c - the safetensors reader and writer: round trips, the checksum, files in
 * PyTorch's layout, and a catalogue of malformed or hostile inputs that must be refused with a
 * message (and, under the sanitizers, without a single bad read). Also XXH64 and atomic files. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "safetensors.h"
#include "util.h"

static char dir[64];
static char path[128];

static void setup(void)
{
    strcpy(dir, "/tmp/ptc-test-st-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

/* A file image: 8-byte little-endian length of header, header, data. */
static unsigned char *image(const char *header, const void *data, size_t datan, size_t *n)
{
    size_t hn = strlen(header);
    *n = 8 + hn + datan;
    unsigned char *b = ptc_xmalloc(*n);
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)hn >> (8 * k));
    memcpy(b + 8, header, hn);
    if (datan)
        memcpy(b + 8 + hn, data, datan);
    return b;
}

static void write_bytes(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Parses header+data from memory; expects a refusal whose message contains want. */
static void expect_bad(const char *header, size_t datan, const char *want)
{
    unsigned char zeros[64] = {0};
    size_t n;
    unsigned char *b = image(header, zeros, datan, &n);
    char err[512] = "";
    ptrt_st_file *f = ptrt_st_parse("bad.safetensors", b, n, err, sizeof err);
    cr_assert_null(f, "accepted: %s", header);
    cr_assert(strstr(err, "bad.safetensors: "), "message '%s' does not name the file", err);
    cr_assert(strstr(err, want), "header %s: message '%s' lacks '%s'", header, err, want);
    free(b);
}

static const float w23[6] = {1, -2, 3.5f, 0, 1e-30f, 6};
static const int64_t step = 1234567890123LL;
static const int32_t ids[4] = {-1, 0, 7, 2147483647};

static void save_sample(void)
{
    ptrt_st_writer *w = ptrt_st_writer_new();
    int64_t s23[2] = {2, 3}, s4[1] = {4};
    ptrt_st_add(w, "h.0.attn.w_qkv", PTRT_ST_F32, 2, s23, w23);
    ptrt_st_add(w, "step", PTRT_ST_I64, 0, NULL, &step);
    ptrt_st_add(w, "ids \"quoted\"\n", PTRT_ST_I32, 1, s4, ids);
    ptrt_st_add(w, "empty", PTRT_ST_F32, 2, (int64_t[]){0, 5}, NULL);
    ptrt_st_add(w, "also empty", PTRT_ST_U8, 1, (int64_t[]){0}, NULL); /* same offset as "empty" */
    ptrt_st_add_meta(w, "note", "caf\xc3\xa9 \\ \"x\"");
    ptrt_st_add_meta(w, "ptc.step", "7");
    char err[256];
    cr_assert_eq(ptrt_st_save(w, path, err, sizeof err), 0, "%s", err);
    ptrt_st_writer_free(w);
}

Test(safetensors, round_trip)
{
    save_sample();
    char err[256];
    ptrt_st_file *f = ptrt_st_open(path, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert(ptrt_st_checksummed(f));
    cr_assert_eq(ptrt_st_ntensors(f), 5);
    const ptrt_st_tensor *t = ptrt_st_find(f, "h.0.attn.w_qkv");
    cr_assert(t && t->dtype == PTRT_ST_F32 && t->ndim == 2 && t->shape[0] == 2 &&
              t->shape[1] == 3 && t->numel == 6 && t->nbytes == 24);
    float got[6];
    cr_assert_eq(ptrt_st_to_f32(t, got, err, sizeof err), 0);
    cr_assert(memcmp(got, w23, sizeof got) == 0);
    t = ptrt_st_find(f, "step");
    int64_t s;
    cr_assert(t && t->dtype == PTRT_ST_I64 && t->ndim == 0 && t->numel == 1);
    cr_assert_eq(ptrt_st_to_i64(t, &s, err, sizeof err), 0);
    cr_assert_eq(s, step);
    t = ptrt_st_find(f, "ids \"quoted\"\n");
    int64_t i4[4];
    cr_assert(t && t->dtype == PTRT_ST_I32);
    cr_assert_eq(ptrt_st_to_i64(t, i4, err, sizeof err), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(i4[i], ids[i]);
    cr_assert_eq(ptrt_st_to_f32(t, got, err, sizeof err), -1);
    cr_assert(strstr(err, "is I32, not a floating-point tensor"), "%s", err);
    t = ptrt_st_find(f, "empty");
    cr_assert(t && t->numel == 0 && t->nbytes == 0);
    cr_assert_null(ptrt_st_find(f, "nope"));
    cr_assert_str_eq(ptrt_st_meta(f, "note"), "caf\xc3\xa9 \\ \"x\"");
    cr_assert(strncmp(ptrt_st_meta(f, PTRT_ST_CHECKSUM_KEY), "xxh64:", 6) == 0);
    cr_assert_null(ptrt_st_meta(f, "absent"));
    ptrt_st_close(f);
}

Test(safetensors, layout_follows_the_spec)
{
    save_sample();
    size_t n;
    char *b = ptc_read_file(path, &n);
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--)
        hn = hn << 8 | (unsigned char)b[k];
    cr_assert_eq(hn % 8, 0, "header padded to a multiple of 8");
    cr_assert_eq(b[8], '{');
    cr_assert_eq(n, 8 + hn + 24 + 8 + 16 + 0, "tensors back to back, nothing after");
    /* data in the order added: the f32 matrix first */
    cr_assert(memcmp(b + 8 + hn, w23, 24) == 0);
    cr_assert(strstr(b + 8, "\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]"));
    free(b);
}

Test(safetensors, checksum_detects_a_flipped_byte)
{
    save_sample();
    size_t n;
    char *b = ptc_read_file(path, &n);
    for (size_t at = n - 48; at < n; at += 5) { /* every region of the data section */
        b[at] ^= 0x10;
        write_bytes(path, b, n);
        b[at] ^= 0x10;
        char err[256] = "";
        cr_assert_null(ptrt_st_open(path, err, sizeof err));
        cr_assert(strstr(err, "model.safetensors: checksum mismatch (file corrupted?)"), "%s", err);
    }
    free(b);
}

Test(safetensors, every_truncation_is_refused)
{
    save_sample();
    size_t n;
    char *b = ptc_read_file(path, &n);
    for (size_t len = 0; len < n; len++) {
        unsigned char *copy = ptc_xmalloc(len + 1); /* exact size: ASan sees any overread */
        memcpy(copy, b, len);
        char err[256] = "";
        ptrt_st_file *f = ptrt_st_parse("cut.safetensors", copy, len, err, sizeof err);
        cr_assert_null(f, "a file cut to %zu of %zu bytes was accepted", len, n);
        cr_assert(strstr(err, "cut.safetensors: "), "%s", err);
        free(copy);
    }
    write_bytes(path, b, n - 1);
    char err[256];
    cr_assert_null(ptrt_st_open(path, err, sizeof err));
    cr_assert(strstr(err, "truncated file?"), "%s", err);
    free(b);
}

/* A file as safetensors.torch.save_file writes it: {"__metadata__":{"format":"pt"}, ...}, keys
 * in its own order, data sorted by dtype alignment, header padded with spaces, no checksum. */
Test(safetensors, pytorch_layout_without_checksum)
{
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2,"
        "2],\"data_offsets\":[8,16]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_"
        "offsets\":[0,8]},\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":["
        "16,22]}}";
    char padded[512];
    snprintf(padded, sizeof padded, "%-*s", (int)((strlen(hdr) + 7) / 8 * 8), hdr);
    unsigned char data[22];
    float a[2] = {0.5f, -3};
    uint16_t bf[4] = {0x3f80, 0xc000, 0x4049, 0x0000}; /* 1, -2, 3.140625, 0 */
    uint16_t hf[3] = {0x3c00, 0xc400, 0x0001};         /* 1, -4, smallest subnormal */
    memcpy(data, a, 8);
    memcpy(data + 8, bf, 8);
    memcpy(data + 16, hf, 6);
    size_t n;
    unsigned char *b = image(padded, data, sizeof data, &n);
    write_bytes(path, b, n);
    char err[256];
    ptrt_st_file *f = ptrt_st_open(path, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert(!ptrt_st_checksummed(f));
    cr_assert_str_eq(ptrt_st_meta(f, "format"), "pt");
    cr_assert_str_eq(ptrt_st_tensor_at(f, 0)->name, "a", "tensors come in offset order");
    float out[4];
    cr_assert_eq(ptrt_st_to_f32(ptrt_st_find(f, "b"), out, err, sizeof err), 0);
    cr_assert(out[0] == 1 && out[1] == -2 && out[2] == 3.140625f && out[3] == 0);
    cr_assert_eq(ptrt_st_to_f32(ptrt_st_find(f, "c"), out, err, sizeof err), 0);
    cr_assert(out[0] == 1 && out[1] == -4 && out[2] == 5.9604644775390625e-8f);
    cr_assert_eq(ptrt_st_to_f32(ptrt_st_find(f, "a"), out, err, sizeof err), 0);
    cr_assert(out[0] == 0.5f && out[1] == -3);
    ptrt_st_close(f);
    free(b);
}

Test(safetensors, json_escapes_and_whitespace)
{
    const char *hdr = " \r\n\t{ \"__metadata__\" : { } , \"\\u00e9\\ud83d\\ude00\\/\\t\" : { "
                      "\"shape\" : [ ] , \"data_offsets\" : [ 0 , 4 ] , \"dtype\" : \"I32\" } }  ";
    int32_t v = -5;
    size_t n;
    unsigned char *b = image(hdr, &v, 4, &n);
    char err[256];
    ptrt_st_file *f = ptrt_st_parse("x", b, n, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert_str_eq(ptrt_st_tensor_at(f, 0)->name, "\xc3\xa9\xf0\x9f\x98\x80/\t");
    ptrt_st_close(f);
    free(b);
}

#define T1 "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"

Test(safetensors, malformed_headers_are_refused)
{
    static const struct {
        const char *header, *want;
    } cases[] = {
        {"", "unexpected end of header"},
        {"{", "unexpected end of header"},
        {"[]", "expected '{' at the start of the header, found '['"},
        {"{\"a\":{" T1 "}", "expected ',' or '}'"},
        {"{\"a\":{" T1 "},}", "expected a string, found '}'"},
        {"{\"a\":{" T1 "}} x", "unexpected bytes after the header object"},
        {"{\"a\":{" T1 "}}}", "unexpected bytes after the header object"},
        {"{\"a\" {" T1 "}}", "expected ':'"},
        {"{a:{" T1 "}}", "expected a string, found 'a'"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", "unknown dtype 'F33'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
         "found a fraction or exponent"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e2],\"data_offsets\":[0,4]}}",
         "found a fraction or exponent"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", "leading zero"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-],\"data_offsets\":[0,4]}}", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",
         "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}",
         "integer out of range"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-9223372036854775809]}}",
         "integer out of range"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", "expected '['"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
         "shape has more than 8 entries"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
         "data_offsets has more than 2 entries"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
         "data_offsets must be [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "bad data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", "bad data_offsets"},
        {"{\"a\":{" T1 ",\"extra\":1}}", "unknown field 'extra' in tensor 'a'"},
        {"{\"a\":{" T1 ",\"dtype\":\"F32\"}}", "duplicate field 'dtype' in tensor 'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "tensor 'a' has no \"data_offsets\""},
        {"{\"a\":{}}", "expected a string, found '}'"},
        {"{\"a\":[]}", "expected '{' (a tensor entry)"},
        {"{\"a\":{\"dtype\":F32}}", "expected a string, found 'F'"},
        {"{\"a\\u0000\":{" T1 "}}", "\\u0000 is not allowed"},
        {"{\"a\\ud800\":{" T1 "}}", "high surrogate not followed by a low surrogate"},
        {"{\"a\\udc00\":{" T1 "}}", "unpaired low surrogate"},
        {"{\"a\\u12g4\":{" T1 "}}", "four hex digits"},
        {"{\"a\\u12", "four hex digits"},
        {"{\"a\\x\":{" T1 "}}", "invalid escape"},
        {"{\"a\\", "unterminated string"},
        {"{\"a", "unterminated string"},
        {"{\"a\tb\":{" T1 "}}", "control character 0x09"},
        {"{\"a\xff\":{" T1 "}}", "invalid UTF-8"},
        {"{\"a\xc0\xaf\":{" T1 "}}", "invalid UTF-8"},
        {"{\"a\xed\xa0\x80\":{" T1 "}}", "invalid UTF-8"},
        {"{\"a\xe2\x82\":{" T1 "}}", "invalid UTF-8"},
        {"{\"__metadata__\":{\"k\":1}}", "expected a string, found '1'"},
        {"{\"__metadata__\":[]}", "expected '{' (the __metadata__ object)"},
        {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", "duplicate metadata key 'k'"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate __metadata__"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[[[[[[[[[[[[[[[[[[[[", "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", "expected ',' or '}'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_bad(cases[i].header, 4, cases[i].want);
}

Test(safetensors, byte_offsets_in_messages)
{
    /* the '}' where a field name should be is header byte 6, file byte 14 */
    expect_bad("{\"a\":{} x", 0, "bad header at byte 14");
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "bad header at byte 22: unknown dtype");
}

Test(safetensors, inconsistent_offsets_are_refused)
{
    static const struct {
        const char *header;
        size_t datan;
        const char *want;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a': shape [2] of F32 does not match its 4 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
         "does not match its 8 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "bad shape [-1]"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8,
         "bad shape"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", 0,
         "does not match"},
        {"{\"a\":{" T1 "}}", 2, "lie outside the 2-byte data section"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775806,"
         "9223372036854775807]}}",
         4, "lie outside"},
        {"{\"a\":{" T1 "},\"b\":{" T1 "}}", 4, "overlaps tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":"
         "\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "4 unused bytes before tensor 'a'"},
        {"{\"a\":{" T1 "}}", 12, "8 bytes after the last tensor"},
        {"{}", 4, "4 bytes after the last tensor"},
        {"{\"a\":{" T1 "},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "tensor 'a' appears twice"},
        {"{\"__metadata__\":{\"ptc.checksum\":\"crc32:1234\"},\"a\":{" T1 "}}", 4,
         "unrecognised ptc.checksum"},
        {"{\"__metadata__\":{\"ptc.checksum\":\"xxh64:00000000000000zz\"},\"a\":{" T1 "}}", 4,
         "malformed ptc.checksum"},
        {"{\"__metadata__\":{\"ptc.checksum\":\"xxh64:0000000000000000\"},\"a\":{" T1 "}}", 4,
         "checksum mismatch (file corrupted?)"},
        {"{\"__metadata__\":{\"ptc.checksum\":\"xxh64:000000000000000A\"},\"a\":{" T1 "}}", 4,
         "malformed ptc.checksum"},
        {"{\"__metadata__\":{\"ptc.step\":\"1\"},\"a\":{" T1 "}}", 4,
         "has ptc metadata but no ptc.checksum (file corrupted?)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_bad(cases[i].header, cases[i].datan, cases[i].want);
}

Test(safetensors, hostile_header_lengths)
{
    static const uint64_t lens[] = {
        UINT64_MAX, (uint64_t)1 << 63, (uint64_t)1 << 40, 100000001, 100, 9};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        unsigned char b[16] = "........{}      ";
        for (int k = 0; k < 8; k++)
            b[k] = (unsigned char)(lens[i] >> (8 * k));
        char err[256] = "";
        cr_assert_null(ptrt_st_parse("h.safetensors", b, sizeof b, err, sizeof err));
        cr_assert(strstr(err, "h.safetensors: header length"), "%s", err);
        cr_assert(strstr(err, lens[i] > 100000000 ? "100 MB limit" : "rest of the file"), "%s",
                  err);
    }
    unsigned char tiny[5] = {0};
    char err[256];
    cr_assert_null(ptrt_st_parse("h.safetensors", tiny, sizeof tiny, err, sizeof err));
    cr_assert(strstr(err, "too short for the 8-byte header length"), "%s", err);
    write_bytes(path, "", 0);
    cr_assert_null(ptrt_st_open(path, err, sizeof err));
    cr_assert(strstr(err, "file has 0 bytes"), "%s", err);
}

/* Random damage to a valid file must never crash the reader or read out of bounds. */
Test(safetensors, random_corruption_never_crashes)
{
    save_sample();
    size_t n;
    char *b = ptc_read_file(path, &n);
    uint64_t s = 12345;
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        unsigned char *copy = ptc_xmalloc(n);
        memcpy(copy, b, n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)(s >> 33) % n;
            copy[at] = (unsigned char)(s >> 20);
        }
        char err[256];
        ptrt_st_file *f = ptrt_st_parse("fuzz", copy, n, err, sizeof err);
        if (f) { /* only when the damage changed nothing but whitespace in the header */
            accepted++;
            for (size_t k = 0; k < n; k++)
                cr_assert(copy[k] == (unsigned char)b[k] ||
                              (strchr(" \t\r\n", b[k]) && strchr(" \t\r\n", copy[k])),
                          "a file damaged at byte %zu was accepted", k);
            ptrt_st_close(f);
        }
        free(copy);
    }
    cr_assert_lt(accepted, 100);
    free(b);
}

Test(safetensors, writer_refuses_bad_input)
{
    static const struct {
        const char *n1, *n2, *key;
        int ndim;
        const char *want;
    } cases[] = {
        {"a", "a", NULL, 1, "tensor 'a' added twice"},
        {"a", "__metadata__", NULL, 1, "tensor '__metadata__' has a reserved name"},
        {"a", "b\xff", NULL, 1, "not valid UTF-8"},
        {"a", "b", PTRT_ST_CHECKSUM_KEY, 1, "metadata key 'ptc.checksum' is reserved"},
        {"a", "b", "k", 1, "metadata key 'k' added twice"},
        {"a", "b", NULL, 9, "tensor 'b' has more dimensions"},
        {"a", "b", NULL, -1, "tensor 'b' has a negative"},
    };
    float x[4] = {0};
    int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg = -2;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ptrt_st_writer *w = ptrt_st_writer_new();
        ptrt_st_add(w, cases[i].n1, PTRT_ST_F32, 1, shape, x);
        if (cases[i].ndim < 0)
            ptrt_st_add(w, cases[i].n2, PTRT_ST_F32, 1, &neg, x);
        else
            ptrt_st_add(w, cases[i].n2, PTRT_ST_F32, cases[i].ndim, shape, x);
        if (cases[i].key) {
            ptrt_st_add_meta(w, cases[i].key, "1");
            if (strcmp(cases[i].key, "k") == 0)
                ptrt_st_add_meta(w, "k", "2");
        }
        char err[256] = "";
        cr_assert_eq(ptrt_st_save(w, path, err, sizeof err), -1, "case %zu", i);
        cr_assert(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err, cases[i].want);
        cr_assert_neq(access(path, F_OK), 0, "nothing is written");
        ptrt_st_writer_free(w);
    }
}

static bool file_equals(const char *p, const void *want, size_t n)
{
    size_t len;
    char *b = ptc_read_file(p, &len);
    bool eq = b && len == n && memcmp(b, want, n) == 0;
    free(b);
    return eq;
}

/* The old file survives every way a replacement can stop short of the rename. */
Test(safetensors, atomic_write_keeps_the_old_file)
{
    save_sample();
    size_t n;
    char *old = ptc_read_file(path, &n);
    char err[256];
    /* a writer that dies before renaming: the temporary file is all that differs */
    ptc_file_file f;
    cr_assert_eq(ptc_file_create(&f, path, err, sizeof err), 0, "%s", err);
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    cr_assert_str_eq(f.tmp, tmp);
    cr_assert_eq(ptc_file_write(&f, "garbage", 7, err, sizeof err), 0);
    cr_assert_eq(access(tmp, F_OK), 0, "the temporary file exists while writing");
    cr_assert(file_equals(path, old, n), "the old file is untouched while writing");
    ptrt_st_file *st = ptrt_st_open(path, err, sizeof err);
    cr_assert(st, "the old file still loads: %s", err);
    ptrt_st_close(st);
    ptc_file_abort(&f);
    cr_assert_neq(access(tmp, F_OK), 0, "abort removes the temporary file");
    cr_assert(file_equals(path, old, n));

    /* a rename that fails: the target became a non-empty directory while it was written (a
     * directory given as the target is refused by ptc_file_create, before any writing) */
    char blocked[256], inner[300];
    snprintf(blocked, sizeof blocked, "%s/blocked", dir);
    snprintf(inner, sizeof inner, "%s/keep", blocked);
    cr_assert_eq(ptc_file_create(&f, blocked, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ptc_file_write(&f, "new", 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(mkdir(blocked, 0755), 0);
    write_bytes(inner, "x", 1);
    cr_assert_eq(ptc_file_commit(&f, err, sizeof err), -1);
    cr_assert(strstr(err, "rename of") && strstr(err, blocked), "%s", err);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", blocked, (long)getpid());
    cr_assert_neq(access(tmp, F_OK), 0, "a failed commit removes the temporary file");
    cr_assert(file_equals(inner, "x", 1));
    cr_assert_eq(ptc_file_write_file(blocked, "new", 3, err, sizeof err), -1);
    cr_assert(strstr(err, "blocked: is a directory"), "%s", err);

    /* a directory that does not exist: nothing is created, the message names the path */
    cr_assert_eq(ptc_file_write_file("/nonexistent-ptc/x.safetensors", "a", 1, err, sizeof err),
                 -1);
    cr_assert(strstr(err, "/nonexistent-ptc/x.safetensors: cannot create temporary file"), "%s",
              err);

    /* a successful replacement is complete, and leaves no temporary file */
    cr_assert_eq(ptc_file_write_file(path, "new", 3, err, sizeof err), 0, "%s", err);
    cr_assert(file_equals(path, "new", 3));
    free(old);
}

Test(safetensors, xxh64_reference_values)
{
    /* values from the reference implementation (xxhsum -H64) */
    cr_assert_eq(ptc_hash64("", 0, 0), 0xef46db3751d8e999ULL);
    cr_assert_eq(ptc_hash64("abc", 3, 0), 0x44bc2cf5ad770999ULL);
    const char *s = "Nobody inspects the spammish repetition";
    cr_assert_eq(ptc_hash64(s, strlen(s), 0), 0xfbcea83c8a378bf1ULL);
    unsigned char b[1000];
    for (int i = 0; i < 1000; i++)
        b[i] = (unsigned char)(i * 7 + 1);
    cr_assert_eq(ptc_hash64(b, sizeof b, 0), 0x6be03acbf959c413ULL);
    /* streaming in uneven pieces gives the same value */
    for (size_t piece = 1; piece < 70; piece += 3) {
        ptc_hash64_state h;
        ptc_hash64_init(&h, 0);
        for (size_t at = 0; at < sizeof b; at += piece)
            ptc_hash64_update(&h, b + at, at + piece <= sizeof b ? piece : sizeof b - at);
        cr_assert_eq(ptc_hash64_final(&h), 0x6be03acbf959c413ULL, "pieces of %zu", piece);
    }
}

/* Many entries cost n log n: a header with 50,000 metadata keys and 50,000 tensors parses fast,
 * and a repeated key among them is still found. */
Test(safetensors, many_entries, .timeout = 60)
{
    enum { N = 50000 };
    size_t cap = (size_t)N * 120, n = 0;
    char *h = ptc_xmalloc(cap);
    n += (size_t)snprintf(h + n, cap - n, "{\"__metadata__\":{");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(h + n, cap - n, "%s\"k%d\":\"v\"", i ? "," : "", i);
    n += (size_t)snprintf(h + n, cap - n, "}");
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(h + n, cap - n,
                              ",\"t%d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                              i, i, i + 1);
    snprintf(h + n, cap - n, "}");
    unsigned char *data = ptc_xcalloc(N, 1);
    size_t len;
    unsigned char *b = image(h, data, N, &len);
    char err[256];
    ptrt_st_file *f = ptrt_st_parse("many", b, len, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert_eq(ptrt_st_ntensors(f), N);
    cr_assert_eq(ptrt_st_nmeta(f), N);
    cr_assert(ptrt_st_find(f, "t49999") && ptrt_st_find(f, "t0") && !ptrt_st_find(f, "t50000"));
    ptrt_st_close(f);
    free(b);
    memcpy(strstr(h, "\"k4321\""), "\"k1234\"", 7); /* now k1234 appears twice */
    b = image(h, data, N, &len);
    cr_assert_null(ptrt_st_parse("many", b, len, err, sizeof err));
    cr_assert(strstr(err, "many: duplicate metadata key 'k1234'"), "%s", err);
    free(b);
    free(data);
    free(h);
}
