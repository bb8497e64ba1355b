/* data.h - training data: llm.c token files and the batches a trainer reads from them.
 *
 * File format (llm.c's, so files made by its scripts work unchanged): a header of 256 little-endian
 * int32 (header[0] = magic 20240520, header[1] = version 1, header[2] = number of tokens), then
 * that many little-endian uint16 token ids and nothing else.
 *
 * Batches. The tokens are cut into windows of T+1 tokens starting every T tokens: window w covers
 * tokens [w*T, w*T + T], so there are W = (ntokens - 1) / T windows, and an epoch is W / B batches
 * (a last, partial batch is dropped). Row b of a batch is one window: inputs are its first T
 * tokens, targets its last T (the inputs shifted by one).
 *   - In order (shuffle off), batch k of every epoch takes windows kB .. kB+B-1, i.e. the B*T+1
 *     contiguous tokens from k*B*T: exactly llm.c's DataLoader, which starts again from the
 *     beginning when the next batch would run past the end.
 *   - Shuffled, epoch e visits the windows in a permutation drawn from a PRNG keyed by
 *     (seed, e): every epoch has its own order, and the same seed gives the same batches.
 *
 * The position is one number, the count of batches served since the start; ptrt_data_seek to a
 * saved position reads exactly the batches an uninterrupted run would have read next.
 */
#ifndef PTRT_DATA_H
#define PTRT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PTRT_DATA_MAGIC 20240520
#define PTRT_DATA_VERSION 1
#define PTRT_DATA_HEADER_BYTES 1024

typedef struct ptrt_data ptrt_data;

/* Opens and validates a token file: magic, version, exact size (1024 + 2 * ntokens bytes), and
 * every token id below vocab (vocab <= 0 skips that check). The tokens are memory-mapped. Returns
 * NULL with a message naming the file and the problem. */
ptrt_data *ptrt_data_open(const char *path, int vocab, char *err, size_t errn);
void ptrt_data_close(ptrt_data *d);

/* Checks the tokens against the model that reads them. A token is a model input (every token but
 * the last) and a target (every token but the first): as an input it must be below input_bound
 * (the rows of the embedding that reads it), as a target below target_bound (the classes of the
 * cross_entropy that reads it); a bound <= 0 is not checked. Returns 0, or -1 with a message that
 * names the file, the position and value of the first bad token, and the bound and its op. */
int ptrt_data_check_ids(const ptrt_data *d, int64_t input_bound, int64_t target_bound, char *err,
                        size_t errn);

size_t ptrt_data_ntokens(const ptrt_data *d);
/* Token i (i < ntokens). */
uint16_t ptrt_data_token(const ptrt_data *d, size_t i);

/* Sets the batch shape and order and goes to position 0. Returns -1 with a message when B or T is
 * not positive or the file holds fewer than B*T+1 tokens (not even one batch). */
int ptrt_data_configure(ptrt_data *d, int B, int T, bool shuffle, uint64_t seed, char *err,
                        size_t errn);

/* Fills inputs and targets (B*T int32 each, row-major [B][T]) with the next batch and advances.
 * ptrt_data_configure must have succeeded. */
void ptrt_data_next_batch(ptrt_data *d, int32_t *inputs, int32_t *targets);
/* The same for rows [row0, row1) of the batch alone (the rest of the arrays is left as it is):
 * a data-parallel rank reads only its own sequences of the file, and advances. */
void ptrt_data_next_rows(ptrt_data *d, int row0, int row1, int32_t *inputs, int32_t *targets);

/* Batches served since position 0 (what a checkpoint saves). */
uint64_t ptrt_data_position(const ptrt_data *d);
/* Goes to a position returned by ptrt_data_position (any value is valid; epochs repeat). */
void ptrt_data_seek(ptrt_data *d, uint64_t position);
uint64_t ptrt_data_batches_per_epoch(const ptrt_data *d);
/* The epoch the next batch belongs to. */
uint64_t ptrt_data_epoch(const ptrt_data *d);

/* Writes tokens as an llm.c token file, atomically (temporary file, fsync, rename). n must fit the
 * header's int32 count. Returns 0, or -1 with a message. */
int ptrt_data_write(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errn);

#endif
