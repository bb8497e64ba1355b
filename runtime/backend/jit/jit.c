/* jit.c - the jit backend: the fast CPU backend's kernels and GEMMs, and the plan's fused kernels
 * compiled through LLVM when an executor starts (codegen/llvm/kjit.h: host CPU, O3, vectorized,
 * cached on disk), run on the CPU backend's threads.
 *
 * Thread t of n runs its part of every parallel loop of a kernel; the parts depend only on the
 * loop's extent and n, and no kernel combines values across threads, so results do not depend on
 * the thread count. Small kernels run on the calling thread alone (waking the pool costs more).
 */
#include <stdlib.h>

#include "backend.h"
#include "cpu.h"
#include "cpu_internal.h"
#include "kjit.h"

/* below this many elements over all its parameters a kernel runs on one thread */
#define SMALL_KERNEL 32768

typedef struct jit_state {
    ptc_kfn *fns;
    bool *small;
} jit_state;

static void jit_release(void *state)
{
    jit_state *s = state;
    if (!s)
        return;
    free(s->fns);
    free(s->small);
    free(s);
}

static int jit_prepare(const ptc_plan *p, void **state, char *err, size_t errn)
{
    jit_state *s = ptc_xcalloc(1, sizeof *s);
    s->fns = ptc_xcalloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *s->fns);
    s->small = ptc_xcalloc((size_t)(p->nkernels ? p->nkernels : 1), sizeof *s->small);
    for (int k = 0; k < p->nkernels; k++) {
        char msg[1024];
        s->fns[k] = ptc_kjit_get(p->kernels[k], NULL, msg, sizeof msg);
        if (!s->fns[k]) {
            ptc_fmt(err, errn, "jit backend: cannot compile kernel %s: %s", p->kernels[k]->name,
                    msg);
            jit_release(s);
            return -1;
        }
        int64_t n = 0;
        for (int q = 0; q < p->kernels[k]->nparams; q++)
            n += p->kernels[k]->params[q].numel;
        s->small[k] = n < SMALL_KERNEL;
    }
    *state = s;
    return 0;
}

typedef struct job {
    ptc_kfn fn;
    void *const *args;
    int64_t nt;
} job;

static void piece(void *ctx, int64_t begin, int64_t end)
{
    const job *j = ctx;
    for (int64_t t = begin; t < end; t++)
        j->fn(j->args, t, j->nt);
}

void ptrt_jit_run(ptc_kfn fn, void *const *args, int64_t nt)
{
    job j = {.fn = fn, .args = args, .nt = nt};
    if (nt == 1)
        fn(args, 0, 1);
    else
        ptrt_cpu_parallel_for(nt, 1, piece, &j);
}

static int jit_fused(void *state, const ptc_plan *p, int k, void *const *args, char *err,
                     size_t errn)
{
    const jit_state *s = state;
    ptrt_jit_run(s->fns[k], args, s->small[k] ? 1 : ptrt_cpu_threads());
    return 0;
}

static const ptrt_backend jit_backend = {
    .name = "jit",
    .kernel = ptrt_cpu_run,
    .gemm = ptrt_cpu_gemm_instr,
    .alloc = ptrt_host_alloc,
    .free = ptrt_host_free,
    .host = true,
    .prepare = jit_prepare,
    .release = jit_release,
    .fused = jit_fused,
};

const ptrt_backend *const ptrt_backend_jit = &jit_backend;
