/* memplan.c - the static memory planner (see planner.h for the algorithm and why). */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

static int64_t align_up(int64_t x)
{
    return (x + PTC_ALIGN - 1) / PTC_ALIGN * PTC_ALIGN;
}

typedef struct placed {
    int64_t lo, hi; /* bytes [lo, hi) */
    int first, last;
} placed;

typedef struct sort_ctx {
    const ptc_buffer *bufs;
    const int *first;
} sort_ctx;

static sort_ctx sort_by;

/* Largest first; ties by earlier start, then by id, so the plan does not depend on qsort. */
static int by_size(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int64_t bx = sort_by.bufs[x].bytes, by = sort_by.bufs[y].bytes;
    if (bx != by)
        return bx > by ? -1 : 1;
    if (sort_by.first[x] != sort_by.first[y])
        return sort_by.first[x] < sort_by.first[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

static int by_offset(const void *a, const void *b)
{
    const placed *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Best fit among the gaps left by the placed buffers that are live at the same time. */
static int64_t best_fit(const placed *all, int nplaced, placed *tmp, int first, int last,
                        int64_t bytes)
{
    int n = 0;
    for (int i = 0; i < nplaced; i++)
        if (all[i].first <= last && first <= all[i].last)
            tmp[n++] = all[i];
    qsort(tmp, (size_t)n, sizeof *tmp, by_offset);
    int64_t best = -1, best_gap = INT64_MAX, at = 0;
    for (int i = 0; i < n; i++) {
        if (tmp[i].lo - at >= bytes && tmp[i].lo - at < best_gap) {
            best = at;
            best_gap = tmp[i].lo - at;
        }
        int64_t end = align_up(tmp[i].hi);
        if (end > at)
            at = end;
    }
    return best >= 0 ? best : at;
}

static void plan_program(ptc_program *pg)
{
    int nb = pg->nbufs;
    int *first = ptc_xmalloc(sizeof(int) * (size_t)(nb ? nb : 1));
    int *last = ptc_xmalloc(sizeof(int) * (size_t)(nb ? nb : 1));
    int *order = ptc_xmalloc(sizeof(int) * (size_t)(nb ? nb : 1));
    placed *done = ptc_xmalloc(sizeof(placed) * (size_t)(nb ? nb : 1));
    placed *tmp = ptc_xmalloc(sizeof(placed) * (size_t)(nb ? nb : 1));
    ptc_prog_lifetimes(pg, first, last);
    memset(pg->region_bytes, 0, sizeof pg->region_bytes);
    int n = 0;
    for (int b = 0; b < nb; b++) {
        ptc_buffer *bf = &pg->bufs[b];
        if (bf->view >= 0)
            continue;
        if (bf->region != PTC_REGION_ACT) { /* persistent: one after the other */
            int64_t *size = &pg->region_bytes[bf->region];
            bf->offset = align_up(*size);
            *size = bf->offset + bf->bytes;
            continue;
        }
        if (first[b] > last[b]) { /* never written nor read: takes no room */
            bf->offset = 0;
            continue;
        }
        order[n++] = b;
    }
    sort_by = (sort_ctx){pg->bufs, first};
    qsort(order, (size_t)n, sizeof *order, by_size);
    int64_t top = 0;
    for (int i = 0; i < n; i++) {
        ptc_buffer *bf = &pg->bufs[order[i]];
        int f = first[order[i]], l = last[order[i]];
        bf->offset = best_fit(done, i, tmp, f, l, bf->bytes);
        done[i] = (placed){bf->offset, bf->offset + bf->bytes, f, l};
        if (bf->offset + bf->bytes > top)
            top = bf->offset + bf->bytes;
    }
    pg->region_bytes[PTC_REGION_ACT] = top;
    for (int b = 0; b < nb; b++)
        if (pg->bufs[b].view >= 0)
            pg->bufs[b].offset = pg->bufs[pg->bufs[b].view].offset;
    free(first);
    free(last);
    free(order);
    free(done);
    free(tmp);
}

void ptc_plan_memory(ptc_plan *p)
{
    for (int i = 0; i < p->nprograms; i++)
        plan_program(&p->programs[i]);
}
