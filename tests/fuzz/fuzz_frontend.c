/* fuzz_frontend.c - libFuzzer harness for the front end.
 *
 * Any bytes must give either a graph that passes the IR verifier or diagnostics, and never a
 * crash, a hang, undefined behaviour or a leak (the build adds ASan and UBSan). The input's size
 * picks the front end's options (training asked for, a data-parallel degree of 0 to 4), so that
 * their checks are fuzzed too. Diagnostics are
 * printed to /dev/null rather than dropped, so that the code printing source lines and carets is
 * fuzzed too.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull)
        devnull = fopen("/dev/null", "w");
    const char *src = (const char *)data;
    ptc_diag diag;
    ptc_diag_init(&diag, devnull, "fuzz.ptm", src, size);
    /* the checks that depend on the use (training, a data-parallel split) on half the inputs */
    ptc_frontend_opts fo = {.train = size & 1, .batch_split = (int)(size % 5)};
    ptc_graph *g = ptc_frontend_compile("fuzz.ptm", src, size, &fo, &diag);
    if (g) {
        char err[512];
        if (ptc_verify(g, err, sizeof err) != 0) {
            fprintf(stderr, "front end produced a graph that does not verify: %s\n", err);
            abort();
        }
        if (diag.nerrors != 0) {
            fprintf(stderr, "front end returned a graph after %d errors\n", diag.nerrors);
            abort();
        }
    } else if (diag.nerrors != 1) {
        fprintf(stderr, "front end failed with %d errors (one expected)\n", diag.nerrors);
        abort();
    }
    ptc_graph_free(g);
    return 0;
}
