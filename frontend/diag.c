/* diag.c - clang-style diagnostics (see diag.h):
 *
 *     model.ptm:12:19: error: shape mismatch in matmul: f32[4,64,64] and f32[32,64] (...)
 *         x = x @ w
 *               ^
 *
 * The source line is printed as it is, except that control bytes become spaces so that a stray
 * NUL or escape sequence in the input cannot garble a terminal; the caret line copies tabs and
 * skips UTF-8 continuation bytes so the caret stays under its column.
 */
#include "diag.h"

#include <stdarg.h>
#include <string.h>

void ptc_diag_init(ptc_diag *d, FILE *out, const char *file, const char *src, size_t srclen)
{
    memset(d, 0, sizeof *d);
    d->out = out;
    d->file = file ? file : "<input>";
    d->src = src;
    d->srclen = srclen;
}

/* Finds line `line` (from 1) of the source; returns false if there is no such line. */
static bool find_line(const ptc_diag *d, int line, const char **start, size_t *len)
{
    if (!d->src || line < 1)
        return false;
    const char *p = d->src, *end = d->src + d->srclen;
    for (int l = 1; l < line; l++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            return false;
        p = nl + 1;
    }
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((nl ? nl : end) - p);
    if (n > 0 && p[n - 1] == '\r')
        n--;
    *start = p;
    *len = n;
    return true;
}

static void show_line(const ptc_diag *d, ptc_loc loc)
{
    const char *s;
    size_t n;
    if (!find_line(d, loc.line, &s, &n))
        return;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        fputc(c == '\t' || (c >= 0x20 && c != 0x7f) ? c : ' ', d->out);
    }
    fputc('\n', d->out);
    for (size_t i = 0; i + 1 < (size_t)loc.col && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\t')
            fputc('\t', d->out);
        else if ((c & 0xc0) != 0x80)
            fputc(' ', d->out);
    }
    fputs("^\n", d->out);
}

static void report(ptc_diag *d, ptc_loc loc, const char *kind, const char *fmt, va_list ap)
{
    if (!d->out)
        return;
    const char *file = loc.file ? loc.file : d->file;
    if (loc.line > 0)
        fprintf(d->out, "%s:%d:%d: %s: ", file, loc.line, loc.col, kind);
    else
        fprintf(d->out, "%s: %s: ", file, kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    if (loc.line > 0)
        show_line(d, loc);
    fflush(d->out);
}

void ptc_diag_error(ptc_diag *d, ptc_loc loc, const char *fmt, ...)
{
    d->nerrors++;
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "error", fmt, ap);
    va_end(ap);
}

void ptc_diag_note(ptc_diag *d, ptc_loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "note", fmt, ap);
    va_end(ap);
}
