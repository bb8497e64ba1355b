/* ptc-runner.c - the program inside every executable that `ptc MODEL.ptm -o NAME` writes. It reads
 * the plan embedded at the end of its own file, loads and verifies it, and trains it
 * (runtime/train/train.c).
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
#include "mpicomm.h"
#include "program.h"
#include "runner_flags.h"
#include "train.h"

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
    char *text = ptrt_plan_read_exe("/proc/self/exe", err, sizeof err);
    if (!text) {
        fprintf(stderr, "%s: error: %s\n", argv[0], err);
        return 2;
    }
    ptc_plan *plan = ptc_plan_load(text, err, sizeof err);
    if (!plan) {
        fprintf(stderr, "%s: error: the embedded plan does not load: %s\n", argv[0], err);
        free(text);
        return 2;
    }
    ptrt_train_opts o;
    ptrt_train_opts_default(&o);
    bool print_plan = false, help = false;
    int rc = ptrt_runner_parse(argc, argv, plan->optim.lr, &o, &print_plan, &help, stderr);
    if (!rc && help) {
        char count[32];
        snprintf(count, sizeof count, "%lld", (long long)plan->logical_params);
        char mesh[128] = "";
        if (plan->mesh.naxes) {
            int k = snprintf(mesh, sizeof mesh, "; mesh ");
            for (int a = 0; a < plan->mesh.naxes; a++)
                k += snprintf(mesh + k, sizeof mesh - (size_t)k, "%s%s=%d", a ? "," : "",
                              plan->mesh.names[a], plan->mesh.sizes[a]);
            snprintf(mesh + k, sizeof mesh - (size_t)k, ": %d ranks as threads", plan->nranks);
        }
        printf(ptrt_runner_usage, argv[0], plan->model, count, mesh);
        fputs(ptrt_runner_usage_backend, stdout);
        fputs(ptrt_runner_usage_device, stdout);
    } else if (!rc && print_plan) {
        fputs(text, stdout);
    } else if (!rc) {
        rc = ptrt_train(plan, &o, err, sizeof err);
        if (rc)
            fprintf(stderr, "%s: error: %s\n", argv[0], err);
    }
    if (!stdout_ok(argv[0]) && !rc)
        rc = help || print_plan ? 2 : 1;
    ptc_plan_free(plan);
    free(text);
    ptrt_mpi_finish(rc); /* under a launcher: MPI_Finalize, or MPI_Abort to end the job */
    return rc;
}
