/* fuzz_util.h - what the file-reading harnesses share: the fuzzer's bytes as a file (the readers
 * under test take paths), and seed files made by the library itself, so that the seeds always
 * follow the current format.
 */
#ifndef PTC_FUZZ_UTIL_H
#define PTC_FUZZ_UTIL_H

#define _GNU_SOURCE 1 /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The bytes as a regular file in memory (no disk): a path that opens the same memfd every call,
 * its contents replaced. */
static const char *fuzz_as_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ptc-fuzz", 0);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) {
        perror("fuzz_as_file");
        abort();
    }
    return path;
}

/* Seeds: with PTC_FUZZ_SEEDS=DIR in the environment, a harness writes its seed files into DIR
 * from LLVMFuzzerInitialize and exits (tests/fuzz/run.sh does this before fuzzing). */
static const char *fuzz_seed_dir(void)
{
    return getenv("PTC_FUZZ_SEEDS");
}

#endif
