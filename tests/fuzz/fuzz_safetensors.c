/* fuzz_safetensors.c - libFuzzer harness for the safetensors reader: any bytes must give either a
 * file whose every tensor lies inside the input, or a refusal with a message; never a crash, an
 * out-of-bounds read or a leak. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    ptrt_st_file *f = ptrt_st_parse("fuzz", data, size, err, sizeof err);
    if (!f)
        return 0;
    for (int i = 0; i < ptrt_st_ntensors(f); i++) {
        const ptrt_st_tensor *t = ptrt_st_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size || ptrt_st_find(f, t->name) != t)
            __builtin_trap();
        volatile uint8_t sum = 0; /* every byte read: ASan checks the bounds it claims */
        for (size_t k = 0; k < t->nbytes; k++)
            sum ^= p[k];
        (void)sum;
    }
    for (int i = 0; i < ptrt_st_nmeta(f); i++)
        if (ptrt_st_meta(f, ptrt_st_meta_key(f, i)) == NULL)
            __builtin_trap();
    ptrt_st_close(f);
    return 0;
}
