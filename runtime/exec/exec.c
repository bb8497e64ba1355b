/* exec.c - the executor of one rank's program (see exec.h).
 *
 * Everything an instruction needs that does not change between runs (operand pointers and types,
 * the kernel call, the members of a collective's group, the peer of a send) is worked out once
 * when the executor is made, so a run is a loop over instructions with one call each.
 */
#include "exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kir.h"
#include "plan.h"
#include "ref.h"
#include "trace.h"

#define CANARY 0x7fa5u

typedef struct prepared {
    ptrt_kcall kc;
    void **in, **out;
    void **args; /* fused: in ++ out, one pointer per kernel parameter */
    ptc_type *it, *ot;
    int *members; /* collectives: the group; send/recv: the peer */
    int nmembers;
    char group[64];
} prepared;

/* A collective finishing in the background (its communicator's token), and its buffers' bytes:
 * nothing may write [in0, in1) or touch [out0, out1) until it is waited for. */
typedef struct inflight {
    int64_t token;
    uintptr_t in0, in1, out0, out1;
    int at; /* the instruction that started it */
} inflight;

struct ptrt_exec {
    const ptc_plan *plan;
    const ptc_program *pg;
    int rank;
    int coords[PTC_MAX_MESH_AXES];
    const ptrt_backend *be;
    void *be_state; /* what the backend's prepare hook made */
    ptrt_comm *comm;
    unsigned char *arena[PTC_NREGIONS];
    size_t arena_bytes[PTC_NREGIONS];
    bool canary;
    void **ptr; /* buffer -> data */
    prepared *prep;
    int64_t step;
    int coll_index, drop;
    /* the guard before the update: the instruction after which the gradient norm is final, and
     * whether this step's norm was not finite (its update instructions were then skipped) */
    int norm_at;
    bool skipped_update;
    bool profile;
    bool tracing;
    double trace_t0;
    ptc_trace_event *trace;
    int ntrace, captrace, maxtrace;
    double prof_s[PTC_NOPS + 1]; /* by op; fused kernels last */
    int64_t prof_calls[PTC_NOPS + 1];
    double prof_flops[PTC_NOPS + 1]; /* the GEMMs' FLOPs (2 m n k per product), by op */
    double *prof_kernel_s; /* by fused kernel of the plan's table */
    int64_t *prof_kernel_calls;
    /* collectives in the background (a communicator with wait, unless no_overlap) */
    bool no_overlap;
    inflight *fl;
    int nfl, capfl;
    int cur; /* the instruction running (ninstrs between runs) */
    int64_t bg_started, bg_overlapped; /* counts; instructions they ran beside, summed */
    /* expert parallelism's all_to_all_v: bytes sent to the other members since the executor was
     * made, and the plan's figure for a step (a balanced routing) */
    int64_t a2a_sent, a2a_planned;
};

void ptrt_exec_all_to_all(const ptrt_exec *x, int64_t *sent, int64_t *planned)
{
    *sent = x->a2a_sent;
    *planned = x->a2a_planned;
}

const ptc_program *ptrt_exec_program(const ptrt_exec *x)
{
    return x->pg;
}

int ptrt_exec_rank(const ptrt_exec *x)
{
    return x->rank;
}

void *ptrt_exec_data(ptrt_exec *x, int b)
{
    return x->be->host ? x->ptr[b] : NULL;
}

/* ---- moving bytes: memcpy on a host backend, the backend's copies on a device ---- */

/* A backend with several devices: the calling thread to this rank's (it succeeded when the
 * executor was made, so it does again). */
static void bind(const ptrt_exec *x)
{
    char e[256];
    if (x->be->bind)
        x->be->bind(x->rank, e, sizeof e);
}

/* ---- collectives in the background ----
 * A collective the communicator runs in the background (comm.h: token) stays in x->fl until an
 * instruction needs its buffers: one that reads or writes its output's bytes, or writes its
 * input's (bytes, not buffer ids: the memory plan gives a dead buffer's bytes to later ones).
 * That instruction waits for it first (and for every earlier one: tokens finish in order); the
 * host's reads and writes, and the end of a run, wait for all. */

static bool meets(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1)
{
    return a0 < b1 && b0 < a1;
}

static int wait_upto(ptrt_exec *x, int64_t token, int at, char *err, size_t errn)
{
    int keep = 0;
    for (int k = 0; k < x->nfl; k++) {
        int beside = at - x->fl[k].at - 1; /* the instructions between */
        if (token < 0 || x->fl[k].token <= token)
            x->bg_overlapped += beside > 0 ? beside : 0;
        else
            x->fl[keep++] = x->fl[k];
    }
    x->nfl = keep;
    return x->comm->ops->wait(x->comm->impl, x->rank, token, err, errn);
}

/* before instruction i: the background collectives it needs finished */
static int settle(ptrt_exec *x, int i, char *err, size_t errn)
{
    const ptc_instr *in = &x->pg->instrs[i];
    int64_t need = 0;
    for (int k = 0; k < x->nfl; k++) {
        const inflight *f = &x->fl[k];
        bool hit = false;
        for (int j = 0; j < in->nin + in->nout && !hit; j++) {
            bool w = j >= in->nin;
            int b = w ? in->out[j - in->nin] : in->in[j];
            uintptr_t p0 = (uintptr_t)x->ptr[b], p1 = p0 + (uintptr_t)x->pg->bufs[b].bytes;
            hit = meets(p0, p1, f->out0, f->out1) || (w && meets(p0, p1, f->in0, f->in1));
        }
        if (hit && f->token > need)
            need = f->token;
    }
    return need ? wait_upto(x, need, i, err, errn) : 0;
}

/* the host is about to read or write the arenas, or the run ends */
static void settle_all(ptrt_exec *x)
{
    char e[256];
    if (x->nfl)
        wait_upto(x, -1, x->cur, e, sizeof e); /* (a failure shows at the sync) */
}

static void to_arena(const ptrt_exec *x, void *dst, const void *src, size_t n)
{
    if (!n)
        return;
    if (x->be->host)
        memcpy(dst, src, n);
    else
        x->be->upload(dst, src, n);
}

static void from_arena(const ptrt_exec *x, void *dst, const void *src, size_t n)
{
    if (!n)
        return;
    if (x->be->host)
        memcpy(dst, src, n);
    else
        x->be->download(dst, src, n);
}

static void move_in_arena(const ptrt_exec *x, void *dst, const void *src, size_t n)
{
    if (!n || dst == src)
        return;
    if (x->be->host)
        memmove(dst, src, n);
    else
        x->be->move(dst, src, n);
}

static void zero_in_arena(const ptrt_exec *x, void *dst, size_t n)
{
    if (!n)
        return;
    if (x->be->host)
        memset(dst, 0, n);
    else
        x->be->zero(dst, n);
}

void ptrt_exec_read(ptrt_exec *x, int b, int64_t off, void *dst, int64_t n)
{
    bind(x);
    settle_all(x);
    from_arena(x, dst, (const char *)x->ptr[b] + off, (size_t)n);
}

void ptrt_exec_write(ptrt_exec *x, int b, int64_t off, const void *src, int64_t n)
{
    bind(x);
    settle_all(x);
    to_arena(x, (char *)x->ptr[b] + off, src, (size_t)n);
}

float ptrt_exec_get(ptrt_exec *x, int b, int64_t i)
{
    ptc_dtype dt = x->pg->bufs[b].type.dtype;
    int64_t es = ptc_dtype_size(dt);
    unsigned char v[4] = {0};
    ptrt_exec_read(x, b, i * es, v, es);
    uint16_t h;
    float f;
    memcpy(&h, v, 2);
    memcpy(&f, v, 4);
    return dt == PTC_BF16 ? ptc_bf16_value(h) : dt == PTC_F16 ? ptc_f16_value(h) : f;
}

void ptrt_exec_set(ptrt_exec *x, int b, int64_t i, float v)
{
    ptc_dtype dt = x->pg->bufs[b].type.dtype;
    uint16_t h = dt == PTC_BF16 ? ptc_bf16_bits(v) : dt == PTC_F16 ? ptc_f16_bits(v) : 0;
    if (dt == PTC_BF16 || dt == PTC_F16)
        ptrt_exec_write(x, b, 2 * i, &h, 2);
    else
        ptrt_exec_write(x, b, 4 * i, &v, 4);
}

float *ptrt_exec_floats(ptrt_exec *x, int b)
{
    ptc_dtype dt = x->pg->bufs[b].type.dtype;
    int64_t n = ptc_type_numel(&x->pg->bufs[b].type);
    float *f = ptc_xmalloc(sizeof(float) * (size_t)(n ? n : 1));
    if (dt == PTC_F32) {
        ptrt_exec_read(x, b, 0, f, 4 * n);
        return f;
    }
    /* 16 bits: into the upper half of f, then widened from the front (element k's 2 bytes at
     * 2n + 2k are read before element k is written at 4k <= 2n + 2k) */
    uint16_t *h = (uint16_t *)f + n;
    ptrt_exec_read(x, b, 0, h, 2 * n);
    for (int64_t k = 0; k < n; k++)
        f[k] = dt == PTC_BF16 ? ptc_bf16_value(h[k]) : ptc_f16_value(h[k]);
    return f;
}

int ptrt_exec_find(const ptrt_exec *x, int kind, const char *name)
{
    for (int b = 0; b < x->pg->nbufs; b++) {
        const ptc_buffer *bf = &x->pg->bufs[b];
        if (bf->view < 0 && bf->kind == kind && bf->name && strcmp(bf->name, name) == 0)
            return b;
    }
    return -1;
}

int64_t ptrt_exec_global_index(const ptrt_exec *x, int b, int64_t i)
{
    const ptc_buffer *bf = &x->pg->bufs[b];
    if (!x->plan->mesh.naxes)
        return i;
    return ptc_global_index(&bf->type, bf->place, &x->plan->mesh, x->coords, i);
}

/* ---- making an executor ---- */

static void put_size(char *buf, size_t n, int64_t b)
{
    if (b >= (int64_t)1 << 30)
        ptc_fmt(buf, n, "%lld bytes (%.2f GiB)", (long long)b, (double)b / (1 << 30));
    else
        ptc_fmt(buf, n, "%lld bytes (%.2f MiB)", (long long)b, (double)b / (1 << 20));
}

static int alloc_arenas(ptrt_exec *x, char *err, size_t errn)
{
    int64_t total = 0;
    for (int r = 0; r < PTC_NREGIONS; r++)
        total += x->pg->region_bytes[r];
    for (int r = 0; r < PTC_NREGIONS; r++) {
        int64_t n = x->pg->region_bytes[r];
        if (n <= 0)
            continue;
        x->arena[r] = x->be->alloc((size_t)n);
        if (!x->arena[r]) {
            char want[64], all[64];
            put_size(want, sizeof want, n);
            put_size(all, sizeof all, total);
            ptc_fmt(err, errn,
                    "rank %d: out of memory: cannot allocate the %s arena of %s (the plan needs %s "
                    "for this rank in all; see ptc --emit memory)",
                    x->rank, ptc_region_name(r), want, all);
            return -1;
        }
        x->arena_bytes[r] = (size_t)n;
        if (x->canary) {
            uint16_t u[4096];
            for (int k = 0; k < 4096; k++)
                u[k] = CANARY;
            for (int64_t k = 0; k < n; k += (int64_t)sizeof u)
                to_arena(x, x->arena[r] + k, u,
                         (size_t)(n - k < (int64_t)sizeof u ? n - k : (int64_t)sizeof u));
        }
    }
    return 0;
}

static void prepare(ptrt_exec *x, int i)
{
    const ptc_program *pg = x->pg;
    const ptc_instr *in = &pg->instrs[i];
    prepared *p = &x->prep[i];
    p->in = ptc_xcalloc((size_t)(in->nin + 1), sizeof(void *));
    p->out = ptc_xcalloc((size_t)(in->nout + 1), sizeof(void *));
    p->it = ptc_xcalloc((size_t)(in->nin + 1), sizeof(ptc_type));
    p->ot = ptc_xcalloc((size_t)(in->nout + 1), sizeof(ptc_type));
    for (int k = 0; k < in->nin; k++) {
        p->in[k] = x->ptr[in->in[k]];
        p->it[k] = pg->bufs[in->in[k]].type;
    }
    for (int k = 0; k < in->nout; k++) {
        p->out[k] = x->ptr[in->out[k]];
        p->ot[k] = pg->bufs[in->out[k]].type;
    }
    p->kc = (ptrt_kcall){.op = in->op, .nin = in->nin, .nout = in->nout, .attrs = in->attrs};
    if (in->kind == PTC_INSTR_FUSED) {
        p->args = ptc_xcalloc((size_t)(in->nin + in->nout + 1), sizeof(void *));
        memcpy(p->args, p->in, sizeof(void *) * (size_t)in->nin);
        memcpy(p->args + in->nin, p->out, sizeof(void *) * (size_t)in->nout);
    }
    const ptc_mesh *m = &x->plan->mesh;
    if (in->kind == PTC_INSTR_KERNEL && in->has_coord)
        p->kc.coord = in->coord; /* a microbatch's part of the rank's batch */
    else if (in->kind == PTC_INSTR_KERNEL && (ptc_ops[in->op].kw & PTC_A_MESH_AXIS) && m->naxes)
        p->kc.coord = x->coords[in->attrs.mesh_axis];
    if (in->kind == PTC_INSTR_COLL) {
        p->members = ptc_xmalloc(sizeof(int) * (size_t)x->plan->nranks);
        p->nmembers = ptc_plan_group(m, x->rank, in->coll.axes, p->members);
        ptc_plan_group_name(m, in->coll.axes, p->group, sizeof p->group);
    } else if (in->kind == PTC_INSTR_SEND || in->kind == PTC_INSTR_RECV) {
        p->members = ptc_xmalloc(sizeof(int));
        p->members[0] = ptc_plan_peer(m, x->rank, in->peer_axis, in->peer_delta);
        p->nmembers = 1;
        ptc_fmt(p->group, sizeof p->group, "%s", m->names[in->peer_axis]);
    }
}

ptrt_exec *ptrt_exec_new(const ptc_plan *plan, int rank, const ptrt_exec_opts *o, char *err,
                         size_t errn)
{
    ptrt_exec *x = ptc_xcalloc(1, sizeof *x);
    x->plan = plan;
    x->rank = rank;
    x->pg = &plan->programs[plan->rank_program[rank]];
    x->be = o && o->backend ? o->backend : &ptrt_backend_ref;
    x->comm = o ? o->comm : NULL;
    x->canary = o && o->canary;
    x->no_overlap = o && o->no_overlap;
    x->drop = o ? o->drop : -1;
    if (!x->be->host && x->comm && !x->comm->device && plan->nranks > 1) {
        ptc_fmt(err, errn,
                "rank %d: the %s backend keeps tensors in device memory, which the %s "
                "communicator cannot reach: a plan of %d ranks on it needs NCCL or the device "
                "communicator, not in this version",
                rank, x->be->name, x->comm->ops->name, plan->nranks);
        free(x);
        return NULL;
    }
    if (plan->mesh.naxes)
        ptc_mesh_coords(&plan->mesh, rank, x->coords);
    if (x->be->bind && x->be->bind(rank, err, errn) < 0) {
        free(x);
        return NULL;
    }
    if (alloc_arenas(x, err, errn) < 0) {
        ptrt_exec_free(x);
        return NULL;
    }
    const ptc_program *pg = x->pg;
    x->ptr = ptc_xcalloc((size_t)(pg->nbufs ? pg->nbufs : 1), sizeof(void *));
    for (int b = 0; b < pg->nbufs; b++) {
        const ptc_buffer *bf = &pg->bufs[b];
        x->ptr[b] = x->arena[bf->region] ? x->arena[bf->region] + bf->offset : NULL;
        if (x->ptr[b] && bf->view >= 0 && bf->view_axis >= 0) /* this rank's shard of the root */
            x->ptr[b] = (char *)x->ptr[b] + (int64_t)x->coords[bf->view_axis] * bf->view_step;
        if (x->ptr[b] && bf->view >= 0)
            x->ptr[b] = (char *)x->ptr[b] + bf->view_offset;
    }
    x->prep = ptc_xcalloc((size_t)(pg->ninstrs ? pg->ninstrs : 1), sizeof *x->prep);
    for (int i = 0; i < pg->ninstrs; i++) {
        prepare(x, i);
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind == PTC_INSTR_COLL && in->coll.kind == PTC_COLL_ALL_TO_ALL_V)
            x->a2a_planned += ptc_plan_comm_bytes(plan, pg, in);
    }
    x->norm_at = -1;
    if (pg->grad_norm >= 0)
        for (int i = 0; i < pg->ninstrs; i++)
            for (int k = 0; k < pg->instrs[i].nout; k++)
                if (ptc_prog_root(pg, pg->instrs[i].out[k]) == ptc_prog_root(pg, pg->grad_norm))
                    x->norm_at = i;
    /* (only where the whole update follows the norm, as the lowering orders it: skipping a
     * part would leave ranks disagreeing on the messages of the rest) */
    for (int i = 0; i < x->norm_at; i++)
        if (pg->instrs[i].phase == PTC_PHASE_UPDATE)
            x->norm_at = -1;
    if (x->be->prepare && x->be->prepare(plan, &x->be_state, err, errn) < 0) {
        ptrt_exec_free(x);
        return NULL;
    }
    return x;
}

void ptrt_exec_free(ptrt_exec *x)
{
    if (!x)
        return;
    for (int i = 0; x->prep && i < x->pg->ninstrs; i++) {
        free(x->prep[i].in);
        free(x->prep[i].out);
        free(x->prep[i].it);
        free(x->prep[i].ot);
        free(x->prep[i].members);
        free(x->prep[i].args);
    }
    bind(x);
    settle_all(x);
    free(x->fl);
    free(x->prof_kernel_s);
    free(x->prof_kernel_calls);
    if (x->be->release && x->be_state)
        x->be->release(x->be_state);
    for (int r = 0; r < PTC_NREGIONS; r++)
        if (x->arena[r])
            x->be->free(x->arena[r], x->arena_bytes[r]);
    free(x->prep);
    free(x->ptr);
    free(x->trace);
    free(x);
}

/* ---- filling buffers ---- */

#define CHUNK 4096

/* Stores float values v[0..n) (n <= CHUNK) at elements [at, at + n) of buffer b, converting to
 * its dtype. */
static void store_floats(ptrt_exec *x, int b, int64_t at, const float *v, int64_t n)
{
    ptc_dtype dt = x->pg->bufs[b].type.dtype;
    if (dt == PTC_F32) {
        ptrt_exec_write(x, b, 4 * at, v, 4 * n);
        return;
    }
    uint16_t h[CHUNK];
    for (int64_t k = 0; k < n; k++)
        h[k] = dt == PTC_BF16 ? ptc_bf16_bits(v[k]) : ptc_f16_bits(v[k]);
    ptrt_exec_write(x, b, 2 * at, h, 2 * n);
}

void ptrt_exec_store(ptrt_exec *x, int b, const float *v)
{
    int64_t n = ptc_type_numel(&x->pg->bufs[b].type);
    for (int64_t i = 0; i < n; i += CHUNK)
        store_floats(x, b, i, v + i, n - i < CHUNK ? n - i : CHUNK);
}

void ptrt_exec_fill(ptrt_exec *x, int b, const ptc_init *init, const char *name, uint64_t seed)
{
    int64_t n = ptc_type_numel(&x->pg->bufs[b].type);
    float tmp[CHUNK];
    /* runs of consecutive full-tensor indices, at most CHUNK at a time */
    for (int64_t i = 0; i < n;) {
        int64_t g0 = ptrt_exec_global_index(x, b, i), len = 1;
        while (i + len < n && len < CHUNK && ptrt_exec_global_index(x, b, i + len) == g0 + len)
            len++;
        ptrt_init_param(init, name, seed, tmp, g0, len);
        store_floats(x, b, i, tmp, len);
        i += len;
    }
}

void ptrt_exec_init_state(ptrt_exec *x, uint64_t seed)
{
    for (int b = 0; b < x->pg->nbufs; b++) {
        const ptc_buffer *bf = &x->pg->bufs[b];
        if (bf->view < 0 && (bf->kind == PTC_BUF_PARAM || bf->kind == PTC_BUF_STATE))
            ptrt_exec_fill(x, b, &bf->init, bf->name, seed);
    }
}

int ptrt_exec_random_input(ptrt_exec *x, int b, const char *key, uint64_t seed, char *err,
                           size_t errn)
{
    const ptc_buffer *bf = &x->pg->bufs[b];
    if (bf->type.dtype != PTC_I32) {
        ptc_init init = {.kind = PTC_INIT_NORMAL, .a = 1.0};
        ptrt_exec_fill(x, b, &init, key, seed);
        return 0;
    }
    if (bf->bound <= 0) {
        ptc_fmt(err, errn,
                "cannot choose random values for i32 input '%s': nothing it feeds bounds its ids",
                bf->name ? bf->name : "?");
        return -1;
    }
    int64_t n = ptc_type_numel(&bf->type);
    int32_t ids[CHUNK];
    ptc_init init = {.kind = PTC_INIT_UNIFORM, .a = 0.0, .b = 1.0};
    float u[CHUNK];
    for (int64_t i = 0; i < n;) {
        int64_t g0 = ptrt_exec_global_index(x, b, i), len = 1;
        while (i + len < n && len < CHUNK && ptrt_exec_global_index(x, b, i + len) == g0 + len)
            len++;
        ptrt_init_param(&init, key, seed, u, g0, len);
        for (int64_t k = 0; k < len; k++) {
            int64_t id = (int64_t)(u[k] * (double)bf->bound);
            ids[k] = (int32_t)(id < bf->bound ? id : bf->bound - 1);
        }
        ptrt_exec_write(x, b, 4 * i, ids, 4 * len);
        i += len;
    }
    return 0;
}

/* ---- running ---- */

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A collective over a group of one rank, or one the drop hook leaves out: out takes in's bytes
 * (or zeros when the sizes differ). */
static void local_collective(const ptrt_exec *x, const ptc_instr *in, const prepared *p,
                             bool same_size_only)
{
    int64_t a = x->pg->bufs[in->in[0]].bytes, b = x->pg->bufs[in->out[0]].bytes;
    if (a == b)
        move_in_arena(x, p->out[0], p->in[0], (size_t)b);
    else if (same_size_only)
        zero_in_arena(x, p->out[0], (size_t)b);
    else
        move_in_arena(x, p->out[0], p->in[0], (size_t)(a < b ? a : b));
}

/* all_to_all_v of expert parallelism (program.h): the rows go by the members' kept choices per
 * expert, which every member has (the counts operand), so each knows what it sends and receives
 * without another exchange. The output's rows past those received are zeroed: the buffer holds
 * the most a rank can receive, and what it holds must not depend on what was there before. */
static int run_uneven(ptrt_exec *x, const ptc_instr *in, const prepared *p, ptrt_coll_desc *d,
                      char *err, size_t errn)
{
    const ptc_coll *c = &in->coll;
    int n = p->nmembers, me = 0;
    while (me < n && p->members[me] != x->rank)
        me++;
    int64_t E = c->count, el = E / n, row = c->chunk, got = 0;
    int32_t *counts = ptc_xmalloc(sizeof(int32_t) * (size_t)(E * n));
    from_arena(x, counts, p->in[1], sizeof(int32_t) * (size_t)(E * n));
    int64_t *v = ptc_xcalloc((size_t)(4 * n), sizeof(int64_t));
    int64_t *sc = v, *so = v + n, *rc = v + 2 * n, *ro = v + 3 * n;
    for (int q = 0; q < n; q++) {
        int64_t to_q = 0, from_q = 0; /* my rows for q's experts, q's rows for mine */
        for (int64_t e = 0; e < el; e++) {
            to_q += counts[(int64_t)me * E + q * el + e];
            from_q += counts[(int64_t)q * E + me * el + e];
        }
        sc[q] = (c->outer ? from_q : to_q) * row;
        rc[q] = (c->outer ? to_q : from_q) * row;
        so[q] = q ? so[q - 1] + sc[q - 1] : 0;
        ro[q] = q ? ro[q - 1] + rc[q - 1] : 0;
        got += rc[q];
    }
    const ptc_program *pg = x->pg;
    ptc_dtype dt = pg->bufs[in->in[0]].type.dtype;
    int64_t in_len = ptc_type_numel(&p->it[0]), out_len = ptc_type_numel(&p->ot[0]);
    int rc0 = x->comm->ops->all_to_all_v(x->comm->impl, x->rank, p->members, n, p->in[0], sc, so,
                                         in_len, p->out[0], rc, ro, out_len, dt, d, err, errn);
    for (int q = 0; q < n && rc0 == 0; q++)
        x->a2a_sent += q == me ? 0 : sc[q] * ptc_dtype_size(dt);
    if (rc0 == 0 && got < out_len) {
        size_t es = (size_t)ptc_dtype_size(dt);
        zero_in_arena(x, (char *)p->out[0] + (size_t)got * es, (size_t)(out_len - got) * es);
    }
    free(counts);
    free(v);
    return rc0;
}

static int run_collective(ptrt_exec *x, const ptc_instr *in, const prepared *p, char *err,
                          size_t errn)
{
    const ptc_coll *c = &in->coll;
    int64_t token = 0;
    ptrt_coll_desc d = {.group_name = p->group, .step = x->step, .index = x->coll_index++};
    /* allreduce, allgather and reduce_scatter may finish in the background */
    if (x->comm && x->comm->ops->wait && !x->no_overlap &&
        (c->kind == PTC_COLL_ALLREDUCE || c->kind == PTC_COLL_ALLGATHER ||
         c->kind == PTC_COLL_REDUCE_SCATTER))
        d.token = &token;
    if (d.index == x->drop || p->nmembers == 1) {
        local_collective(x, in, p, d.index == x->drop);
        return 0;
    }
    if (!x->comm) {
        ptc_fmt(err, errn, "a collective over %s in a run without a communicator", p->group);
        return -1;
    }
    const ptrt_comm_ops *ops = x->comm->ops;
    void *impl = x->comm->impl;
    ptc_dtype dt = x->pg->bufs[in->in[0]].type.dtype;
    ptrt_reduce op = c->reduce ? PTRT_RED_MAX : PTRT_RED_SUM;
    int rc;
    switch (c->kind) {
    case PTC_COLL_ALLREDUCE:
        rc = ops->allreduce(impl, x->rank, p->members, p->nmembers, p->in[0], p->out[0], c->count,
                            dt, op, &d, err, errn);
        break;
    case PTC_COLL_ALLGATHER:
        rc = ops->allgather(impl, x->rank, p->members, p->nmembers, p->in[0], p->out[0],
                            c->outer, c->chunk, dt, &d, err, errn);
        break;
    case PTC_COLL_REDUCE_SCATTER:
        rc = ops->reduce_scatter(impl, x->rank, p->members, p->nmembers, p->in[0], p->out[0],
                                 c->outer, c->chunk, dt, op, &d, err, errn);
        break;
    case PTC_COLL_ALL_TO_ALL_V: return run_uneven(x, in, p, &d, err, errn);
    default:
        return ops->all_to_all(impl, x->rank, p->members, p->nmembers, p->in[0], p->out[0],
                               c->outer, c->chunk, c->outer2, c->chunk2, dt, &d, err, errn);
    }
    if (rc == 0 && token > 0) {
        const ptc_program *pg = x->pg;
        uintptr_t i0 = (uintptr_t)p->in[0], o0 = (uintptr_t)p->out[0];
        PTC_GROW(x->fl, x->capfl, x->nfl);
        x->fl[x->nfl++] = (inflight){token, i0, i0 + (uintptr_t)pg->bufs[in->in[0]].bytes, o0,
                                     o0 + (uintptr_t)pg->bufs[in->out[0]].bytes,
                                     (int)(in - pg->instrs)};
        x->bg_started++;
    }
    return rc;
}

static int run_p2p(ptrt_exec *x, const ptc_instr *in, const prepared *p, char *err, size_t errn)
{
    ptrt_coll_desc d = {.group_name = p->group, .step = x->step, .index = -1};
    if (!x->comm) {
        ptc_fmt(err, errn, "a send or receive in a run without a communicator");
        return -1;
    }
    if (in->kind == PTC_INSTR_SEND)
        return x->comm->ops->send(x->comm->impl, x->rank, p->members[0], p->in[0],
                                  ptc_type_numel(&p->it[0]), p->it[0].dtype, &d, err, errn);
    return x->comm->ops->recv(x->comm->impl, x->rank, p->members[0], p->out[0],
                              ptc_type_numel(&p->ot[0]), p->ot[0].dtype, &d, err, errn);
}

/* A kernel instruction the device backend has no code for: the CPU backend's kernel on host
 * copies of its operands (outputs too: a kernel may read what it accumulates into), the
 * results copied back. An operand given twice (in place) is one host copy. */
static int host_kernel(ptrt_exec *x, const ptc_instr *in, const prepared *p, char *err,
                       size_t errn)
{
    int n = in->nin + in->nout;
    void **h = ptc_xcalloc((size_t)n + 1, sizeof *h);
    for (int j = 0; j < n; j++) {
        bool out = j >= in->nin;
        void *dev = out ? p->out[j - in->nin] : p->in[j];
        size_t bytes = (size_t)x->pg->bufs[out ? in->out[j - in->nin] : in->in[j]].bytes;
        for (int k = 0; k < j && !h[j]; k++) {
            bool ko = k >= in->nin;
            if ((ko ? p->out[k - in->nin] : p->in[k]) == dev)
                h[j] = h[k];
        }
        if (!h[j]) {
            h[j] = ptc_xmalloc(bytes ? bytes : 1);
            from_arena(x, h[j], dev, bytes);
        }
    }
    int rc = ptrt_backend_cpu.kernel(&p->kc, p->it, h, p->ot, h + in->nin, err, errn);
    for (int j = in->nin; j < n && rc == 0; j++)
        to_arena(x, p->out[j - in->nin], h[j], (size_t)x->pg->bufs[in->out[j - in->nin]].bytes);
    for (int j = 0; j < n; j++) {
        bool shared = false;
        for (int k = 0; k < j && !shared; k++)
            shared = h[k] == h[j];
        if (!shared)
            free(h[j]);
    }
    free(h);
    return rc;
}

static int run_instr(ptrt_exec *x, int i, char *err, size_t errn)
{
    const ptc_instr *in = &x->pg->instrs[i];
    const prepared *p = &x->prep[i];
    switch (in->kind) {
    case PTC_INSTR_KERNEL:
        if (x->be->instr) {
            int rc = x->be->instr(x->be_state, x->plan, x->plan->rank_program[x->rank], i,
                                  p->kc.coord, p->in, p->out, err, errn);
            return rc == PTRT_ON_HOST ? host_kernel(x, in, p, err, errn) : rc;
        }
        return x->be->kernel(&p->kc, p->it, p->in, p->ot, p->out, err, errn);
    case PTC_INSTR_GEMM: x->be->gemm(&in->gemm, p->in[0], p->in[1], p->out[0]); return 0;
    case PTC_INSTR_COLL: return run_collective(x, in, p, err, errn);
    case PTC_INSTR_COPY: move_in_arena(x, p->out[0], p->in[0], (size_t)in->bytes); return 0;
    case PTC_INSTR_FUSED:
        if (!x->be->fused) {
            ptc_fmt(err, errn, "backend %s cannot run generated kernels", x->be->name);
            return -1;
        }
        return x->be->fused(x->be_state, x->plan, in->kernel, p->args, err, errn);
    default: return run_p2p(x, in, p, err, errn);
    }
}

int ptrt_exec_run(ptrt_exec *x, ptrt_entry e, int64_t step, char *err, size_t errn)
{
    const ptc_program *pg = x->pg;
    int n = e == PTRT_ENTRY_EVAL ? pg->neval : pg->ninstrs;
    bind(x);
    x->step = step;
    x->coll_index = 0;
    x->skipped_update = false;
    for (int k = 0; k < n; k++) {
        int i = e == PTRT_ENTRY_EVAL ? pg->eval[k] : k;
        const ptc_instr *in = &pg->instrs[i];
        /* a non-finite gradient never reaches the weights: every rank holds the same norm (it is
         * reduced over the whole mesh), so every rank skips the same updates and messages */
        if (x->skipped_update && in->phase == PTC_PHASE_UPDATE)
            continue;
        char msg[1536];
        msg[0] = 0;
        double t0 = x->profile || x->tracing ? seconds() : 0;
        x->cur = i;
        int rc = x->nfl ? settle(x, i, msg, sizeof msg) : 0;
        if (rc == 0)
            rc = run_instr(x, i, msg, sizeof msg);
        /* a device runs what is queued later: timed, each instruction waits for its own work
         * (so a profile or trace gives the device's time, at the cost of every overlap) */
        if (rc == 0 && (x->profile || x->tracing) && !x->be->host && x->be->sync)
            rc = x->be->sync(msg, sizeof msg);
        int slot = in->kind == PTC_INSTR_FUSED ? PTC_NOPS : (int)in->op;
        if (x->profile) {
            double dt = seconds() - t0;
            x->prof_s[slot] += dt;
            x->prof_calls[slot]++;
            if (in->kind == PTC_INSTR_GEMM)
                x->prof_flops[slot] += 2.0 * (double)in->gemm.m * (double)in->gemm.n *
                                       (double)in->gemm.k * (double)in->gemm.batch;
            if (in->kind == PTC_INSTR_FUSED && in->kernel >= 0 && in->kernel < x->plan->nkernels) {
                x->prof_kernel_s[in->kernel] += dt;
                x->prof_kernel_calls[in->kernel]++;
            }
        }
        if (x->tracing && x->ntrace < x->maxtrace) {
            PTC_GROW(x->trace, x->captrace, x->ntrace);
            x->trace[x->ntrace++] = (ptc_trace_event){.rank = x->rank,
                                                      .instr = i,
                                                      .start = t0 - x->trace_t0,
                                                      .dur = seconds() - t0,
                                                      .step = (long long)step};
        }
        if (rc < 0) {
            const char *what = in->kind == PTC_INSTR_COLL    ? ptc_coll_name(in->coll.kind)
                               : in->kind == PTC_INSTR_FUSED ? x->plan->kernels[in->kernel]->name
                                                             : ptc_ops[in->op].name;
            if (in->loc.line)
                ptc_fmt(err, errn, "%s:%d:%d: %s: %s", in->loc.file ? in->loc.file : "?",
                        in->loc.line, in->loc.col, what, msg);
            else
                ptc_fmt(err, errn, "%s: %s", what, msg);
            return -1;
        }
        if (i == x->norm_at && e == PTRT_ENTRY_STEP) {
            float norm;
            ptrt_exec_read(x, pg->grad_norm, 0, &norm, 4); /* (a device waits for it here) */
            x->skipped_update = !isfinite(norm);
        }
    }
    x->cur = pg->ninstrs;
    settle_all(x);
    if (x->be->sync && x->be->sync(err, errn) < 0)
        return -1;
    return 0;
}

void ptrt_exec_overlap(const ptrt_exec *x, int64_t *started, int64_t *beside)
{
    *started = x->bg_started;
    *beside = x->bg_overlapped;
}

bool ptrt_exec_skipped_update(const ptrt_exec *x)
{
    return x->skipped_update;
}

int64_t ptrt_exec_high_water(const ptrt_exec *x, int region)
{
    if (!x->canary)
        return -1;
    bind(x);
    /* from the end, a block at a time, to the last unit that is not the pattern */
    uint16_t u[4096];
    int64_t n = (int64_t)x->arena_bytes[region] / 2;
    while (n > 0) {
        int64_t k = n < 4096 ? n : 4096;
        from_arena(x, u, x->arena[region] + 2 * (n - k), (size_t)(2 * k));
        for (int64_t j = k - 1; j >= 0; j--)
            if (u[j] != CANARY)
                return 2 * (n - k + j + 1);
        n -= k;
    }
    return 0;
}

/* ---- trace ---- */

void ptrt_exec_set_trace(ptrt_exec *x, bool on, double t0, int max)
{
    x->tracing = on;
    x->trace_t0 = t0;
    x->maxtrace = max;
}

const ptc_trace_event *ptrt_exec_trace(const ptrt_exec *x, int *n)
{
    *n = x->ntrace;
    return x->trace;
}

/* ---- profile ---- */

void ptrt_exec_set_profile(ptrt_exec *x, bool on)
{
    x->profile = on;
    memset(x->prof_s, 0, sizeof x->prof_s);
    memset(x->prof_calls, 0, sizeof x->prof_calls);
    memset(x->prof_flops, 0, sizeof x->prof_flops);
    int nk = x->plan->nkernels ? x->plan->nkernels : 1;
    if (!x->prof_kernel_s) {
        x->prof_kernel_s = ptc_xcalloc((size_t)nk, sizeof(double));
        x->prof_kernel_calls = ptc_xcalloc((size_t)nk, sizeof(int64_t));
    }
    memset(x->prof_kernel_s, 0, sizeof(double) * (size_t)nk);
    memset(x->prof_kernel_calls, 0, sizeof(int64_t) * (size_t)nk);
}

/* A fused kernel's kind: its name without the "f<number>_" that numbers it in the table. */
static const char *kernel_kind(const char *name)
{
    const char *u = name[0] == 'f' ? strchr(name, '_') : NULL;
    return u ? u + 1 : name;
}

/* Under the fused kernels' row, their kinds (kernels of one name summed), largest first: the
 * eight largest and what the rest add up to. */
static void print_fused_kinds(const ptrt_exec *x, FILE *f, double per, double total)
{
    int nk = x->plan->nkernels, n = 0;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)(nk ? nk : 1)); /* a kind's first kernel */
    double *s = ptc_xcalloc((size_t)(nk ? nk : 1), sizeof(double));
    int64_t *calls = ptc_xcalloc((size_t)(nk ? nk : 1), sizeof(int64_t));
    for (int k = 0; k < nk; k++) {
        if (!x->prof_kernel_calls[k])
            continue;
        const char *kind = kernel_kind(x->plan->kernels[k]->name);
        int q = 0;
        while (q < n && strcmp(kernel_kind(x->plan->kernels[first[q]]->name), kind) != 0)
            q++;
        if (q == n)
            first[n++] = k;
        s[q] += x->prof_kernel_s[k];
        calls[q] += x->prof_kernel_calls[k];
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j] > s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1], s[j - 1] = t;
            int64_t c = calls[j];
            calls[j] = calls[j - 1], calls[j - 1] = c;
            int k = first[j];
            first[j] = first[j - 1], first[j - 1] = k;
        }
    double rest = 0;
    int64_t rest_calls = 0;
    for (int q = 0; q < n; q++) {
        if (q >= 8) {
            rest += s[q];
            rest_calls += calls[q];
            continue;
        }
        fprintf(f, "  %-42.42s %8lld %12.3f %6.1f%%\n", kernel_kind(x->plan->kernels[first[q]]->name),
                (long long)((double)calls[q] / per + 0.5), 1e3 * s[q] / per,
                total > 0 ? 100.0 * s[q] / total : 0.0);
    }
    if (n > 8)
        fprintf(f, "  %-42s %8lld %12.3f %6.1f%%\n", "(the other kinds)",
                (long long)((double)rest_calls / per + 0.5), 1e3 * rest / per,
                total > 0 ? 100.0 * rest / total : 0.0);
    free(first);
    free(s);
    free(calls);
}

void ptrt_exec_print_profile(const ptrt_exec *x, FILE *f, int64_t steps)
{
    int order[PTC_NOPS + 1], n = 0;
    double total = 0;
    for (int op = 0; op <= PTC_NOPS; op++)
        if (x->prof_calls[op]) {
            order[n++] = op;
            total += x->prof_s[op];
        }
    for (int i = 1; i < n; i++) /* insertion sort, largest time first */
        for (int j = i; j > 0 && x->prof_s[order[j]] > x->prof_s[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double per = steps > 0 ? (double)steps : 1.0;
    fprintf(f, "%-44s %8s %12s %7s %10s %8s\n", "op", "calls", "ms/step", "share", "GFLOP/step",
            "GFLOP/s");
    for (int i = 0; i < n; i++) {
        int op = order[i];
        fprintf(f, "%-44s %8lld %12.3f %6.1f%%",
                op == PTC_NOPS ? "(fused kernels)" : ptc_ops[op].name,
                (long long)((double)x->prof_calls[op] / per + 0.5), 1e3 * x->prof_s[op] / per,
                total > 0 ? 100.0 * x->prof_s[op] / total : 0.0);
        /* the GEMMs' rate, against which bench/fma_peak's ceiling of the FMA units is read */
        if (x->prof_flops[op] > 0 && x->prof_s[op] > 0)
            fprintf(f, " %10.3f %8.1f", 1e-9 * x->prof_flops[op] / per,
                    1e-9 * x->prof_flops[op] / x->prof_s[op]);
        fputc('\n', f);
        if (op == PTC_NOPS && x->prof_kernel_calls)
            print_fused_kinds(x, f, per, total);
    }
    fprintf(f, "%-44s %8s %12.3f %6.1f%%\n", "total", "", 1e3 * total / per, 100.0);
}
