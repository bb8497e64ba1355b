/* fuzz_plan.c - see fuzz_plan.h. */
#include "fuzz_plan.h"
#include "ptc_auto.h"

#include <stdlib.h>

#include "frontend.h"
#include "passes.h"
#include "plan.h"
#include "planner.h"

void fuzz_plan(const ptc_options *o, const char *file, const char *src, size_t len, int max_ranks,
               FILE *out)
{
    ptc_diag diag;
    ptc_diag_init(&diag, out, file, src, len);
    ptc_frontend_opts fo = ptc_flags_frontend_opts(o);
    ptc_graph *g = ptc_frontend_compile(file, src, len, &fo, &diag);
    if (!g) {
        if (diag.nerrors != 1) {
            fprintf(stderr, "front end failed with %d errors (one expected)\n", diag.nerrors);
            abort();
        }
        return;
    }
    char verr[512];
    if (diag.nerrors != 0 || ptc_verify(g, verr, sizeof verr) != 0) {
        fprintf(stderr,
                "front end returned a graph after %d errors, or one that does not "
                "verify\n",
                diag.nerrors);
        abort();
    }
    int nranks = o->mesh.naxes ? ptc_mesh_nranks(&o->mesh) : 1;
    int64_t logical_params = ptc_graph_param_count(g);
    if (ptc_flags_apply(o, g, out) == 0 && o->train && nranks <= max_ranks) {
        char err[2048];
        ptc_compile_opts co = ptc_flags_compile_opts(o);
        co.dump = out;
        ptc_pass_ctx ctx = {.g = g, .opts = &co, .err = err, .errn = sizeof err};
        if (ptc_run_passes(&ctx) == 0) {
            ptc_lower_opts lo = ptc_flags_lower_opts(o, ctx.g);
            lo.logical_params = logical_params;
            lo.notes = ctx.notes;
            ptc_plan *plan = ptc_lower(ctx.g, &lo, err, sizeof err);
            if (plan && ptc_plan_check(plan, -1, -1, err, sizeof err) == 0)
                ptc_check_device_memory(plan, o, out);
            ptc_plan_free(plan);
        }
        g = ctx.g;
        ptc_pass_ctx_free(&ctx);
    }
    ptc_graph_free(g);
}
