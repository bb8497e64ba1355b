/* frontend.h - .ptm text to the checked, unrolled logical IR.
 *
 * Lexing and parsing are flex + bison (reentrant, with locations) into an AST; lowering evaluates
 * consts (with -D overrides), instantiates blocks with their scopes, unrolls `repeat`, names
 * parameters as the language page says, and builds IR nodes through the IR builder, whose shape
 * inference reports mismatches; the front end attaches file:line:col.
 */
#ifndef PTC_FRONTEND_H
#define PTC_FRONTEND_H

#include <stddef.h>

#include "diag.h"
#include "ir.h"

/* A `-D NAME=VALUE` override of a const. */
typedef struct ptc_define {
    const char *name;
    double value;
} ptc_define;

/* What a compile learned about the model, for a caller that compiles it again with other
 * consts: the consts that the first two dimensions of the model's first i32 input are written as
 * (`tokens: i32[batch, seq]` gives "batch" and "seq"), "" where a dimension is not a const's
 * name. */
typedef struct ptc_frontend_info {
    char batch_const[64], seq_const[64];
} ptc_frontend_info;

typedef struct ptc_frontend_opts {
    const ptc_define *defines;
    int ndefines;
    /* Checks that depend on how the model will be used, reported at the line that must change:
     * train - training is asked for: a model without parameters is an error;
     * batch_split - the data-parallel degree (dp of the mesh; 0 or 1: none): dp splits every
     *   model input along its first dimension, which must then divide by it;
     * microbatches - the step's batch is also split in time into this many (0 or 1: none);
     * batch_axes - how messages name the data-parallel degree: NULL for "mesh axis dp=N", else
     *   the axes that make it up, e.g. "dp x ep" (expert parallelism splits the batch too). */
    bool train;
    int batch_split;
    int microbatches;
    const char *batch_axes;
    ptc_frontend_info *info; /* filled when not NULL */
} ptc_frontend_opts;

/* Compiles the .ptm source `src` (srclen bytes, need not be NUL-terminated; `path` is the name used
 * in messages). Returns the graph, or NULL after reporting every error to diag (diag->nerrors > 0).
 * Never crashes, never hangs, whatever the bytes. */
ptc_graph *ptc_frontend_compile(const char *path, const char *src, size_t srclen,
                                const ptc_frontend_opts *opts, ptc_diag *diag);

/* Parses "NAME=VALUE" for -D; returns 0, or -1 if malformed. name points into an arena-free copy
 * owned by the caller (the string is modified in place). */
int ptc_define_parse(char *arg, ptc_define *out);

#endif
