/* llvm_emit.c - a kernel of the kernel IR as an LLVM function, built through the LLVM C API.
 *
 * Loops become the canonical shape LLVM's loop passes expect (preheader, header with the index
 * phi, body, latch); every loop carries `llvm.loop.vectorize.enable`, which also lets the loop
 * vectorizer reassociate the float sums of reductions (LLVM 14's C API cannot set fast-math flags
 * on an instruction). exp and tanh are open-coded (Cephes' expf polynomial, tanh from exp), so a
 * loop that uses them vectorizes instead of calling libm per element; log and sqrt are LLVM's
 * intrinsics. A product feeding a sum becomes llvm.fmuladd (one FMA on the host). Values are f32; sums of f32 reductions are accumulated in f32.
 */
#include "llvm_internal.h"

#include <stdlib.h>
#include <string.h>


typedef struct em {
    LLVMContextRef C;
    LLVMModuleRef M;
    LLVMBuilderRef B;
    LLVMValueRef fn;
    const ptc_kir *k;
    LLVMValueRef *ptr; /* param -> typed pointer */
    LLVMValueRef *var; /* var -> value */
    LLVMTypeRef f32, i64, i32, i16, i1;
    LLVMValueRef tid, nt;
    unsigned loop_kind;
} em;

static LLVMValueRef fconst(em *e, double v)
{
    return LLVMConstReal(e->f32, v);
}

static LLVMValueRef iconst(em *e, int64_t v)
{
    return LLVMConstInt(e->i64, (unsigned long long)v, 1);
}

/* a call of the f32 intrinsic `name` on n f32 arguments (declared in the module on first use) */
static LLVMValueRef intrinsic(em *e, const char *name, LLVMValueRef *args, unsigned n)
{
    LLVMTypeRef types[3] = {e->f32, e->f32, e->f32};
    LLVMTypeRef ft = LLVMFunctionType(e->f32, types, n, 0);
    LLVMValueRef f = LLVMGetNamedFunction(e->M, name);
    if (!f)
        f = LLVMAddFunction(e->M, name, ft);
    return LLVMBuildCall2(e->B, ft, f, args, n, "");
}

static LLVMValueRef intrinsic1(em *e, const char *name, LLVMValueRef a)
{
    return intrinsic(e, name, &a, 1);
}

static LLVMValueRef intrinsic2(em *e, const char *name, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef v[2] = {a, b};
    return intrinsic(e, name, v, 2);
}

/* a * b + c, fused into one FMA where the target has it (llvm.fmuladd: one rounding or two, as
 * the target does it fastest; CUDA C contracts the same expressions by default) */
static LLVMValueRef fmuladd(em *e, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c)
{
    LLVMValueRef v[3] = {a, b, c};
    return intrinsic(e, "llvm.fmuladd.f32", v, 3);
}

/* expf as Cephes computes it: x = n ln2 + r, exp(r) by a degree-6 polynomial, times 2^n built in
 * the exponent bits. Relative error about 2e-7 over the range; below -87.3 (where f32 would go
 * subnormal) it is 0, above 88.7 about 3.4e38; NaN stays NaN. */
static LLVMValueRef emit_exp(em *e, LLVMValueRef x)
{
    LLVMBuilderRef B = e->B;
    LLVMValueRef lo = fconst(e, -87.33654475), hi = fconst(e, 88.72283905);
    LLVMValueRef under = LLVMBuildFCmp(B, LLVMRealOLT, x, lo, "");
    LLVMValueRef xc = LLVMBuildSelect(B, under, lo, x, "");
    xc = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, xc, hi, ""), hi, xc, "");
    LLVMValueRef fx = intrinsic1(e, "llvm.floor.f32",
                                 fmuladd(e, xc, fconst(e, 1.44269504088896341), fconst(e, 0.5)));
    LLVMValueRef ordered = LLVMBuildFCmp(B, LLVMRealOEQ, fx, fx, "");
    LLVMValueRef fxs = LLVMBuildSelect(B, ordered, fx, fconst(e, 0.0), "");
    LLVMValueRef r = fmuladd(e, fx, fconst(e, -0.693359375), xc);
    r = fmuladd(e, fx, fconst(e, 2.12194440e-4), r);
    static const double c[6] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                                4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
    LLVMValueRef p = fconst(e, c[0]);
    for (int i = 1; i < 6; i++)
        p = fmuladd(e, p, r, fconst(e, c[i]));
    p = fmuladd(e, p, LLVMBuildFMul(B, r, r, ""), LLVMBuildFAdd(B, r, fconst(e, 1.0), ""));
    LLVMValueRef n = LLVMBuildFPToSI(B, fxs, e->i32, "");
    LLVMValueRef bits = LLVMBuildShl(B, LLVMBuildAdd(B, n, LLVMConstInt(e->i32, 127, 0), ""),
                                     LLVMConstInt(e->i32, 23, 0), "");
    LLVMValueRef y = LLVMBuildFMul(B, p, LLVMBuildBitCast(B, bits, e->f32, ""), "");
    return LLVMBuildSelect(B, under, fconst(e, 0.0), y, "");
}

/* tanh x = 1 - 2 / (exp(2x) + 1): exact limits at both ends, absolute error about 1e-7 */
static LLVMValueRef emit_tanh(em *e, LLVMValueRef x)
{
    LLVMBuilderRef B = e->B;
    LLVMValueRef ex = emit_exp(e, LLVMBuildFMul(B, x, fconst(e, 2.0), ""));
    LLVMValueRef q = LLVMBuildFDiv(B, fconst(e, 2.0), LLVMBuildFAdd(B, ex, fconst(e, 1.0), ""), "");
    return LLVMBuildFSub(B, fconst(e, 1.0), q, "");
}

/* Marks the loop whose latch is br for vectorization (a self-referential loop ID). */
static void mark_loop(em *e, LLVMValueRef br)
{
    LLVMMetadataRef tmp = LLVMTemporaryMDNode(e->C, NULL, 0);
    const char *key = "llvm.loop.vectorize.enable";
    LLVMMetadataRef prop[2] = {LLVMMDStringInContext2(e->C, key, strlen(key)),
                               LLVMValueAsMetadata(LLVMConstInt(e->i1, 1, 0))};
    LLVMMetadataRef ops[2] = {tmp, LLVMMDNodeInContext2(e->C, prop, 2)};
    LLVMMetadataRef id = LLVMMDNodeInContext2(e->C, ops, 2);
    LLVMMetadataReplaceAllUsesWith(tmp, id);
    LLVMSetMetadata(br, e->loop_kind, LLVMMetadataAsValue(e->C, id));
}

typedef struct loop {
    LLVMBasicBlockRef header, body, exit;
    LLVMValueRef index, hi;
} loop;

/* for index in [lo, hi): leaves the builder in the body */
static void loop_open(em *e, loop *l, LLVMValueRef lo, LLVMValueRef hi)
{
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->B);
    l->header = LLVMAppendBasicBlockInContext(e->C, e->fn, "header");
    l->body = LLVMAppendBasicBlockInContext(e->C, e->fn, "body");
    l->exit = LLVMAppendBasicBlockInContext(e->C, e->fn, "exit");
    l->hi = hi;
    LLVMBuildBr(e->B, l->header);
    LLVMPositionBuilderAtEnd(e->B, l->header);
    l->index = LLVMBuildPhi(e->B, e->i64, "i");
    LLVMAddIncoming(l->index, &lo, &pre, 1);
    LLVMBuildCondBr(e->B, LLVMBuildICmp(e->B, LLVMIntSLT, l->index, hi, ""), l->body, l->exit);
    LLVMPositionBuilderAtEnd(e->B, l->body);
}

/* the latch: index + 1 back to the header; leaves the builder after the loop. Only innermost
 * loops are marked: the loop vectorizer handles those alone, and warns about the others. */
static void loop_close(em *e, loop *l, bool innermost)
{
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->B);
    LLVMValueRef next = LLVMBuildAdd(e->B, l->index, iconst(e, 1), "");
    LLVMAddIncoming(l->index, &next, &latch, 1);
    LLVMValueRef br = LLVMBuildBr(e->B, l->header);
    if (innermost)
        mark_loop(e, br);
    LLVMPositionBuilderAtEnd(e->B, l->exit);
}

/* whether expression x contains a reduction (a loop of its own) */
static bool has_loop_x(const ptc_kir *k, int x)
{
    if (x < 0)
        return false;
    const ptc_kx *e = &k->x[x];
    if (e->kind == PTC_KX_SUM || e->kind == PTC_KX_RMAX)
        return true;
    return has_loop_x(k, e->a) || has_loop_x(k, e->b) || has_loop_x(k, e->c);
}

static bool has_loop_list(const ptc_kir *k, int s)
{
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        if (st->kind == PTC_KS_FOR || has_loop_x(k, st->value) || has_loop_x(k, st->index))
            return true;
    }
    return false;
}

static LLVMValueRef emit_x(em *e, int id);

static LLVMValueRef emit_reduce(em *e, const ptc_kx *x)
{
    LLVMValueRef n = emit_x(e, x->a);
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->B);
    loop l;
    loop_open(e, &l, iconst(e, 0), n);
    /* the accumulator's phi sits in the header beside the index */
    LLVMPositionBuilderBefore(e->B, LLVMGetNextInstruction(l.index));
    LLVMValueRef acc = LLVMBuildPhi(e->B, e->f32, "acc");
    LLVMValueRef init = fconst(e, x->kind == PTC_KX_SUM ? 0.0 : -3.4028234663852886e38);
    LLVMAddIncoming(acc, &init, &pre, 1);
    LLVMPositionBuilderAtEnd(e->B, l.body);
    e->var[x->var] = l.index;
    LLVMValueRef v = emit_x(e, x->b), next;
    if (x->kind == PTC_KX_SUM)
        next = LLVMBuildFAdd(e->B, acc, v, "");
    else
        next = LLVMBuildSelect(e->B, LLVMBuildFCmp(e->B, LLVMRealOGT, v, acc, ""), v, acc, "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->B);
    LLVMAddIncoming(acc, &next, &latch, 1);
    loop_close(e, &l, !has_loop_x(e->k, x->b));
    return acc;
}

/* bf16 storage: the high half of an f32. round_bits(v) is v's nearest bf16 (ties to even) as
 * the 16 bits in an i32 (NaN: the quiet NaN of its sign, as common/half.c) */
static LLVMValueRef round_bits(em *e, LLVMValueRef v)
{
    LLVMBuilderRef B = e->B;
    LLVMValueRef u = LLVMBuildBitCast(B, v, e->i32, "");
    LLVMValueRef hi = LLVMBuildLShr(B, u, LLVMConstInt(e->i32, 16, 0), "");
    LLVMValueRef lsb = LLVMBuildAnd(B, hi, LLVMConstInt(e->i32, 1, 0), "");
    LLVMValueRef r = LLVMBuildLShr(
        B, LLVMBuildAdd(B, LLVMBuildAdd(B, u, LLVMConstInt(e->i32, 0x7fff, 0), ""), lsb, ""),
        LLVMConstInt(e->i32, 16, 0), "");
    LLVMValueRef nan = LLVMBuildICmp(B, LLVMIntUGT,
                                     LLVMBuildAnd(B, u, LLVMConstInt(e->i32, 0x7fffffff, 0), ""),
                                     LLVMConstInt(e->i32, 0x7f800000, 0), "");
    LLVMValueRef q = LLVMBuildOr(B, LLVMConstInt(e->i32, 0x7fc0, 0),
                                 LLVMBuildAnd(B, hi, LLVMConstInt(e->i32, 0x8000, 0), ""), "");
    return LLVMBuildSelect(B, nan, q, r, "");
}

static LLVMValueRef ic(em *e, uint64_t v)
{
    return LLVMConstInt(e->i32, v, 0);
}

/* IEEE half in integer arithmetic (no libgcc half builtins in a JIT'd kernel), as
 * runtime/backend/cpu/cpu_elementwise.c: f16_bits(v) the nearest f16 (ties to even; overflow to
 * infinity; NaN to 0x7e00, as common/half.c) in an i32, f16_value(bits) its f32 value */
static LLVMValueRef f16_bits(em *e, LLVMValueRef v)
{
    LLVMBuilderRef B = e->B;
    LLVMValueRef u = LLVMBuildBitCast(B, v, e->i32, "");
    LLVMValueRef sign = LLVMBuildAnd(B, LLVMBuildLShr(B, u, ic(e, 16), ""), ic(e, 0x8000), "");
    LLVMValueRef a = LLVMBuildAnd(B, u, ic(e, 0x7fffffff), "");
    LLVMValueRef odd = LLVMBuildAnd(B, LLVMBuildLShr(B, a, ic(e, 13), ""), ic(e, 1), "");
    LLVMValueRef rn = LLVMBuildLShr(
        B, LLVMBuildAdd(B, LLVMBuildAdd(B, a, ic(e, 0xc8000fff), ""), odd, ""), ic(e, 13), "");
    LLVMValueRef half = LLVMConstReal(e->f32, 0.5);
    LLVMValueRef rs = LLVMBuildSub(
        B, LLVMBuildBitCast(B, LLVMBuildFAdd(B, LLVMBuildBitCast(B, a, e->f32, ""), half, ""), e->i32, ""),
        ic(e, 0x3f000000), "");
    LLVMValueRef r = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntUGE, a, ic(e, 0x38800000), ""), rn, rs, "");
    r = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntUGE, a, ic(e, 0x477ff000), ""), ic(e, 0x7c00), r, "");
    r = LLVMBuildOr(B, r, sign, "");
    return LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntUGT, a, ic(e, 0x7f800000), ""), ic(e, 0x7e00), r, "");
}

static LLVMValueRef f16_value(em *e, LLVMValueRef h)
{
    LLVMBuilderRef B = e->B;
    LLVMValueRef o = LLVMBuildShl(B, LLVMBuildAnd(B, h, ic(e, 0x7fff), ""), ic(e, 13), "");
    LLVMValueRef ex = LLVMBuildAnd(B, o, ic(e, 0x0f800000), "");
    o = LLVMBuildAdd(B, o, ic(e, 0x38000000), "");
    LLVMValueRef inf = LLVMBuildAdd(B, o, ic(e, 0x38000000), "");
    LLVMValueRef sub = LLVMBuildBitCast(
        B,
        LLVMBuildFSub(B, LLVMBuildBitCast(B, LLVMBuildAdd(B, o, ic(e, 0x00800000), ""), e->f32, ""),
                      LLVMBuildBitCast(B, ic(e, 0x38800000), e->f32, ""), ""),
        e->i32, "");
    o = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, ex, ic(e, 0), ""), sub, o, "");
    o = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, ex, ic(e, 0x0f800000), ""), inf, o, "");
    LLVMValueRef sign = LLVMBuildShl(B, LLVMBuildAnd(B, h, ic(e, 0x8000), ""), ic(e, 16), "");
    return LLVMBuildBitCast(B, LLVMBuildOr(B, o, sign, ""), e->f32, "");
}

/* the f32 value of 16 bf16 bits in an i32 */
static LLVMValueRef bf16_value(em *e, LLVMValueRef bits)
{
    return LLVMBuildBitCast(e->B, LLVMBuildShl(e->B, bits, LLVMConstInt(e->i32, 16, 0), ""),
                            e->f32, "");
}

static LLVMValueRef emit_x(em *e, int id)
{
    const ptc_kx *x = &e->k->x[id];
    LLVMBuilderRef B = e->B;
    switch ((ptc_kx_kind)x->kind) {
    case PTC_KX_FCONST: return fconst(e, x->f);
    case PTC_KX_ICONST: return iconst(e, x->i);
    case PTC_KX_VAR: return e->var[x->var];
    case PTC_KX_LOAD: {
        ptc_dtype dt = e->k->params[x->param].dtype;
        bool h = dt == PTC_BF16 || dt == PTC_F16;
        LLVMTypeRef t = dt == PTC_F32 ? e->f32 : h ? e->i16 : e->i32;
        LLVMValueRef idx = emit_x(e, x->a);
        LLVMValueRef p = LLVMBuildInBoundsGEP2(B, t, e->ptr[x->param], &idx, 1, "");
        LLVMValueRef v = LLVMBuildLoad2(B, t, p, "");
        LLVMSetAlignment(v, h ? 2 : 4);
        if (dt == PTC_BF16)
            return bf16_value(e, LLVMBuildZExt(B, v, e->i32, ""));
        if (dt == PTC_F16)
            return f16_value(e, LLVMBuildZExt(B, v, e->i32, ""));
        return dt == PTC_F32 ? v : LLVMBuildSExt(B, v, e->i64, "");
    }
    case PTC_KX_SELECT: {
        LLVMValueRef c = emit_x(e, x->a), a = emit_x(e, x->b), b = emit_x(e, x->c);
        return LLVMBuildSelect(B, c, a, b, "");
    }
    case PTC_KX_SUM:
    case PTC_KX_RMAX: return emit_reduce(e, x);
    case PTC_KX_NEG: {
        LLVMValueRef a = emit_x(e, x->a);
        return x->type == PTC_KT_F32 ? LLVMBuildFNeg(B, a, "") : LLVMBuildNeg(B, a, "");
    }
    case PTC_KX_EXP: return emit_exp(e, emit_x(e, x->a));
    case PTC_KX_TANH: return emit_tanh(e, emit_x(e, x->a));
    case PTC_KX_LOG: return intrinsic1(e, "llvm.log.f32", emit_x(e, x->a));
    case PTC_KX_SQRT: return intrinsic1(e, "llvm.sqrt.f32", emit_x(e, x->a));
    case PTC_KX_SIN: return intrinsic1(e, "llvm.sin.f32", emit_x(e, x->a));
    case PTC_KX_COS: return intrinsic1(e, "llvm.cos.f32", emit_x(e, x->a));
    case PTC_KX_FLOAT: return LLVMBuildSIToFP(B, emit_x(e, x->a), e->f32, "");
    case PTC_KX_RBF16: return bf16_value(e, round_bits(e, emit_x(e, x->a)));
    case PTC_KX_RF16: return f16_value(e, f16_bits(e, emit_x(e, x->a)));
    default: break;
    }
    bool f = e->k->x[x->a].type == PTC_KT_F32;
    if (f && (x->kind == PTC_KX_ADD || x->kind == PTC_KX_SUB)) { /* a product and a sum: one FMA */
        const ptc_kx *xa = &e->k->x[x->a], *xb = &e->k->x[x->b];
        if (xa->kind == PTC_KX_MUL) {
            LLVMValueRef c = emit_x(e, x->b);
            return fmuladd(e, emit_x(e, xa->a), emit_x(e, xa->b),
                           x->kind == PTC_KX_ADD ? c : LLVMBuildFNeg(B, c, ""));
        }
        if (xb->kind == PTC_KX_MUL) {
            LLVMValueRef c = emit_x(e, x->a), m = emit_x(e, xb->a);
            return fmuladd(e, x->kind == PTC_KX_ADD ? m : LLVMBuildFNeg(B, m, ""),
                           emit_x(e, xb->b), c);
        }
    }
    LLVMValueRef a = emit_x(e, x->a), b = emit_x(e, x->b);
    switch (x->kind) {
    case PTC_KX_ADD: return f ? LLVMBuildFAdd(B, a, b, "") : LLVMBuildAdd(B, a, b, "");
    case PTC_KX_SUB: return f ? LLVMBuildFSub(B, a, b, "") : LLVMBuildSub(B, a, b, "");
    case PTC_KX_MUL: return f ? LLVMBuildFMul(B, a, b, "") : LLVMBuildMul(B, a, b, "");
    case PTC_KX_DIV: return f ? LLVMBuildFDiv(B, a, b, "") : LLVMBuildSDiv(B, a, b, "");
    case PTC_KX_REM: return LLVMBuildSRem(B, a, b, "");
    case PTC_KX_MIN:
        if (f)
            return intrinsic2(e, "llvm.minnum.f32", a, b);
        return LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, a, b, ""), a, b, "");
    case PTC_KX_MAX:
        if (f)
            return intrinsic2(e, "llvm.maxnum.f32", a, b);
        return LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, a, b, ""), a, b, "");
    case PTC_KX_LT: return f ? LLVMBuildFCmp(B, LLVMRealOLT, a, b, "") : LLVMBuildICmp(B, LLVMIntSLT, a, b, "");
    case PTC_KX_LE: return f ? LLVMBuildFCmp(B, LLVMRealOLE, a, b, "") : LLVMBuildICmp(B, LLVMIntSLE, a, b, "");
    case PTC_KX_EQ: return f ? LLVMBuildFCmp(B, LLVMRealOEQ, a, b, "") : LLVMBuildICmp(B, LLVMIntEQ, a, b, "");
    default: return f ? LLVMBuildFCmp(B, LLVMRealUNE, a, b, "") : LLVMBuildICmp(B, LLVMIntNE, a, b, "");
    }
}

static void emit_list(em *e, int s, int depth)
{
    const ptc_kir *k = e->k;
    for (; s >= 0; s = k->s[s].next) {
        const ptc_ks *st = &k->s[s];
        switch (st->kind) {
        case PTC_KS_LET: e->var[st->var] = emit_x(e, st->value); break;
        case PTC_KS_STORE: {
            ptc_dtype dt = k->params[st->param].dtype;
            bool h = dt == PTC_BF16 || dt == PTC_F16;
            LLVMTypeRef t = dt == PTC_F32 ? e->f32 : h ? e->i16 : e->i32;
            LLVMValueRef idx = emit_x(e, st->index), v = emit_x(e, st->value);
            if (h)
                v = LLVMBuildTrunc(e->B, dt == PTC_BF16 ? round_bits(e, v) : f16_bits(e, v), e->i16, "");
            else if (dt != PTC_F32)
                v = LLVMBuildTrunc(e->B, v, e->i32, "");
            LLVMValueRef p = LLVMBuildInBoundsGEP2(e->B, t, e->ptr[st->param], &idx, 1, "");
            LLVMSetAlignment(LLVMBuildStore(e->B, v, p), h ? 2 : 4);
            break;
        }
        default: {
            LLVMValueRef n = emit_x(e, st->extent), lo = iconst(e, 0), hi = n;
            if (st->parallel && depth == 0) { /* this thread's part: [n*tid/nt, n*(tid+1)/nt) */
                lo = LLVMBuildSDiv(e->B, LLVMBuildMul(e->B, n, e->tid, ""), e->nt, "");
                LLVMValueRef t1 = LLVMBuildAdd(e->B, e->tid, iconst(e, 1), "");
                hi = LLVMBuildSDiv(e->B, LLVMBuildMul(e->B, n, t1, ""), e->nt, "");
            }
            loop l;
            loop_open(e, &l, lo, hi);
            e->var[st->var] = l.index;
            emit_list(e, st->body, depth + 1);
            loop_close(e, &l, !has_loop_list(k, st->body));
        }
        }
    }
}

static void add_string_attr(em *e, const char *key, const char *value)
{
    LLVMAttributeRef a = LLVMCreateStringAttribute(e->C, key, (unsigned)strlen(key), value,
                                                   (unsigned)strlen(value));
    LLVMAddAttributeAtIndex(e->fn, LLVMAttributeFunctionIndex, a);
}

LLVMModuleRef ptc_llvm_emit(LLVMContextRef C, const ptc_kir *k, const char *symbol)
{
    em e = {.C = C, .k = k};
    e.M = LLVMModuleCreateWithNameInContext(symbol, C);
    e.B = LLVMCreateBuilderInContext(C);
    e.f32 = LLVMFloatTypeInContext(C);
    e.i64 = LLVMInt64TypeInContext(C);
    e.i32 = LLVMInt32TypeInContext(C);
    e.i16 = LLVMInt16TypeInContext(C);
    e.i1 = LLVMInt1TypeInContext(C);
    e.loop_kind = LLVMGetMDKindIDInContext(C, "llvm.loop", 9);
    LLVMTypeRef i8p = LLVMPointerType(LLVMInt8TypeInContext(C), 0);
    LLVMTypeRef argv = LLVMPointerType(i8p, 0);
    LLVMTypeRef params[3] = {argv, e.i64, e.i64};
    LLVMTypeRef ft = LLVMFunctionType(LLVMVoidTypeInContext(C), params, 3, 0);
    e.fn = LLVMAddFunction(e.M, symbol, ft);
    /* NaN-free max reductions may be vectorized; the kernels' sums are reassociated anyway */
    add_string_attr(&e, "no-nans-fp-math", "true");
    add_string_attr(&e, "no-signed-zeros-fp-math", "true");
    /* full AVX-512 registers where the host has them (LLVM's tuning for recent Xeons keeps loops to
     * 256 bits, fearing the clock drop of older parts; measured faster here: bench/results) */
    add_string_attr(&e, "prefer-vector-width", "512");
    LLVMPositionBuilderAtEnd(e.B, LLVMAppendBasicBlockInContext(C, e.fn, "entry"));
    LLVMValueRef args = LLVMGetParam(e.fn, 0);
    e.tid = LLVMGetParam(e.fn, 1);
    e.nt = LLVMGetParam(e.fn, 2);
    e.ptr = ptc_xcalloc((size_t)(k->nparams ? k->nparams : 1), sizeof *e.ptr);
    e.var = ptc_xcalloc((size_t)(k->nvars ? k->nvars : 1), sizeof *e.var);
    for (int p = 0; p < k->nparams; p++) {
        if (k->params[p].local) { /* on this thread's stack, for every part it runs */
            e.ptr[p] =
                LLVMBuildArrayAlloca(e.B, e.f32, iconst(&e, k->params[p].numel), k->params[p].name);
            LLVMSetAlignment(e.ptr[p], 64);
            continue;
        }
        if (k->params[p].alias >= 0) { /* the same pointer: LLVM sees the accesses alias */
            e.ptr[p] = e.ptr[k->params[p].alias];
            continue;
        }
        LLVMValueRef idx = iconst(&e, p);
        LLVMValueRef slot = LLVMBuildInBoundsGEP2(e.B, i8p, args, &idx, 1, "");
        LLVMValueRef raw = LLVMBuildLoad2(e.B, i8p, slot, k->params[p].name);
        ptc_dtype dt = k->params[p].dtype;
        LLVMTypeRef t = LLVMPointerType(dt == PTC_F32                      ? e.f32
                                        : dt == PTC_BF16 || dt == PTC_F16 ? e.i16
                                                                          : e.i32,
                                        0);
        e.ptr[p] = LLVMBuildBitCast(e.B, raw, t, "");
    }
    emit_list(&e, k->body, 0);
    LLVMBuildRetVoid(e.B);
    free(e.ptr);
    free(e.var);
    LLVMDisposeBuilder(e.B);
    return e.M;
}
