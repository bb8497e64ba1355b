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

#endif
