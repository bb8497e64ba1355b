/* infer.c - shape and dtype inference for every op of the table.
 *
 * The builder and the verifier both call ptc_infer, so a graph that verifies has exactly the types
 * that inference gives. Messages name the op and both shapes of a mismatch; the caller adds the
 * source location. Axes are normalised here (negative counts from the end).
 */
#include <string.h>

#include "ir.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        ptc_fmt(err, errn, __VA_ARGS__);                                                           \
        return -1;                                                                                 \
    } while (0)

static bool is_float(ptc_dtype t)
{
    return t != PTC_I32;
}

/* Normalises *axis against rank; false if out of range. */
static bool norm_axis(int64_t *axis, int rank)
{
    int64_t a = *axis < 0 ? *axis + rank : *axis;
    if (a < 0 || a >= rank)
        return false;
    *axis = a;
    return true;
}

static int check_numel(const ptc_type *t, char *err, size_t errn)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dims[i] <= 0) {
            char b[128];
            FAIL("dimension %d of %s must be positive", i, ptc_type_str(t, b, sizeof b));
        }
        if (!ptc_mul_ok(n, t->dims[i], &n) || n > ((int64_t)1 << 46))
            FAIL("tensor of %d dimensions is too large (more than 2^46 elements)", t->rank);
    }
    return 0;
}

static int broadcast(const char *op, const ptc_type *a, const ptc_type *b, ptc_type *o, char *err,
                     size_t errn)
{
    char sa[160], sb[160];
    o->rank = a->rank > b->rank ? a->rank : b->rank;
    o->dtype = a->dtype;
    for (int i = 0; i < o->rank; i++) {
        int ia = a->rank - o->rank + i, ib = b->rank - o->rank + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            FAIL("shape mismatch in %s: %s and %s do not broadcast", op,
                 ptc_type_str(a, sa, sizeof sa), ptc_type_str(b, sb, sizeof sb));
        o->dims[i] = da == 1 ? db : da;
    }
    return 0;
}

static int infer_matmul(const ptc_type *a, const ptc_type *b, ptc_type *o, char *err, size_t errn)
{
    char sa[160], sb[160];
    ptc_type_str(a, sa, sizeof sa);
    ptc_type_str(b, sb, sizeof sb);
    if (a->rank < 2 || b->rank < 2)
        FAIL("matmul needs operands of rank 2 or more, got %s and %s", sa, sb);
    if (a->dims[a->rank - 1] != b->dims[b->rank - 2])
        FAIL("shape mismatch in matmul: %s and %s (inner dimensions %lld and %lld differ)", sa, sb,
             (long long)a->dims[a->rank - 1], (long long)b->dims[b->rank - 2]);
    ptc_type la = *a, lb = *b;
    la.rank -= 2;
    lb.rank -= 2;
    if (broadcast("matmul", &la, &lb, o, err, errn) < 0)
        FAIL("shape mismatch in matmul: leading dimensions of %s and %s do not broadcast", sa, sb);
    o->dims[o->rank++] = a->dims[a->rank - 2];
    o->dims[o->rank++] = b->dims[b->rank - 1];
    return 0;
}

static int infer_attention(const ptc_type *in, ptc_attrs *at, ptc_type *o, char *err, size_t errn)
{
    char sq[160], sk[160], sv[160];
    ptc_type_str(&in[0], sq, sizeof sq);
    ptc_type_str(&in[1], sk, sizeof sk);
    ptc_type_str(&in[2], sv, sizeof sv);
    for (int i = 0; i < 3; i++)
        if (in[i].rank != 3)
            FAIL("attention needs q, k, v of shape [batch, seq, features], got %s, %s, %s", sq, sk,
                 sv);
    int64_t h = at->heads, kvh = at->kv_heads ? at->kv_heads : at->heads;
    if (h <= 0 || kvh <= 0)
        FAIL("attention: heads and kv_heads must be positive");
    if (h % kvh)
        FAIL("attention: heads=%lld is not divisible by kv_heads=%lld", (long long)h,
             (long long)kvh);
    int64_t e = in[0].dims[2];
    if (e % h)
        FAIL("attention: q features %lld (%s) not divisible by heads=%lld", (long long)e, sq,
             (long long)h);
    int64_t dh = e / h;
    if (in[1].dims[2] != kvh * dh || in[2].dims[2] != kvh * dh)
        FAIL("shape mismatch in attention: with heads=%lld, kv_heads=%lld and q %s, k and v need "
             "%lld features, got %s and %s",
             (long long)h, (long long)kvh, sq, (long long)(kvh * dh), sk, sv);
    if (in[0].dims[0] != in[1].dims[0] || in[1].dims[0] != in[2].dims[0] ||
        in[1].dims[1] != in[2].dims[1])
        FAIL("shape mismatch in attention: q %s, k %s, v %s", sq, sk, sv);
    at->kv_heads = kvh;
    *o = in[0];
    return 0;
}

static int infer_source(ptc_op op, ptc_attrs *at, ptc_type *o, char *err, size_t errn)
{
    o->dtype = op == PTC_OP_STATE ? PTC_F32 : at->dtype; /* a param: f32 unless --precision */
    o->rank = op == PTC_OP_CONST ? 0 : at->nshape;
    if (o->rank < 0 || o->rank > PTC_MAX_RANK)
        FAIL("a tensor may have at most %d dimensions", PTC_MAX_RANK);
    for (int i = 0; i < o->rank; i++)
        o->dims[i] = at->shape[i];
    return check_numel(o, err, errn);
}

static int infer_reshape(const ptc_type *x, ptc_attrs *at, ptc_type *o, char *err, size_t errn)
{
    char sx[160], so[160];
    if (at->nshape < 0 || at->nshape > PTC_MAX_RANK)
        FAIL("reshape: at most %d dimensions", PTC_MAX_RANK);
    o->dtype = x->dtype;
    o->rank = at->nshape;
    for (int i = 0; i < o->rank; i++)
        o->dims[i] = at->shape[i];
    if (check_numel(o, err, errn) < 0)
        return -1;
    if (ptc_type_numel(o) != ptc_type_numel(x))
        FAIL("reshape: %s has %lld elements but [%s] has %lld", ptc_type_str(x, sx, sizeof sx),
             (long long)ptc_type_numel(x), ptc_type_str(o, so, sizeof so) + 4,
             (long long)ptc_type_numel(o));
    return 0;
}

static int infer_permute(const ptc_type *x, ptc_attrs *at, ptc_type *o, char *err, size_t errn)
{
    char sx[160];
    if (at->nshape != x->rank)
        FAIL("permute: %d axes given for %s", at->nshape, ptc_type_str(x, sx, sizeof sx));
    bool seen[PTC_MAX_RANK] = {0};
    *o = *x;
    for (int i = 0; i < x->rank; i++) {
        if (!norm_axis(&at->shape[i], x->rank) || seen[at->shape[i]])
            FAIL("permute: axes are not a permutation of the %d dimensions of %s", x->rank,
                 ptc_type_str(x, sx, sizeof sx));
        seen[at->shape[i]] = true;
        o->dims[i] = x->dims[at->shape[i]];
    }
    return 0;
}

static int infer_concat(const ptc_type *in, int nin, ptc_attrs *at, ptc_type *o, char *err,
                        size_t errn)
{
    char s0[160], si[160];
    if (!norm_axis(&at->axis, in[0].rank))
        FAIL("concat: axis out of range for %s", ptc_type_str(&in[0], s0, sizeof s0));
    *o = in[0];
    for (int i = 1; i < nin; i++) {
        bool ok = in[i].dtype == in[0].dtype && in[i].rank == in[0].rank;
        for (int d = 0; ok && d < in[0].rank; d++)
            ok = d == at->axis || in[i].dims[d] == in[0].dims[d];
        if (!ok)
            FAIL("shape mismatch in concat along axis %lld: %s and %s", (long long)at->axis,
                 ptc_type_str(&in[0], s0, sizeof s0), ptc_type_str(&in[i], si, sizeof si));
        o->dims[at->axis] += in[i].dims[at->axis];
    }
    return 0;
}

/* Ops whose single operand and result share a type, after checks on rank and axis. */
static int infer_same(ptc_op op, const ptc_type *x, ptc_attrs *at, ptc_type *o, char *err,
                      size_t errn)
{
    char sx[160];
    const char *name = ptc_ops[op].name;
    ptc_type_str(x, sx, sizeof sx);
    if (!is_float(x->dtype))
        FAIL("%s needs a floating-point tensor, got %s", name, sx);
    if ((ptc_ops[op].kw & PTC_A_AXIS) && !norm_axis(&at->axis, x->rank))
        FAIL("%s: axis %lld out of range for %s", name, (long long)at->axis, sx);
    *o = *x;
    return 0;
}

static int infer_model_op(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *o, char *err,
                          size_t errn)
{
    char s0[160], s1[160];
    ptc_type_str(&in[0], s0, sizeof s0);
    switch (op) {
    case PTC_OP_EMBEDDING:
        ptc_type_str(&in[1], s1, sizeof s1);
        if (in[0].rank != 2 || !is_float(in[0].dtype))
            FAIL("embedding: table must be a float matrix [rows, features], got %s", s0);
        if (in[1].dtype != PTC_I32)
            FAIL("embedding: ids must be i32, got %s", s1);
        if (in[1].rank + 1 > PTC_MAX_RANK)
            FAIL("embedding: ids have too many dimensions");
        *o = in[1];
        o->dtype = in[0].dtype;
        o->dims[o->rank++] = in[0].dims[1];
        return 0;
    case PTC_OP_ROPE:
        if (in[0].rank != 3 || !is_float(in[0].dtype))
            FAIL("rope needs a float tensor [batch, seq, heads*head_dim], got %s", s0);
        if (at->heads <= 0 || in[0].dims[2] % at->heads || (in[0].dims[2] / at->heads) % 2)
            FAIL("rope: features of %s must split into heads=%lld heads of even size", s0,
                 (long long)at->heads);
        *o = in[0];
        return 0;
    case PTC_OP_CROSS_ENTROPY: {
        ptc_type_str(&in[1], s1, sizeof s1);
        if (!is_float(in[0].dtype) || in[0].rank < 1)
            FAIL("cross_entropy: logits must be a float tensor [..., classes], got %s", s0);
        if (in[1].dtype != PTC_I32)
            FAIL("cross_entropy: targets must be i32, got %s", s1);
        bool ok = in[1].rank == in[0].rank - 1;
        for (int i = 0; ok && i < in[1].rank; i++)
            ok = in[1].dims[i] == in[0].dims[i];
        if (!ok)
            FAIL("shape mismatch in cross_entropy: logits %s need targets of shape %s without its "
                 "last dimension, got %s",
                 s0, s0, s1);
        o->dtype = PTC_F32;
        o->rank = 0;
        return 0;
    }
    case PTC_OP_MSE:
        ptc_type_str(&in[1], s1, sizeof s1);
        if (!is_float(in[0].dtype) || !ptc_type_eq(&in[0], &in[1]))
            FAIL("shape mismatch in mse: %s and %s (same float shape needed)", s0, s1);
        o->dtype = PTC_F32;
        o->rank = 0;
        return 0;
    default: break;
    }
    PTC_UNREACHABLE("not a model op");
    return -1;
}

static int infer_norm(ptc_op op, const ptc_type *in, int nin, ptc_type *o, char *err, size_t errn)
{
    char s0[160], si[160];
    ptc_type_str(&in[0], s0, sizeof s0);
    if (!is_float(in[0].dtype) || in[0].rank < 1)
        FAIL("%s needs a float tensor, got %s", ptc_ops[op].name, s0);
    for (int i = 1; i < nin; i++)
        if (in[i].rank != 1 || in[i].dims[0] != in[0].dims[in[0].rank - 1] ||
            in[i].dtype != in[0].dtype)
            FAIL("shape mismatch in %s: %s needs %s of shape %s[%lld], got %s", ptc_ops[op].name,
                 s0, i == 1 ? "gain" : "bias", ptc_dtype_name(in[0].dtype),
                 (long long)in[0].dims[in[0].rank - 1], ptc_type_str(&in[i], si, sizeof si));
    *o = in[0];
    return 0;
}

static int same_shape(const char *name, const ptc_type *a, const ptc_type *b, char *err,
                      size_t errn)
{
    char sa[160], sb[160];
    if (a->rank != b->rank || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank))
        FAIL("shape mismatch in %s: %s and %s", name, ptc_type_str(a, sa, sizeof sa),
             ptc_type_str(b, sb, sizeof sb));
    return 0;
}

static int is_scalar(const char *name, const ptc_type *t, char *err, size_t errn)
{
    char s[160];
    if (t->rank != 0 || t->dtype != PTC_F32)
        FAIL("%s: expected an f32 scalar, got %s", name, ptc_type_str(t, s, sizeof s));
    return 0;
}

static int infer_internal(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out,
                          char *err, size_t errn);

/* Collectives and rank-dependent ops of SPMD programs (types are local to a rank). */
static int infer_spmd(ptc_op op, const ptc_type *in, ptc_attrs *at, ptc_type *out, char *err,
                      size_t errn)
{
    const char *name = ptc_ops[op].name;
    char s0[160];
    ptc_type_str(&in[0], s0, sizeof s0);
    int64_t g = at->group;
    out[0] = in[0];
    switch (op) {
    case PTC_OP_ALLREDUCE:
    case PTC_OP_PARTIALIZE: return 1;
    case PTC_OP_ALLGATHER:
    case PTC_OP_REDUCE_SCATTER:
    case PTC_OP_SHARD_SLICE:
    case PTC_OP_ALL_TO_ALL: {
        if (g < 1 || (op != PTC_OP_ALL_TO_ALL && at->n < 1))
            FAIL("%s: group size and groups must be positive", name);
        if (!norm_axis(&at->axis, in[0].rank))
            FAIL("%s: axis out of range for %s", name, s0);
        int64_t *d = &out[0].dims[at->axis];
        if (op == PTC_OP_ALLGATHER) {
            *d *= g;
        } else if (op == PTC_OP_ALL_TO_ALL) {
            int64_t to = at->to;
            if (!norm_axis(&to, in[0].rank) || to == at->axis || in[0].dims[to] % g)
                FAIL("all_to_all: cannot shard dimension %d of %s over %lld ranks", at->to, s0,
                     (long long)g);
            at->to = (int)to;
            *d *= g;
            out[0].dims[to] /= g;
        } else if (*d % (g * at->n)) {
            FAIL("%s: dimension %lld of %s does not divide into %lld parts", name,
                 (long long)at->axis, s0, (long long)(g * at->n));
        } else {
            *d /= g;
        }
        return 1;
    }
    case PTC_OP_EMBEDDING_SHARD:
        return infer_model_op(PTC_OP_EMBEDDING, in, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_EMBEDDING_GRAD_SHARD:
        return infer_internal(PTC_OP_EMBEDDING_GRAD, in, 2, at, out, err, errn);
    case PTC_OP_CE_SUMEXP:
    case PTC_OP_CE_PICK: {
        bool ok = in[0].rank == in[1].rank + 1 && is_float(in[0].dtype) &&
                  (op == PTC_OP_CE_PICK ? in[1].dtype == PTC_I32 : is_float(in[1].dtype));
        for (int i = 0; ok && i < in[1].rank; i++)
            ok = in[0].dims[i] == in[1].dims[i];
        if (!ok)
            FAIL("%s: logits %s and per-row operand do not match", name, s0);
        out[0] = in[1];
        out[0].dtype = PTC_F32;
        return 1;
    }
    case PTC_OP_CE_LOSS:
        if (same_shape(name, &in[0], &in[1], err, errn) < 0 ||
            same_shape(name, &in[0], &in[2], err, errn) < 0)
            return -1;
        out[0] = (ptc_type){.dtype = PTC_F32, .rank = 0};
        return 1;
    case PTC_OP_CE_GRAD_SHARD: {
        /* the per-row max (the logits' dtype) and sum of exponentials (f32): any float dtype */
        ptc_type rows = in[0], mx = in[2], se = in[3];
        rows.rank--;
        rows.dtype = mx.dtype = se.dtype = PTC_F32;
        if (infer_spmd(PTC_OP_CE_PICK, in, at, out, err, errn) < 0 || !is_float(in[2].dtype) ||
            !is_float(in[3].dtype) || !ptc_type_eq(&mx, &rows) || !ptc_type_eq(&se, &rows) ||
            is_scalar(name, &in[4], err, errn) < 0)
            FAIL("%s: operands do not match logits %s", name, s0);
        out[0] = in[0];
        return 1;
    }
    case PTC_OP_ATTENTION_SHARD:
    case PTC_OP_ATTENTION_SHARD_GRAD: {
        if (at->heads < 1 || at->kv_heads < 1 || at->n < at->heads || at->n % at->heads ||
            at->n % at->kv_heads)
            FAIL("%s: heads=%lld of n=%lld with kv_heads=%lld do not fit", name,
                 (long long)at->heads, (long long)at->n, (long long)at->kv_heads);
        ptc_attrs local = *at;
        local.kv_heads = at->heads; /* k, v carry all kv heads; check q against itself */
        ptc_type q = in[0];
        if (infer_attention((ptc_type[]){q, q, q}, &local, out, err, errn) < 0)
            return -1;
        int64_t dh = in[0].dims[2] / at->heads;
        if (in[1].dims[2] != at->kv_heads * dh || !ptc_type_eq(&in[1], &in[2]))
            FAIL("%s: k and v need %lld features, got %s", name, (long long)(at->kv_heads * dh),
                 ptc_type_str(&in[1], (char[160]){0}, 160));
        if (op == PTC_OP_ATTENTION_SHARD)
            return 1;
        if (same_shape(name, &in[0], &in[3], err, errn) < 0)
            return -1;
        out[1] = in[1];
        out[2] = in[2];
        return 3;
    }
    default: break;
    }
    FAIL("no shape rule for op %s", name);
}

/* Ops produced by passes (autodiff, optimizer). Operands come from correct graphs, but the
 * verifier and the text parser rely on these rules, so they check as strictly as the rest. */
static int infer_internal(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out,
                          char *err, size_t errn)
{
    const char *name = ptc_ops[op].name;
    char s0[160];
    switch (op) {
    case PTC_OP_BROADCAST_TO:
    case PTC_OP_SUM_TO: {
        ptc_type t = {.dtype = in[0].dtype, .rank = at->nshape};
        memcpy(t.dims, at->shape, sizeof(int64_t) * (size_t)at->nshape);
        ptc_type o;
        const ptc_type *big = op == PTC_OP_BROADCAST_TO ? &t : &in[0];
        const ptc_type *small = op == PTC_OP_BROADCAST_TO ? &in[0] : &t;
        if (check_numel(&t, err, errn) < 0 || broadcast(name, big, small, &o, err, errn) < 0)
            return -1;
        if (!ptc_type_eq(&o, big))
            FAIL("%s: %s does not broadcast to %s", name, ptc_type_str(small, s0, sizeof s0),
                 ptc_type_str(big, (char[160]){0}, 160));
        out[0] = t;
        return 1;
    }
    case PTC_OP_PAD:
        if (!norm_axis(&at->axis, in[0].rank) || at->start < 0 ||
            at->start + in[0].dims[at->axis] > at->len)
            FAIL("pad: %s does not fit at start=%lld in len=%lld",
                 ptc_type_str(&in[0], s0, sizeof s0), (long long)at->start, (long long)at->len);
        out[0] = in[0];
        out[0].dims[at->axis] = at->len;
        return 1;
    case PTC_OP_SUMSQ:
        if (!is_float(in[0].dtype))
            FAIL("sumsq needs a float tensor, got %s", ptc_type_str(&in[0], s0, sizeof s0));
        out[0] = (ptc_type){.dtype = PTC_F32, .rank = 0};
        return 1;
    case PTC_OP_RELU_GRAD:
    case PTC_OP_GELU_GRAD:
    case PTC_OP_SILU_GRAD:
    case PTC_OP_SOFTMAX_GRAD:
    case PTC_OP_LOG_SOFTMAX_GRAD:
    case PTC_OP_MAX_GRAD: {
        if (op == PTC_OP_MAX_GRAD) {
            ptc_type r = in[0];
            if (!norm_axis(&at->axis, r.rank))
                FAIL("max_grad: axis out of range");
            for (int i = (int)at->axis; i + 1 < r.rank; i++)
                r.dims[i] = r.dims[i + 1];
            r.rank--;
            if (same_shape(name, &r, &in[1], err, errn) < 0)
                return -1;
        } else {
            if (same_shape(name, &in[0], &in[1], err, errn) < 0)
                return -1;
            if ((ptc_ops[op].kw & PTC_A_AXIS) && !norm_axis(&at->axis, in[0].rank))
                FAIL("%s: axis out of range", name);
        }
        out[0] = in[0];
        return 1;
    }
    case PTC_OP_LAYERNORM_GRAD:
    case PTC_OP_RMSNORM_GRAD: {
        int k = op == PTC_OP_LAYERNORM_GRAD ? 3 : 2;
        if (infer_norm(op, in, 2, out, err, errn) < 0 ||
            same_shape(name, &in[0], &in[2], err, errn) < 0)
            return -1;
        out[0] = in[0];
        out[1] = in[1];
        if (k == 3)
            out[2] = in[1];
        return k;
    }
    case PTC_OP_EMBEDDING_GRAD: {
        bool ok = in[0].dtype == PTC_I32 && is_float(in[1].dtype) && in[1].rank == in[0].rank + 1 &&
                  at->n >= 1;
        for (int i = 0; ok && i < in[0].rank; i++)
            ok = in[0].dims[i] == in[1].dims[i];
        if (!ok)
            FAIL("embedding_grad: ids %s and gradient %s do not match",
                 ptc_type_str(&in[0], s0, sizeof s0), ptc_type_str(&in[1], (char[160]){0}, 160));
        out[0] = (ptc_type){
            .dtype = in[1].dtype, .rank = 2, .dims = {at->n, in[1].dims[in[1].rank - 1]}};
        return 1;
    }
    case PTC_OP_ATTENTION_GRAD:
        if (infer_attention(in, at, out, err, errn) < 0 ||
            same_shape(name, &in[0], &in[3], err, errn) < 0)
            return -1;
        out[0] = in[0];
        out[1] = in[1];
        out[2] = in[2];
        return 3;
    case PTC_OP_ROPE_GRAD: return infer_model_op(PTC_OP_ROPE, in, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_CROSS_ENTROPY_GRAD:
        if (infer_model_op(PTC_OP_CROSS_ENTROPY, in, at, out, err, errn) < 0 ||
            is_scalar(name, &in[2], err, errn) < 0)
            return -1;
        out[0] = in[0];
        return 1;
    case PTC_OP_CLIP_COEF:
        if (is_scalar(name, &in[0], err, errn) < 0 || is_scalar(name, &in[1], err, errn) < 0)
            return -1;
        out[0] = in[0];
        return 1;
    case PTC_OP_ADAMW_UPDATE:
    case PTC_OP_SGD_UPDATE: {
        int nstate = op == PTC_OP_ADAMW_UPDATE ? 3 : 2; /* p, m, v  or  p, buf */
        const ptc_type *st[3] = {&in[0], &in[2], &in[3]};
        if (same_shape(name, &in[0], &in[1], err, errn) < 0)
            return -1;
        for (int i = 1; i < nstate; i++)
            if (same_shape(name, &in[0], st[i], err, errn) < 0)
                return -1;
        for (int i = nstate + 1; i < nin; i++)
            if (is_scalar(name, &in[i], err, errn) < 0)
                return -1;
        for (int i = 0; i < nstate; i++)
            out[i] = in[0];
        return nstate;
    }
    default: break;
    }
    return infer_spmd(op, in, at, out, err, errn);
}

static int infer_any(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out,
                     char *err, size_t errn)
{
    const ptc_op_info *info = &ptc_ops[op];
    char s0[160], s1[160];
    if (info->nin >= 0 ? nin != info->nin : nin < 1)
        FAIL("%s takes %d tensor operand%s, got %d", info->name, info->nin < 0 ? 1 : info->nin,
             info->nin == 1 ? "" : "s", nin);
    if (info->flags & PTC_F_BINARY) {
        if (in[0].dtype != in[1].dtype)
            FAIL("dtype mismatch in %s: %s and %s", info->name, ptc_type_str(&in[0], s0, sizeof s0),
                 ptc_type_str(&in[1], s1, sizeof s1));
        if (!is_float(in[0].dtype))
            FAIL("%s needs floating-point tensors, got %s", info->name,
                 ptc_type_str(&in[0], s0, sizeof s0));
        return broadcast(info->name, &in[0], &in[1], out, err, errn) < 0 ? -1 : 1;
    }
    if (info->flags & PTC_F_UNARY)
        return infer_same(op, &in[0], at, out, err, errn) < 0 ? -1 : 1;
    switch (op) {
    case PTC_OP_INPUT:
    case PTC_OP_PARAM:
    case PTC_OP_STATE:
    case PTC_OP_CONST:
    case PTC_OP_FILL: return infer_source(op, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_MATMUL:
        if (in[0].dtype != in[1].dtype || !is_float(in[0].dtype))
            FAIL("matmul needs two float tensors of one dtype, got %s and %s",
                 ptc_type_str(&in[0], s0, sizeof s0), ptc_type_str(&in[1], s1, sizeof s1));
        return infer_matmul(&in[0], &in[1], out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_CAST:
        out[0] = in[0];
        out[0].dtype = at->dtype;
        return 1;
    case PTC_OP_SUM:
    case PTC_OP_MEAN:
    case PTC_OP_MAX:
        if (infer_same(op, &in[0], at, out, err, errn) < 0)
            return -1;
        for (int i = (int)at->axis; i + 1 < out->rank; i++)
            out->dims[i] = out->dims[i + 1];
        out->rank--;
        return 1;
    case PTC_OP_LAYERNORM:
    case PTC_OP_RMSNORM:
        if (at->eps < 0)
            FAIL("%s: eps must not be negative", info->name);
        return infer_norm(op, in, nin, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_SOFTMAX:
    case PTC_OP_LOG_SOFTMAX: return infer_same(op, &in[0], at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_RESHAPE: return infer_reshape(&in[0], at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_TRANSPOSE:
        if (in[0].rank < 2)
            FAIL("transpose needs rank 2 or more, got %s", ptc_type_str(&in[0], s0, sizeof s0));
        out[0] = in[0];
        out[0].dims[in[0].rank - 1] = in[0].dims[in[0].rank - 2];
        out[0].dims[in[0].rank - 2] = in[0].dims[in[0].rank - 1];
        return 1;
    case PTC_OP_PERMUTE: return infer_permute(&in[0], at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_SPLIT: {
        ptc_type_str(&in[0], s0, sizeof s0);
        if (!norm_axis(&at->axis, in[0].rank))
            FAIL("split: axis %lld out of range for %s", (long long)at->axis, s0);
        if (at->n < 1 || at->n > PTC_MAX_RESULTS)
            FAIL("split: N must be between 1 and %d, got %lld", PTC_MAX_RESULTS, (long long)at->n);
        if (in[0].dims[at->axis] % at->n)
            FAIL("split: dimension %lld of %s (%lld) is not divisible by %lld", (long long)at->axis,
                 s0, (long long)in[0].dims[at->axis], (long long)at->n);
        for (int i = 0; i < at->n; i++) {
            out[i] = in[0];
            out[i].dims[at->axis] /= at->n;
        }
        return (int)at->n;
    }
    case PTC_OP_CONCAT: return infer_concat(in, nin, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_SLICE:
        ptc_type_str(&in[0], s0, sizeof s0);
        if (!norm_axis(&at->axis, in[0].rank))
            FAIL("slice: axis %lld out of range for %s", (long long)at->axis, s0);
        if (at->start < 0 || at->len < 1 || at->start + at->len > in[0].dims[at->axis])
            FAIL("slice: start=%lld len=%lld is outside dimension %lld of %s (size %lld)",
                 (long long)at->start, (long long)at->len, (long long)at->axis, s0,
                 (long long)in[0].dims[at->axis]);
        out[0] = in[0];
        out[0].dims[at->axis] = at->len;
        return 1;
    case PTC_OP_ATTENTION: return infer_attention(in, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_EMBEDDING:
    case PTC_OP_ROPE:
    case PTC_OP_CROSS_ENTROPY:
    case PTC_OP_MSE: return infer_model_op(op, in, at, out, err, errn) < 0 ? -1 : 1;
    case PTC_OP_ALL_TO_ALL_V: return ptc_infer_moe(op, in, nin, at, out, err, errn);
    default:
        if (ptc_op_is_moe(op))
            return ptc_infer_moe(op, in, nin, at, out, err, errn);
        return infer_internal(op, in, nin, at, out, err, errn);
    }
}

int ptc_infer(ptc_op op, const ptc_type *in, int nin, ptc_attrs *at, ptc_type *out, char *err,
              size_t errn)
{
    int n = infer_any(op, in, nin, at, out, err, errn);
    /* every result must be a tensor the runtime can hold (also for IR read from text) */
    for (int i = 0; i < n; i++)
        if (check_numel(&out[i], err, errn) < 0) {
            char t[160];
            ptc_fmt(err, errn, "the result of %s, %s, is too large (more than 2^46 elements)",
                    ptc_ops[op].name, ptc_type_str(&out[i], t, sizeof t));
            return -1;
        }
    return n;
}
