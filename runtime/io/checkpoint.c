/* checkpoint.c - checkpoints of a training run over safetensors (see checkpoint.h). */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "util.h"

#define FORMAT_VERSION "1"

static int64_t numel_of(const ptrt_ckpt_param *p)
{
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= p->shape[d];
    return n;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? "," : "", shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Each tensor's (name, shape) hashed alone, the hashes sorted: the same set of tensors gives the
 * same hash in any order (a partitioned program lists its parameters in another order than the
 * single-device one, and a checkpoint moves between meshes). */
uint64_t ptrt_ckpt_config_hash(const ptrt_ckpt_param *p, int n, const char *extra)
{
    uint64_t *each = ptc_xmalloc(sizeof(uint64_t) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        ptc_hash64_state h;
        ptc_hash64_init(&h, 0x707463636b7074ULL);
        ptc_hash64_update(&h, p[i].name, strlen(p[i].name) + 1);
        int nd = p[i].ndim < 0 ? 0 : p[i].ndim > PTRT_ST_MAXDIM ? PTRT_ST_MAXDIM : p[i].ndim;
        int64_t dims[PTRT_ST_MAXDIM + 1] = {p[i].ndim};
        for (int d = 0; d < nd; d++)
            dims[d + 1] = p[i].shape[d];
        ptc_hash64_update(&h, dims, sizeof(int64_t) * (size_t)(nd + 1));
        each[i] = ptc_hash64_final(&h);
    }
    qsort(each, (size_t)(n > 0 ? n : 0), sizeof(uint64_t), cmp_u64);
    ptc_hash64_state h;
    ptc_hash64_init(&h, 0x707463636b7074ULL);
    ptc_hash64_update(&h, each, sizeof(uint64_t) * (size_t)(n > 0 ? n : 0));
    if (extra)
        ptc_hash64_update(&h, extra, strlen(extra));
    free(each);
    uint64_t v = ptc_hash64_final(&h);
    return v ? v : 1;
}

/* ---- a list of problems, one line each, as many as fit ---- */

typedef struct problems {
    const char *file;
    char *err;
    size_t errn, len;
    int count, hidden;
} problems;

__attribute__((format(printf, 2, 3))) static void problem(problems *pr, const char *fmt, ...)
{
    char line[600];
    int k = snprintf(line, sizeof line, "%s%s: ", pr->len ? "\n" : "", pr->file);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + k, sizeof line - (size_t)k, fmt, ap);
    va_end(ap);
    pr->count++;
    size_t need = strlen(line), tail = 40; /* room for "... and N more" */
    if (pr->len == 0 || pr->len + need + tail < pr->errn) {
        ptc_fmt(pr->err + pr->len, pr->errn - pr->len, "%s", line);
        pr->len += strlen(pr->err + pr->len);
    } else {
        pr->hidden++;
    }
}

static int problems_done(problems *pr)
{
    if (pr->hidden && pr->len < pr->errn)
        ptc_fmt(pr->err + pr->len, pr->errn - pr->len, "\n... and %d more", pr->hidden);
    return pr->count ? -1 : 0;
}

/* ---- saving ---- */

/* Creates dir and its missing parents. dir is not empty: its first byte is never a separator
 * to split at, and the scan starts after it. */
static int mkdir_p(const char *dir, char *err, size_t errn)
{
    PTC_ASSERT(*dir);
    char *p = ptc_xstrdup(dir);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0)
            continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            ptc_fmt(err, errn, "%s: cannot create directory %s: %s", dir, p, strerror(errno));
            rc = -1;
            break;
        }
        *s = c;
        if (!c)
            break;
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        ptc_fmt(err, errn, "%s: not a directory", dir);
        rc = -1;
    }
    free(p);
    return rc;
}

/* The step of a checkpoint file name "step_<digits>.safetensors", or -1. */
static int64_t step_of(const char *name)
{
    if (strncmp(name, "step_", 5) != 0)
        return -1;
    const char *s = name + 5;
    int64_t v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return digits && strcmp(s, ".safetensors") == 0 ? v : -1;
}

static int cmp_step_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the checkpoint files in dir, newest first; *n gets their number. NULL if none. */
static int64_t *list_steps(const char *dir, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    int64_t *steps = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of(e->d_name);
        if (s < 0)
            continue;
        PTC_GROW(steps, cap, *n);
        steps[(*n)++] = s;
    }
    closedir(d);
    if (*n)
        qsort(steps, (size_t)*n, sizeof *steps, cmp_step_desc);
    return steps;
}

/* Temporary files left by a writer that was killed mid-save (NAME.tmp.PID, see io.h) are as
 * large as a checkpoint; a save removes those of other processes. */
static void remove_stale_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char mine[32];
    snprintf(mine, sizeof mine, ".tmp.%ld", (long)getpid());
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp.");
        bool ours_kind = strncmp(e->d_name, "step_", 5) == 0 || strncmp(e->d_name, "latest", 6) == 0;
        if (!t || !ours_kind || strcmp(t, mine) == 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* The part files of a step (step_N.part_*), removed with it. */
static void remove_parts(const char *dir, int64_t step)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "step_%08" PRId64 ".part_", step);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || strstr(e->d_name, ".tmp."))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static int prune(const char *dir, int keep, int64_t current, char *err, size_t errn)
{
    int n, rc = 0;
    remove_stale_temps(dir);
    int64_t *steps = list_steps(dir, &n);
    for (int i = keep; i < n && rc == 0; i++) {
        if (steps[i] == current)
            continue;
        remove_parts(dir, steps[i]);
        char path[4096];
        snprintf(path, sizeof path, "%s/step_%08" PRId64 ".safetensors", dir, steps[i]);
        if (step_of(strrchr(path, '/') + 1) == steps[i] && unlink(path) != 0 && errno != ENOENT) {
            ptc_fmt(err, errn, "%s: checkpoint saved, but removing the old %s failed: %s", dir,
                    path, strerror(errno));
            rc = -1;
        }
    }
    free(steps);
    return rc;
}

static void add_meta_u64(ptrt_st_writer *w, const char *key, uint64_t v, bool hex)
{
    char buf[32];
    snprintf(buf, sizeof buf, hex ? "%016" PRIx64 : "%" PRIu64, v);
    ptrt_st_add_meta(w, key, buf);
}

/* Tensor i of a checkpoint of nparts parts is in part i % nparts (part 0: the step file). */
static bool in_part(int i, int part, int nparts)
{
    return nparts <= 1 || i % nparts == part;
}

/* The file of part `part` (> 0) of a step: step_N.part_P-of-K.safetensors. */
static void part_name(char *buf, size_t n, const char *dir, int64_t step, int part, int nparts)
{
    ptc_fmt(buf, n, "%s/step_%08" PRId64 ".part_%03d-of-%03d.safetensors", dir, step, part,
            nparts);
}

static int write_checkpoint(const char *file, const ptrt_ckpt_param *p, int n,
                            const ptrt_ckpt_state *st, int part, int nparts, char *err,
                            size_t errn)
{
    ptrt_st_writer *w = ptrt_st_writer_new();
    if (nparts > 1) {
        add_meta_u64(w, "ptc.part", (uint64_t)part, false);
        add_meta_u64(w, "ptc.parts", (uint64_t)nparts, false);
    }
    ptrt_st_add_meta(w, "ptc.format", FORMAT_VERSION);
    add_meta_u64(w, "ptc.step", (uint64_t)st->step, false);
    add_meta_u64(w, "ptc.data_position", st->data_position, false);
    add_meta_u64(w, "ptc.seed", st->seed, false);
    if (st->total_steps > 0)
        add_meta_u64(w, "ptc.total_steps", (uint64_t)st->total_steps, false);
    add_meta_u64(w, "ptc.config_hash", st->config_hash, true);
    if (st->loss_scale > 0) {
        char buf[40];
        snprintf(buf, sizeof buf, "%.17g", st->loss_scale);
        ptrt_st_add_meta(w, "ptc.loss_scale", buf);
        add_meta_u64(w, "ptc.scale_clean", (uint64_t)st->scale_clean, false);
        add_meta_u64(w, "ptc.skipped_steps", (uint64_t)st->skipped_steps, false);
    }
    for (int i = 0; i < n; i++)
        if (in_part(i, part, nparts))
            ptrt_st_add(w, p[i].name, PTRT_ST_F32, p[i].ndim, p[i].shape, p[i].value);
    char name[1024];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
            const float *mom = k == 0 ? p[i].m : p[i].v;
            if (!mom || !in_part(i, part, nparts))
                continue;
            snprintf(name, sizeof name, "optim.%c.%s", k == 0 ? 'm' : 'v', p[i].name);
            ptrt_st_add(w, name, PTRT_ST_F32, p[i].ndim, p[i].shape, mom);
        }
    int rc = ptrt_st_save(w, file, err, errn);
    ptrt_st_writer_free(w);
    return rc;
}

int ptrt_ckpt_save_part(const char *dir, const ptrt_ckpt_param *p, int n,
                        const ptrt_ckpt_state *st, int part, int nparts, char *err, size_t errn)
{
    if (part < 1 || part >= nparts || nparts > PTRT_CKPT_MAX_PARTS || st->step < 0 ||
        st->step > PTRT_CKPT_MAX_STEP) {
        ptc_fmt(err, errn, "%s: bad checkpoint part %d of %d", dir, part, nparts);
        return -1;
    }
    if (!*dir || mkdir_p(dir, err, errn) != 0) {
        if (!*dir)
            ptc_fmt(err, errn, "the checkpoint directory has an empty name");
        return -1;
    }
    char file[4096];
    part_name(file, sizeof file, dir, st->step, part, nparts);
    return write_checkpoint(file, p, n, st, part, nparts, err, errn);
}

int ptrt_ckpt_save(const char *dir, const ptrt_ckpt_param *p, int n, const ptrt_ckpt_state *st,
                   int keep, char *path, size_t pathn, char *err, size_t errn)
{
    return ptrt_ckpt_save_sharded(dir, p, n, st, 1, keep, path, pathn, err, errn);
}

int ptrt_ckpt_save_sharded(const char *dir, const ptrt_ckpt_param *p, int n,
                           const ptrt_ckpt_state *st, int nparts, int keep, char *path,
                           size_t pathn, char *err, size_t errn)
{
    if (nparts < 1 || nparts > PTRT_CKPT_MAX_PARTS) {
        ptc_fmt(err, errn, "%s: a checkpoint of %d parts", dir, nparts);
        return -1;
    }
    if (st->step < 0 || st->step > PTRT_CKPT_MAX_STEP) {
        ptc_fmt(err, errn, "%s: cannot save a checkpoint for step %" PRId64, dir, st->step);
        return -1;
    }
    if (!*dir) {
        ptc_fmt(err, errn, "the checkpoint directory has an empty name");
        return -1;
    }
    if (mkdir_p(dir, err, errn) != 0)
        return -1;
    char base[64], file[4096], latest[4096];
    snprintf(base, sizeof base, "step_%08" PRId64 ".safetensors", st->step);
    int k1 = snprintf(file, sizeof file, "%s/%s", dir, base);
    int k2 = snprintf(latest, sizeof latest, "%s/latest", dir);
    if (k1 >= (int)sizeof file || k2 >= (int)sizeof latest) {
        ptc_fmt(err, errn, "%s: directory name too long", dir);
        return -1;
    }
    if (write_checkpoint(file, p, n, st, 0, nparts, err, errn) != 0)
        return -1;
    char line[80];
    snprintf(line, sizeof line, "%s\n", base);
    if (ptc_file_write_file(latest, line, strlen(line), err, errn) != 0)
        return -1;
    if (path)
        ptc_fmt(path, pathn, "%s", file);
    return keep > 0 ? prune(dir, keep, st->step, err, errn) : 0;
}

/* ---- finding and loading ---- */

int ptrt_ckpt_latest(const char *dir, char *path, size_t pathn, char *err, size_t errn)
{
    if (!*dir) { /* "" would make "/latest", a file at the root */
        ptc_fmt(err, errn, "the checkpoint directory has an empty name");
        return -1;
    }
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    size_t len;
    char *text = ptc_read_file_max(latest, 4096, &len); /* one file name; never a stream */
    if (!text && errno != ENOENT) {
        ptc_fmt(err, errn, "%s: cannot read: %s", latest,
                errno == EFBIG ? "longer than a file name" : strerror(errno));
        return -1;
    }
    if (text) {
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r'))
            text[--len] = 0;
        int64_t step = strlen(text) == len ? step_of(text) : -1;
        int ok = step >= 0 && (size_t)snprintf(path, pathn, "%s/%s", dir, text) < pathn;
        struct stat st;
        if (!ok || stat(path, &st) != 0) {
            ptc_fmt(err, errn, "%s: names '%.100s', which is %s", latest, text,
                    ok ? "missing" : "not a checkpoint file name");
            free(text);
            return -1;
        }
        free(text);
        return 1;
    }
    int n;
    int64_t *steps = list_steps(dir, &n);
    if (n > 0 && (size_t)snprintf(path, pathn, "%s/step_%08" PRId64 ".safetensors", dir,
                                  steps[0]) >= pathn) {
        free(steps);
        ptc_fmt(err, errn, "%s: path too long", dir);
        return -1;
    }
    free(steps);
    return n > 0;
}

/* Checks that tensor `name` exists with p's shape and a floating dtype. */
static void expect_tensor(const ptrt_st_file *f, const char *name, const ptrt_ckpt_param *p,
                          problems *pr)
{
    char want[200], have[200];
    fmt_shape(want, sizeof want, p->ndim, p->shape);
    const ptrt_st_tensor *t = ptrt_st_find(f, name);
    if (!t) {
        problem(pr, "missing tensor '%s' (expected %s)", name, want);
        return;
    }
    bool same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = t->shape[d] == p->shape[d];
    fmt_shape(have, sizeof have, t->ndim, t->shape);
    if (!same)
        problem(pr, "tensor '%s' has shape %s, model expects %s", name, have, want);
    else if (t->dtype != PTRT_ST_F32 && t->dtype != PTRT_ST_F64 && t->dtype != PTRT_ST_F16 &&
             t->dtype != PTRT_ST_BF16)
        problem(pr, "tensor '%s' is %s, model expects floating point", name,
                ptrt_st_dtype_name(t->dtype));
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names a file should hold: each parameter, and its moments when `moments`. */
static char **expected_names(const ptrt_ckpt_param *p, int n, bool moments, int *count)
{
    char **names = ptc_xmalloc(sizeof(char *) * (size_t)(3 * n + 1));
    *count = 0;
    for (int i = 0; i < n; i++) {
        names[(*count)++] = ptc_xstrdup(p[i].name);
        for (int k = 0; moments && k < 2; k++) {
            if (!(k == 0 ? p[i].m : p[i].v))
                continue;
            size_t len = strlen(p[i].name) + 9;
            names[*count] = ptc_xmalloc(len);
            snprintf(names[(*count)++], len, "optim.%c.%s", k == 0 ? 'm' : 'v', p[i].name);
        }
    }
    qsort(names, (size_t)*count, sizeof *names, cmp_cstr);
    return names;
}

/* Every mismatch between the file and the parameters, all reported. With !moments (init-from),
 * optim.* tensors are neither expected nor unexpected. */
static void match_part(const ptrt_st_file *f, const ptrt_ckpt_param *p, int n, bool moments,
                       int part, int nparts, problems *pr)
{
    char name[1024];
    for (int i = 0; i < n; i++) {
        if (!in_part(i, part, nparts))
            continue;
        expect_tensor(f, p[i].name, p + i, pr);
        for (int k = 0; moments && k < 2; k++) {
            if (!(k == 0 ? p[i].m : p[i].v))
                continue;
            snprintf(name, sizeof name, "optim.%c.%s", k == 0 ? 'm' : 'v', p[i].name);
            expect_tensor(f, name, p + i, pr);
        }
    }
    int nn;
    char **names = expected_names(p, n, moments, &nn);
    for (int i = 0; i < ptrt_st_ntensors(f); i++) {
        const ptrt_st_tensor *t = ptrt_st_tensor_at(f, i);
        if (bsearch(&t->name, names, (size_t)nn, sizeof *names, cmp_cstr))
            continue;
        if (!moments && strncmp(t->name, "optim.", 6) == 0)
            continue;
        char have[200];
        fmt_shape(have, sizeof have, t->ndim, t->shape);
        problem(pr, "unexpected tensor '%s' %s (the model has no such %s)", t->name, have,
                strncmp(t->name, "optim.", 6) == 0 ? "optimizer state" : "parameter");
    }
    for (int i = 0; i < nn; i++)
        free(names[i]);
    free(names);
}


/* Copies the matched tensors into the trainer's arrays (match found no problem). */
static void fill_part(const ptrt_st_file *f, const ptrt_ckpt_param *p, int n, bool moments,
                      int part, int nparts)
{
    char name[1024], e[8];
    for (int i = 0; i < n; i++)
        for (int k = 0; k < (moments ? 3 : 1) && in_part(i, part, nparts); k++) {
            float *dst = k == 0 ? p[i].value : k == 1 ? p[i].m : p[i].v;
            if (!dst)
                continue;
            if (k == 0)
                snprintf(name, sizeof name, "%s", p[i].name);
            else
                snprintf(name, sizeof name, "optim.%c.%s", k == 1 ? 'm' : 'v', p[i].name);
            const ptrt_st_tensor *t = ptrt_st_find(f, name);
            PTC_ASSERT(t && t->numel == numel_of(&p[i]));
            int rc = ptrt_st_to_f32(t, dst, e, sizeof e);
            PTC_ASSERT(rc == 0);
        }
}


static int meta_u64(const ptrt_st_file *f, const char *path, const char *key, int base,
                    uint64_t *out, char *err, size_t errn)
{
    const char *s = ptrt_st_meta(f, key);
    if (!s) {
        ptc_fmt(err, errn,
                "%s: not a ptc checkpoint (no \"%s\" in __metadata__); --init-from loads the "
                "weights alone",
                path, key);
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (!*s || *end || errno || *s == '-' || *s == ' ' || *s == '+') {
        ptc_fmt(err, errn, "%s: malformed \"%s\": \"%.40s\"", path, key, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int read_state(const ptrt_st_file *f, const char *path, uint64_t config_hash,
                      ptrt_ckpt_state *st, char *err, size_t errn)
{
    const char *fmt = ptrt_st_meta(f, "ptc.format");
    if (fmt && strcmp(fmt, FORMAT_VERSION) != 0) {
        ptc_fmt(err, errn, "%s: checkpoint format %.20s is not supported (this build reads %s)",
                path, fmt, FORMAT_VERSION);
        return -1;
    }
    uint64_t step;
    if (meta_u64(f, path, "ptc.step", 10, &step, err, errn) != 0 ||
        meta_u64(f, path, "ptc.data_position", 10, &st->data_position, err, errn) != 0 ||
        meta_u64(f, path, "ptc.seed", 10, &st->seed, err, errn) != 0 ||
        meta_u64(f, path, "ptc.config_hash", 16, &st->config_hash, err, errn) != 0)
        return -1;
    uint64_t total = 0;
    if (ptrt_st_meta(f, "ptc.total_steps") &&
        meta_u64(f, path, "ptc.total_steps", 10, &total, err, errn) != 0)
        return -1;
    st->total_steps = total <= (uint64_t)PTRT_CKPT_MAX_STEP ? (int64_t)total : 0;
    st->loss_scale = 0;
    st->scale_clean = st->skipped_steps = 0;
    const char *ls = ptrt_st_meta(f, "ptc.loss_scale");
    if (ls) {
        char *end;
        double v = strtod(ls, &end);
        uint64_t clean, skipped;
        if (end == ls || *end || !(v > 0) || !isfinite(v)) {
            ptc_fmt(err, errn, "%s: ptc.loss_scale '%.40s' is not a positive number", path, ls);
            return -1;
        }
        if (meta_u64(f, path, "ptc.scale_clean", 10, &clean, err, errn) != 0 ||
            meta_u64(f, path, "ptc.skipped_steps", 10, &skipped, err, errn) != 0)
            return -1;
        if (skipped > step || clean > (uint64_t)PTRT_CKPT_MAX_STEP) {
            ptc_fmt(err, errn, "%s: ptc.skipped_steps %" PRIu64 " or ptc.scale_clean %" PRIu64
                    " out of range for step %" PRIu64, path, skipped, clean, step);
            return -1;
        }
        st->loss_scale = v;
        st->scale_clean = (int64_t)clean;
        st->skipped_steps = (int64_t)skipped;
    }
    if (step > (uint64_t)PTRT_CKPT_MAX_STEP) {
        ptc_fmt(err, errn, "%s: step %" PRIu64 " out of range (at most %" PRId64 ")", path, step,
                PTRT_CKPT_MAX_STEP);
        return -1;
    }
    st->step = (int64_t)step;
    if (config_hash && st->config_hash != config_hash) {
        ptc_fmt(err, errn,
                "%s: saved by a different model or training setup (config hash %016" PRIx64
                ", this run %016" PRIx64 "); use a new checkpoint directory, or --init-from to "
                "start from its weights",
                path, st->config_hash, config_hash);
        return -1;
    }
    return 0;
}

/* The directory of a file's path ("." for a bare name). */
static void dir_of(const char *path, char *dir, size_t n)
{
    ptc_fmt(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        ptc_fmt(dir, n, ".");
    else if (slash == dir)
        dir[1] = 0; /* "/file" */
    else
        *slash = 0;
}

/* The parts of a sharded checkpoint (its step file says "ptc.parts"), opened and checked to be
 * parts of the same step and run; files[0] is the step file. */
static int open_parts(ptrt_st_file *f, const char *path, const ptrt_ckpt_state *got,
                      ptrt_st_file **files, int *nparts, char *err, size_t errn)
{
    uint64_t k = 1;
    if (ptrt_st_meta(f, "ptc.parts") && meta_u64(f, path, "ptc.parts", 10, &k, err, errn) != 0)
        return -1;
    if (k < 1 || k > PTRT_CKPT_MAX_PARTS) {
        ptc_fmt(err, errn, "%s: \"ptc.parts\" is %" PRIu64 ", out of range", path, k);
        return -1;
    }
    *nparts = (int)k;
    files[0] = f;
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    for (int q = 1; q < *nparts; q++) {
        char file[4200];
        part_name(file, sizeof file, dir, got->step, q, *nparts);
        if (!(files[q] = ptrt_st_open(file, err, errn))) {
            size_t len = strlen(err);
            ptc_fmt(err + len, errn - len, " (part %d of the %d of checkpoint %s)", q, *nparts,
                    path);
            return -1;
        }
        ptrt_ckpt_state ps;
        uint64_t part = 0;
        if (read_state(files[q], file, got->config_hash, &ps, err, errn) != 0 ||
            meta_u64(files[q], file, "ptc.part", 10, &part, err, errn) != 0)
            return -1;
        if (ps.step != got->step || part != (uint64_t)q) {
            ptc_fmt(err, errn, "%s: is part %" PRIu64 " of step %" PRId64
                    ", not part %d of step %" PRId64 " (%s)",
                    file, part, ps.step, q, got->step, path);
            return -1;
        }
    }
    return 0;
}

/* p from the file at path and the parts it names: a checkpoint (`ckpt`: its state into *st, the
 * moments expected) or a weights file (--init-from: a checkpoint's weights, or any safetensors
 * file, whose optim.* tensors are passed over). */
static int load_all(const char *path, const ptrt_ckpt_param *p, int n, bool ckpt,
                    uint64_t config_hash, ptrt_ckpt_state *st, char *err, size_t errn)
{
    ptrt_st_file *f = ptrt_st_open(path, err, errn);
    if (!f)
        return -1;
    ptrt_ckpt_state got = {0};
    ptrt_st_file *files[PTRT_CKPT_MAX_PARTS] = {0};
    int nparts = 1, rc = 0;
    if (ckpt || ptrt_st_meta(f, "ptc.parts"))
        rc = read_state(f, path, config_hash, &got, err, errn);
    if (rc == 0)
        rc = open_parts(f, path, &got, files, &nparts, err, errn);
    files[0] = f;
    for (int q = 0; q < nparts && rc == 0; q++) {
        char pf[4200];
        if (q) {
            char dir[4096];
            dir_of(path, dir, sizeof dir);
            part_name(pf, sizeof pf, dir, got.step, q, nparts);
        }
        problems pr = {.file = q ? pf : path, .err = err, .errn = errn};
        match_part(files[q], p, n, ckpt, q, nparts, &pr);
        rc = problems_done(&pr);
    }
    if (rc == 0) {
        for (int q = 0; q < nparts; q++)
            fill_part(files[q], p, n, ckpt, q, nparts);
        if (st)
            *st = got;
    }
    for (int q = 0; q < nparts; q++)
        if (files[q])
            ptrt_st_close(files[q]);
    return rc;
}

int ptrt_ckpt_load(const char *path, const ptrt_ckpt_param *p, int n, uint64_t config_hash,
                   ptrt_ckpt_state *st, char *err, size_t errn)
{
    return load_all(path, p, n, true, config_hash, st, err, errn);
}

int ptrt_ckpt_resume(const char *dir, const ptrt_ckpt_param *p, int n, uint64_t config_hash,
                     ptrt_ckpt_state *st, char *path, size_t pathn, char *err, size_t errn)
{
    char file[4096];
    int found = ptrt_ckpt_latest(dir, file, sizeof file, err, errn);
    if (found <= 0)
        return found;
    if (ptrt_ckpt_load(file, p, n, config_hash, st, err, errn) != 0)
        return -1;
    if (path)
        ptc_fmt(path, pathn, "%s", file);
    return 1;
}

int ptrt_ckpt_init_from(const char *path, const ptrt_ckpt_param *p, int n, char *err, size_t errn)
{
    return load_all(path, p, n, false, 0, NULL, err, errn);
}
