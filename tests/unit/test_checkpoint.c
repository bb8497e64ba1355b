/* test_checkpoint.c - checkpoints of a run: save and resume (values, moments, state), the latest
 * pointer and pruning, refusing another model's or a corrupted checkpoint, and --init-from with
 * every mismatch listed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "util.h"

static char dir[64];
static char ckdir[128];

static void setup(void)
{
    strcpy(dir, "/tmp/ptc-test-ckpt-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(ckdir, sizeof ckdir, "%s/run/ckpt", dir); /* created by the first save */
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

/* A small model: wte [16,4], h.0.attn.w_qkv [4,12], h.1.mlp.w_fc [4,8], ln.b [4]. */
enum { NP = 4 };
typedef struct model {
    ptrt_ckpt_param p[NP];
    float buf[3][NP][64];
} model;

static void model_init(model *m, float base, bool moments)
{
    static const char *names[NP] = {"wte", "h.0.attn.w_qkv", "h.1.mlp.w_fc", "ln.b"};
    static const int64_t shapes[NP][2] = {{16, 4}, {4, 12}, {4, 8}, {4, 0}};
    memset(m, 0, sizeof *m);
    for (int i = 0; i < NP; i++) {
        ptrt_ckpt_param *p = &m->p[i];
        p->name = names[i];
        p->ndim = shapes[i][1] ? 2 : 1;
        p->shape[0] = shapes[i][0];
        p->shape[1] = shapes[i][1];
        p->value = m->buf[0][i];
        p->m = moments ? m->buf[1][i] : NULL;
        p->v = moments ? m->buf[2][i] : NULL;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 64; j++)
                m->buf[k][i][j] = base + 1000.0f * (float)k + 100.0f * (float)i + (float)j;
    }
}

static int numel(const ptrt_ckpt_param *p)
{
    return (int)(p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1));
}

/* Whether the parameters' values (k = 0) or moments (k = 1, 2) of a and b are equal. */
static bool same(const model *a, const model *b, int k)
{
    for (int i = 0; i < NP; i++)
        if (memcmp(a->buf[k][i], b->buf[k][i], sizeof(float) * (size_t)numel(&a->p[i])) != 0)
            return false;
    return true;
}

static ptrt_ckpt_state state_at(int64_t step, uint64_t hash)
{
    return (ptrt_ckpt_state){.step = step,
                             .data_position = 3 * (uint64_t)step + 1,
                             .seed = 0xfeedfacecafebeefULL,
                             .config_hash = hash};
}

static void save(const model *m, int64_t step, int keep)
{
    ptrt_ckpt_state st = state_at(step, 77);
    char err[512], path[512];
    cr_assert_eq(ptrt_ckpt_save(ckdir, m->p, NP, &st, keep, path, sizeof path, err, sizeof err), 0,
                 "%s", err);
    char want[256];
    snprintf(want, sizeof want, "%s/step_%08lld.safetensors", ckdir, (long long)step);
    cr_assert_str_eq(path, want);
}

static bool exists_step(int64_t step)
{
    char p[256];
    snprintf(p, sizeof p, "%s/step_%08lld.safetensors", ckdir, (long long)step);
    return access(p, F_OK) == 0;
}

Test(checkpoint, save_and_resume)
{
    model a, b;
    model_init(&a, 1, true);
    save(&a, 100, 0);
    model_init(&b, -5, true);
    ptrt_ckpt_state st;
    char err[512], path[512];
    int got = ptrt_ckpt_resume(ckdir, b.p, NP, 77, &st, path, sizeof path, err, sizeof err);
    cr_assert_eq(got, 1, "%s", err);
    cr_assert(strstr(path, "step_00000100.safetensors"));
    cr_assert(same(&a, &b, 0) && same(&a, &b, 1) && same(&a, &b, 2), "values and moments restored");
    ptrt_ckpt_state want = state_at(100, 77);
    cr_assert(st.step == want.step && st.data_position == want.data_position &&
              st.seed == want.seed && st.config_hash == 77);
    size_t n;
    char latest[256];
    snprintf(latest, sizeof latest, "%s/latest", ckdir);
    char *text = ptc_read_file(latest, &n);
    cr_assert_str_eq(text, "step_00000100.safetensors\n");
    free(text);
}

Test(checkpoint, file_is_plain_safetensors)
{
    model a;
    model_init(&a, 1, true);
    save(&a, 5, 0);
    char p[256], err[256];
    snprintf(p, sizeof p, "%s/step_00000005.safetensors", ckdir);
    ptrt_st_file *f = ptrt_st_open(p, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert(ptrt_st_checksummed(f));
    cr_assert_eq(ptrt_st_ntensors(f), 3 * NP);
    cr_assert(ptrt_st_find(f, "h.0.attn.w_qkv") && ptrt_st_find(f, "optim.m.h.0.attn.w_qkv") &&
              ptrt_st_find(f, "optim.v.ln.b"));
    cr_assert_str_eq(ptrt_st_meta(f, "ptc.step"), "5");
    cr_assert_str_eq(ptrt_st_meta(f, "ptc.data_position"), "16");
    cr_assert_str_eq(ptrt_st_meta(f, "ptc.seed"), "18369614221190020847");
    cr_assert_str_eq(ptrt_st_meta(f, "ptc.config_hash"), "000000000000004d");
    ptrt_st_close(f);
}

Test(checkpoint, keep_last_k_and_latest)
{
    model a;
    model_init(&a, 1, false);
    for (int s = 1; s <= 5; s++)
        save(&a, s * 10, 2);
    cr_assert(!exists_step(10) && !exists_step(20) && !exists_step(30));
    cr_assert(exists_step(40) && exists_step(50));
    char path[512], err[256];
    cr_assert_eq(ptrt_ckpt_latest(ckdir, path, sizeof path, err, sizeof err), 1);
    cr_assert(strstr(path, "step_00000050"));
    /* without the pointer file the highest step wins */
    char latest[256];
    snprintf(latest, sizeof latest, "%s/latest", ckdir);
    cr_assert_eq(unlink(latest), 0);
    cr_assert_eq(ptrt_ckpt_latest(ckdir, path, sizeof path, err, sizeof err), 1);
    cr_assert(strstr(path, "step_00000050"));
    /* a pointer to a missing file is an error, not a silent fresh start */
    FILE *f = fopen(latest, "w");
    fputs("step_00000070.safetensors\n", f);
    fclose(f);
    cr_assert_eq(ptrt_ckpt_latest(ckdir, path, sizeof path, err, sizeof err), -1);
    cr_assert(strstr(err, "latest: names 'step_00000070.safetensors', which is missing"), "%s",
              err);
    f = fopen(latest, "w");
    fputs("../../etc/passwd\n", f);
    fclose(f);
    cr_assert_eq(ptrt_ckpt_latest(ckdir, path, sizeof path, err, sizeof err), -1);
    cr_assert(strstr(err, "not a checkpoint file name"), "%s", err);
}

Test(checkpoint, no_checkpoint_yet)
{
    model a;
    model_init(&a, 1, true);
    ptrt_ckpt_state st = {0};
    char err[256] = "", path[256];
    cr_assert_eq(ptrt_ckpt_resume(ckdir, a.p, NP, 77, &st, path, sizeof path, err, sizeof err), 0);
    cr_assert_eq(ptrt_ckpt_latest(dir, path, sizeof path, err, sizeof err), 0, "empty directory");
}

Test(checkpoint, other_model_is_refused)
{
    model a, b;
    model_init(&a, 1, true);
    save(&a, 3, 0);
    model_init(&b, 9, true);
    ptrt_ckpt_state st = {0};
    char err[512];
    cr_assert_eq(ptrt_ckpt_resume(ckdir, b.p, NP, 78, &st, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "step_00000003.safetensors: saved by a different model or training "
                          "setup (config hash 000000000000004d, this run 000000000000004e)"),
              "%s", err);
    cr_assert_eq(b.buf[0][0][0], 9, "nothing loaded");
}

Test(checkpoint, config_hash_depends_on_shapes_and_extra)
{
    model a;
    model_init(&a, 1, true);
    uint64_t h = ptrt_ckpt_config_hash(a.p, NP, "B=4 T=64");
    cr_assert_neq(h, 0);
    cr_assert_eq(h, ptrt_ckpt_config_hash(a.p, NP, "B=4 T=64"));
    cr_assert_neq(h, ptrt_ckpt_config_hash(a.p, NP, "B=8 T=64"));
    a.p[1].shape[1] = 13;
    cr_assert_neq(h, ptrt_ckpt_config_hash(a.p, NP, "B=4 T=64"));
}

Test(checkpoint, corrupted_checkpoint_is_refused)
{
    model a;
    model_init(&a, 1, true);
    save(&a, 7, 0);
    char p[256];
    snprintf(p, sizeof p, "%s/step_00000007.safetensors", ckdir);
    size_t n;
    char *b = ptc_read_file(p, &n);
    b[n - 100] ^= 1;
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
    free(b);
    ptrt_ckpt_state st;
    char err[512];
    cr_assert_eq(ptrt_ckpt_resume(ckdir, a.p, NP, 77, &st, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "step_00000007.safetensors: checksum mismatch (file corrupted?)"), "%s",
              err);
}

Test(checkpoint, resume_needs_the_moments)
{
    model a, b;
    model_init(&a, 1, false); /* saved without moments */
    save(&a, 2, 0);
    model_init(&b, 1, true);
    ptrt_ckpt_state st;
    char err[1024];
    cr_assert_eq(ptrt_ckpt_resume(ckdir, b.p, NP, 0, &st, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "missing tensor 'optim.m.wte' (expected [16,4])"), "%s", err);
    cr_assert(strstr(err, "missing tensor 'optim.v.ln.b' (expected [4])"), "%s", err);
}

/* Writes an init file as PyTorch would: a state dict with no ptc metadata. */
static void write_init(const char *p, const char *const *names, const int64_t (*shapes)[2],
                       const int *ndims, int n, ptrt_st_dtype dt)
{
    static uint16_t data[8][512];
    ptrt_st_writer *w = ptrt_st_writer_new();
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 512; j++)
            data[i][j] = 0x3f80; /* 1.0 in bf16 */
        ptrt_st_add(w, names[i], dt, ndims[i], shapes[i], data[i]);
    }
    char err[256];
    cr_assert_eq(ptrt_st_save(w, p, err, sizeof err), 0, "%s", err);
    ptrt_st_writer_free(w);
}

Test(checkpoint, init_from_lists_every_mismatch)
{
    char p[256];
    snprintf(p, sizeof p, "%s/init.safetensors", dir);
    static const char *const names[] = {"wte", "h.0.attn.w_qkv", "ln.b", "lm_head", "optim.m.wte"};
    static const int64_t shapes[][2] = {{300, 4}, {4, 12}, {4, 0}, {4, 16}, {16, 4}};
    static const int ndims[] = {2, 2, 1, 2, 2};
    write_init(p, names, shapes, ndims, 5, PTRT_ST_BF16);
    model m;
    model_init(&m, 1, true);
    char err[2048];
    cr_assert_eq(ptrt_ckpt_init_from(p, m.p, NP, err, sizeof err), -1);
    cr_assert(strstr(err, "init.safetensors: tensor 'wte' has shape [300,4], model expects [16,4]"),
              "%s", err);
    cr_assert(strstr(err, "init.safetensors: missing tensor 'h.1.mlp.w_fc' (expected [4,8])"), "%s",
              err);
    cr_assert(strstr(err, "init.safetensors: unexpected tensor 'lm_head' [4,16] (the model has no "
                          "such parameter)"),
              "%s", err);
    cr_assert(!strstr(err, "optim.m.wte"), "optimizer state is not the model's business: %s", err);
    cr_assert(!strstr(err, "ln.b"), "%s", err);
    cr_assert_eq(m.buf[0][1][0], 101, "nothing loaded on failure");
}

Test(checkpoint, init_from_bf16_state_dict)
{
    char p[256];
    snprintf(p, sizeof p, "%s/init.safetensors", dir);
    static const char *const names[] = {"ln.b", "h.1.mlp.w_fc", "wte", "h.0.attn.w_qkv"};
    static const int64_t shapes[][2] = {{4, 0}, {4, 8}, {16, 4}, {4, 12}};
    static const int ndims[] = {1, 2, 2, 2};
    write_init(p, names, shapes, ndims, 4, PTRT_ST_BF16);
    model m;
    model_init(&m, 1, true);
    char err[512];
    cr_assert_eq(ptrt_ckpt_init_from(p, m.p, NP, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < NP; i++)
        cr_assert_eq(m.buf[0][i][0], 1.0f);
    cr_assert_eq(m.buf[0][0][63], 1.0f);
    cr_assert_eq(m.buf[1][0][0], 1001, "moments untouched");
}

Test(checkpoint, init_from_a_checkpoint_takes_the_weights)
{
    model a, b;
    model_init(&a, 1, true);
    save(&a, 9, 0);
    model_init(&b, -1, false);
    char p[256], err[512];
    snprintf(p, sizeof p, "%s/step_00000009.safetensors", ckdir);
    cr_assert_eq(ptrt_ckpt_init_from(p, b.p, NP, err, sizeof err), 0, "%s", err);
    cr_assert(same(&a, &b, 0));
}

Test(checkpoint, long_lists_are_cut_with_a_count)
{
    char p[256];
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    write_init(p, NULL, NULL, NULL, 0, PTRT_ST_F32);
    model m;
    model_init(&m, 1, false);
    char err[120];
    cr_assert_eq(ptrt_ckpt_init_from(p, m.p, NP, err, sizeof err), -1);
    cr_assert(strstr(err, "missing tensor 'wte'"), "%s", err);
    cr_assert(strstr(err, "... and "), "%s", err);
    cr_assert_lt(strlen(err), sizeof err);
}

Test(checkpoint, weights_only_file_cannot_resume)
{
    char p[256];
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    static const char *const names[] = {"ln.b"};
    static const int64_t shapes[][2] = {{4, 0}};
    static const int ndims[] = {1};
    write_init(p, names, shapes, ndims, 1, PTRT_ST_F32);
    model m;
    model_init(&m, 1, false);
    ptrt_ckpt_state st;
    char err[512];
    cr_assert_eq(ptrt_ckpt_load(p, m.p, NP, 0, &st, err, sizeof err), -1);
    cr_assert(strstr(err, "not a ptc checkpoint (no \"ptc.step\" in __metadata__)"), "%s", err);
}

Test(checkpoint, save_into_an_unwritable_place)
{
    model a;
    model_init(&a, 1, false);
    ptrt_ckpt_state st = state_at(1, 1);
    char err[512], blocker[256], sub[300];
    snprintf(blocker, sizeof blocker, "%s/file", dir);
    FILE *f = fopen(blocker, "w");
    fclose(f);
    snprintf(sub, sizeof sub, "%s/ckpt", blocker); /* a directory under a regular file */
    cr_assert_eq(ptrt_ckpt_save(sub, a.p, NP, &st, 0, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot create directory"), "%s", err);
}

/* A checkpoint whose metadata claims a step the run could not count past (as a forged or damaged
 * file might: the checksum covers the metadata, so the file is written with a valid one). */
static void write_with_step(const char *p, const model *m, const char *step)
{
    ptrt_st_writer *w = ptrt_st_writer_new();
    ptrt_st_add_meta(w, "ptc.format", "1");
    ptrt_st_add_meta(w, "ptc.step", step);
    ptrt_st_add_meta(w, "ptc.data_position", "0");
    ptrt_st_add_meta(w, "ptc.seed", "1");
    ptrt_st_add_meta(w, "ptc.config_hash", "000000000000004d");
    for (int i = 0; i < NP; i++)
        ptrt_st_add(w, m->p[i].name, PTRT_ST_F32, m->p[i].ndim, m->p[i].shape, m->p[i].value);
    char err[512];
    cr_assert_eq(ptrt_st_save(w, p, err, sizeof err), 0, "%s", err);
    ptrt_st_writer_free(w);
}

Test(checkpoint, steps_beyond_the_limit_are_refused)
{
    model a, b;
    model_init(&a, 1, false);
    model_init(&b, -5, false);
    char p[256], err[512], step[32];
    snprintf(p, sizeof p, "%s/forged.safetensors", dir);
    ptrt_ckpt_state st = {0};
    const char *bad[] = {"9223372036854775807", "9223372036854775806", "4611686018427387905"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_with_step(p, &a, bad[i]);
        cr_assert_eq(ptrt_ckpt_load(p, b.p, NP, 77, &st, err, sizeof err), -1, "%s", bad[i]);
        cr_assert(strstr(err, "out of range (at most 4611686018427387904)"), "%s", err);
        cr_assert(!same(&a, &b, 0), "nothing is loaded");
    }
    snprintf(step, sizeof step, "%lld", (long long)PTRT_CKPT_MAX_STEP);
    write_with_step(p, &a, step);
    cr_assert_eq(ptrt_ckpt_load(p, b.p, NP, 77, &st, err, sizeof err), 0, "%s", err);
    cr_assert_eq(st.step, PTRT_CKPT_MAX_STEP);
    /* and a save never writes one */
    st = state_at(PTRT_CKPT_MAX_STEP + 1, 77);
    cr_assert_eq(ptrt_ckpt_save(ckdir, a.p, NP, &st, 0, NULL, 0, err, sizeof err), -1);
}

/* An empty directory name is refused, not read as "/latest" or scanned past its end. */
Test(checkpoint, empty_directory_name)
{
    model a;
    model_init(&a, 1, false);
    ptrt_ckpt_state st = state_at(1, 1);
    char err[512], path[256];
    cr_assert_eq(ptrt_ckpt_save("", a.p, NP, &st, 0, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "empty name"), "%s", err);
    cr_assert_eq(ptrt_ckpt_latest("", path, sizeof path, err, sizeof err), -1);
    cr_assert(strstr(err, "empty name"), "%s", err);
}

/* A checkpoint in 3 parts (as 3 processes write it): each part holds tensors i % 3 == part; the
 * step file names the parts; loading takes each tensor from its part; a missing part, or a part
 * of another step, is refused by name; pruning removes parts with their step. */
static void save_parts(const model *m, int64_t step, int keep)
{
    ptrt_ckpt_state st = state_at(step, 77);
    char err[512], path[512];
    for (int q = 1; q < 3; q++)
        cr_assert_eq(ptrt_ckpt_save_part(ckdir, m->p, NP, &st, q, 3, err, sizeof err), 0, "%s",
                     err);
    cr_assert_eq(ptrt_ckpt_save_sharded(ckdir, m->p, NP, &st, 3, keep, path, sizeof path, err,
                                        sizeof err),
                 0, "%s", err);
}

static bool exists_part(int64_t step, int part)
{
    char p[256];
    snprintf(p, sizeof p, "%s/step_%08lld.part_%03d-of-003.safetensors", ckdir, (long long)step,
             part);
    return access(p, F_OK) == 0;
}

Test(checkpoint, sharded_save_and_resume)
{
    model a, b;
    model_init(&a, 1, true);
    save_parts(&a, 7, 0);
    cr_assert(exists_step(7) && exists_part(7, 1) && exists_part(7, 2));
    model_init(&b, -5, true);
    ptrt_ckpt_state st;
    char err[512];
    cr_assert_eq(ptrt_ckpt_resume(ckdir, b.p, NP, 77, &st, NULL, 0, err, sizeof err), 1, "%s",
                 err);
    cr_assert(same(&a, &b, 0) && same(&a, &b, 1) && same(&a, &b, 2), "every part's tensors");
    cr_assert_eq(st.step, 7);
    /* the step file alone holds part 0: wte (i = 0) but not w_qkv (i = 1) */
    char p[256];
    snprintf(p, sizeof p, "%s/step_00000007.safetensors", ckdir);
    ptrt_st_file *f = ptrt_st_open(p, err, sizeof err);
    cr_assert(f, "%s", err);
    cr_assert(ptrt_st_find(f, "wte") && !ptrt_st_find(f, "h.0.attn.w_qkv"));
    cr_assert_str_eq(ptrt_st_meta(f, "ptc.parts"), "3");
    ptrt_st_close(f);
}

Test(checkpoint, sharded_missing_or_foreign_part_is_refused)
{
    model a, b;
    model_init(&a, 1, true);
    save_parts(&a, 7, 0);
    char from[256], to[256], err[1024];
    snprintf(from, sizeof from, "%s/step_00000007.part_002-of-003.safetensors", ckdir);
    snprintf(to, sizeof to, "%s/moved", ckdir);
    cr_assert_eq(rename(from, to), 0);
    model_init(&b, -5, true);
    ptrt_ckpt_state st;
    cr_assert_eq(ptrt_ckpt_resume(ckdir, b.p, NP, 77, &st, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "part_002-of-003") && strstr(err, "part 2 of the 3"), "%s", err);
    cr_assert(same(&b, &b, 0));
    /* part 2 of another step in its place */
    ptrt_ckpt_state other = state_at(8, 77);
    cr_assert_eq(ptrt_ckpt_save_part(ckdir, a.p, NP, &other, 2, 3, err, sizeof err), 0, "%s", err);
    snprintf(from, sizeof from, "%s/step_00000008.part_002-of-003.safetensors", ckdir);
    snprintf(to, sizeof to, "%s/step_00000007.part_002-of-003.safetensors", ckdir);
    cr_assert_eq(rename(from, to), 0);
    cr_assert_eq(ptrt_ckpt_resume(ckdir, b.p, NP, 77, &st, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "is part 2 of step 8, not part 2 of step 7"), "%s", err);
}

Test(checkpoint, sharded_prune_removes_parts)
{
    model a;
    model_init(&a, 1, true);
    for (int64_t s = 1; s <= 3; s++)
        save_parts(&a, s, 2);
    cr_assert(!exists_step(1) && !exists_part(1, 1) && !exists_part(1, 2), "step 1 and its parts");
    cr_assert(exists_step(2) && exists_part(2, 2) && exists_step(3) && exists_part(3, 1));
}

Test(checkpoint, init_from_a_sharded_checkpoint_takes_every_part)
{
    model a, b;
    model_init(&a, 1, true);
    save_parts(&a, 7, 0);
    model_init(&b, -5, false);
    char p[256], err[512];
    snprintf(p, sizeof p, "%s/step_00000007.safetensors", ckdir);
    cr_assert_eq(ptrt_ckpt_init_from(p, b.p, NP, err, sizeof err), 0, "%s", err);
    cr_assert(same(&a, &b, 0), "the weights of all 3 parts");
}
