/* fuzz_checkpoint.c - libFuzzer harness for the checkpoint loader (runtime/io/checkpoint.c) over
 * the safetensors reader: any bytes given to --resume or --init-from must load into a model's
 * arrays or be refused with a message, touching nothing then; never a crash, an out-of-bounds
 * read or write, undefined behaviour or a leak. A first byte 'L' makes the rest the contents of
 * DIR/latest instead, for the code that finds the newest checkpoint.
 *
 * The model: wte [16,4], h.0.attn.w_qkv [4,12] and ln.b [4] with Adam moments. The seeds
 * (PTC_FUZZ_SEEDS=DIR) are checkpoints of it saved by ptrt_ckpt_save, a weights-only file and
 * a few latest files.
 */
#include "fuzz_util.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { NP = 3, MAXN = 64 };
static const char *const names[NP] = {"wte", "h.0.attn.w_qkv", "ln.b"};
static const int64_t shapes[NP][2] = {{16, 4}, {4, 12}, {4, 0}};
static float buf[3][NP][MAXN];
static ptrt_ckpt_param params[NP];
static char dir[64];

static void model(bool moments, float base)
{
    for (int i = 0; i < NP; i++) {
        ptrt_ckpt_param *p = &params[i];
        p->name = names[i];
        p->ndim = shapes[i][1] ? 2 : 1;
        p->shape[0] = shapes[i][0];
        p->shape[1] = shapes[i][1];
        p->value = buf[0][i];
        p->m = moments ? buf[1][i] : NULL;
        p->v = moments ? buf[2][i] : NULL;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < MAXN; j++)
                buf[k][i][j] = base + (float)(k * 100 + i * 10 + j);
    }
}

static void write_seeds(const char *out)
{
    char err[512], path[600];
    model(true, 1);
    for (int64_t step = 1; step <= 3; step += 2) {
        ptrt_ckpt_state st = {.step = step, .data_position = 7, .seed = 1, .config_hash = 42};
        if (ptrt_ckpt_save(out, params, NP, &st, 0, path, sizeof path, err, sizeof err) != 0) {
            fprintf(stderr, "seed: %s\n", err);
            exit(1);
        }
    }
    model(false, 2);
    ptrt_st_writer *w = ptrt_st_writer_new();
    for (int i = 0; i < NP; i++)
        ptrt_st_add(w, names[i], PTRT_ST_F32, params[i].ndim, params[i].shape, params[i].value);
    snprintf(path, sizeof path, "%s/weights.safetensors", out);
    if (ptrt_st_save(w, path, err, sizeof err) != 0)
        exit(1);
    ptrt_st_writer_free(w);
    const char *latest[] = {"Lstep_00000001.safetensors\n", "Lstep_00000003.safetensors",
                            "Lgarbage"};
    for (size_t i = 0; i < sizeof latest / sizeof latest[0]; i++) {
        snprintf(path, sizeof path, "%s/latest_%zu", out, i);
        FILE *f = fopen(path, "w");
        fputs(latest[i], f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/latest", out); /* not a seed of its own */
    unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (fuzz_seed_dir()) {
        write_seeds(fuzz_seed_dir());
        exit(0);
    }
    snprintf(dir, sizeof dir, "/tmp/ptc-fuzz-ckpt.%ld", (long)getpid());
    mkdir(dir, 0755);
    return 0;
}

/* A failed load must leave the arrays as they were. */
static void expect_untouched(const char *what)
{
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < NP; i++)
            for (int j = 0; j < MAXN; j++)
                if (buf[k][i][j] != -1.0f + (float)(k * 100 + i * 10 + j)) {
                    fprintf(stderr, "%s failed but changed the model\n", what);
                    abort();
                }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[1024], path[600];
    ptrt_ckpt_state st;
    if (size > 0 && data[0] == 'L') { /* DIR/latest holds the rest */
        snprintf(path, sizeof path, "%s/latest", dir);
        FILE *f = fopen(path, "w");
        fwrite(data + 1, 1, size - 1, f);
        fclose(f);
        model(true, -1);
        int got = ptrt_ckpt_resume(dir, params, NP, 0, &st, path, sizeof path, err, sizeof err);
        if (got <= 0)
            expect_untouched("resume");
        return 0;
    }
    const char *file = fuzz_as_file(data, size);
    model(true, -1);
    if (ptrt_ckpt_load(file, params, NP, 0, &st, err, sizeof err) != 0) {
        expect_untouched("load");
    } else if (st.step < 0 || st.step > PTRT_CKPT_MAX_STEP) {
        fprintf(stderr, "load gave step %lld\n", (long long)st.step);
        abort();
    }
    model(false, -1);
    if (ptrt_ckpt_init_from(file, params, NP, err, sizeof err) != 0)
        expect_untouched("init-from");
    return 0;
}
