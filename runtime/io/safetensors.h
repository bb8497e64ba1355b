/* safetensors.h - reading and writing safetensors files, the checkpoint format PyTorch users load
 * with `safetensors.torch.load_file`.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"key": "value", ...},
 *    "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
 * then the data section: every tensor's bytes (little-endian, row-major), offsets relative to the
 * start of the data, tensors back to back in the order of their offsets, with no gaps and nothing
 * after the last. The header is padded with spaces to a multiple of 8 bytes.
 *
 * Integrity: files written here carry "ptc.checksum": "xxh64:<16 lowercase hex digits>" in
 * __metadata__: the XXH64 (seed 0) of the whole data section followed by a fixed encoding of the
 * header's entries, so that damage to a dtype, a shape or a metadata value is caught like damage
 * to the data: for each metadata entry in header order except the checksum, "M" key NUL value NUL;
 * then for each tensor in name order (strcmp), "T" name NUL dtype NUL and the little-endian uint64s
 * ndim, each dimension, begin, end. Whitespace and the order of keys inside an entry are not
 * covered. The reader verifies the checksum when present and refuses a mismatch; files without one
 * (written by other tools) load after the structural checks alone, unless they have other "ptc."
 * metadata (then it was the checksum's own key that was damaged).
 *
 * The reader trusts nothing in the file: the header must be strict JSON of exactly the shape above
 * (objects, strings with escapes, integers, arrays of integers; valid UTF-8), no larger than 100 MB
 * or than the file, and every tensor's dtype, shape and offsets must agree with each other and
 * with the file size. A problem is reported with the file name and, for syntax, the byte offset.
 */
#ifndef PTRT_SAFETENSORS_H
#define PTRT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The dtypes of the safetensors format: X(name as spelled in the header, bytes per element). */
#define PTRT_ST_DTYPES(X)                                                                          \
    X(BOOL, 1)                                                                                     \
    X(U8, 1)                                                                                       \
    X(I8, 1)                                                                                       \
    X(F8_E4M3, 1)                                                                                  \
    X(F8_E5M2, 1)                                                                                  \
    X(I16, 2)                                                                                      \
    X(U16, 2)                                                                                      \
    X(F16, 2)                                                                                      \
    X(BF16, 2)                                                                                     \
    X(I32, 4)                                                                                      \
    X(U32, 4)                                                                                      \
    X(F32, 4)                                                                                      \
    X(F64, 8)                                                                                      \
    X(I64, 8)                                                                                      \
    X(U64, 8)

typedef enum ptrt_st_dtype {
#define PTRT_ST_ENUM_(name, size) PTRT_ST_##name,
    PTRT_ST_DTYPES(PTRT_ST_ENUM_)
#undef PTRT_ST_ENUM_
        PTRT_ST_NDTYPES
} ptrt_st_dtype;

const char *ptrt_st_dtype_name(ptrt_st_dtype dt);
size_t ptrt_st_dtype_size(ptrt_st_dtype dt);

#define PTRT_ST_MAXDIM 8
#define PTRT_ST_MAX_HEADER 100000000 /* bytes; the limit of the reference implementation */
#define PTRT_ST_CHECKSUM_KEY "ptc.checksum"

/* ---- reading ---- */

typedef struct ptrt_st_tensor {
    const char *name;
    ptrt_st_dtype dtype;
    int ndim;
    int64_t shape[PTRT_ST_MAXDIM];
    int64_t numel;
    const void *data; /* in the file's mapping until ptrt_st_close; little-endian; byte-aligned */
    size_t nbytes;
} ptrt_st_tensor;

typedef struct ptrt_st_file ptrt_st_file;

/* Opens (memory-maps) and validates a file, verifying the ptc checksum when present. Returns NULL
 * with a message naming the file and the problem. */
ptrt_st_file *ptrt_st_open(const char *path, char *err, size_t errn);
/* The same over bytes in memory, which must outlive the result; name is used in messages. */
ptrt_st_file *ptrt_st_parse(const char *name, const void *buf, size_t n, char *err, size_t errn);
void ptrt_st_close(ptrt_st_file *f);

/* Tensors in the order of their data offsets. */
int ptrt_st_ntensors(const ptrt_st_file *f);
const ptrt_st_tensor *ptrt_st_tensor_at(const ptrt_st_file *f, int i);
/* The tensor called name, or NULL. */
const ptrt_st_tensor *ptrt_st_find(const ptrt_st_file *f, const char *name);

/* __metadata__ entries in header order; ptrt_st_meta gives the value of key, or NULL. */
int ptrt_st_nmeta(const ptrt_st_file *f);
const char *ptrt_st_meta_key(const ptrt_st_file *f, int i);
const char *ptrt_st_meta_value(const ptrt_st_file *f, int i);
const char *ptrt_st_meta(const ptrt_st_file *f, const char *key);
/* Whether the file carried a ptc checksum (it was verified: a mismatch fails ptrt_st_open). */
bool ptrt_st_checksummed(const ptrt_st_file *f);

/* Copies t into out (t->numel floats), converting from F32, F64, F16 or BF16. Returns -1 with a
 * message for other dtypes. */
int ptrt_st_to_f32(const ptrt_st_tensor *t, float *out, char *err, size_t errn);
/* Copies t into out (t->numel values), converting from any integer dtype or BOOL (U64 values above
 * INT64_MAX are refused). Returns -1 with a message for floating dtypes. */
int ptrt_st_to_i64(const ptrt_st_tensor *t, int64_t *out, char *err, size_t errn);

/* ---- writing ---- */

typedef struct ptrt_st_writer ptrt_st_writer;

ptrt_st_writer *ptrt_st_writer_new(void);
void ptrt_st_writer_free(ptrt_st_writer *w);
/* Adds a tensor (name and shape are copied; data, little-endian and numel * dtype size bytes, is
 * only borrowed until ptrt_st_save). Tensors are stored in the order they are added. */
void ptrt_st_add(ptrt_st_writer *w, const char *name, ptrt_st_dtype dt, int ndim,
                 const int64_t *shape, const void *data);
/* Adds a __metadata__ entry (copied). The checksum key is reserved for ptrt_st_save. */
void ptrt_st_add_meta(ptrt_st_writer *w, const char *key, const char *value);
/* Writes everything added so far to path, atomically (see io.h), with the checksum. Names,
 * shapes and keys are checked first: duplicates, "__metadata__" as a tensor name, more than
 * PTRT_ST_MAXDIM dimensions or a negative one give -1 with a message and nothing is written. */
int ptrt_st_save(const ptrt_st_writer *w, const char *path, char *err, size_t errn);

#endif
