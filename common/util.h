/* util.h - small pieces every layer uses: an arena that is freed in one call, an assert that stays
 * on in release builds and names file:line, checked size arithmetic, and a growable array macro.
 */
#ifndef PTC_UTIL_H
#define PTC_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Always-on assert for internal invariants (never for user errors). */
#define PTC_ASSERT(c)                                                                              \
    do {                                                                                           \
        if (!(c))                                                                                  \
            ptc_assert_fail(__FILE__, __LINE__, #c);                                               \
    } while (0)
/* Marks code that cannot be reached (the compiler knows it does not return, even at -O0). */
#define PTC_UNREACHABLE(what) ptc_assert_fail(__FILE__, __LINE__, "unreachable: " what)
_Noreturn void ptc_assert_fail(const char *file, int line, const char *cond);

/* Arena: bump allocation in chunks; everything is released by ptc_arena_free. */
typedef struct ptc_arena ptc_arena;
ptc_arena *ptc_arena_new(void);
void ptc_arena_free(ptc_arena *a);
void *ptc_arena_alloc(ptc_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *ptc_arena_strdup(ptc_arena *a, const char *s);
char *ptc_arena_strndup(ptc_arena *a, const char *s, size_t n);
char *ptc_arena_printf(ptc_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* malloc/realloc that abort with a message on exhaustion (out of memory is not a user error). */
void *ptc_xmalloc(size_t n);
void *ptc_xcalloc(size_t n, size_t size);
void *ptc_xrealloc(void *p, size_t n);
char *ptc_xstrdup(const char *s);

/* Grows (ptr, cap) so that index n is valid; elements are zeroed. */
#define PTC_GROW(ptr, cap, n)                                                                      \
    do {                                                                                           \
        if ((n) >= (cap)) {                                                                        \
            int ptc_nc_ = (cap) ? (cap)*2 : 16;                                                    \
            while (ptc_nc_ <= (n))                                                                 \
                ptc_nc_ *= 2;                                                                      \
            (ptr) = ptc_xrealloc((ptr), (size_t)ptc_nc_ * sizeof *(ptr));                          \
            memset((ptr) + (cap), 0, (size_t)(ptc_nc_ - (cap)) * sizeof *(ptr));                   \
            (cap) = ptc_nc_;                                                                       \
        }                                                                                          \
    } while (0)

/* a*b into *out; false on overflow of int64 or a negative operand. */
bool ptc_mul_ok(int64_t a, int64_t b, int64_t *out);

/* snprintf that tolerates truncation and returns its buffer. */
char *ptc_fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes s as a quoted JSON string through put(ctx, bytes, n): quotes and backslashes escaped,
 * control characters as \u00XX, everything else (UTF-8 included) as it is. The one JSON string
 * writer of the project (plans, safetensors headers). */
void ptc_json_quote(const char *s, void (*put)(void *ctx, const char *p, size_t n), void *ctx);

/* Reads a whole file; returns malloc'd NUL-terminated text (and its length) or NULL with errno. */
/* Glob match where '*' matches any run of characters (none included) and every other character
 * itself, as --place patterns are written. Time O(|pattern| + |name|), whatever the pattern: the
 * pieces between stars are found leftmost-first (Knuth-Morris-Pratt), which is enough because a
 * '*' can absorb whatever lies between two pieces, so no choice ever has to be undone. */
bool ptc_glob_match(const char *pattern, const char *name);

/* The closest of n names to `name` for a "did you mean": at most strlen(name)/3 edits away
 * (Levenshtein, letter case ignored, a difference of case alone counting least), never name
 * itself; NULL if none is that close. Names longer than 64 bytes are never suggested. */
const char *ptc_similar(const char *name, const char *const *cands, int n);

/* Reads a whole file; returns malloc'd NUL-terminated text (and its length) or NULL with errno.
 * Only regular files and pipes are read (others: ENODEV; a directory: EISDIR), without blocking in
 * open(), and at most max bytes (longer: EFBIG). ptc_file_read_all gives the reason in words. */
char *ptc_read_file_max(const char *path, size_t max, size_t *len);
/* ptc_read_file_max with no practical bound (1 TiB). */
char *ptc_read_file(const char *path, size_t *len);

#endif
