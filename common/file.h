/* file.h - file helpers shared by the data and checkpoint layer: replacing a file atomically,
 * reading whole files with a bound, and the 64-bit hash (XXH64) that guards checkpoint data.
 *
 * Atomic replacement: a reader of PATH sees either the old file or the complete new one, never a
 * half-written file, even if the writer crashes or the machine loses power. The bytes go to
 * PATH.tmp.<pid> in the same directory, which is flushed and fsync'ed, then renamed over PATH, and
 * the directory is fsync'ed so the rename itself is durable.
 *
 * What PATH names decides how it is written:
 *   - nothing, or a regular file: atomic replacement as above. A symbolic link to a regular file
 *     is followed: its target is replaced and the link stays.
 *   - a character device (/dev/null, a terminal) or a FIFO: written straight through, as a shell
 *     redirection would; there is nothing to replace, and a device node must never become a
 *     regular file. A FIFO's open waits for its reader.
 *   - a directory, a block device or a socket: refused with a message naming PATH.
 * Tools refuse an output that is one of their inputs before they start (ptc_file_same).
 */
#ifndef PTC_FILE_H
#define PTC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A file being written; invisible under its final name until ptc_file_commit. */
typedef struct ptc_file_file {
    int fd;
    char *path; /* final name (the target of a symbolic link given as the name) */
    char *tmp;  /* PATH.tmp.<pid>; NULL when writing straight to a device or FIFO, whose mode
                   and owner a caller must then leave alone */
} ptc_file_file;

/* Opens PATH for writing as the header says: creates PATH.tmp.<pid> (replacing a stale one), or
 * opens the device or FIFO. Returns 0, or -1 with a message naming PATH. */
int ptc_file_create(ptc_file_file *f, const char *path, char *err, size_t errn);
/* Appends n bytes. Returns 0, or -1 with a message (the file stays open: call ptc_file_abort). */
int ptc_file_write(ptc_file_file *f, const void *p, size_t n, char *err, size_t errn);
/* fsyncs and closes the temporary file, renames it over the final name and fsyncs the directory.
 * Returns 0, or -1 with a message; on failure the temporary file is removed and the old file (if
 * any) is left untouched. Either way f is finished. */
int ptc_file_commit(ptc_file_file *f, char *err, size_t errn);
/* Closes and removes the temporary file; the final name is never touched. */
void ptc_file_abort(ptc_file_file *f);

/* Checks, before any work is done, that ptc_file_create(path) could write: path names a regular
 * file, a character device or a FIFO, or nothing in an existing directory that this process may
 * write. Returns 0, or -1 with a message naming path. */
int ptc_file_check_output(const char *path, char *err, size_t errn);

/* Whether a and b name one regular file: an existing one (through links, hard or symbolic, too),
 * or one neither has created yet (the same name in the same directory). */
bool ptc_file_same(const char *a, const char *b);

/* What a stat mode is, for messages: "a directory", "a character device", "a FIFO", ... */
const char *ptc_file_kind(unsigned mode);

/* Opens path for reading; it must be a regular file. Never blocks (a FIFO is refused at once, not
 * waited on). Returns the descriptor and its size, or -1 with a message naming the file. */
int ptc_file_open_regular(const char *path, size_t *size, char *err, size_t errn);

/* Reads all of path: a regular file, or a pipe or FIFO read to its end. At most max bytes: a
 * longer input (an endless stream such as a `yes` pipe) is refused once max + 1 bytes are read.
 * Devices (/dev/zero), directories and sockets are refused without reading. Never blocks in
 * open(): a FIFO with no writer reads as empty. Returns the NUL-terminated bytes (malloc'd; *len
 * gets their number), or NULL with a message naming path. */
char *ptc_file_read_all(const char *path, size_t max, size_t *len, char *err, size_t errn);

/* ptc's cache directory for `sub` ("kernels": compiled kernels; "": measurements kept per
 * machine): $XDG_CACHE_HOME/ptc/SUB, else $HOME/.cache/ptc/SUB, made (mkdir -p) when missing.
 * Returns buf, or NULL when neither variable is set or the directory cannot be had (a cache
 * then only costs what it would have saved). */
char *ptc_file_cache_dir(const char *sub, char *buf, size_t n);
/* mkdir -p path (its '/'s restored on return); false when the directory cannot be had. */
bool ptc_file_mkdirs(char *path);

/* Writes n bytes to path atomically (create + write + commit). */
int ptc_file_write_file(const char *path, const void *p, size_t n, char *err, size_t errn);

/* Whether standard output took everything printed on it: flushes it and looks at its error flag.
 * Returns 0, or -1 with the reason in err ("No space left on device"; "write error" when the
 * failed write left no reason behind). Call it right after the output: the reason of a write that
 * failed inside an earlier fputs is taken from errno when it is an I/O error. */
int ptc_file_check_stdout(char *err, size_t errn);

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
