/* half.c - rounding to bf16 and f16 and their 2-byte storage (see half.h). */
#include "half.h"

#include <math.h>
#include <string.h>

/* Rounds x to a binary format with p significand bits (the implicit one included), smallest normal
 * exponent emin (below it the spacing stays 2^(emin-p+1): subnormals) and largest finite value max.
 * Round to nearest, ties to even; beyond max (after rounding) is infinity; NaN stays NaN. Every
 * step is exact in double except the one rounding decision, which is made on integers. */
static double round_format(double x, int p, int emin, double max)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    int exp = e - 1 < emin ? emin : e - 1;
    int qexp = exp - p + 1;            /* the spacing of the format near |x| is 2^qexp */
    double s = ldexp(fabs(x), -qexp);  /* |x| in units of the spacing: < 2^p */
    double q = floor(s), frac = s - q; /* both exact */
    if (frac > 0.5 || (frac == 0.5 && fmod(q, 2.0) == 1.0))
        q += 1;
    double r = ldexp(q, qexp);
    if (r > max)
        r = INFINITY;
    return copysign(r, x);
}

/* bf16: 8 significand bits and the exponent range of f32.
 * f16: 11 significand bits, normals from 2^-14, largest finite 65504. */
double ptc_round_bf16(double x)
{
    return round_format(x, 8, -126, ldexp(255.0, 120)); /* (2 - 2^-7) * 2^127 */
}

double ptc_round_f16(double x)
{
    return round_format(x, 11, -14, 65504.0);
}

uint16_t ptc_bf16_bits(double x)
{
    float r = (float)ptc_round_bf16(x); /* exact in bf16, so its low 16 bits are zero */
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    if (isnan(r))
        u = 0x7fc00000u | (u & 0x80000000u);
    return (uint16_t)(u >> 16);
}

float ptc_bf16_value(uint16_t bits)
{
    uint32_t u = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t ptc_f16_bits(double x)
{
    double r = ptc_round_f16(x);
    uint16_t sign = signbit(r) ? 0x8000 : 0;
    double a = fabs(r);
    if (isnan(r))
        return 0x7e00;
    if (isinf(r))
        return (uint16_t)(sign | 0x7c00);
    if (a < ldexp(1.0, -14)) /* subnormal: a multiple of 2^-24 */
        return (uint16_t)(sign | (uint16_t)ldexp(a, 24));
    int e;
    double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2 - 1) * 1024));
}

float ptc_f16_value(uint16_t bits)
{
    int e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (float)(bits & 0x8000 ? -v : v);
}

