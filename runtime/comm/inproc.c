/* inproc.c - the in-process communicator (see inproc.h): ranks are threads, data moves by memcpy
 * (a device communicator: by its backend's copies and reduction kernel, mem_* below).
 *
 * One mutex guards all bookkeeping; data moves outside it. Every rank has one condition variable
 * (on CLOCK_MONOTONIC, so timeouts ignore changes of the wall clock) on which only that rank waits,
 * for whatever it waits for; whoever changes what a rank waits for signals it, and a failure
 * signals every rank.
 *
 * Groups are kept in a hash map keyed by the sorted member set, created on first use. A group has
 * one slot per member (in sorted order) and a generation barrier. A collective:
 *   post     the member writes what it called (kind, sizes, step, member order, pointers) into its
 *            slot and counts the call;
 *   phase A  barrier: wait until every member has posted (timed, and left at once on failure);
 *            then every member checks all slots against member 0's: the same verdict everywhere
 *            (on a mismatch all fail, after phase B, since the message reads the others' slots);
 *   compute  each member reads the others' inputs and writes its own output;
 *   phase B  barrier: nobody returns (and frees or overwrites its input, or posts again) until all
 *            have read.
 * Allreduce is reduce-scatter then allgather: member q reduces slice q of all inputs into its own
 * output (a private temporary where in and out partly overlap), phase B, copies the other slices
 * from their owners, phase C. In place (in == out) needs no temporary: slice q of my buffer is the
 * only one I write in the first half, and the others read only their own slices of it.
 * The waits after phase A are neither timed nor cut short by a failure: every member is then
 * inside the call doing a bounded copy, and leaving early could free memory another still reads.
 *
 * Reductions run left to right over the members in group order, element by element in float, so
 * every member computes the same bits whichever slice it owns.
 */
#include "inproc.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "half.h"
#include "util.h"

#define REASON_MAX 1024
#define NAME_MAX_LEN 32
#define TILE 1024       /* elements reduced at a time, in a stack buffer of floats */
#define SHOW_MEMBERS 16 /* longer member lists are cut short in messages */

typedef enum {
    K_BARRIER,
    K_ALLREDUCE,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_ALL_TO_ALL,
    K_ALL_TO_ALL_V,
    K_SEND,
    K_RECV
} kind;
static const char *const kind_name[] = {"barrier",    "allreduce",    "allgather", "reduce_scatter",
                                        "all_to_all", "all_to_all_v", "send",      "recv"};

/* One collective call: what matching compares, plus the buffers. size[] holds count (allreduce),
 * outer and chunk (allgather, reduce_scatter), outer_in, chunk_in, outer_out, chunk_out
 * (all_to_all), nothing for all_to_all_v, whose counts may differ between members (they are
 * checked against each other instead). op is PTRT_RED_SUM for kinds that do not reduce. */
typedef struct {
    kind k;
    ptrt_reduce op;
    int64_t size[4];
    int64_t step;
    const int *order; /* the members as this member passed them */
    ptc_dtype dt;     /* of the elements: f32 and i32 take 4 bytes, bf16 and f16 2 */
    const void *in;
    void *out;
    const void *part; /* allreduce: this member's reduced slice, read by the others in phase C */
    /* all_to_all_v: elements to and from each member (in group order), where they start, and
     * how many elements in and out hold */
    const int64_t *send_count, *send_off, *recv_count, *recv_off;
    int64_t in_len, out_len;
} post;

typedef struct group {
    struct group *next; /* hash chain */
    uint64_t hash;
    int n;
    int *sorted;     /* the member set, ascending; slot i belongs to rank sorted[i] */
    uint64_t *calls; /* per slot: collectives entered on this group */
    post *posts;     /* per slot: the current (or last) collective */
    int count;       /* members arrived at the current barrier */
    uint64_t gen;    /* barriers completed */
} group;

typedef struct msg {
    struct msg *next;
    void *dev; /* the data, in device memory (a device communicator); else data[] holds it */
    int64_t count, step;
    ptc_dtype dt;
    int index;
    char name[NAME_MAX_LEN];
    unsigned char data[];
} msg;

typedef struct {
    msg *head, *tail;
    uint64_t received;
} chan;

/* One call, as messages describe it. */
typedef struct {
    ptrt_inproc *c;
    int me;
    kind k;
    const int *members; /* collectives */
    int n;
    int peer; /* send, recv */
    char name[NAME_MAX_LEN];
    int64_t step;
    int index;
    char *err;
    size_t errn;
} call;

/* Where a waiting rank waits, so that a timeout elsewhere can say why it never arrived. */
typedef struct {
    bool waiting;
    call what; /* members points into the waiting rank's own call: valid while it waits */
} whereabouts;

struct ptrt_inproc {
    int nranks;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t *cv; /* per rank; only that rank waits on it */
    bool failed;
    char reason[REASON_MAX]; /* the first failure */
    group **buckets;
    size_t nbuckets, ngroups;
    chan **chans; /* chans[receiver][sender], a row allocated on first use */
    whereabouts *where;
    const ptrt_backend *be; /* a device communicator's backend, whose memory the buffers are in;
                             * NULL: host memory */
    ptrt_comm iface; /* the interface over this communicator (ptrt_inproc_comm) */
};

/* ---- messages ---------------------------------------------------------------------------- */

/* An appending snprintf that tolerates truncation. */
typedef struct {
    char *p;
    size_t n, len;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->len + 1 >= b->n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->len, b->n - b->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        b->len = b->len + (size_t)k < b->n ? b->len + (size_t)k : b->n - 1;
}

static void sb_members(sbuf *b, const int *m, int n)
{
    if (!m || n < 1) {
        sb_printf(b, "[]");
        return;
    }
    sb_printf(b, "[");
    for (int i = 0; i < n && i < SHOW_MEMBERS; i++)
        sb_printf(b, "%s%d", i ? "," : "", m[i]);
    if (n > SHOW_MEMBERS)
        sb_printf(b, ",...] (%d ranks)", n);
    else
        sb_printf(b, "]");
}

/* "allreduce on group tp [4,5,6,7] (collective #12, step 3)", "recv from rank 2 on group pp (...)"
 */
static void sb_what(sbuf *b, const call *x)
{
    sb_printf(b, "%s", kind_name[x->k]);
    if (x->k == K_SEND || x->k == K_RECV)
        sb_printf(b, " %s rank %d", x->k == K_SEND ? "to" : "from", x->peer);
    if (x->k != K_SEND && x->k != K_RECV) {
        sb_printf(b, " on group %s%s", x->name, x->name[0] ? " " : "");
        sb_members(b, x->members, x->n);
    } else if (x->name[0]) {
        sb_printf(b, " on group %s", x->name);
    }
    if (x->index >= 0 && x->step >= 0)
        sb_printf(b, " (collective #%d, step %lld)", x->index, (long long)x->step);
    else if (x->index >= 0)
        sb_printf(b, " (collective #%d)", x->index);
    else if (x->step >= 0)
        sb_printf(b, " (step %lld)", (long long)x->step);
}

static void set_err(const call *x, const char *msg)
{
    if (x->err && x->errn)
        ptc_fmt(x->err, x->errn, "%s", msg);
}

static void fail_locked(ptrt_inproc *c, const char *reason)
{
    if (!c->failed) {
        c->failed = true;
        ptc_fmt(c->reason, sizeof c->reason, "%s", reason);
    }
    for (int r = 0; r < c->nranks; r++)
        pthread_cond_broadcast(&c->cv[r]);
}

/* The call fails with its own message, and the communicator with it (mu held). */
static int fail_call(call *x, const char *msg)
{
    set_err(x, msg);
    fail_locked(x->c, msg);
    return -1;
}

/* The call fails because the communicator already has (mu held). */
static int fail_failed(const call *x)
{
    char buf[REASON_MAX + 512];
    sbuf b = {buf, sizeof buf, 0};
    sb_printf(&b, "rank %d: ", x->me);
    sb_what(&b, x);
    sb_printf(&b, " failed: %s", x->c->reason);
    set_err(x, buf);
    return -1;
}

/* The call fails on its arguments: "rank R: WHAT: PROBLEM" (mu held). */
__attribute__((format(printf, 2, 3))) static int fail_invalid(call *x, const char *fmt, ...)
{
    char buf[REASON_MAX], why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    sbuf b = {buf, sizeof buf, 0};
    sb_printf(&b, "rank %d: ", x->me);
    sb_what(&b, x);
    sb_printf(&b, ": %s", why);
    return fail_call(x, buf);
}

static void init_call(call *x, ptrt_inproc *c, int me, kind k, const ptrt_coll_desc *d, char *err,
                      size_t errn)
{
    memset(x, 0, sizeof *x);
    x->c = c;
    x->me = me;
    x->k = k;
    x->peer = -1;
    x->step = d ? d->step : -1;
    x->index = d ? d->index : -1;
    if (d && d->group_name)
        ptc_fmt(x->name, sizeof x->name, "%s", d->group_name);
    x->err = err;
    x->errn = errn;
    if (err && errn)
        err[0] = '\0';
}

/* "; rank 6 is in allreduce on group dp [2,6] (...)" for a rank that did not arrive (mu held). */
static void sb_whereabouts(sbuf *b, const ptrt_inproc *c, int rank)
{
    const whereabouts *w = &c->where[rank];
    if (!w->waiting) {
        sb_printf(b, "rank %d is in no communicator call", rank);
        return;
    }
    sb_printf(b, "rank %d is waiting in ", rank);
    sb_what(b, &w->what);
}

static void set_where(call *x)
{
    x->c->where[x->me].waiting = true;
    x->c->where[x->me].what = *x;
}

/* "2.0" for timeouts in tenths of a second, else as many digits as needed. */
static void sb_seconds(sbuf *b, double s)
{
    if (fabs(s * 10 - round(s * 10)) < 1e-9)
        sb_printf(b, "%.1f s", s);
    else
        sb_printf(b, "%g s", s);
}

/* ---- groups ------------------------------------------------------------------------------ */

static uint64_t hash_set(const int *sorted, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)sorted[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void rehash(ptrt_inproc *c)
{
    size_t nb = c->nbuckets ? c->nbuckets * 2 : 16;
    group **b = ptc_xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (group *g = c->buckets[i], *next; g; g = next) {
            next = g->next;
            g->next = b[g->hash % nb];
            b[g->hash % nb] = g;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
}

/* The group of a member set, created on first use (mu held). */
static group *group_get(ptrt_inproc *c, const int *sorted, int n)
{
    uint64_t h = hash_set(sorted, n);
    if (c->nbuckets) {
        for (group *g = c->buckets[h % c->nbuckets]; g; g = g->next)
            if (g->hash == h && g->n == n && !memcmp(g->sorted, sorted, (size_t)n * sizeof(int)))
                return g;
    }
    if (c->ngroups >= c->nbuckets)
        rehash(c);
    group *g = ptc_xcalloc(1, sizeof *g);
    g->hash = h;
    g->n = n;
    g->sorted = ptc_xmalloc((size_t)n * sizeof(int));
    memcpy(g->sorted, sorted, (size_t)n * sizeof(int));
    g->calls = ptc_xcalloc((size_t)n, sizeof *g->calls);
    g->posts = ptc_xcalloc((size_t)n, sizeof *g->posts);
    g->next = c->buckets[h % c->nbuckets];
    c->buckets[h % c->nbuckets] = g;
    c->ngroups++;
    return g;
}

static int slot_of(const group *g, int rank)
{
    int lo = 0, hi = g->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->sorted[mid] == rank)
            return mid;
        if (g->sorted[mid] < rank)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    ptc_assert_fail(__FILE__, __LINE__, "rank is a member of the group");
}

static void free_groups(ptrt_inproc *c)
{
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (group *g = c->buckets[i], *next; g; g = next) {
            next = g->next;
            free(g->sorted);
            free(g->calls);
            free(g->posts);
            free(g);
        }
    }
    free(c->buckets);
}

/* ---- waiting ----------------------------------------------------------------------------- */

static struct timespec deadline_after(double s)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double whole = floor(s);
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((s - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* "rank 5: timeout after 2.0 s in WHAT: ranks 4, 5, 7 arrived; rank 6 did not (...)" */
static int fail_timeout(call *x, const group *g)
{
    char buf[REASON_MAX];
    sbuf b = {buf, sizeof buf, 0};
    sb_printf(&b, "rank %d: timeout after ", x->me);
    sb_seconds(&b, x->c->timeout_s);
    sb_printf(&b, " in ");
    sb_what(&b, x);
    uint64_t mine = g->calls[slot_of(g, x->me)];
    int narrived = 0;
    for (int j = 0; j < x->n; j++)
        narrived += g->calls[slot_of(g, x->members[j])] == mine;
    int nmissing = x->n - narrived; /* at least one, or the barrier would have completed */
    for (int pass = 0; pass < 2; pass++) {
        int cnt = pass ? nmissing : narrived, seen = 0;
        sb_printf(&b, pass ? "; %s " : ": %s ", cnt > 1 ? "ranks" : "rank");
        for (int j = 0; j < x->n; j++) {
            bool arrived = g->calls[slot_of(g, x->members[j])] == mine;
            if (arrived != (pass == 0))
                continue;
            sb_printf(&b, "%s%d", seen++ ? ", " : "", x->members[j]);
        }
        sb_printf(&b, pass ? " did not" : " arrived");
    }
    sb_printf(&b, " (");
    for (int j = 0, seen = 0; j < x->n; j++) {
        if (g->calls[slot_of(g, x->members[j])] == mine)
            continue;
        sb_printf(&b, "%s", seen++ ? "; " : "");
        sb_whereabouts(&b, x->c, x->members[j]);
    }
    sb_printf(&b, ")");
    return fail_call(x, buf);
}

/* Arrives at g's barrier and waits for the other members (mu held); 0 once all have arrived.
 * timed: phase A, which gives up after the timeout or when the communicator fails. */
static int barrier(call *x, group *g, bool timed)
{
    ptrt_inproc *c = x->c;
    uint64_t gen = g->gen;
    if (++g->count == g->n) {
        g->count = 0;
        g->gen++;
        for (int i = 0; i < g->n; i++)
            pthread_cond_signal(&c->cv[g->sorted[i]]);
        return 0;
    }
    if (!timed) {
        while (g->gen == gen)
            pthread_cond_wait(&c->cv[x->me], &c->mu);
        return 0;
    }
    struct timespec dl = deadline_after(c->timeout_s);
    set_where(x);
    int rc = 0;
    while (g->gen == gen) {
        if (c->failed) {
            rc = fail_failed(x);
            break;
        }
        int w = pthread_cond_timedwait(&c->cv[x->me], &c->mu, &dl);
        if (w == ETIMEDOUT && g->gen == gen) {
            rc = fail_timeout(x, g);
            break;
        }
    }
    c->where[x->me].waiting = false;
    return rc;
}

static void barrier_unlocked(call *x, group *g)
{
    pthread_mutex_lock(&x->c->mu);
    barrier(x, g, false);
    pthread_mutex_unlock(&x->c->mu);
}

/* ---- matching ---------------------------------------------------------------------------- */

static bool same_post(const post *a, const post *b, int n)
{
    return a->k == b->k && a->op == b->op && a->dt == b->dt &&
           !memcmp(a->size, b->size, sizeof a->size) && a->step == b->step &&
           !memcmp(a->order, b->order, (size_t)n * sizeof(int));
}

/* "allreduce(count 4096, sum)", with the step and member order where they differ from other's. */
static void sb_post(sbuf *b, const post *p, const post *other, int n)
{
    const char *op = p->op == PTRT_RED_SUM ? "sum" : "max";
    const int64_t *s = p->size;
    sb_printf(b, "%s", kind_name[p->k]);
    switch (p->k) {
    case K_ALLREDUCE: sb_printf(b, "(count %lld, %s)", (long long)s[0], op); break;
    case K_ALLGATHER:
        sb_printf(b, "(outer %lld, chunk %lld)", (long long)s[0], (long long)s[1]);
        break;
    case K_REDUCE_SCATTER:
        sb_printf(b, "(outer %lld, chunk %lld, %s)", (long long)s[0], (long long)s[1], op);
        break;
    case K_ALL_TO_ALL:
        sb_printf(b, "(in %lld x %lld, out %lld x %lld)", (long long)s[0], (long long)s[1],
                  (long long)s[2], (long long)s[3]);
        break;
    case K_ALL_TO_ALL_V: sb_printf(b, "(uneven counts)"); break;
    default: break;
    }
    if (p->dt != other->dt)
        sb_printf(b, " of %s", ptc_dtype_name(p->dt));
    if (p->step != other->step)
        sb_printf(b, " at step %lld", (long long)p->step);
    if (memcmp(p->order, other->order, (size_t)n * sizeof(int))) {
        sb_printf(b, " with members ");
        sb_members(b, p->order, n);
    }
}

/* After phase A (mu held): every member compares every slot with that of member 0 of its own
 * order, so all reach the same verdict (if the orders differ, every member sees some difference).
 */
static int check_match(call *x, const post *const *mp)
{
    for (int j = 1; j < x->n; j++) {
        if (same_post(mp[j], mp[0], x->n))
            continue;
        char buf[REASON_MAX];
        sbuf b = {buf, sizeof buf, 0};
        sb_printf(&b, "rank %d: collective mismatch on group %s%s", x->me, x->name,
                  x->name[0] ? " " : "");
        sb_members(&b, x->members, x->n);
        if (mp[0]->step >= 0)
            sb_printf(&b, " at step %lld", (long long)mp[0]->step);
        sb_printf(&b, ": rank %d called ", x->members[j]);
        sb_post(&b, mp[j], mp[0], x->n);
        sb_printf(&b, " but rank %d called ", x->members[0]);
        sb_post(&b, mp[0], mp[j], x->n);
        return fail_call(x, buf);
    }
    return 0;
}

/* ---- data movement ----------------------------------------------------------------------- */

static float max_nan(float a, float b)
{
    return (a > b || isnan(a)) ? a : b;
}

static size_t esize(ptc_dtype dt)
{
    return (size_t)ptc_dtype_size(dt);
}

/* Elements [base, base + m) of src as floats. */
static void load_tile(float *acc, const void *src, ptc_dtype dt, int64_t base, int64_t m)
{
    if (dt == PTC_F32) {
        memcpy(acc, (const float *)src + base, (size_t)m * sizeof(float));
        return;
    }
    const uint16_t *u = (const uint16_t *)src + base;
    for (int64_t i = 0; i < m; i++)
        acc[i] = dt == PTC_BF16 ? ptc_bf16_value(u[i]) : ptc_f16_value(u[i]);
}

static void store_tile(void *dst, ptc_dtype dt, int64_t base, const float *acc, int64_t m)
{
    if (dt == PTC_F32) {
        memcpy((float *)dst + base, acc, (size_t)m * sizeof(float));
        return;
    }
    uint16_t *u = (uint16_t *)dst + base;
    for (int64_t i = 0; i < m; i++)
        u[i] = dt == PTC_BF16 ? ptc_bf16_bits(acc[i]) : ptc_f16_bits(acc[i]);
}

/* dst[i] = src[0][i] op src[1][i] op ... (left to right, in float; 16-bit values are widened and
 * the result rounded once), a tile at a time: dst may be one of the sources exactly, since a tile
 * is written only after all of it has been read. */
static void reduce_run(void *dst, const void *const *src, int n, int64_t len, ptrt_reduce op,
                       ptc_dtype dt)
{
    float acc[TILE], s[TILE];
    for (int64_t base = 0; base < len; base += TILE) {
        int64_t m = len - base < TILE ? len - base : TILE;
        load_tile(acc, src[0], dt, base, m);
        for (int j = 1; j < n; j++) {
            load_tile(s, src[j], dt, base, m);
            if (op == PTRT_RED_SUM)
                for (int64_t i = 0; i < m; i++)
                    acc[i] += s[i];
            else
                for (int64_t i = 0; i < m; i++)
                    acc[i] = max_nan(acc[i], s[i]);
        }
        store_tile(dst, dt, base, acc, m);
    }
}


static bool overlap(const void *a, int64_t na, const void *b, int64_t nb, size_t es)
{
    uintptr_t a0 = (uintptr_t)a, a1 = a0 + (uintptr_t)na * es;
    uintptr_t b0 = (uintptr_t)b, b1 = b0 + (uintptr_t)nb * es;
    return na > 0 && nb > 0 && a0 < b1 && b0 < a1;
}

static void *elem(void *p, int64_t i, size_t es)
{
    return (char *)p + (size_t)i * es;
}

static const void *celem(const void *p, int64_t i, size_t es)
{
    return (const char *)p + (size_t)i * es;
}

/* Memory. A host communicator moves data with memcpy and reduces on the calling thread; a device
 * communicator (c->be) queues the same moves and reductions on the device through its backend,
 * and its temporaries are device memory. */
static void *mem_alloc(const ptrt_inproc *c, size_t n)
{
    if (!c->be)
        return ptc_xmalloc(n + 1);
    void *p = c->be->alloc(n ? n : 1);
    if (!p) { /* (a temporary of an overlapping call, or a message in flight; as ptc_xmalloc) */
        fprintf(stderr, "ptc: the device communicator is out of device memory allocating %zu "
                        "bytes\n", n);
        abort();
    }
    return p;
}

static void mem_free(const ptrt_inproc *c, void *p, size_t n)
{
    if (!c->be)
        free(p);
    else if (p)
        c->be->free(p, n ? n : 1);
}

static void mem_copy(const ptrt_inproc *c, void *dst, const void *src, size_t n)
{
    if (!n)
        return;
    if (c->be)
        c->be->move(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* reduce_run on the communicator's memory: 0, or -1 (the call failed, with a message) */
static int mem_reduce(call *x, void *dst, const void *const *src, int n, int64_t len,
                      ptrt_reduce op, ptc_dtype dt)
{
    const ptrt_inproc *c = x->c;
    if (!c->be) {
        reduce_run(dst, src, n, len, op, dt);
        return 0;
    }
    char e[512];
    if (len == 0 || c->be->reduce(dst, src, n, len, op == PTRT_RED_MAX, dt, e, sizeof e) == 0)
        return 0;
    char buf[REASON_MAX];
    ptc_fmt(buf, sizeof buf, "rank %d: %s: %s", x->me, kind_name[x->k], e);
    pthread_mutex_lock(&x->c->mu);
    fail_call(x, buf);
    pthread_mutex_unlock(&x->c->mu);
    return -1;
}

/* Copies a part of len elements of es bytes: its element e is src[(e / sc) * sstride + e % sc]
 * and goes to dst[(e / dc) * dstride + e % dc], a contiguous run at a time. */
static void copy_part(const ptrt_inproc *c, void *dst, int64_t dc, int64_t dstride,
                      const void *src, int64_t sc, int64_t sstride, int64_t len, size_t es)
{
    for (int64_t e = 0; e < len;) {
        int64_t si = e % sc, di = e % dc, run = len - e;
        if (run > sc - si)
            run = sc - si;
        if (run > dc - di)
            run = dc - di;
        mem_copy(c, (char *)dst + (size_t)((e / dc) * dstride + di) * es,
                 (const char *)src + (size_t)((e / sc) * sstride + si) * es, (size_t)run * es);
        e += run;
    }
}

/* copy_part on the communicator's memory: on a device, runs of equal length at equal pitches
 * go as one strided copy (a part of whole blocks as one, a block's runs of a finer layout as
 * one each), else run by run */
static void mem_copy_part(const ptrt_inproc *c, void *dst, int64_t dc, int64_t dstride,
                          const void *src, int64_t sc, int64_t sstride, int64_t len, size_t es)
{
    if (!c->be || len <= 0) {
        copy_part(c, dst, dc, dstride, src, sc, sstride, len, es);
        return;
    }
    char *d = dst;
    const char *s = src;
    if (sc == dc && len % sc == 0) {
        c->be->copy2d(d, (size_t)dstride * es, s, (size_t)sstride * es, (size_t)sc * es,
                      (size_t)(len / sc));
    } else if (dc % sc == 0 && len % dc == 0) { /* a destination row holds dc / sc source rows */
        for (int64_t r = 0; r < len / dc; r++)
            c->be->copy2d(d + (size_t)(r * dstride) * es, (size_t)sc * es,
                          s + (size_t)(r * (dc / sc) * sstride) * es, (size_t)sstride * es,
                          (size_t)sc * es, (size_t)(dc / sc));
    } else if (sc % dc == 0 && len % sc == 0) { /* a source row fills sc / dc destination rows */
        for (int64_t r = 0; r < len / sc; r++)
            c->be->copy2d(d + (size_t)(r * (sc / dc) * dstride) * es, (size_t)dstride * es,
                          s + (size_t)(r * sstride) * es, (size_t)dc * es, (size_t)dc * es,
                          (size_t)(sc / dc));
    } else {
        copy_part(c, dst, dc, dstride, src, sc, sstride, len, es);
    }
}

/* Start of slice q when len is cut into n nearly equal slices. */
static int64_t slice_start(int64_t len, int n, int q)
{
    int64_t base = len / n, rem = len % n;
    return base * q + (q < rem ? q : rem);
}

/* The data phases of each kind (mu not held; phase A done). mp: the members' slots in group
 * order; q: my position; a: my own slot. */
static int run_allreduce(call *x, group *g, const post *const *mp, int q, post *a)
{
    int n = x->n;
    const ptrt_inproc *c = x->c;
    size_t es = esize(a->dt);
    int64_t count = a->size[0], lo = slice_start(count, n, q), hi = slice_start(count, n, q + 1);
    bool partial = a->in != a->out && overlap(a->in, count, a->out, count, es);
    void *part = partial ? mem_alloc(c, (size_t)(hi - lo) * es) : elem(a->out, lo, es);
    const void **src = ptc_xmalloc((size_t)n * sizeof *src);
    for (int j = 0; j < n; j++)
        src[j] = celem(mp[j]->in, lo, es);
    int rc = mem_reduce(x, part, src, n, hi - lo, a->op, a->dt);
    pthread_mutex_lock(&x->c->mu);
    a->part = part;
    barrier(x, g, false);
    for (int j = 0; j < n; j++)
        src[j] = mp[j]->part;
    pthread_mutex_unlock(&x->c->mu);
    for (int j = 0; j < n; j++) {
        int64_t jl = slice_start(count, n, j), jh = slice_start(count, n, j + 1);
        if (j != q || partial)
            mem_copy(c, elem(a->out, jl, es), src[j], (size_t)(jh - jl) * es);
    }
    barrier_unlocked(x, g);
    free(src);
    if (partial)
        mem_free(c, part, (size_t)(hi - lo) * es);
    return rc;
}

static int run_reduce_scatter(call *x, group *g, const post *const *mp, int q, post *a)
{
    int n = x->n, rc = 0;
    const ptrt_inproc *c = x->c;
    size_t es = esize(a->dt);
    int64_t outer = a->size[0], chunk = a->size[1];
    bool partial = overlap(a->in, outer * n * chunk, a->out, outer * chunk, es);
    void *dst = partial ? mem_alloc(c, (size_t)(outer * chunk) * es) : a->out;
    const void **src = ptc_xmalloc((size_t)n * sizeof *src);
    for (int64_t o = 0; o < outer && rc == 0; o++) {
        for (int j = 0; j < n; j++)
            src[j] = celem(mp[j]->in, (o * n + q) * chunk, es);
        rc = mem_reduce(x, elem(dst, o * chunk, es), src, n, chunk, a->op, a->dt);
    }
    barrier_unlocked(x, g);
    if (partial) {
        mem_copy(c, a->out, dst, (size_t)(outer * chunk) * es);
        mem_free(c, dst, (size_t)(outer * chunk) * es);
    }
    free(src);
    return rc;
}

static int position(const int *members, int n, int me)
{
    for (int j = 0; j < n; j++)
        if (members[j] == me)
            return j;
    return -1;
}

/* Allgather and all-to-all: part q of every member's input becomes part j of my output (for
 * allgather the input is a single part). */
static int run_gather(call *x, group *g, const post *const *mp, int q, post *a)
{
    int n = x->n;
    const ptrt_inproc *c = x->c;
    const int64_t *s = a->size;
    int64_t outer_in = s[0], chunk_in = s[1], nparts_in = n;
    int64_t outer_out = s[0], chunk_out = s[1];
    if (a->k == K_ALLGATHER) {
        nparts_in = 1;
        q = 0;
    } else {
        outer_out = s[2];
        chunk_out = s[3];
    }
    int64_t in_len = outer_in * nparts_in * chunk_in, out_len = outer_out * n * chunk_out;
    size_t es = esize(a->dt);
    /* an allgather in place: my part already sits at its place in my output; nobody writes it */
    int me = position(x->members, n, x->me);
    bool in_place = a->k == K_ALLGATHER && outer_in == 1 &&
                    a->in == celem(a->out, me * chunk_out, es);
    bool partial = !in_place && overlap(a->in, in_len, a->out, out_len, es);
    void *dst = partial ? mem_alloc(c, (size_t)out_len * es) : a->out;
    for (int j = 0; j < n; j++)
        if (!(in_place && j == me))
            mem_copy_part(c, elem(dst, j * chunk_out, es), chunk_out, n * chunk_out,
                          celem(mp[j]->in, q * chunk_in, es), chunk_in, nparts_in * chunk_in,
                          outer_in * chunk_in, es);
    barrier_unlocked(x, g);
    if (partial) {
        mem_copy(c, a->out, dst, (size_t)out_len * es);
        mem_free(c, dst, (size_t)out_len * es);
    }
    return 0;
}

/* All-to-all with uneven counts: every member checks every pair (so all reach the same verdict:
 * member i's send count to j equals j's receive count from i), then copies from each member's
 * input its part for me into my output. */
static int check_uneven(call *x, const post *const *mp)
{
    for (int i = 0; i < x->n; i++)
        for (int j = 0; j < x->n; j++) {
            if (mp[i]->send_count[j] == mp[j]->recv_count[i])
                continue;
            char buf[REASON_MAX];
            sbuf b = {buf, sizeof buf, 0};
            sb_printf(&b, "rank %d: all_to_all_v on group %s%s", x->me, x->name,
                      x->name[0] ? " " : "");
            sb_members(&b, x->members, x->n);
            sb_printf(&b, ": rank %d sends %lld elements to rank %d, which expects %lld",
                      x->members[i], (long long)mp[i]->send_count[j], x->members[j],
                      (long long)mp[j]->recv_count[i]);
            return fail_call(x, buf);
        }
    return 0;
}

static int run_uneven(call *x, group *g, const post *const *mp, int q, post *a)
{
    const ptrt_inproc *c = x->c;
    size_t es = esize(a->dt);
    bool partial = overlap(a->in, a->in_len, a->out, a->out_len, es);
    void *dst = partial ? mem_alloc(c, (size_t)a->out_len * es) : a->out;
    for (int j = 0; j < x->n; j++)
        mem_copy(c, elem(dst, a->recv_off[j], es), celem(mp[j]->in, mp[j]->send_off[q], es),
                 (size_t)a->recv_count[j] * es);
    barrier_unlocked(x, g);
    if (partial) {
        for (int j = 0; j < x->n; j++) /* only the parts received: the rest keeps its bytes */
            mem_copy(c, elem(a->out, a->recv_off[j], es), celem(dst, a->recv_off[j], es),
                     (size_t)a->recv_count[j] * es);
        mem_free(c, dst, (size_t)a->out_len * es);
    }
    return 0;
}

/* ---- collectives ------------------------------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Checks the group (mu held) and fills sorted with the member set. */
static int check_members(call *x, int *sorted)
{
    ptrt_inproc *c = x->c;
    if (x->me < 0 || x->me >= c->nranks)
        return fail_invalid(x, "rank %d is not in 0..%d", x->me, c->nranks - 1);
    if (!x->members || x->n < 1 || x->n > c->nranks)
        return fail_invalid(x, "a group has 1..%d members, not %d", c->nranks, x->n);
    memcpy(sorted, x->members, (size_t)x->n * sizeof(int));
    qsort(sorted, (size_t)x->n, sizeof(int), cmp_int);
    for (int i = 0; i < x->n; i++) {
        if (sorted[i] < 0 || sorted[i] >= c->nranks)
            return fail_invalid(x, "member %d is not in 0..%d", sorted[i], c->nranks - 1);
        if (i && sorted[i] == sorted[i - 1])
            return fail_invalid(x, "member %d appears twice", sorted[i]);
    }
    if (!bsearch(&x->me, sorted, (size_t)x->n, sizeof(int), cmp_int))
        return fail_invalid(x, "rank %d is not a member", x->me);
    return 0;
}

/* Checks sizes and buffers (mu held): in_len and out_len floats must be addressable. */
static int check_sizes(call *x, const post *a)
{
    int64_t in_len = 0, out_len = 0, t, n = x->n;
    const int64_t *s = a->size;
    for (int i = 0; i < 4; i++)
        if (s[i] < 0)
            return fail_invalid(x, "negative size %lld", (long long)s[i]);
    bool ok = true;
    switch (a->k) {
    case K_ALLREDUCE: ok = ptc_mul_ok(s[0], 1, &in_len) && ptc_mul_ok(s[0], 1, &out_len); break;
    case K_ALLGATHER:
    case K_REDUCE_SCATTER:
        ok = ptc_mul_ok(s[0], s[1], &in_len) && ptc_mul_ok(in_len, n, &out_len);
        if (a->k == K_REDUCE_SCATTER) {
            t = in_len;
            in_len = out_len;
            out_len = t;
        }
        break;
    case K_ALL_TO_ALL:
        ok = ptc_mul_ok(s[0], s[1], &t) && ptc_mul_ok(t, n, &in_len) &&
             ptc_mul_ok(s[2], s[3], &t) && ptc_mul_ok(t, n, &out_len);
        if (ok && in_len != out_len)
            return fail_invalid(x,
                                "outer_in * chunk_in (%lld x %lld) differs from outer_out * "
                                "chunk_out (%lld x %lld)",
                                (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
        break;
    case K_ALL_TO_ALL_V:
        in_len = a->in_len;
        out_len = a->out_len;
        if (in_len < 0 || out_len < 0 || !a->send_count || !a->send_off || !a->recv_count ||
            !a->recv_off)
            return fail_invalid(x, "all_to_all_v needs counts, offsets and lengths");
        for (int j = 0; j < n; j++) {
            int64_t so = a->send_off[j], sc = a->send_count[j];
            int64_t ro = a->recv_off[j], rc = a->recv_count[j];
            if (sc < 0 || rc < 0 || so < 0 || ro < 0 || so > in_len || sc > in_len - so ||
                ro > out_len || rc > out_len - ro)
                return fail_invalid(x, "part %d of all_to_all_v lies outside its buffer", j);
        }
        break;
    default: break;
    }
    int64_t es = (int64_t)esize(a->dt);
    if (!ok || !ptc_mul_ok(in_len, es, &t) || !ptc_mul_ok(out_len, es, &t))
        return fail_invalid(x, "sizes overflow");
    bool reduces = a->k == K_ALLREDUCE || a->k == K_REDUCE_SCATTER;
    if ((unsigned)a->dt >= PTC_NDTYPES || (reduces && a->dt == PTC_I32))
        return fail_invalid(x, "cannot %s %s data", reduces ? "reduce" : "move",
                            (unsigned)a->dt < PTC_NDTYPES ? ptc_dtype_name(a->dt) : "unknown");
    if ((in_len > 0 && !a->in) || (out_len > 0 && !a->out))
        return fail_invalid(x, "a buffer is NULL");
    if (a->op != PTRT_RED_SUM && a->op != PTRT_RED_MAX)
        return fail_invalid(x, "unknown reduction %d", (int)a->op);
    return 0;
}

/* Posts, waits for all members (phase A), checks they called the same (mu held). Returns my slot,
 * or -1 on failure. mp gets the members' slots in group order. */
static post *enter(call *x, const post *mine, group **gp, const post **mp)
{
    ptrt_inproc *c = x->c;
    if (c->failed) {
        fail_failed(x);
        return NULL;
    }
    int *sorted = ptc_xmalloc((size_t)(x->n > 0 ? x->n : 1) * sizeof(int));
    int bad = check_members(x, sorted) || check_sizes(x, mine);
    group *g = bad ? NULL : group_get(c, sorted, x->n);
    free(sorted);
    if (!g)
        return NULL;
    int slot = slot_of(g, x->me);
    post *a = &g->posts[slot];
    *a = *mine;
    g->calls[slot]++;
    if (barrier(x, g, true))
        return NULL;
    for (int j = 0; j < x->n; j++)
        mp[j] = &g->posts[slot_of(g, x->members[j])];
    if (check_match(x, mp)) {
        /* every member finds the mismatch; none may leave while another still reads its slot */
        barrier(x, g, false);
        return NULL;
    }
    *gp = g;
    return a;
}


/* True when the call moves no data (then its buffers may be NULL). */
static bool moves_nothing(const post *a)
{
    switch (a->k) {
    case K_ALLREDUCE: return a->size[0] == 0;
    case K_ALLGATHER:
    case K_REDUCE_SCATTER:
    case K_ALL_TO_ALL: return a->size[0] == 0 || a->size[1] == 0;
    case K_ALL_TO_ALL_V: return false;
    default: return true;
    }
}

static int collective(ptrt_inproc *c, int me, const int *members, int n, const post *mine,
                      const ptrt_coll_desc *d, char *err, size_t errn)
{
    call x;
    init_call(&x, c, me, mine->k, d, err, errn);
    if (!c) {
        if (err && errn)
            ptc_fmt(err, errn, "rank %d: %s: no communicator", me, kind_name[mine->k]);
        return -1;
    }
    x.members = members;
    x.n = n;
    const post **mp = ptc_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *mp);
    group *g = NULL;
    pthread_mutex_lock(&c->mu);
    post *a = enter(&x, mine, &g, mp);
    if (a && a->k == K_ALL_TO_ALL_V && check_uneven(&x, mp)) {
        barrier(&x, g, false); /* every member found it; none may leave while another reads */
        a = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    int rc = a ? 0 : -1;
    if (a) {
        int q = position(members, n, me);
        switch (moves_nothing(a) ? K_BARRIER : a->k) {
        case K_ALLREDUCE: rc = run_allreduce(&x, g, mp, q, a); break;
        case K_REDUCE_SCATTER: rc = run_reduce_scatter(&x, g, mp, q, a); break;
        case K_ALLGATHER:
        case K_ALL_TO_ALL: rc = run_gather(&x, g, mp, q, a); break;
        case K_ALL_TO_ALL_V: rc = run_uneven(&x, g, mp, q, a); break;
        default: barrier_unlocked(&x, g); break; /* phase B only */
        }
    }
    free(mp);
    return rc;
}

static int post_call(ptrt_inproc *c, int me, const int *members, int n, post p,
                     const ptrt_coll_desc *d, char *err, size_t errn)
{
    p.step = d ? d->step : -1;
    p.order = members;
    return collective(c, me, members, n, &p, d, err, errn);
}

int ptrt_inproc_allreduce_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                             void *out, int64_t count, ptc_dtype dt, ptrt_reduce op,
                             const ptrt_coll_desc *d, char *err, size_t errn)
{
    post p = {.k = K_ALLREDUCE, .op = op, .size = {count}, .dt = dt, .in = in, .out = out};
    return post_call(c, me, members, n, p, d, err, errn);
}

int ptrt_inproc_allgather_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                             void *out, int64_t outer, int64_t chunk, ptc_dtype dt,
                             const ptrt_coll_desc *d, char *err, size_t errn)
{
    post p = {.k = K_ALLGATHER, .size = {outer, chunk}, .dt = dt, .in = in, .out = out};
    return post_call(c, me, members, n, p, d, err, errn);
}

int ptrt_inproc_reduce_scatter_dt(ptrt_inproc *c, int me, const int *members, int n,
                                  const void *in, void *out, int64_t outer, int64_t chunk,
                                  ptc_dtype dt, ptrt_reduce op, const ptrt_coll_desc *d,
                                  char *err, size_t errn)
{
    post p = {.k = K_REDUCE_SCATTER, .op = op, .size = {outer, chunk}, .dt = dt, .in = in,
              .out = out};
    return post_call(c, me, members, n, p, d, err, errn);
}

int ptrt_inproc_all_to_all_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                              void *out, int64_t outer_in, int64_t chunk_in, int64_t outer_out,
                              int64_t chunk_out, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                              size_t errn)
{
    post p = {.k = K_ALL_TO_ALL,
              .size = {outer_in, chunk_in, outer_out, chunk_out},
              .dt = dt,
              .in = in,
              .out = out};
    return post_call(c, me, members, n, p, d, err, errn);
}

int ptrt_inproc_all_to_all_v_dt(ptrt_inproc *c, int me, const int *members, int n, const void *in,
                                const int64_t *send_count, const int64_t *send_off, int64_t in_len,
                                void *out, const int64_t *recv_count, const int64_t *recv_off,
                                int64_t out_len, ptc_dtype dt, const ptrt_coll_desc *d, char *err,
                                size_t errn)
{
    post p = {.k = K_ALL_TO_ALL_V,
              .dt = dt,
              .in = in,
              .out = out,
              .send_count = send_count,
              .send_off = send_off,
              .recv_count = recv_count,
              .recv_off = recv_off,
              .in_len = in_len,
              .out_len = out_len};
    return post_call(c, me, members, n, p, d, err, errn);
}

int ptrt_inproc_allreduce(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                          float *out, int64_t count, ptrt_reduce op, const ptrt_coll_desc *d,
                          char *err, size_t errn)
{
    return ptrt_inproc_allreduce_dt(c, me, members, n, in, out, count, PTC_F32, op, d, err,
                                    errn);
}

int ptrt_inproc_allgather(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                          float *out, int64_t outer, int64_t chunk, const ptrt_coll_desc *d,
                          char *err, size_t errn)
{
    return ptrt_inproc_allgather_dt(c, me, members, n, in, out, outer, chunk, PTC_F32, d, err,
                                    errn);
}

int ptrt_inproc_reduce_scatter(ptrt_inproc *c, int me, const int *members, int n,
                               const float *in, float *out, int64_t outer, int64_t chunk,
                               ptrt_reduce op, const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_reduce_scatter_dt(c, me, members, n, in, out, outer, chunk, PTC_F32, op, d,
                                         err, errn);
}

int ptrt_inproc_all_to_all(ptrt_inproc *c, int me, const int *members, int n, const float *in,
                           float *out, int64_t outer_in, int64_t chunk_in, int64_t outer_out,
                           int64_t chunk_out, const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_all_to_all_dt(c, me, members, n, in, out, outer_in, chunk_in, outer_out,
                                     chunk_out, PTC_F32, d, err, errn);
}

int ptrt_inproc_barrier(ptrt_inproc *c, int me, const int *members, int n, const ptrt_coll_desc *d,
                      char *err, size_t errn)
{
    post p = {.k = K_BARRIER};
    p.step = d ? d->step : -1;
    p.order = members;
    return collective(c, me, members, n, &p, d, err, errn);
}

/* ---- point to point ---------------------------------------------------------------------- */

/* Checks me, peer and the buffer (mu held). */
static int check_p2p(call *x, const void *buf, int64_t count, ptc_dtype dt)
{
    int last = x->c->nranks - 1;
    int64_t bytes;
    if (x->me < 0 || x->me > last)
        return fail_invalid(x, "rank %d is not in 0..%d", x->me, last);
    if (x->peer < 0 || x->peer > last)
        return fail_invalid(x, "peer %d is not in 0..%d", x->peer, last);
    if ((unsigned)dt >= PTC_NDTYPES)
        return fail_invalid(x, "unknown dtype %d", (int)dt);
    if (!ptc_mul_ok(count, (int64_t)esize(dt), &bytes))
        return fail_invalid(x, "bad count %lld", (long long)count);
    if (count > 0 && !buf)
        return fail_invalid(x, "the buffer is NULL");
    return 0;
}

static void free_msg(const ptrt_inproc *c, msg *m)
{
    if (m && m->dev)
        mem_free(c, m->dev, (size_t)m->count * esize(m->dt));
    free(m);
}

static chan *chan_get(ptrt_inproc *c, int receiver, int sender)
{
    if (!c->chans[receiver])
        c->chans[receiver] = ptc_xcalloc((size_t)c->nranks, sizeof(chan));
    return &c->chans[receiver][sender];
}

int ptrt_inproc_send_dt(ptrt_inproc *c, int me, int peer, const void *buf, int64_t count,
                        ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    call x;
    init_call(&x, c, me, K_SEND, d, err, errn);
    x.peer = peer;
    if (!c) {
        set_err(&x, "send: no communicator");
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    int rc = c->failed ? fail_failed(&x) : check_p2p(&x, buf, count, dt);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return -1;
    size_t bytes = (size_t)count * esize(dt);
    msg *m = ptc_xmalloc(sizeof *m + (c->be ? 0 : bytes));
    m->next = NULL;
    m->dev = c->be ? mem_alloc(c, bytes) : NULL;
    m->count = count;
    m->dt = dt;
    m->step = x.step;
    m->index = x.index;
    memcpy(m->name, x.name, sizeof m->name);
    mem_copy(c, c->be ? m->dev : m->data, buf, bytes);
    pthread_mutex_lock(&c->mu);
    if (c->failed) {
        rc = fail_failed(&x);
        free_msg(c, m);
    } else {
        chan *ch = chan_get(c, peer, me);
        if (ch->tail)
            ch->tail->next = m;
        else
            ch->head = m;
        ch->tail = m;
        pthread_cond_signal(&c->cv[peer]);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Waits for the next message on ch (mu held); NULL after a timeout or failure. */
static msg *recv_wait(call *x, chan *ch)
{
    ptrt_inproc *c = x->c;
    if (!ch->head) {
        struct timespec dl = deadline_after(c->timeout_s);
        set_where(x);
        while (!ch->head && !c->failed) {
            if (pthread_cond_timedwait(&c->cv[x->me], &c->mu, &dl) == ETIMEDOUT && !ch->head)
                break;
        }
        c->where[x->me].waiting = false;
    }
    if (!ch->head) {
        if (c->failed) {
            fail_failed(x);
            return NULL;
        }
        char buf[REASON_MAX];
        sbuf b = {buf, sizeof buf, 0};
        sb_printf(&b, "rank %d: timeout after ", x->me);
        sb_seconds(&b, c->timeout_s);
        sb_printf(&b, " in ");
        sb_what(&b, x);
        sb_printf(&b, ": nothing arrived from rank %d (%llu received before; ", x->peer,
                  (unsigned long long)ch->received);
        sb_whereabouts(&b, c, x->peer);
        sb_printf(&b, ")");
        fail_call(x, buf);
        return NULL;
    }
    msg *m = ch->head;
    ch->head = m->next;
    if (!ch->head)
        ch->tail = NULL;
    ch->received++;
    return m;
}

/* The message must be what the receiver expects: same count, dtype and step (mu held). */
static int check_msg(call *x, const msg *m, int64_t count, ptc_dtype dt)
{
    if (m->count == count && m->dt == dt && m->step == x->step)
        return 0;
    call s = *x;
    s.k = K_SEND;
    s.me = x->peer;
    s.peer = x->me;
    s.step = m->step;
    s.index = m->index;
    memcpy(s.name, m->name, sizeof s.name);
    char buf[REASON_MAX];
    sbuf b = {buf, sizeof buf, 0};
    sb_printf(&b, "rank %d: send/recv mismatch: rank %d called ", x->me, x->peer);
    sb_what(&b, &s);
    bool dts = m->dt != dt; /* name the dtypes only where they differ */
    sb_printf(&b, " with count %lld%s%s but rank %d called ", (long long)m->count,
              dts ? " of " : "", dts ? ptc_dtype_name(m->dt) : "", x->me);
    sb_what(&b, x);
    sb_printf(&b, " with count %lld%s%s", (long long)count, dts ? " of " : "",
              dts ? ptc_dtype_name(dt) : "");
    return fail_call(x, buf);
}

int ptrt_inproc_recv_dt(ptrt_inproc *c, int me, int peer, void *buf, int64_t count,
                        ptc_dtype dt, const ptrt_coll_desc *d, char *err, size_t errn)
{
    call x;
    init_call(&x, c, me, K_RECV, d, err, errn);
    x.peer = peer;
    if (!c) {
        set_err(&x, "recv: no communicator");
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    msg *m = NULL;
    int rc = c->failed ? fail_failed(&x) : check_p2p(&x, buf, count, dt);
    if (!rc) {
        m = recv_wait(&x, chan_get(c, me, peer));
        rc = m ? check_msg(&x, m, count, dt) : -1;
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc && count > 0)
        mem_copy(c, buf, c->be ? m->dev : m->data, (size_t)count * esize(dt));
    free_msg(c, m);
    return rc;
}

int ptrt_inproc_send(ptrt_inproc *c, int me, int peer, const float *buf, int64_t count,
                     const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_send_dt(c, me, peer, buf, count, PTC_F32, d, err, errn);
}

int ptrt_inproc_recv(ptrt_inproc *c, int me, int peer, float *buf, int64_t count,
                     const ptrt_coll_desc *d, char *err, size_t errn)
{
    return ptrt_inproc_recv_dt(c, me, peer, buf, count, PTC_F32, d, err, errn);
}

/* ---- the communicator -------------------------------------------------------------------- */

ptrt_inproc *ptrt_inproc_new(int nranks, double timeout_s, char *err, size_t errn)
{
    if (!err)
        errn = 0;
    if (nranks < 1) {
        ptc_fmt(err, errn, "communicator: %d ranks (need at least 1)", nranks);
        return NULL;
    }
    if (!(timeout_s > 0 && timeout_s <= 1e9)) {
        ptc_fmt(err, errn, "communicator: timeout %g s (need 0 < timeout <= 1e9)", timeout_s);
        return NULL;
    }
    ptrt_inproc *c = ptc_xcalloc(1, sizeof *c);
    c->nranks = nranks;
    c->timeout_s = timeout_s;
    PTC_ASSERT(pthread_mutex_init(&c->mu, NULL) == 0);
    pthread_condattr_t ca;
    PTC_ASSERT(pthread_condattr_init(&ca) == 0);
    PTC_ASSERT(pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0);
    c->cv = ptc_xcalloc((size_t)nranks, sizeof *c->cv);
    for (int r = 0; r < nranks; r++)
        PTC_ASSERT(pthread_cond_init(&c->cv[r], &ca) == 0);
    pthread_condattr_destroy(&ca);
    c->chans = ptc_xcalloc((size_t)nranks, sizeof *c->chans);
    c->where = ptc_xcalloc((size_t)nranks, sizeof *c->where);
    return c;
}

void ptrt_inproc_free(ptrt_inproc *c)
{
    if (!c)
        return;
    for (int r = 0; r < c->nranks; r++) {
        for (int s = 0; c->chans[r] && s < c->nranks; s++) {
            for (msg *m = c->chans[r][s].head, *next; m; m = next) {
                next = m->next;
                free_msg(c, m);
            }
        }
        free(c->chans[r]);
        pthread_cond_destroy(&c->cv[r]);
    }
    free_groups(c);
    free(c->chans);
    free(c->cv);
    free(c->where);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int ptrt_inproc_nranks(const ptrt_inproc *c)
{
    return c->nranks;
}

void ptrt_inproc_abort(ptrt_inproc *c, int rank, const char *msg)
{
    if (!c)
        return;
    char buf[REASON_MAX];
    ptc_fmt(buf, sizeof buf, "aborted: rank %d failed: %s", rank, msg ? msg : "(no message)");
    pthread_mutex_lock(&c->mu);
    fail_locked(c, buf);
    pthread_mutex_unlock(&c->mu);
}

bool ptrt_inproc_failed(ptrt_inproc *c, char *reason, size_t n)
{
    if (!c)
        return false;
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    if (failed && reason && n)
        ptc_fmt(reason, n, "%s", c->reason);
    pthread_mutex_unlock(&c->mu);
    return failed;
}

ptrt_comm *ptrt_inproc_comm(ptrt_inproc *c)
{
    c->iface = (ptrt_comm){.ops = &ptrt_inproc_ops, .impl = c, .nranks = c->nranks,
                           .device = c->be != NULL};
    return &c->iface;
}

ptrt_inproc *ptrt_inproc_new_on(int nranks, double timeout_s, const ptrt_backend *be, char *err,
                                size_t errn)
{
    if (be && !be->host && (!be->copy2d || !be->reduce || !be->move || !be->alloc)) {
        ptc_fmt(err, errn, "communicator: the %s backend cannot move or reduce its memory itself",
                be->name);
        return NULL;
    }
    ptrt_inproc *c = ptrt_inproc_new(nranks, timeout_s, err, errn);
    if (c && be && !be->host)
        c->be = be;
    return c;
}
