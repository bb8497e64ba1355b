/* ptc-runner.c - the program inside every executable that `ptc MODEL.ptm -o NAME` writes. It reads
 * the plan embedded at the end of its own file and trains it (runtime/train.c).
 *
 * Exit status: 0 success, 1 a failure during the run (diverged loss, failed checkpoint write,
 * standard output that cannot be written), 2 a bad flag or a bad file given by the user (the
 * flags: runner_flags.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "file.h"
#include "ir.h"
#include "runner_flags.h"
#include "spmd.h"
#include "train.h"

/* Parameters of the logical model (a partitioned plan holds shards). */
static int64_t model_params(const ptc_graph *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ptc_node *nd = &g->nodes[i];
        if (nd->op != PTC_OP_PARAM)
            continue;
        const ptc_value *v = &g->values[nd->out[0]];
        ptc_type t = g->mesh.naxes ? ptrt_spmd_global_type(&v->type, v->place, &g->mesh) : v->type;
        int64_t k = ptc_type_numel(&t);
        n = k > INT64_MAX - n ? INT64_MAX : n + k; /* a plan is text anyone can edit */
    }
    return n;
}

/* Standard output must have taken every line printed on it (a full disk is not success). */
static bool stdout_ok(const char *prog)
{
    char err[256];
    if (ptc_file_check_stdout(err, sizeof err) == 0)
        return true;
    fprintf(stderr, "%s: error: writing to standard output failed: %s\n", prog, err);
    return false;
}

int main(int argc, char **argv)
{
    char err[4096];
    char *plan = ptrt_plan_read_exe("/proc/self/exe", err, sizeof err);
    if (!plan) {
        fprintf(stderr, "%s: error: %s\n", argv[0], err);
        return 2;
    }
    ptc_graph *g = ptc_parse_ir(plan, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s: error: the embedded plan does not parse: %s\n", argv[0], err);
        free(plan);
        return 2;
    }
    ptrt_train_opts o;
    ptrt_train_opts_default(&o);
    bool print_plan = false, help = false;
    int rc = ptrt_runner_parse(argc, argv, g->optim.lr, &o, &print_plan, &help, stderr);
    if (!rc && help) {
        char count[32];
        snprintf(count, sizeof count, "%lld", (long long)model_params(g));
        char mesh[128] = "";
        for (int a = 0, k = 0; a < g->mesh.naxes; a++)
            k += snprintf(mesh + k, sizeof mesh - (size_t)k, "%s%s=%d", a ? "," : "; mesh ",
                          g->mesh.names[a], g->mesh.sizes[a]);
        if (g->mesh.naxes)
            snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), ": %d ranks as threads",
                     ptc_mesh_nranks(&g->mesh));
        printf(ptrt_runner_usage, argv[0], g->name, count, mesh);
    } else if (!rc && print_plan) {
        fputs(plan, stdout);
    } else if (!rc) {
        rc = ptrt_train(g, &o, err, sizeof err);
        if (rc)
            fprintf(stderr, "%s: error: %s\n", argv[0], err);
    }
    if (!stdout_ok(argv[0]) && !rc)
        rc = help || print_plan ? 2 : 1;
    ptc_graph_free(g);
    free(plan);
    return rc;
}
