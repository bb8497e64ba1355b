/* forge_step.c - a test tool for tests/robust/overflow.sh: copies a checkpoint with its step set
 * to any decimal string, resealed with a valid checksum, as a forged or damaged file could be.
 *   forge_step IN.safetensors STEP OUT.safetensors
 * Exit status 0, or 1 with a message. */
#include <stdio.h>
#include <string.h>

#include "safetensors.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: forge_step IN.safetensors STEP OUT.safetensors\n");
        return 1;
    }
    char err[1024];
    ptrt_st_file *f = ptrt_st_open(argv[1], err, sizeof err);
    if (!f) {
        fprintf(stderr, "forge_step: %s\n", err);
        return 1;
    }
    ptrt_st_writer *w = ptrt_st_writer_new();
    for (int i = 0; i < ptrt_st_nmeta(f); i++) {
        const char *key = ptrt_st_meta_key(f, i);
        if (strcmp(key, PTRT_ST_CHECKSUM_KEY) != 0) /* the writer seals the copy afresh */
            ptrt_st_add_meta(w, key,
                             strcmp(key, "ptc.step") == 0 ? argv[2] : ptrt_st_meta_value(f, i));
    }
    for (int i = 0; i < ptrt_st_ntensors(f); i++) {
        const ptrt_st_tensor *t = ptrt_st_tensor_at(f, i);
        ptrt_st_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    int rc = ptrt_st_save(w, argv[3], err, sizeof err);
    if (rc)
        fprintf(stderr, "forge_step: %s\n", err);
    ptrt_st_writer_free(w);
    ptrt_st_close(f);
    return rc ? 1 : 0;
}
