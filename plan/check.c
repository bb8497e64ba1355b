/* check.c - the pre-launch check: would the ranks' communication match up?
 *
 * Each rank runs its program in order, so its communication forms a sequence of collectives,
 * sends and receives. The check steps every rank forward as the runtime would:
 *   - a collective of a group completes when every member has it next, with the same kind,
 *     size, reduction and group;
 *   - a send completes at once (sends are buffered) and leaves a message for its peer;
 *   - a receive completes when the next message from its peer is there, of the same size and
 *     with the same tag (what the message is: the compiler numbers them, so a receive that
 *     would take another message of the same size is caught too);
 *   - a message never received is an error too, naming both ranks.
 * A disagreement (kind, size, reduction, a message of the wrong size) would fail at run time; no
 * progress while ranks still have communication left would hang. Both are reported before
 * anything runs, naming the ranks, the group and the instructions involved.
 */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

typedef struct comm_op {
    const ptc_instr *in;
    int index; /* position among the rank's collectives (the drop hook counts these) */
    int instr; /* instruction number in the program */
    int64_t count;
} comm_op;

typedef struct rank_seq {
    comm_op *ops;
    int n, pos;
} rank_seq;

/* Pending messages from one rank to another, in order. */
typedef struct channel {
    const comm_op **msgs;
    int n, cap, head;
} channel;

typedef struct checker {
    const ptc_plan *p;
    rank_seq *seq;
    channel *chan; /* [from * R + to] */
    int R;
    int *members;
    char *err;
    size_t errn;
} checker;

static int build_sequence(const ptc_plan *p, int r, int drop, rank_seq *s)
{
    const ptc_program *pg = &p->programs[p->rank_program[r]];
    int cap = 0, idx = 0;
    s->ops = NULL;
    s->n = s->pos = 0;
    for (int i = 0; i < pg->ninstrs; i++) {
        const ptc_instr *in = &pg->instrs[i];
        if (in->kind != PTC_INSTR_COLL && in->kind != PTC_INSTR_SEND &&
            in->kind != PTC_INSTR_RECV)
            continue;
        if (in->kind == PTC_INSTR_COLL && idx++ == drop)
            continue;
        PTC_GROW(s->ops, cap, s->n);
        int b = in->kind == PTC_INSTR_RECV ? in->out[0] : in->in[0];
        s->ops[s->n++] = (comm_op){in, in->kind == PTC_INSTR_COLL ? idx - 1 : -1, i,
                                   ptc_type_numel(&pg->bufs[b].type)};
    }
    return 0;
}

/* The messages from one rank to another (allocated when a plan first sends). */
static channel *chan(checker *c, int from, int to)
{
    if (!c->chan)
        c->chan = ptc_xcalloc((size_t)c->R * (size_t)c->R, sizeof *c->chan);
    return &c->chan[(size_t)from * (size_t)c->R + (size_t)to];
}

static void describe(const checker *c, const comm_op *o, char *buf, size_t n)
{
    const ptc_instr *in = o->in;
    char group[64];
    if (in->kind == PTC_INSTR_COLL) {
        ptc_plan_group_name(&c->p->mesh, in->coll.axes, group, sizeof group);
        ptc_fmt(buf, n, "%s over %s of %lld elements (collective #%d, instruction %d, line %d)",
                ptc_coll_name(in->coll.kind), group, (long long)o->count, o->index, o->instr,
                in->loc.line);
    } else {
        ptc_fmt(buf, n, "%s of %lld elements over %s (instruction %d, line %d)",
                in->kind == PTC_INSTR_SEND ? "send" : "recv", (long long)o->count,
                c->p->mesh.names[in->peer_axis], o->instr, in->loc.line);
    }
}

static bool same_coll(const comm_op *a, const comm_op *b)
{
    const ptc_coll *x = &a->in->coll, *y = &b->in->coll;
    return x->kind == y->kind && x->reduce == y->reduce && x->axes == y->axes &&
           a->count == b->count;
}

static const comm_op *next_op(const checker *c, int r)
{
    const rank_seq *s = &c->seq[r];
    return s->pos < s->n ? &s->ops[s->pos] : NULL;
}

/* Tries to complete rank r's next communication; 1 progress, 0 blocked, -1 error. */
static int step_rank(checker *c, int r)
{
    const comm_op *o = next_op(c, r);
    const ptc_mesh *m = &c->p->mesh;
    if (!o)
        return 0;
    if (o->in->kind == PTC_INSTR_SEND) {
        int q = ptc_plan_peer(m, r, o->in->peer_axis, o->in->peer_delta);
        channel *ch = chan(c, r, q);
        PTC_GROW(ch->msgs, ch->cap, ch->n);
        ch->msgs[ch->n++] = o;
        c->seq[r].pos++;
        return 1;
    }
    if (o->in->kind == PTC_INSTR_RECV) {
        int q = ptc_plan_peer(m, r, o->in->peer_axis, o->in->peer_delta);
        channel *ch = chan(c, q, r);
        if (ch->head == ch->n)
            return 0;
        const comm_op *s = ch->msgs[ch->head];
        if (s->count != o->count || s->in->tag != o->in->tag) {
            char a[256], b[256];
            describe(c, o, a, sizeof a);
            describe(c, s, b, sizeof b);
            ptc_fmt(c->err, c->errn,
                    "plan check: rank %d receives from rank %d in %s (message %d), but the "
                    "message there is rank %d's %s (message %d)",
                    r, q, a, o->in->tag, q, b, s->in->tag);
            return -1;
        }
        ch->head++;
        c->seq[r].pos++;
        return 1;
    }
    int n = ptc_plan_group(m, r, o->in->coll.axes, c->members);
    for (int k = 0; k < n; k++) {
        const comm_op *d = next_op(c, c->members[k]);
        if (!d || d->in->kind != PTC_INSTR_COLL || d->in->coll.axes != o->in->coll.axes)
            return 0;
        if (!same_coll(o, d)) {
            char a[256], b[256], group[64];
            describe(c, o, a, sizeof a);
            describe(c, d, b, sizeof b);
            ptc_plan_group_name(m, o->in->coll.axes, group, sizeof group);
            ptc_fmt(c->err, c->errn,
                    "plan check: collective mismatch on the %s group of ranks %d and %d: rank %d "
                    "issues %s but rank %d issues %s",
                    group, r, c->members[k], r, a, c->members[k], b);
            return -1;
        }
    }
    for (int k = 0; k < n; k++)
        c->seq[c->members[k]].pos++;
    return 1;
}

/* Everyone is blocked: name a rank that waits and the rank it waits for. */
static void report_hang(checker *c)
{
    const ptc_mesh *m = &c->p->mesh;
    for (int r = 0; r < c->R; r++) {
        const comm_op *o = next_op(c, r);
        if (!o)
            continue;
        char a[256];
        describe(c, o, a, sizeof a);
        if (o->in->kind == PTC_INSTR_RECV) {
            int q = ptc_plan_peer(m, r, o->in->peer_axis, o->in->peer_delta);
            ptc_fmt(c->err, c->errn,
                    "plan check: the plan would hang: rank %d waits in %s, but rank %d never "
                    "sends it",
                    r, a, q);
            return;
        }
        int n = ptc_plan_group(m, r, o->in->coll.axes, c->members), q = -1;
        for (int k = 0; k < n && q < 0; k++) {
            const comm_op *d = next_op(c, c->members[k]);
            if (!d || d->in->kind != PTC_INSTR_COLL || d->in->coll.axes != o->in->coll.axes)
                q = c->members[k];
        }
        const comm_op *d = q >= 0 ? next_op(c, q) : NULL;
        ptc_fmt(c->err, c->errn,
                "plan check: the plan would hang: rank %d waits in %s, but rank %d of its group "
                "%s",
                r, a, q,
                !d                                ? "has no collective left"
                : d->in->kind != PTC_INSTR_COLL   ? "waits in a send or receive"
                                                  : "waits in a collective of another group");
        return;
    }
}

int ptc_plan_check(const ptc_plan *p, int drop_rank, int drop_index, char *err, size_t errn)
{
    if (p->nranks == 1)
        return 0;
    checker c = {.p = p, .R = p->nranks, .err = err, .errn = errn};
    c.seq = ptc_xcalloc((size_t)c.R, sizeof *c.seq);
    c.members = ptc_xmalloc(sizeof(int) * (size_t)c.R);
    for (int r = 0; r < c.R; r++)
        build_sequence(p, r, r == drop_rank ? drop_index : -1, &c.seq[r]);
    int rc = 0;
    for (bool progress = true; progress && !rc;) {
        progress = false;
        for (int r = 0; r < c.R && !rc; r++) {
            int s;
            while ((s = step_rank(&c, r)) > 0)
                progress = true;
            rc = s < 0 ? -1 : 0;
        }
    }
    for (int r = 0; r < c.R && !rc; r++)
        if (next_op(&c, r)) {
            report_hang(&c);
            rc = -1;
        }
    for (size_t i = 0; c.chan && !rc && i < (size_t)c.R * (size_t)c.R; i++)
        if (c.chan[i].head < c.chan[i].n) { /* a send without its receive */
            char a[256];
            describe(&c, c.chan[i].msgs[c.chan[i].head], a, sizeof a);
            ptc_fmt(err, errn,
                    "plan check: rank %d's %s is never received: rank %d has no receive left "
                    "for it",
                    (int)(i / (size_t)c.R), a, (int)(i % (size_t)c.R));
            rc = -1;
        }
    for (int r = 0; r < c.R; r++)
        free(c.seq[r].ops);
    for (size_t i = 0; c.chan && i < (size_t)c.R * (size_t)c.R; i++)
        free(c.chan[i].msgs);
    free(c.seq);
    free(c.chan);
    free(c.members);
    return rc;
}
