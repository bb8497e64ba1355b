/* kernel.h - one call of a kernel, as every backend's kernels receive it.
 *
 * The executor builds one per kernel instruction of a rank's program: the op and its attributes
 * from the plan, and the rank's coordinate on the op's mesh axis for the ops whose result depends
 * on it (shard slices, the pieces of vocabulary-parallel embedding and cross-entropy, attention
 * over this rank's heads). Operands and results come as typed pointers beside it.
 *
 * Storage: f32 and i32 operands are 4 bytes an element. Of the kernels, casts read and write
 * bf16 and f16 storage (2 bytes), and so do the ops of ptc_op_storage16 (attention and its
 * gradient, concat, sum_to, sumsq, the norms' gradients) over 16-bit operands: they widen them as
 * they load, compute in f32 and round their 16-bit results as they store (ptrt_storage16 in
 * ref.h; the fusion pass folds the casts around them into them). Fused kernels declare their
 * parameters' dtypes.
 */
#ifndef PTRT_KERNEL_H
#define PTRT_KERNEL_H

#include <stddef.h>

#include "ir.h"

/* A hot loop of plain C compiled three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and
 * the baseline, the copy for the running CPU chosen once when the program loads (GCC's function
 * multiversioning through an ifunc). The files that use it are built at -O3 (runtime/
 * CMakeLists.txt), so the loops vectorize at each level's width. Which copy runs is fixed for a
 * process, so results still do not depend on the thread count; the v3 and v4 copies may contract
 * a * b + c into one FMA where the baseline rounds twice, which is why kernels that promise the
 * reference's bits keep to adds and exact products there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) &&       \
    !defined(__SANITIZE_THREAD__) /* (ThreadSanitizer's code in an ifunc resolver: a crash) */
#define PTRT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PTRT_CLONES
#endif

typedef struct ptrt_kcall {
    ptc_op op;
    int nin, nout;
    ptc_attrs attrs;
    int coord; /* this rank's coordinate on attrs.mesh_axis (0 without a mesh) */
} ptrt_kcall;

/* in[i] points at operand i of type it[i], out[j] at result j of type ot[j]. Returns 0, or -1
 * with a message in err for bad data (an id or target out of range) or an op it cannot run. */
typedef int (*ptrt_kernel_fn)(const ptrt_kcall *k, const ptc_type *it, void *const *in,
                              const ptc_type *ot, void *const *out, char *err, size_t errn);

#endif
