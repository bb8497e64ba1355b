/* fuzz_data.c - libFuzzer harness for the token-file reader (runtime/io/data.c): any bytes given
 * to --data must open or be refused with a message, and an open file must give batches whose ids
 * are its tokens in the documented order; never a crash, an out-of-bounds read, undefined
 * behaviour or a leak.
 *
 * The first 8 bytes choose the use: batch B (1..8), sequence T (1..64), the bounds the model puts
 * on ids (embedding rows, cross_entropy classes: 0 for none), shuffle, seed, and a position to
 * seek to; the rest is the file. The seeds (PTC_FUZZ_SEEDS=DIR) are token files written by
 * ptrt_data_write.
 */
#include "fuzz_util.h"

#include <string.h>

#include "data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void write_seeds(const char *out)
{
    static const size_t counts[] = {0, 1, 2, 65, 300, 2000};
    uint16_t tok[2000];
    for (size_t i = 0; i < 2000; i++)
        tok[i] = (uint16_t)((i * 37) % 300);
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        char path[600], err[512], tmp[600];
        snprintf(tmp, sizeof tmp, "%s/tokens_%zu.tmpbin", out, counts[k]);
        if (ptrt_data_write(tmp, tok, counts[k], err, sizeof err) != 0) {
            fprintf(stderr, "seed: %s\n", err);
            exit(1);
        }
        /* the seed: 8 bytes of use (B=2, T=8, rows 300, classes 256, in order) + the file */
        FILE *in = fopen(tmp, "rb");
        snprintf(path, sizeof path, "%s/tokens_%zu", out, counts[k]);
        FILE *f = fopen(path, "wb");
        const uint8_t use[8] = {1, 7, 44, 1, 0, 1, 0, 3};
        fwrite(use, 1, 8, f);
        int c;
        while ((c = fgetc(in)) != EOF)
            fputc(c, f);
        fclose(in);
        fclose(f);
        unlink(tmp);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (fuzz_seed_dir()) {
        write_seeds(fuzz_seed_dir());
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    int B = 1 + data[0] % 8, T = 1 + data[1] % 64;
    int64_t rows = data[2] ? data[2] * 8 : 0, classes = data[3] ? data[3] * 4 : 0;
    bool shuffle = data[4] & 1;
    uint64_t seed = data[5], seek = (uint64_t)data[6] << 8 | data[7];
    const char *file = fuzz_as_file(data + 8, size - 8);
    char err[1024];
    ptrt_data *d = ptrt_data_open(file, (int)(data[4] >> 1), err, sizeof err);
    if (!d)
        return 0;
    size_t n = ptrt_data_ntokens(d);
    if (8 + 1024 + 2 * n != size) {
        fprintf(stderr, "opened a file of %zu bytes as %zu tokens\n", size - 8, n);
        abort();
    }
    ptrt_data_check_ids(d, rows, classes, err, sizeof err);
    if (ptrt_data_configure(d, B, T, shuffle, seed, err, sizeof err) == 0) {
        int32_t in[8 * 64], tg[8 * 64];
        for (int k = 0; k < 3; k++) {
            if (k == 2)
                ptrt_data_seek(d, seek);
            ptrt_data_next_batch(d, in, tg);
            for (int i = 0; i < B * T; i++) {
                bool next = i % T == T - 1 || tg[i] == in[i + 1]; /* targets: inputs shifted */
                if (in[i] < 0 || in[i] > 65535 || tg[i] < 0 || tg[i] > 65535 || !next) {
                    fprintf(stderr, "batch %d: bad ids at %d\n", k, i);
                    abort();
                }
            }
        }
    }
    ptrt_data_close(d);
    return 0;
}
