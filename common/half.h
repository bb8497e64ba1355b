/* half.h - the 16-bit floating formats, in one place: rounding to bfloat16 and IEEE half
 * precision, and their 2-byte storage. Kernels, casts, the communicators and the executor's
 * buffer fills all round through here, so every layer rounds alike.
 *
 * Rounding is to nearest, ties to even; beyond the largest finite value (after rounding) is
 * infinity; NaN stays NaN. It works from a double, so a value held exactly in double (an i32, a
 * sum accumulated in double) is rounded once.
 */
#ifndef PTC_HALF_H
#define PTC_HALF_H

#include <stdint.h>

/* x rounded to bf16 (8 significand bits, f32's exponent range) / f16 (11 bits, normals from
 * 2^-14, largest 65504), as a double. */
double ptc_round_bf16(double x);
double ptc_round_f16(double x);

/* The 2-byte storage: x rounded once to the format's bits, and the value of bits. */
uint16_t ptc_bf16_bits(double x);
float ptc_bf16_value(uint16_t bits);
uint16_t ptc_f16_bits(double x);
float ptc_f16_value(uint16_t bits);

#endif
