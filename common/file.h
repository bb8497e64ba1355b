/* file.h - file helpers shared by the data and checkpoint layer: replacing a file atomically, and the
 * 64-bit hash (XXH64) that guards checkpoint data.
 *
 * Atomic replacement: a reader of PATH sees either the old file or the complete new one, never a
 * half-written file, even if the writer crashes or the machine loses power. The bytes go to
 * PATH.tmp.<pid> in the same directory, which is flushed and fsync'ed, then renamed over PATH, and
 * the directory is fsync'ed so the rename itself is durable.
 */
#ifndef PTC_FILE_H
#define PTC_FILE_H

#include <stddef.h>
#include <stdint.h>

/* A file being written; invisible under its final name until ptc_file_commit. */
typedef struct ptc_file_file {
    int fd;
    char *path; /* final name */
    char *tmp;  /* PATH.tmp.<pid> */
} ptc_file_file;

/* Creates PATH.tmp.<pid> for writing (replacing a stale one). Returns 0, or -1 with a message. */
int ptc_file_create(ptc_file_file *f, const char *path, char *err, size_t errn);
/* Appends n bytes. Returns 0, or -1 with a message (the file stays open: call ptc_file_abort). */
int ptc_file_write(ptc_file_file *f, const void *p, size_t n, char *err, size_t errn);
/* fsyncs and closes the temporary file, renames it over the final name and fsyncs the directory.
 * Returns 0, or -1 with a message; on failure the temporary file is removed and the old file (if
 * any) is left untouched. Either way f is finished. */
int ptc_file_commit(ptc_file_file *f, char *err, size_t errn);
/* Closes and removes the temporary file; the final name is never touched. */
void ptc_file_abort(ptc_file_file *f);

/* Opens path for reading; it must be a regular file. Returns the descriptor and its size, or -1
 * with a message naming the file. */
int ptc_file_open_regular(const char *path, size_t *size, char *err, size_t errn);

/* Writes n bytes to path atomically (create + write + commit). */
int ptc_file_write_file(const char *path, const void *p, size_t n, char *err, size_t errn);

/* XXH64 (the published xxHash 64-bit algorithm), one shot and streaming. */
uint64_t ptc_hash64(const void *p, size_t n, uint64_t seed);

typedef struct ptc_hash64_state {
    uint64_t v[4];
    uint64_t total, seed;
    unsigned char buf[32];
    size_t nbuf;
} ptc_hash64_state;

void ptc_hash64_init(ptc_hash64_state *s, uint64_t seed);
void ptc_hash64_update(ptc_hash64_state *s, const void *p, size_t n);
uint64_t ptc_hash64_final(const ptc_hash64_state *s);

#endif
