/* cuda_loops.h - the analysis behind cuda_emit.c's mapping of loops onto threads (the mapping is
 * described in cuda_emit.h; ptc_cuda_launch, the launch it gives, is declared there). Internal to
 * codegen/cuda. */
#ifndef PTC_CUDA_LOOPS_H
#define PTC_CUDA_LOOPS_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_emit.h"
#include "kir.h"

/* x is a reduction (sum or max) */
bool ptc_cuda_is_reduce(const ptc_kx *x);
/* expression x holds a reduction */
bool ptc_cuda_has_reduce(const ptc_kir *k, int x);
/* statement list s holds a loop or a reduction */
bool ptc_cuda_has_loop(const ptc_kir *k, int s);
/* parallel loop st runs a block per iteration (a row) rather than a thread per iteration */
bool ptc_cuda_row_loop(const ptc_kir *k, const ptc_ks *st);
/* loop st's iterations may run on different threads: none stores an element another stores or
 * reads */
bool ptc_cuda_iterations_independent(const ptc_kir *k, const ptc_ks *st);
/* the parameter whose bytes param's are (itself, or the input an output is written over) */
int ptc_cuda_storage(const ptc_kir *k, int param);
/* marks rd[storage] for the storages expression x loads (inside its reductions too, unless
 * skip_reduce) */
void ptc_cuda_x_reads(const ptc_kir *k, int x, bool skip_reduce, uint8_t *rd);
/* the storages statement list s reads (rd) and writes (wr) */
void ptc_cuda_list_access(const ptc_kir *k, int s, uint8_t *rd, uint8_t *wr);

/* ---- packets (cuda_loops.c): a loop whose arrays sit at base + v takes vec consecutive
 * elements a thread, its streams loaded and stored 16 bytes at a time ---- */
#define PACKET_STREAMS 16 /* the most arrays a packed loop streams */

typedef struct ptc_cuda_packet {
    int vec; /* elements a thread takes at once; 0: the loop is not packed */
    int n;   /* streams: an array at base + v, 16 bytes at a time into/out of pk_<i> */
    int param[PACKET_STREAMS], index[PACKET_STREAMS];
    bool store[PACKET_STREAMS];
} ptc_cuda_packet;

/* the packet of a loop over var v < extent (statements body, or the reduced expression value if
 * body < 0); pk->vec 0 where the loop cannot be packed */
void ptc_cuda_packet_of(const ptc_kir *k, int v, int extent, int body, int value,
                        ptc_cuda_packet *pk);
/* the packet of a row's loop st (independent iterations, spread over a block's threads) */
void ptc_cuda_packet_of_for(const ptc_kir *k, const ptc_ks *st, ptc_cuda_packet *pk);
/* the packet of reduction x at a row's top level */
void ptc_cuda_packet_of_reduce(const ptc_kir *k, int x, ptc_cuda_packet *pk);
/* the stream of pk that loads (store false) or stores array param at index, or -1 */
int ptc_cuda_stream_of(const ptc_kir *k, const ptc_cuda_packet *pk, int param, int index,
                       bool store);

#endif
