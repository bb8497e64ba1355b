/* peak.h - the CPU's FLOP rate for the runner's MFU, where no --peak-flops is given: the best
 * 1024^3 GEMM on the CPU backend's threads, measured once per machine, GEMM library, operand
 * dtype, float32 matmul precision and thread count, and kept in the cache directory. */
#ifndef PTRT_PEAK_H
#define PTRT_PEAK_H

#include <stdbool.h>

#include "program.h"

/* Whether plan p's GEMMs run on the CPU library's bf16 GEMM (their operands are bf16): its peak,
 * not f32's, is theirs. */
bool ptrt_peak_bf16(const ptc_plan *p);
/* The FLOP/s of that GEMM (bf16 operands or f32 ones) at `threads` threads. */
double ptrt_peak_flops(int threads, bool bf16);
/* A run reached `rate` FLOP/s of model FLOPs: where that is above the kept peak, the measurement
 * was low (taken while the machine was busy, say) and `rate` is kept in its place, so that no
 * later run shows an MFU above 100% for it either. */
void ptrt_peak_flops_seen(int threads, bool bf16, double rate);

#endif
