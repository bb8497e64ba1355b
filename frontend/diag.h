/* diag.h - clang-style diagnostics: "file:line:col: error: message", the source line and a caret.
 *
 * A diag context belongs to one compilation (no globals), so the front end is reentrant and the
 * fuzz harness can run it in a loop. Library code reports here and returns a status; only the
 * command-line driver decides to exit.
 */
#ifndef PTC_DIAG_H
#define PTC_DIAG_H

#include <stddef.h>
#include <stdio.h>

#include "ir.h"

typedef struct ptc_diag {
    FILE *out;        /* where messages go; NULL = discard */
    const char *file; /* name shown in messages */
    const char *src;  /* source text, for the line and caret (may be NULL) */
    size_t srclen;
    int nerrors;
} ptc_diag;

void ptc_diag_init(ptc_diag *d, FILE *out, const char *file, const char *src, size_t srclen);
/* Reports an error at loc (loc.file NULL means d->file; line 0 means no location). */
void ptc_diag_error(ptc_diag *d, ptc_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A note that follows an error (e.g. "in instance h.3.attn"), with its own location. */
void ptc_diag_note(ptc_diag *d, ptc_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
