/* verify.c - the plan verifier (see program.h): what every lowered and every loaded plan must
 * satisfy before anything runs it. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kir.h"
#include "program.h"

typedef struct vctx {
    const ptc_plan *p;
    const ptc_program *pg;
    int prog;
    char *err;
    size_t errn;
} vctx;

static int bad(vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(vctx *v, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ptc_fmt(v->err, v->errn, "program %d: %s", v->prog, msg);
    return -1;
}

static bool is_16bit(ptc_dtype t)
{
    return t == PTC_BF16 || t == PTC_F16;
}

static int check_buffer(vctx *v, int b)
{
    const ptc_buffer *bf = &v->pg->bufs[b];
    const ptc_type *t = &bf->type;
    if ((unsigned)t->dtype >= PTC_NDTYPES || t->rank < 0 || t->rank > PTC_MAX_RANK)
        return bad(v, "buffer b%d has a bad type", b);
    int64_t n = 1, bytes;
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] < 0 || !ptc_mul_ok(n, t->dims[d], &n))
            return bad(v, "buffer b%d has a bad shape", b);
    if (!ptc_mul_ok(n, ptc_dtype_size(t->dtype), &bytes) || bytes != bf->bytes)
        return bad(v, "buffer b%d holds %lld bytes, its type needs %lld", b, (long long)bf->bytes,
                   (long long)bytes);
    if (bf->kind > PTC_BUF_STATE || bf->region >= PTC_NREGIONS || bf->role >= PTC_NROLES)
        return bad(v, "buffer b%d has a bad kind, region or role", b);
    for (int a = 0; a < PTC_MAX_MESH_AXES; a++) {
        ptc_placement pl = bf->place[a];
        if (pl.kind > PTC_PLACE_PARTIAL || (a >= v->p->mesh.naxes && pl.kind) ||
            (pl.kind == PTC_PLACE_SHARD && (pl.dim < 0 || pl.dim >= t->rank)))
            return bad(v, "buffer b%d has a bad placement on mesh axis %d", b, a);
    }
    if (bf->view >= 0) {
        const ptc_buffer *r = &v->pg->bufs[bf->view];
        if (bf->view >= v->pg->nbufs || bf->view == b || r->view >= 0)
            return bad(v, "buffer b%d views b%d, which is not a root buffer", b, bf->view);
        if (bf->view_offset < 0)
            return bad(v, "view b%d has a negative offset", b);
        /* the farthest byte of the root any rank's view touches */
        int64_t reach = bf->bytes + bf->view_offset;
        if (bf->view_axis >= 0) {
            if (bf->view_axis >= v->p->mesh.naxes || bf->view_step < 0)
                return bad(v, "view b%d has a bad shard step", b);
            reach += (int64_t)(v->p->mesh.sizes[bf->view_axis] - 1) * bf->view_step;
        }
        if (reach > r->bytes || bf->offset != r->offset || bf->region != r->region)
            return bad(v, "view b%d does not fit in b%d", b, bf->view);
        if (bf->kind != PTC_BUF_TEMP)
            return bad(v, "view b%d is not a temporary", b);
        return 0;
    }
    int want = bf->kind == PTC_BUF_PARAM ? PTC_REGION_PARAM
               : bf->kind == PTC_BUF_STATE ? PTC_REGION_OPTIM
               : bf->kind == PTC_BUF_INPUT ? PTC_REGION_ACT
                                           : -1;
    if (want >= 0 && bf->region != want)
        return bad(v, "%s buffer b%d is not in the %s region", bf->kind == PTC_BUF_INPUT ? "input"
                   : bf->kind == PTC_BUF_PARAM ? "parameter" : "state",
                   b, ptc_region_name(want));
    if (want >= 0 && !bf->name)
        return bad(v, "buffer b%d has no name", b);
    if (bf->offset < 0 || bf->offset % PTC_ALIGN ||
        bf->offset > v->pg->region_bytes[bf->region] - bf->bytes)
        return bad(v, "buffer b%d (%lld bytes at %lld) lies outside its %s arena of %lld bytes", b,
                   (long long)bf->bytes, (long long)bf->offset, ptc_region_name(bf->region),
                   (long long)v->pg->region_bytes[bf->region]);
    return 0;
}

static int64_t numel(const vctx *v, int b)
{
    return ptc_type_numel(&v->pg->bufs[b].type);
}

static ptc_dtype dtype(const vctx *v, int b)
{
    return v->pg->bufs[b].type.dtype;
}

static int check_kernel(vctx *v, int i, const ptc_instr *in)
{
    if ((unsigned)in->op >= PTC_NOPS)
        return bad(v, "i%d: unknown op", i);
    const ptc_op_info *info = &ptc_ops[in->op];
    if ((info->flags & (PTC_F_SOURCE | PTC_F_COMM)) && in->op != PTC_OP_CONST &&
        in->op != PTC_OP_FILL)
        return bad(v, "i%d: %s cannot be a kernel", i, info->name);
    if ((info->nin >= 0 && in->nin != info->nin) || (info->nin < 0 && in->nin < 1))
        return bad(v, "i%d: %s takes %d operands, not %d", i, info->name, info->nin, in->nin);
    ptc_type it[PTC_MAX_RESULTS * 2], ot[PTC_MAX_RESULTS];
    /* 16-bit storage is read and written by casts and the ops of ptc_op_storage16 alone: every
     * other kernel computes on f32 copies (kernel.h), and one handed 16-bit bytes would read them
     * as floats. Those ops take operands of one 16-bit type and give results of it (or f32). */
    ptc_dtype t16 = in->nin ? dtype(v, in->in[0]) : PTC_F32;
    bool s16 = ptc_op_storage16(in->op) && is_16bit(t16);
    for (int k = 0; s16 && k < in->nin + in->nout; k++) {
        ptc_dtype t = dtype(v, k < in->nin ? in->in[k] : in->out[k - in->nin]);
        if (t != t16 && (k < in->nin || t != PTC_F32))
            return bad(v, "i%d: %s over 16-bit storage has %s b%d of another dtype", i,
                       info->name, k < in->nin ? "operand" : "result",
                       k < in->nin ? in->in[k] : in->out[k - in->nin]);
    }
    for (int k = 0; k < in->nin + in->nout && in->op != PTC_OP_CAST && !s16; k++)
        if (is_16bit(dtype(v, k < in->nin ? in->in[k] : in->out[k - in->nin])))
            return bad(v, "i%d: %s %s b%d is 16-bit: only a cast reads or writes 16-bit storage",
                       i, info->name, k < in->nin ? "operand" : "result",
                       k < in->nin ? in->in[k] : in->out[k - in->nin]);
    for (int k = 0; k < in->nin; k++)
        it[k] = v->pg->bufs[in->in[k]].type;
    ptc_attrs a = in->attrs;
    char msg[400];
    int n = ptc_infer(in->op, it, in->nin, &a, ot, msg, sizeof msg);
    if (n < 0)
        return bad(v, "i%d: %s: %s", i, info->name, msg);
    if (n != in->nout)
        return bad(v, "i%d: %s gives %d results, not %d", i, info->name, n, in->nout);
    for (int k = 0; k < n; k++) {
        ptc_type got = v->pg->bufs[in->out[k]].type;
        /* a kernel computing in f32 for 16-bit storage writes an f32 result */
        if (got.dtype == PTC_F32 && is_16bit(ot[k].dtype) && in->op != PTC_OP_CAST)
            got.dtype = ot[k].dtype;
        if (!ptc_type_eq(&got, &ot[k])) {
            char a1[160], a2[160];
            return bad(v, "i%d: %s result %d is %s, its operands give %s", i, info->name, k,
                       ptc_type_str(&v->pg->bufs[in->out[k]].type, a1, sizeof a1),
                       ptc_type_str(&ot[k], a2, sizeof a2));
        }
    }
    return 0;
}

static int check_gemm(vctx *v, int i, const ptc_instr *in)
{
    const ptc_gemm *g = &in->gemm;
    /* beta != 0 reads C too: a third operand, the result itself (an accumulated gradient) */
    int nin = g->beta != 0 ? 3 : 2;
    if (in->nin != nin || in->nout != 1 || (nin == 3 && in->in[2] != in->out[0]))
        return bad(v, "i%d: a gemm has two operands (three, the last its result, when beta is "
                      "not 0) and one result",
                   i);
    if (g->ab != PTC_F32 && g->ab != PTC_BF16 && g->ab != PTC_F16)
        return bad(v, "i%d: gemm operands of a bad dtype", i);
    if (g->cd != PTC_F32 && (g->cd != g->ab || g->beta != 0))
        return bad(v, "i%d: a gemm result of a bad dtype (f32, or its operands' with beta 0)", i);
    for (int k = 0; k < 3; k++) {
        int b = k < 2 ? in->in[k] : in->out[0];
        ptc_dtype want = (ptc_dtype)(k < 2 ? g->ab : g->cd);
        if (dtype(v, b) != want)
            return bad(v, "i%d: gemm %s b%d is not %s", i, k < 2 ? "operand" : "result", b,
                       ptc_dtype_name(want));
    }
    if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1 || g->lda != (g->ta ? g->m : g->k) ||
        g->ldb != (g->tb ? g->k : g->n) || g->ldc != g->n)
        return bad(v, "i%d: inconsistent gemm shape", i);
    int64_t ma = g->m * g->k, mb = g->k * g->n, mc = g->m * g->n;
    if ((g->sa != 0 && g->sa != ma) || (g->sb != 0 && g->sb != mb) ||
        (g->batch > 1 && g->sc != mc) || numel(v, in->in[0]) != (g->sa ? g->batch : 1) * ma ||
        numel(v, in->in[1]) != (g->sb ? g->batch : 1) * mb ||
        numel(v, in->out[0]) != g->batch * mc)
        return bad(v, "i%d: gemm sizes disagree with its buffers", i);
    return 0;
}

static int check_coll(vctx *v, int i, const ptc_instr *in)
{
    const ptc_coll *c = &in->coll;
    const ptc_mesh *m = &v->p->mesh;
    int nin = c->kind == PTC_COLL_ALL_TO_ALL_V ? 2 : 1;
    if (in->nin != nin || in->nout != 1 || c->kind >= PTC_NCOLLS)
        return bad(v, "i%d: a collective has one operand (all_to_all_v: two) and one result", i);
    if (!c->axes || (m->naxes < 32 && (c->axes >> m->naxes)))
        return bad(v, "i%d: %s over no or unknown mesh axes", i, ptc_coll_name(c->kind));
    int64_t n = 1, x = numel(v, in->in[0]), y = numel(v, in->out[0]);
    for (int a = 0; a < m->naxes; a++)
        if (c->axes & (1u << a))
            n *= m->sizes[a];
    if (dtype(v, in->in[0]) != dtype(v, in->out[0]))
        return bad(v, "i%d: %s changes the dtype", i, ptc_coll_name(c->kind));
    bool ok = true;
    switch (c->kind) {
    case PTC_COLL_ALLREDUCE: ok = c->count == x && x == y; break;
    case PTC_COLL_ALLGATHER: ok = y == c->outer * n * c->chunk && x == c->outer * c->chunk; break;
    case PTC_COLL_REDUCE_SCATTER:
        ok = x == c->outer * n * c->chunk && y == c->outer * c->chunk;
        break;
    case PTC_COLL_ALL_TO_ALL_V: /* rows of chunk elements; counts i32[n * experts] */
        ok = c->chunk > 0 && c->count > 0 && c->count % n == 0 && x % c->chunk == 0 &&
             y % c->chunk == 0 && (c->outer == 0 || c->outer == 1) &&
             dtype(v, in->in[1]) == PTC_I32 && numel(v, in->in[1]) == n * c->count;
        break;
    default:
        ok = x == c->outer * n * c->chunk && y == c->outer2 * n * c->chunk2 &&
             c->outer * c->chunk == c->outer2 * c->chunk2;
    }
    return ok ? 0 : bad(v, "i%d: %s layout disagrees with its buffers", i, ptc_coll_name(c->kind));
}

/* A fused instruction against its kernel: one parameter per operand (inputs, then results) of the
 * buffer's dtype and size; an out parameter over an in parameter is a result in the bytes of that
 * operand, and every other result shares no bytes with any operand (the generated code may assume
 * so). */
static int check_fused(vctx *v, int i, const ptc_instr *in)
{
    if (in->kernel < 0 || in->kernel >= v->p->nkernels)
        return bad(v, "i%d: a fused instruction without a kernel", i);
    const ptc_kir *k = v->p->kernels[in->kernel];
    if (k->nparams != in->nin + in->nout)
        return bad(v, "i%d: kernel %s has %d parameters for %d operands and results", i, k->name,
                   k->nparams, in->nin + in->nout);
    for (int q = 0; q < k->nparams; q++) {
        const ptc_kparam *pp = &k->params[q];
        bool out = q >= in->nin;
        int b = out ? in->out[q - in->nin] : in->in[q];
        const ptc_buffer *bf = &v->pg->bufs[b];
        if (pp->out != out || pp->dtype != bf->type.dtype || pp->numel != numel(v, b))
            return bad(v, "i%d: parameter %s of kernel %s does not match b%d", i, pp->name,
                       k->name, b);
        if (!out)
            continue;
        int root = ptc_prog_root(v->pg, b);
        for (int r = 0; r < in->nin + (q - in->nin); r++) {
            int o = r < in->nin ? in->in[r] : in->out[r - in->nin];
            bool shared = ptc_prog_root(v->pg, o) == root;
            if (shared != (r == pp->alias))
                return bad(v, "i%d: result b%d of kernel %s %s b%d", i, b, k->name,
                           shared ? "shares the bytes of" : "is declared over", o);
        }
    }
    return 0;
}

static int check_instr(vctx *v, int i)
{
    const ptc_instr *in = &v->pg->instrs[i];
    int cap = in->kind == PTC_INSTR_FUSED ? PTC_MAX_FUSED_OPERANDS : PTC_MAX_RESULTS;
    if (in->nin < 0 || in->nout < 0 || in->nin > 2 * cap || in->nout > cap ||
        in->phase > PTC_PHASE_UPDATE)
        return bad(v, "i%d: bad operand count or phase", i);
    for (int k = 0; k < in->nin; k++)
        if (in->in[k] < 0 || in->in[k] >= v->pg->nbufs)
            return bad(v, "i%d: operand %d is not a buffer", i, k);
    for (int k = 0; k < in->nout; k++)
        if (in->out[k] < 0 || in->out[k] >= v->pg->nbufs)
            return bad(v, "i%d: result %d is not a buffer", i, k);
    switch (in->kind) {
    case PTC_INSTR_KERNEL: return check_kernel(v, i, in);
    case PTC_INSTR_GEMM: return check_gemm(v, i, in);
    case PTC_INSTR_COLL: return check_coll(v, i, in);
    case PTC_INSTR_COPY:
        if (in->nin != 1 || in->nout != 1 || in->bytes < 0 ||
            in->bytes > v->pg->bufs[in->in[0]].bytes || in->bytes > v->pg->bufs[in->out[0]].bytes)
            return bad(v, "i%d: copy of %lld bytes does not fit its buffers", i,
                       (long long)in->bytes);
        return 0;
    case PTC_INSTR_FUSED: return check_fused(v, i, in);
    case PTC_INSTR_SEND:
    case PTC_INSTR_RECV:
        if (in->nin != (in->kind == PTC_INSTR_SEND) || in->nout != (in->kind == PTC_INSTR_RECV) ||
            in->peer_axis < 0 || in->peer_axis >= v->p->mesh.naxes)
            return bad(v, "i%d: bad send/recv", i);
        return 0;
    default: return bad(v, "i%d: unknown instruction kind %d", i, in->kind);
    }
}

/* Every buffer is read after it is written (or is live at entry). A view that no instruction
 * writes (a reshape) is readable once any buffer sharing its bytes is. */
static int check_dataflow(vctx *v)
{
    const ptc_program *pg = v->pg;
    int nb = pg->nbufs ? pg->nbufs : 1;
    bool *written = ptc_xcalloc((size_t)nb, 1), *ready = ptc_xcalloc((size_t)nb, 1);
    bool *is_out = ptc_xcalloc((size_t)nb, 1);
    int rc = 0;
    for (int i = 0; i < pg->ninstrs; i++)
        for (int k = 0; k < pg->instrs[i].nout; k++)
            is_out[pg->instrs[i].out[k]] = true;
    for (int b = 0; b < pg->nbufs; b++)
        if (pg->bufs[b].view < 0 && pg->bufs[b].kind != PTC_BUF_TEMP)
            written[b] = ready[b] = true;
    for (int i = 0; i < pg->ninstrs && !rc; i++) {
        const ptc_instr *in = &pg->instrs[i];
        for (int k = 0; k < in->nin && !rc; k++) {
            int b = in->in[k], r = ptc_prog_root(pg, b);
            if (!(written[b] || (!is_out[b] && ready[r])))
                rc = bad(v, "i%d reads b%d before anything writes it", i, b);
        }
        for (int k = 0; k < in->nout; k++)
            written[in->out[k]] = ready[ptc_prog_root(pg, in->out[k])] = true;
    }
    free(written);
    free(ready);
    free(is_out);
    return rc;
}

static int by_first_ctx_cmp(const void *a, const void *b, const int *first)
{
    int x = *(const int *)a, y = *(const int *)b;
    return first[x] != first[y] ? (first[x] < first[y] ? -1 : 1) : (x < y ? -1 : x > y);
}
static const int *sort_first;
static int by_first(const void *a, const void *b)
{
    return by_first_ctx_cmp(a, b, sort_first);
}

/* No two buffers of a region whose lifetimes overlap share a byte: a sweep over start times
 * with the set of live buffers. */
static int check_overlap(vctx *v)
{
    const ptc_program *pg = v->pg;
    int nb = pg->nbufs ? pg->nbufs : 1, rc = 0;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)nb), *last = ptc_xmalloc(sizeof(int) * (size_t)nb);
    int *order = ptc_xmalloc(sizeof(int) * (size_t)nb), *live = ptc_xmalloc(sizeof(int) * (size_t)nb);
    ptc_prog_lifetimes(pg, first, last);
    for (int region = 0; region < PTC_NREGIONS && !rc; region++) {
        int n = 0, nlive = 0;
        for (int b = 0; b < pg->nbufs; b++)
            if (pg->bufs[b].view < 0 && pg->bufs[b].region == region && first[b] <= last[b] &&
                pg->bufs[b].bytes > 0)
                order[n++] = b;
        sort_first = first;
        qsort(order, (size_t)n, sizeof *order, by_first);
        for (int i = 0; i < n && !rc; i++) {
            int b = order[i], kept = 0;
            const ptc_buffer *x = &pg->bufs[b];
            for (int j = 0; j < nlive; j++)
                if (last[live[j]] >= first[b])
                    live[kept++] = live[j];
            nlive = kept;
            for (int j = 0; j < nlive && !rc; j++) {
                const ptc_buffer *y = &pg->bufs[live[j]];
                if (x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes)
                    rc = bad(v, "buffers b%d and b%d are live at the same time and share bytes "
                                "of the %s arena", live[j], b, ptc_region_name(region));
            }
            live[nlive++] = b;
        }
    }
    free(first);
    free(last);
    free(order);
    free(live);
    return rc;
}

static int check_program(vctx *v)
{
    const ptc_program *pg = v->pg;
    for (int r = 0; r < PTC_NREGIONS; r++)
        if (pg->region_bytes[r] < 0)
            return bad(v, "negative %s arena", ptc_region_name(r));
    for (int b = 0; b < pg->nbufs; b++)
        if (check_buffer(v, b) < 0)
            return -1;
    for (int i = 0; i < pg->ninstrs; i++)
        if (check_instr(v, i) < 0)
            return -1;
    int ends[2] = {pg->loss, pg->grad_norm};
    for (int k = 0; k < 2; k++)
        if (ends[k] < -1 || ends[k] >= pg->nbufs)
            return bad(v, "the loss or gradient norm is not a buffer");
    for (int k = 0; k < pg->nstats; k++)
        if (pg->stats[k] < 0 || pg->stats[k] >= pg->nbufs || dtype(v, pg->stats[k]) != PTC_F32 ||
            numel(v, pg->stats[k]) != 3)
            return bad(v, "moe statistics %d are not an f32[3] buffer", k);
    for (int k = 0; k < pg->noutputs; k++)
        if (pg->outputs[k] < 0 || pg->outputs[k] >= pg->nbufs)
            return bad(v, "output %d is not a buffer", k);
    for (int k = 0; k < pg->neval; k++)
        if (pg->eval[k] < 0 || pg->eval[k] >= pg->ninstrs || (k && pg->eval[k] <= pg->eval[k - 1]))
            return bad(v, "the eval entry is not an ascending list of instructions");
    if (check_dataflow(v) < 0 || check_overlap(v) < 0)
        return -1;
    return 0;
}

int ptc_plan_verify(const ptc_plan *p, char *err, size_t errn)
{
    vctx v = {.p = p, .err = err, .errn = errn, .prog = -1};
    if (p->nranks < 1 || p->nprograms < 1 ||
        (p->mesh.naxes && ptc_mesh_nranks(&p->mesh) != p->nranks))
        return bad(&v, "the plan has no programs or a mesh that disagrees with its ranks");
    for (int r = 0; r < p->nranks; r++) {
        int k = p->rank_program[r];
        if (k < 0 || k >= p->nprograms)
            return bad(&v, "rank %d has no program", r);
        bool listed = false;
        for (int i = 0; i < p->programs[k].nranks; i++)
            listed |= p->programs[k].ranks[i] == r;
        if (!listed)
            return bad(&v, "rank %d runs program %d, which does not list it", r, k);
    }
    for (int k = 0; k < p->nprograms; k++) {
        v.prog = k;
        v.pg = &p->programs[k];
        if (check_program(&v) < 0)
            return -1;
    }
    return 0;
}
