/* init.c - deterministic initial values of parameters.
 *
 * The language page requires element i of parameter P to be a pure function of (seed, P's full
 * name, i), so that the same model comes out whatever the mesh, stage cut or rank count: a rank
 * holding elements offset..offset+n-1 computes exactly those, with no state carried between
 * elements. The generator is counter-based (splitmix64 indexed by the element), so this is direct.
 *
 * The exact function (all arithmetic on unsigned 64-bit integers, wrapping; reimplement it from
 * this comment, e.g. in Python with `& (2**64 - 1)`):
 *
 *   GOLDEN = 0x9E3779B97F4A7C15
 *   mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
 *              z = (z ^ (z >> 27)) * 0x94D049BB133111EB
 *              return z ^ (z >> 31)                      (splitmix64's output function)
 *   fnv1a64(name): h = 0xCBF29CE484222325; for each byte c of the UTF-8 name (no terminator):
 *              h = (h ^ c) * 0x100000001B3
 *   key      = mix64(fnv1a64(name) ^ mix64(seed + GOLDEN))
 *   bits(k)  = mix64(key + (k + 1) * GOLDEN)             (the k-th output of splitmix64 seeded key)
 *   u01(k)   = (bits(k) >> 11) * 2^-53                   in [0, 1)
 *   u01c(k)  = ((bits(k) >> 11) + 1) * 2^-53             in (0, 1]
 *
 *   The fp32 master weight of a 16-bit parameter (optim.master.NAME, --precision) takes NAME's
 *   key: the parameter's working copy is its master rounded to 16 bits.
 *
 *   element i (0-based, over the whole parameter in row-major order), computed in double and then
 *   rounded to the nearest float:
 *     zeros:            0
 *     ones:             1
 *     constant(v):      v
 *     uniform(lo, hi):  lo + (hi - lo) * u01(2i)         (in [lo, hi]; hi only through rounding)
 *     normal(std):      std * sqrt(-2 ln u01c(2i)) * cos(2 pi u01(2i+1))      (Box-Muller)
 */
#include <math.h>
#include <string.h>

#include "exec.h"

#define GOLDEN 0x9E3779B97F4A7C15ull

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 0x100000001B3ull;
    return h;
}

static uint64_t bits(uint64_t key, uint64_t k)
{
    return mix64(key + (k + 1) * GOLDEN);
}

static double u01(uint64_t key, uint64_t k)
{
    return (double)(bits(key, k) >> 11) * 0x1p-53;
}

static double u01c(uint64_t key, uint64_t k)
{
    return (double)((bits(key, k) >> 11) + 1) * 0x1p-53;
}

static double init_value(const ptc_init *init, uint64_t key, uint64_t i)
{
    switch (init->kind) {
    case PTC_INIT_ZEROS: return 0.0;
    case PTC_INIT_ONES: return 1.0;
    case PTC_INIT_CONSTANT: return init->a;
    case PTC_INIT_UNIFORM: return init->a + (init->b - init->a) * u01(key, 2 * i);
    case PTC_INIT_NORMAL: {
        const double two_pi = 6.28318530717958647692;
        double r = sqrt(-2.0 * log(u01c(key, 2 * i)));
        return init->a * r * cos(two_pi * u01(key, 2 * i + 1));
    }
    }
    PTC_UNREACHABLE("unknown init kind");
}

void ptrt_init_param(const ptc_init *init, const char *name, uint64_t seed, float *out,
                     int64_t offset, int64_t n)
{
    PTC_ASSERT(offset >= 0 && n >= 0);
    if (!name)
        name = "";
    else if (strncmp(name, PTC_MASTER_PREFIX, strlen(PTC_MASTER_PREFIX)) == 0)
        name += strlen(PTC_MASTER_PREFIX);
    uint64_t key = mix64(fnv1a64(name) ^ mix64(seed + GOLDEN));
    for (int64_t j = 0; j < n; j++)
        out[j] = (float)init_value(init, key, (uint64_t)(offset + j));
}
