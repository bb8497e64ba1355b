/* spmd.h - running one rank of an SPMD program: collectives through the communicator, and the
 * local ops whose result depends on the rank's mesh coordinate (shard slices, the pieces of
 * vocabulary-parallel embedding and cross-entropy, attention over this rank's query heads).
 *
 * Every collective and rank-dependent op of a program goes through ptrt_spmd_run (the
 * interpreter's SPMD hook); everything else through the kernels (reference or fast CPU).
 */
#ifndef PTRT_SPMD_H
#define PTRT_SPMD_H

#include <stdint.h>

#include "comm.h"
#include "ir.h"

typedef struct ptrt_spmd_ctx {
    ptrt_comm *comm;
    const ptc_mesh *mesh;
    int rank;
    int coords[PTC_MAX_MESH_AXES];
    int64_t step; /* for messages and matching */
    int index;    /* collectives issued in this step so far */
    int drop;     /* test hook: this rank skips its collective number `drop` (-1: none) */
} ptrt_spmd_ctx;

void ptrt_spmd_ctx_init(ptrt_spmd_ctx *c, ptrt_comm *comm, const ptc_mesh *mesh, int rank);

/* Runs node n for rank c (the ptrt_kernel_fn contract plus the rank). Ops that are neither
 * collectives nor rank-dependent are refused. */
int ptrt_spmd_run(ptrt_spmd_ctx *c, const ptc_node *n, const ptc_type *it, void *const *in,
                  const ptc_type *ot, void *const *out, char *err, size_t errn);

/* The rank-dependent and vocabulary-parallel kernels, with the rank's coordinate c on the op's
 * mesh axis (exposed for tests). */
int ptrt_spmd_kernel(const ptc_node *n, int c, const ptc_type *it, void *const *in,
                     const ptc_type *ot, void *const *out, char *err, size_t errn);

/* Element index in the full (logical) tensor of element i of a rank's local part of a value with
 * local type t and placements pl on mesh m, for the rank at coords. Placements are applied
 * innermost axis first (as the partitioner does), so this undoes them outermost first. */
int64_t ptrt_spmd_global_index(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m,
                               const int *coords, int64_t i);
/* The full (logical) type of a value with local type t and placements pl. */
ptc_type ptrt_spmd_global_type(const ptc_type *t, const ptc_placement *pl, const ptc_mesh *m);

#endif
