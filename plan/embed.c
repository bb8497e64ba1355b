/* plan_embed.c - writing and reading the plan carried by a compiled executable (see header). */
#include "embed.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file.h"
#include "util.h"

int ptrt_plan_write_exe(const char *runner, const char *plan, size_t planlen, const char *out,
                        char *err, size_t errn)
{
    size_t n;
    char *bin = ptc_read_file(runner, &n);
    if (!bin) {
        ptc_fmt(err, errn, "cannot read the runner '%s': %s", runner, strerror(errno));
        return -1;
    }
    unsigned char trailer[16];
    for (int i = 0; i < 8; i++)
        trailer[i] = (unsigned char)((uint64_t)planlen >> (8 * i));
    memcpy(trailer + 8, PTRT_PLAN_MAGIC, 8);
    ptc_file_file f;
    int rc = -1;
    if (ptc_file_create(&f, out, err, errn) == 0) {
        if (ptc_file_write(&f, bin, n, err, errn) < 0 ||
            ptc_file_write(&f, plan, planlen, err, errn) < 0 ||
            ptc_file_write(&f, trailer, sizeof trailer, err, errn) < 0) {
            ptc_file_abort(&f);
        } else if (fchmod(f.fd, 0755) < 0) {
            ptc_fmt(err, errn, "%s: cannot make it executable: %s", out, strerror(errno));
            ptc_file_abort(&f);
        } else {
            rc = ptc_file_commit(&f, err, errn);
        }
    }
    free(bin);
    return rc;
}

char *ptrt_plan_read_exe(const char *path, char *err, size_t errn)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ptc_fmt(err, errn, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    unsigned char trailer[16];
    char *plan = NULL;
    long size;
    if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 16 || fseek(f, size - 16, SEEK_SET) < 0 ||
        fread(trailer, 1, 16, f) != 16 || memcmp(trailer + 8, PTRT_PLAN_MAGIC, 8) != 0) {
        ptc_fmt(err, errn, "%s carries no plan: build executables with `ptc MODEL.ptm -o NAME`",
                path);
        goto out;
    }
    uint64_t len = 0;
    for (int i = 0; i < 8; i++)
        len |= (uint64_t)trailer[i] << (8 * i);
    if (len > (uint64_t)size - 16) {
        ptc_fmt(err, errn, "%s: corrupt plan trailer", path);
        goto out;
    }
    plan = ptc_xmalloc((size_t)len + 1);
    if (fseek(f, size - 16 - (long)len, SEEK_SET) < 0 || fread(plan, 1, (size_t)len, f) != len) {
        ptc_fmt(err, errn, "%s: cannot read the plan", path);
        free(plan);
        plan = NULL;
        goto out;
    }
    plan[len] = 0;
out:
    fclose(f);
    return plan;
}
