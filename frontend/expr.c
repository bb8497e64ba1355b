/* expr.c - expressions to IR: names, arithmetic, constant folding and calls of built-in ops.
 *
 * An expression gives a compile-time number or a tensor. Arithmetic on numbers alone is folded
 * here (in double, with overflow and division by zero reported); a number next to a tensor
 * becomes a scalar const of the tensor's dtype. Built-in calls are driven entirely by the op table
 * (ops.def): its arity, its positional attribute (LANGPOS), the keyword attributes it accepts (KW)
 * and requires (REQ), and its defaults; only the way each kind of attribute value is read is
 * spelt out, once per attribute, not once per op.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"

/* Attributes that a .ptm call may give by keyword (the others are positional or internal). */
#define KEYWORD_ATTRS                                                                              \
    (PTC_A_AXIS | PTC_A_N | PTC_A_START | PTC_A_LEN | PTC_A_EPS | PTC_A_HEADS | PTC_A_KV_HEADS |   \
     PTC_A_CAUSAL | PTC_A_BASE | PTC_A_TOP_K | PTC_A_CAPACITY | PTC_A_NORMALIZE | PTC_A_ACT)

static ptc_val num_val(double v)
{
    return (ptc_val){.is_num = true, .num = {.v = v}, .vid = -1};
}

static ptc_val tensor_val(int vid)
{
    return (ptc_val){.vid = vid};
}

static bool integral(double v)
{
    return isfinite(v) && v == floor(v);
}

static const ptc_type *type_of(const ptc_lower *L, int vid)
{
    return &L->g->values[vid].type;
}

static ptc_op lang_op(const char *name)
{
    ptc_op op = ptc_op_lookup(name);
    return op != PTC_NOPS && (ptc_ops[op].flags & PTC_F_LANG) ? op : PTC_NOPS;
}

/* ---- names ---- */

int ptc_lower_build(ptc_lower *L, ptc_op op, const int *in, int nin, const ptc_attrs *at,
                    ptc_loc loc, int *out, int cap, int *nout)
{
    char err[512];
    int res[PTC_MAX_RESULTS];
    if (L->g->nvalues > PTC_FE_MAX_VALUES - PTC_MAX_RESULTS)
        return ptc_lower_fail(L, loc, "model too large: more than %d values after unrolling",
                              PTC_FE_MAX_VALUES);
    int none = 0; /* never NULL: ptc_build memcpy's the operands even when there are none */
    loc.scope = L->scopelen ? L->scope : NULL;
    if (ptc_build(L->g, op, in ? in : &none, nin, at, loc, res, err, sizeof err) < 0)
        return ptc_lower_fail(L, loc, "%s", err);
    const ptc_node *n = &L->g->nodes[L->g->nnodes - 1];
    PTC_ASSERT(n->nout >= 1 && n->nout <= cap);
    for (int i = 0; i < n->nout; i++) {
        const ptc_type *t = type_of(L, res[i]);
        int64_t numel = 1;
        for (int d = 0; d < t->rank; d++)
            if (!ptc_mul_ok(numel, t->dims[d], &numel) || numel > PTC_FE_MAX_NUMEL) {
                char s[160];
                return ptc_lower_fail(L, loc,
                                      "the result of %s, %s, is too large (more than 2^46 "
                                      "elements)",
                                      ptc_ops[op].name, ptc_type_str(t, s, sizeof s));
            }
        out[i] = res[i];
    }
    *nout = n->nout;
    return 0;
}

int ptc_lower_materialize(ptc_lower *L, ptc_val *v, ptc_dtype dt, ptc_loc loc)
{
    if (!v->is_num)
        return 0;
    if (dt == PTC_I32 && !integral(v->num.v))
        return ptc_lower_fail(L, loc, "an i32 value must be an integer, got %.15g", v->num.v);
    ptc_attrs at = ptc_attrs_default(PTC_OP_CONST);
    at.value = v->num.v;
    at.dtype = dt;
    int vid, n;
    if (ptc_lower_build(L, PTC_OP_CONST, NULL, 0, &at, loc, &vid, 1, &n) < 0)
        return -1;
    *v = tensor_val(vid);
    return 0;
}

static int unknown_name(ptc_lower *L, const ptc_expr *e)
{
    for (int i = L->ndead - 1; i >= L->deadbase; i--)
        if (L->dead[i].name == e->name)
            return ptc_lower_fail(L, e->loc,
                                  "unknown name '%s' (the '%s' assigned at line %d is "
                                  "local to its repeat body)",
                                  e->name, e->name, L->dead[i].loc.line);
    if (ptc_lower_find_decl(L, PTC_D_BLOCK, e->name))
        return ptc_lower_fail(L, e->loc, "'%s' is a block; call it: %s(...)", e->name, e->name);
    if (lang_op(e->name) != PTC_NOPS)
        return ptc_lower_fail(L, e->loc, "'%s' is a built-in op; call it: %s(...)", e->name,
                              e->name);
    int n = 0, cap = L->nvars - L->frame;
    for (const ptc_decl *d = L->ast->decls; d; d = d->next)
        cap += d->kind == PTC_D_CONST;
    const char **cands = ptc_xmalloc(sizeof *cands * (size_t)(cap + 1));
    for (int i = L->frame; i < L->nvars; i++)
        cands[n++] = L->vars[i].name;
    for (const ptc_decl *d = L->ast->decls; d; d = d->next)
        if (d->kind == PTC_D_CONST && d->state == 1)
            cands[n++] = d->name;
    const char *near = ptc_similar(e->name, cands, n);
    free(cands);
    if (near)
        return ptc_lower_fail(L, e->loc, "unknown name '%s'; did you mean '%s'?", e->name, near);
    return ptc_lower_fail(L, e->loc, "unknown name '%s'", e->name);
}

/* A variable hides a const of the same name, except where a number is needed: a tensor is never
 * that, so `param b : [d]` in a block does not stop the dimension `b` from meaning the const. */
static int lower_name(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    int i = ptc_lower_find_var(L, e->name);
    ptc_decl *c = ptc_lower_find_decl(L, PTC_D_CONST, e->name);
    if (i >= 0 && (L->vars[i].v.is_num || !L->numctx || !c)) {
        *out = L->vars[i].v;
        return 0;
    }
    if (!c)
        return unknown_name(L, e);
    if (c->state == 2)
        return ptc_lower_fail(L, e->loc, "const '%s' is defined in terms of itself", e->name);
    if (c->state == 0)
        return ptc_lower_fail(L, e->loc,
                              "const '%s' is defined later (line %d); a const may "
                              "only use earlier consts",
                              e->name, c->loc.line);
    *out = (ptc_val){.is_num = true, .num = c->num, .vid = -1};
    return 0;
}

/* ---- arithmetic ---- */

static int fold_binary(ptc_lower *L, char op, ptc_loc loc, ptc_num a, ptc_num b, ptc_num *out)
{
    ptc_num r = a.inexact ? a : b; /* keeps the first inexact division that went in */
    r.inexact = a.inexact || b.inexact;
    switch (op) {
    case '+': r.v = a.v + b.v; break;
    case '-': r.v = a.v - b.v; break;
    case '*': r.v = a.v * b.v; break;
    case '/':
        if (b.v == 0)
            return ptc_lower_fail(L, loc, "division by zero: %.15g / 0", a.v);
        r.v = a.v / b.v;
        if (!r.inexact && integral(a.v) && integral(b.v) && !integral(r.v))
            r = (ptc_num){.v = r.v, .inexact = true, .divloc = loc, .diva = a.v, .divb = b.v};
        break;
    default:
        return ptc_lower_fail(L, loc, "'@' multiplies matrices, but both operands are numbers");
    }
    if (!isfinite(r.v))
        return ptc_lower_fail(L, loc, "constant arithmetic overflows: %.15g %c %.15g", a.v, op,
                              b.v);
    *out = r;
    return 0;
}

static int lower_binary(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    ptc_val a, b;
    if (ptc_lower_expr(L, e->lhs, &a) < 0 || ptc_lower_expr(L, e->rhs, &b) < 0)
        return -1;
    if (a.is_num && b.is_num) {
        out->is_num = true;
        out->vid = -1;
        return fold_binary(L, e->op, e->loc, a.num, b.num, &out->num);
    }
    ptc_op op = e->op == '+'   ? PTC_OP_ADD
                : e->op == '-' ? PTC_OP_SUB
                : e->op == '*' ? PTC_OP_MUL
                : e->op == '/' ? PTC_OP_DIV
                               : PTC_OP_MATMUL;
    ptc_dtype dt = type_of(L, a.is_num ? b.vid : a.vid)->dtype;
    if (ptc_lower_materialize(L, &a, dt, e->lhs->loc) < 0 ||
        ptc_lower_materialize(L, &b, dt, e->rhs->loc) < 0)
        return -1;
    int in[2] = {a.vid, b.vid}, vid, n;
    if (ptc_lower_build(L, op, in, 2, NULL, e->loc, &vid, 1, &n) < 0)
        return -1;
    *out = tensor_val(vid);
    return 0;
}

/* An elementwise function of the op table applied to a number. */
static int fold_unary(ptc_lower *L, ptc_op op, ptc_loc loc, ptc_num x, ptc_num *out)
{
    double v = x.v, r;
    switch (op) {
    case PTC_OP_NEG: r = -v; break;
    case PTC_OP_EXP: r = exp(v); break;
    case PTC_OP_LOG:
    case PTC_OP_RSQRT:
        if (v <= 0)
            return ptc_lower_fail(L, loc, "%s of %.15g: the number must be positive",
                                  ptc_ops[op].name, v);
        r = op == PTC_OP_LOG ? log(v) : 1 / sqrt(v);
        break;
    case PTC_OP_SQRT:
        if (v < 0)
            return ptc_lower_fail(L, loc, "sqrt of a negative number: %.15g", v);
        r = sqrt(v);
        break;
    case PTC_OP_TANH: r = tanh(v); break;
    case PTC_OP_SIGMOID: r = 1 / (1 + exp(-v)); break;
    case PTC_OP_RELU: r = v > 0 ? v : 0; break;
    case PTC_OP_GELU:
        r = 0.5 * v * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
        break;
    case PTC_OP_SILU: r = v / (1 + exp(-v)); break;
    default: return ptc_lower_fail(L, loc, "%s needs a tensor, not a number", ptc_ops[op].name);
    }
    if (!isfinite(r))
        return ptc_lower_fail(L, loc, "%s(%.15g) overflows", ptc_ops[op].name, v);
    *out = x;
    out->v = r;
    return 0;
}

static int lower_neg(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    ptc_val a;
    if (ptc_lower_expr(L, e->lhs, &a) < 0)
        return -1;
    if (a.is_num) {
        *out = a;
        return fold_unary(L, PTC_OP_NEG, e->loc, a.num, &out->num);
    }
    int vid, n;
    if (ptc_lower_build(L, PTC_OP_NEG, &a.vid, 1, NULL, e->loc, &vid, 1, &n) < 0)
        return -1;
    *out = tensor_val(vid);
    return 0;
}

/* ---- compile-time numbers ---- */

static int not_a_number(ptc_lower *L, const ptc_expr *e, const ptc_val *v, const char *what)
{
    char s[160];
    ptc_type_str(type_of(L, v->vid), s, sizeof s);
    if (e->kind == PTC_E_NAME)
        return ptc_lower_fail(L, e->loc,
                              "%s must be a compile-time number, but '%s' is a tensor (%s)", what,
                              e->name, s);
    return ptc_lower_fail(L, e->loc, "%s must be a compile-time number, but this is a tensor (%s)",
                          what, s);
}

/* An expression where a compile-time number is needed. */
static int lower_number(ptc_lower *L, const ptc_expr *e, ptc_val *v)
{
    L->numctx++;
    int rc = ptc_lower_expr(L, e, v);
    L->numctx--;
    return rc;
}

int ptc_lower_num(ptc_lower *L, const ptc_expr *e, const char *what, double *out)
{
    ptc_val v;
    if (lower_number(L, e, &v) < 0)
        return -1;
    if (!v.is_num)
        return not_a_number(L, e, &v, what);
    *out = v.num.v;
    return 0;
}

int ptc_lower_int(ptc_lower *L, const ptc_expr *e, const char *what, int64_t *out)
{
    ptc_val v;
    if (lower_number(L, e, &v) < 0)
        return -1;
    if (!v.is_num)
        return not_a_number(L, e, &v, what);
    if (v.num.inexact)
        return ptc_lower_fail(L, v.num.divloc, "integer division is not exact: %.15g / %.15g",
                              v.num.diva, v.num.divb);
    if (!integral(v.num.v))
        return ptc_lower_fail(L, e->loc, "%s must be an integer, got %.15g", what, v.num.v);
    if (fabs(v.num.v) > 9007199254740992.0)
        return ptc_lower_fail(L, e->loc, "%s is too large: %.15g", what, v.num.v);
    *out = (int64_t)v.num.v;
    return 0;
}

int ptc_lower_type(ptc_lower *L, const ptc_type_ast *t, bool want_dtype, ptc_type *out)
{
    memset(out, 0, sizeof *out);
    out->dtype = PTC_F32;
    if (want_dtype && ptc_dtype_parse(t->dtype, &out->dtype) < 0)
        return ptc_lower_fail(L, t->loc, "unknown dtype '%s' (expected f32, bf16, f16 or i32)",
                              t->dtype);
    if (!want_dtype && t->dtype)
        return ptc_lower_fail(L, t->loc,
                              "a param's type has no dtype (parameters are f32 master "
                              "weights): write [...] without '%s'",
                              t->dtype);
    if (t->ndims > PTC_MAX_RANK)
        return ptc_lower_fail(L, t->loc, "a tensor has at most %d dimensions, this type has %d",
                              PTC_MAX_RANK, t->ndims);
    for (const ptc_arg *g = t->dims; g; g = g->next) {
        int64_t d = 0; /* (set unless ptc_lower_int fails; -O3 cannot tell) */
        if (ptc_lower_int(L, g->value, "a dimension", &d) < 0)
            return -1;
        if (d < 1)
            return ptc_lower_fail(L, g->value->loc, "a dimension must be positive, got %lld",
                                  (long long)d);
        out->dims[out->rank++] = d;
    }
    return 0;
}

/* ---- built-in calls, from the op table ---- */

static int64_t *int_attr(ptc_attrs *at, unsigned bit)
{
    switch (bit) {
    case PTC_A_AXIS: return &at->axis;
    case PTC_A_N: return &at->n;
    case PTC_A_START: return &at->start;
    case PTC_A_LEN: return &at->len;
    case PTC_A_HEADS: return &at->heads;
    case PTC_A_KV_HEADS: return &at->kv_heads;
    case PTC_A_TOP_K: return &at->top_k;
    default: return NULL;
    }
}

/* A list literal of integers: reshape's dimensions or permute's axes. */
static int list_attr(ptc_lower *L, const char *opname, const ptc_expr *e, bool dims, ptc_attrs *at)
{
    const char *what = dims ? "a dimension" : "an axis";
    if (e->kind != PTC_E_LIST)
        return ptc_lower_fail(L, e->loc, "%s takes a list of %s here, e.g. [%s]", opname,
                              dims ? "dimensions" : "axes", dims ? "batch, seq, d" : "0, 2, 1, 3");
    if (e->nargs > PTC_MAX_RANK)
        return ptc_lower_fail(L, e->loc, "a tensor has at most %d dimensions, this list has %d",
                              PTC_MAX_RANK, e->nargs);
    at->nshape = 0;
    for (const ptc_arg *g = e->args; g; g = g->next)
        if (ptc_lower_int(L, g->value, what, &at->shape[at->nshape++]) < 0)
            return -1;
    return 0;
}

/* Reads the value of attribute `bit` of a call to info->name from expression e. */
static int set_attr(ptc_lower *L, const ptc_op_info *info, unsigned bit, const ptc_expr *e,
                    ptc_attrs *at)
{
    const char *name = ptc_attr_name(bit);
    int64_t *field = int_attr(at, bit);
    if (field) {
        if (ptc_lower_int(L, e, name, field) < 0)
            return -1;
        if ((bit == PTC_A_HEADS || bit == PTC_A_KV_HEADS || bit == PTC_A_TOP_K) && *field < 1)
            return ptc_lower_fail(L, e->loc, "%s must be positive, got %lld", name,
                                  (long long)*field);
        return 0;
    }
    switch (bit) {
    case PTC_A_EPS:
    case PTC_A_BASE: {
        double v = 0;
        if (ptc_lower_num(L, e, name, &v) < 0)
            return -1;
        if (bit == PTC_A_EPS ? v < 0 : v <= 0)
            return ptc_lower_fail(L, e->loc, "%s must be %s, got %.15g", name,
                                  bit == PTC_A_EPS ? "zero or more" : "positive", v);
        *(bit == PTC_A_EPS ? &at->eps : &at->base) = v;
        return 0;
    }
    case PTC_A_CAPACITY: {
        double v = 0;
        if (ptc_lower_num(L, e, name, &v) < 0)
            return -1;
        if (!(v >= 0))
            return ptc_lower_fail(L, e->loc,
                                  "capacity must be 0 (drop nothing) or positive, got %.15g", v);
        at->capacity = v;
        return 0;
    }
    case PTC_A_CAUSAL:
    case PTC_A_NORMALIZE:
        if (e->kind != PTC_E_BOOL)
            return ptc_lower_fail(L, e->loc, "%s must be true or false", name);
        *(bit == PTC_A_CAUSAL ? &at->causal : &at->normalize) = e->truth;
        return 0;
    case PTC_A_ACT:
        /* a name, not an expression: a variable called gelu does not change it */
        if (e->kind != PTC_E_NAME || ptc_act_parse(e->name, &at->act) < 0)
            return ptc_lower_fail(L, e->loc,
                                  "act takes the name of an activation: gelu, relu, silu or "
                                  "swiglu%s%s%s",
                                  e->kind == PTC_E_NAME ? ", not '" : "",
                                  e->kind == PTC_E_NAME ? e->name : "",
                                  e->kind == PTC_E_NAME ? "'" : "");
        return 0;
    case PTC_A_DTYPE:
        if (e->kind != PTC_E_NAME || ptc_dtype_parse(e->name, &at->dtype) < 0)
            return ptc_lower_fail(L, e->loc, "%s takes a dtype here: f32, bf16, f16 or i32",
                                  info->name);
        return 0;
    case PTC_A_SHAPE:
    case PTC_A_PERM: return list_attr(L, info->name, e, bit == PTC_A_SHAPE, at);
    default: PTC_UNREACHABLE("attribute with no .ptm form");
    }
}

static const char *langpos_words(unsigned bit)
{
    switch (bit) {
    case PTC_A_N: return "the number of parts";
    case PTC_A_DTYPE: return "a dtype";
    case PTC_A_SHAPE: return "a list of dimensions";
    case PTC_A_PERM: return "a list of axes";
    default: return ptc_attr_name(bit);
    }
}

static int arity_error(ptc_lower *L, const ptc_expr *e, const ptc_op_info *info, int npos)
{
    char want[128];
    if (info->nin < 0)
        ptc_fmt(want, sizeof want, "one or more tensors");
    else if (info->nin == 1)
        ptc_fmt(want, sizeof want, "a tensor");
    else
        ptc_fmt(want, sizeof want, "%d tensors", info->nin);
    if (info->langpos) {
        size_t k = strlen(want);
        ptc_fmt(want + k, sizeof want - k, " and %s", langpos_words(info->langpos));
    }
    return ptc_lower_fail(L, e->loc, "%s takes %s, got %d positional argument%s", info->name, want,
                          npos, npos == 1 ? "" : "s");
}

static unsigned keyword_bit(const ptc_op_info *info, const char *key, unsigned mask)
{
    for (int i = 0; i < PTC_A_COUNT; i++) {
        unsigned bit = 1u << i;
        if ((mask & bit) && strcmp(ptc_attr_name(bit), key) == 0)
            return bit;
    }
    (void)info;
    return 0;
}

static int unknown_keyword(ptc_lower *L, const ptc_arg *g, const ptc_op_info *info,
                           unsigned accepted)
{
    if (info->langpos && keyword_bit(info, g->key, info->langpos))
        return ptc_lower_fail(L, g->keyloc, "%s takes %s as a positional argument, not as %s=...",
                              info->name, langpos_words(info->langpos), g->key);
    char list[256] = "";
    size_t k = 0;
    for (int i = 0; i < PTC_A_COUNT && k < sizeof list; i++)
        if (accepted & (1u << i))
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "",
                                  ptc_attr_name(1u << i));
    if (!accepted)
        return ptc_lower_fail(L, g->keyloc, "unknown keyword argument '%s': %s takes none", g->key,
                              info->name);
    return ptc_lower_fail(L, g->keyloc, "unknown keyword argument '%s' for %s (it takes %s)",
                          g->key, info->name, list);
}

/* Checks the shape of a call against the table before anything is lowered: positional count,
 * keyword names, duplicates, required keywords. Sets *ntensor. */
static int check_call(ptc_lower *L, const ptc_expr *e, const ptc_op_info *info, int *ntensor)
{
    int npos = 0;
    bool kw = false;
    unsigned accepted = info->kw & ~info->langpos & KEYWORD_ATTRS, given = 0;
    if (e->nargs > PTC_FE_MAX_ARGS)
        return ptc_lower_fail(L, e->loc, "too many arguments (more than %d)", PTC_FE_MAX_ARGS);
    for (const ptc_arg *g = e->args; g; g = g->next) {
        if (!g->key) {
            if (kw)
                return ptc_lower_fail(L, g->value->loc,
                                      "positional argument after keyword arguments");
            npos++;
            continue;
        }
        kw = true;
        unsigned bit = keyword_bit(info, g->key, accepted);
        if (!bit)
            return unknown_keyword(L, g, info, accepted);
        if (given & bit)
            return ptc_lower_fail(L, g->keyloc, "keyword argument '%s' is given twice", g->key);
        given |= bit;
    }
    int extra = info->langpos ? 1 : 0;
    *ntensor = info->nin >= 0 ? info->nin : npos - extra;
    if (info->nin >= 0 ? npos != info->nin + extra : npos - extra < 1)
        return arity_error(L, e, info, npos);
    unsigned missing = info->req & ~given;
    for (int i = 0; i < PTC_A_COUNT; i++)
        if (missing & (1u << i))
            return ptc_lower_fail(L, e->loc, "%s needs the keyword argument %s=...", info->name,
                                  ptc_attr_name(1u << i));
    return 0;
}

/* Lowers the tensor operands; a lone number given to an elementwise function is folded instead
 * (*folded set). */
static int call_operands(ptc_lower *L, const ptc_expr *e, ptc_op op, int ntensor, int *in,
                         ptc_val *folded)
{
    const ptc_arg *g = e->args;
    for (int i = 0; i < ntensor; i++, g = g->next) {
        ptc_val v;
        if (ptc_lower_expr(L, g->value, &v) < 0)
            return -1;
        if (v.is_num && (ptc_ops[op].flags & PTC_F_UNARY)) {
            *folded = v;
            return fold_unary(L, op, e->loc, v.num, &folded->num);
        }
        if (ptc_lower_materialize(L, &v, PTC_F32, g->value->loc) < 0)
            return -1;
        in[i] = v.vid;
    }
    return 0;
}

/* A call of a built-in op: up to cap results into vids (*nres of them), the first also into *out
 * (a number when the call was folded). */
static int builtin_call(ptc_lower *L, const ptc_expr *e, ptc_op op, int *vids, int cap, int *nres,
                        ptc_val *out)
{
    const ptc_op_info *info = &ptc_ops[op];
    int ntensor = 0;
    if (check_call(L, e, info, &ntensor) < 0)
        return -1;
    int inbuf[8], *in = ntensor <= 8 ? inbuf : ptc_xmalloc(sizeof *in * (size_t)ntensor);
    ptc_attrs at = ptc_attrs_default(op);
    int rc = -1;
    out->is_num = false;
    if (call_operands(L, e, op, ntensor, in, out) < 0)
        goto done;
    if (out->is_num) {
        *nres = 1;
        rc = 0;
        goto done;
    }
    const ptc_arg *g = e->args;
    for (int i = 0; i < ntensor; i++)
        g = g->next;
    if (info->langpos && set_attr(L, info, info->langpos, g->value, &at) < 0)
        goto done;
    for (; g; g = g->next)
        if (g->key &&
            set_attr(L, info, keyword_bit(info, g->key, KEYWORD_ATTRS), g->value, &at) < 0)
            goto done;
    int64_t nout = info->nout >= 0 ? info->nout : at.n;
    if (nout > cap && nout <= PTC_MAX_RESULTS) {
        ptc_lower_fail(L, e->loc,
                       "%s returns %lld values; assign them to as many names, as in `%s`",
                       info->name, (long long)nout,
                       op == PTC_OP_MOE ? "y, aux = moe(...)" : "q, k, v = split(...)");
        goto done;
    }
    if (ptc_lower_build(L, op, in, ntensor, &at, e->loc, vids, cap, nres) < 0)
        goto done;
    *out = tensor_val(vids[0]);
    rc = 0;
done:
    if (in != inbuf)
        free(in);
    return rc;
}

/* What other frameworks call the ops the language spells otherwise: the hint for an unknown op
 * that no spelling distance would find (matmul is not one typo away from `@`). */
static const struct {
    const char *name, *hint;
} foreign_ops[] = {
    {"matmul", "'a @ b'"},
    {"mm", "'a @ b'"},
    {"bmm", "'a @ b'"},
    {"dot", "'a @ b'"},
    {"linear", "'x @ w + b'"},
    {"einsum", "'a @ b' with permute"},
    {"add", "'a + b'"},
    {"sub", "'a - b'"},
    {"subtract", "'a - b'"},
    {"mul", "'a * b'"},
    {"multiply", "'a * b'"},
    {"div", "'a / b'"},
    {"divide", "'a / b'"},
    {"neg", "'-a'"},
    {"ln", "'log'"},
    {"swish", "'silu'"},
    {"gelu_new", "'gelu'"},
    {"cat", "'concat'"},
    {"concatenate", "'concat'"},
    {"view", "'reshape'"},
    {"flatten", "'reshape'"},
    {"squeeze", "'reshape'"},
    {"unsqueeze", "'reshape'"},
    {"chunk", "'split'"},
    {"swapaxes", "'permute'"},
    {"amax", "'max'"},
    {"reduce_sum", "'sum'"},
    {"reduce_mean", "'mean'"},
    {"reduce_max", "'max'"},
    {"nll_loss", "'cross_entropy'"},
    {"mse_loss", "'mse'"},
    {"scaled_dot_product_attention", "'attention'"},
    {"sdpa", "'attention'"},
    {"rotary", "'rope'"},
    {"rotary_embedding", "'rope'"},
};

static int unknown_callee(ptc_lower *L, const ptc_expr *e)
{
    if (ptc_lower_find_var(L, e->name) >= 0)
        return ptc_lower_fail(L, e->loc, "'%s' is a variable, not an op or a block", e->name);
    if (strcmp(e->name, "dropout") == 0)
        return ptc_lower_fail(L, e->loc,
                              "unknown op 'dropout': the language has no dropout (nothing in a "
                              "model is random)");
    for (size_t i = 0; i < sizeof foreign_ops / sizeof foreign_ops[0]; i++)
        if (strcmp(e->name, foreign_ops[i].name) == 0 &&
            !ptc_lower_find_decl(L, PTC_D_BLOCK, e->name))
            return ptc_lower_fail(L, e->loc, "unknown op or block '%s'; did you mean %s?", e->name,
                                  foreign_ops[i].hint);
    int n = 0, cap = PTC_NOPS;
    for (const ptc_decl *d = L->ast->decls; d; d = d->next)
        cap += d->kind == PTC_D_BLOCK;
    const char **cands = ptc_xmalloc(sizeof *cands * (size_t)cap);
    for (int i = 0; i < PTC_NOPS; i++)
        if (ptc_ops[i].flags & PTC_F_LANG)
            cands[n++] = ptc_ops[i].name;
    for (const ptc_decl *d = L->ast->decls; d; d = d->next)
        if (d->kind == PTC_D_BLOCK)
            cands[n++] = d->name;
    const char *near = ptc_similar(e->name, cands, n);
    free(cands);
    if (near)
        return ptc_lower_fail(L, e->loc, "unknown op or block '%s'; did you mean '%s'?", e->name,
                              near);
    return ptc_lower_fail(L, e->loc, "unknown op or block '%s'", e->name);
}

static int lower_call(ptc_lower *L, const ptc_expr *e, int *vids, int cap, int *nres, ptc_val *out)
{
    ptc_decl *b = ptc_lower_find_decl(L, PTC_D_BLOCK, e->name);
    if (b) {
        *nres = 1;
        return ptc_lower_block_call(L, b, e, e->name, e->loc, out);
    }
    ptc_op op = lang_op(e->name);
    if (op == PTC_NOPS)
        return unknown_callee(L, e);
    return builtin_call(L, e, op, vids, cap, nres, out);
}

/* CALL as NAME */
static int lower_as(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    const ptc_expr *c = e->lhs;
    if (c->kind != PTC_E_CALL)
        return ptc_lower_fail(L, e->loc,
                              "'as' names a block instance, so it must follow a call of a block");
    ptc_decl *b = ptc_lower_find_decl(L, PTC_D_BLOCK, c->name);
    if (b)
        return ptc_lower_block_call(L, b, c, e->name, e->nameloc, out);
    if (lang_op(c->name) != PTC_NOPS)
        return ptc_lower_fail(L, e->loc,
                              "'as' names a block instance, but %s is a built-in op "
                              "(it has no parameters to name)",
                              c->name);
    return unknown_callee(L, c);
}

static int lower_expr_kind(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    int vid, n;
    switch (e->kind) {
    case PTC_E_NUM: *out = num_val(e->num); return 0;
    case PTC_E_BOOL:
        return ptc_lower_fail(L, e->loc,
                              "'%s' is only a value of a keyword argument such as causal=%s",
                              e->truth ? "true" : "false", e->truth ? "true" : "false");
    case PTC_E_NAME: return lower_name(L, e, out);
    case PTC_E_BIN: return lower_binary(L, e, out);
    case PTC_E_NEG: return lower_neg(L, e, out);
    case PTC_E_CALL: return lower_call(L, e, &vid, 1, &n, out);
    case PTC_E_AS: return lower_as(L, e, out);
    case PTC_E_LIST:
        return ptc_lower_fail(L, e->loc, "a list [...] is only an argument of reshape or permute");
    }
    PTC_UNREACHABLE("bad expression kind");
    return -1;
}

int ptc_lower_expr(ptc_lower *L, const ptc_expr *e, ptc_val *out)
{
    if (ptc_lower_step(L, e->loc) < 0)
        return -1;
    if (L->depth >= PTC_FE_MAX_NEST)
        return ptc_lower_fail(L, e->loc,
                              "blocks, repeats and expressions nested too deeply "
                              "(more than %d levels)",
                              PTC_FE_MAX_NEST);
    L->depth++;
    int rc = lower_expr_kind(L, e, out);
    L->depth--;
    return rc;
}

int ptc_lower_tensor(ptc_lower *L, const ptc_expr *e, ptc_dtype dt, int *vid)
{
    ptc_val v;
    if (ptc_lower_expr(L, e, &v) < 0 || ptc_lower_materialize(L, &v, dt, e->loc) < 0)
        return -1;
    *vid = v.vid;
    return 0;
}

int ptc_lower_multi(ptc_lower *L, const ptc_expr *e, int *vids, int cap, int *n)
{
    ptc_val v;
    if (e->kind == PTC_E_CALL) {
        if (ptc_lower_step(L, e->loc) < 0 || lower_call(L, e, vids, cap, n, &v) < 0)
            return -1;
    } else {
        if (ptc_lower_expr(L, e, &v) < 0)
            return -1;
        *n = 1;
    }
    if (*n == 1 && (ptc_lower_materialize(L, &v, PTC_F32, e->loc) < 0))
        return -1;
    if (*n == 1)
        vids[0] = v.vid;
    return 0;
}
