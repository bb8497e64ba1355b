/* ref_grad.h - the CPU reference kernels of the internal ops (ops.def after "internal ops"): the
 * backward ops autodiff emits, the broadcasting adjoints, and the optimizer updates.
 *
 * They follow the conventions of ref.h (row-major, float storage for every float dtype, int32_t for
 * i32, double accumulation) and are the reference that faster backends are tested against.
 * ptrt_ref_run sends every internal op here; calling this directly is the same thing.
 */
#ifndef PTRT_REF_GRAD_H
#define PTRT_REF_GRAD_H

#include <stddef.h>

#include "kernel.h"

/* Runs the internal op n (FILL .. SGD_UPDATE) like ptrt_ref_run: in[i] is operand i of type it[i],
 * out[j] the allocated result j of type ot[j] (results never alias operands). Returns 0, or -1 with
 * a message in err for bad data (an id or target out of range), for STATE (a source the executor
 * fills) and for an op that is not internal. bf16/f16 results are rounded to their format. */
int ptrt_ref_run_internal(const ptrt_kcall *n, const ptc_type *it, void *const *in,
                          const ptc_type *ot, void *const *out, char *err, size_t errn);

#endif
