/* ptc-tokenize.c - the byte-level tokenizer: turns a text file into llm.c token files (each byte is
 * one token, 0..255), optionally splitting off the end of the text as a validation set, so a demo
 * can train on any text with no vocabulary to download.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "file.h"
#include "util.h"

static const char usage[] =
    "usage: ptc-tokenize INPUT.txt -o OUTPUT.bin [--val-fraction F --val-output VAL.bin]\n"
    "\n"
    "Turns a text file into an llm.c token file (a 256 x int32 header with magic 20240520 and\n"
    "version 1, then uint16 tokens) with a byte-level tokenizer: every byte of the input is one\n"
    "token whose id is the byte's value, 0..255, so the model's vocabulary size is 256.\n"
    "\n"
    "Options:\n"
    "  -o, --output FILE     write the (training) tokens to FILE (required)\n"
    "  --val-fraction F      keep the last fraction F of the text (0 < F < 1) for validation; the\n"
    "                        split moves forward to the start of the next line when there is one\n"
    "  --val-output FILE     write the validation tokens to FILE (required with --val-fraction)\n"
    "  -h, --help            print this text and exit\n"
    "\n"
    "Files are replaced atomically: a reader sees the old file or the complete new one.\n"
    "Exit status: 0 on success, 2 for bad options or a file that cannot be read or written\n"
    "(standard output included); an output that is the input is refused.\n"
    "\n"
    "Example:\n"
    "  ptc-tokenize corpus.txt -o corpus_train.bin --val-fraction 0.1 --val-output "
    "corpus_val.bin\n";

typedef struct opts {
    const char *input, *output, *val_output;
    double val_fraction; /* 0: no validation file */
} opts;

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "ptc-tokenize: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(ptc-tokenize --help for usage)\n");
    return 2;
}

/* The value of a flag given as "--flag VALUE" or "--flag=VALUE"; NULL when it is not this flag. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag, bool *missing)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != 0)
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

/* The outputs can be written, and neither is the input nor the other output (a text replaced by
 * its tokens would be lost). Returns -1 when they are fine, else 2 after a message. */
static int check_outputs(const opts *o)
{
    const char *paths[2] = {o->output, o->val_output};
    char err[1024];
    for (int i = 0; i < 2 && paths[i]; i++) {
        if (ptc_file_check_output(paths[i], err, sizeof err) < 0)
            return bad_usage("%s", err);
        if (ptc_file_same(paths[i], o->input))
            return bad_usage("%s: is the input file; refusing to replace it", paths[i]);
    }
    if (o->val_output && ptc_file_same(o->output, o->val_output))
        return bad_usage("%s: given as both -o and --val-output", o->output);
    return -1;
}

/* Returns -1 when the command line is fine, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, opts *o)
{
    bool have_fraction = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        bool missing = false;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if ((v = flag_value(argc, argv, &i, "-o", &missing)) ||
            (v = flag_value(argc, argv, &i, "--output", &missing))) {
            o->output = v;
        } else if ((v = flag_value(argc, argv, &i, "--val-output", &missing))) {
            o->val_output = v;
        } else if ((v = flag_value(argc, argv, &i, "--val-fraction", &missing))) {
            char *end;
            errno = 0;
            o->val_fraction = strtod(v, &end);
            if (end == v || *end || errno || !(o->val_fraction > 0 && o->val_fraction < 1))
                return bad_usage("--val-fraction takes a number between 0 and 1, not '%s'", v);
            have_fraction = true;
        } else if (missing) {
            return bad_usage("%s needs a value", a);
        } else if (a[0] == '-' && a[1] != 0) {
            return bad_usage("unknown option '%s'", a);
        } else if (o->input) {
            return bad_usage("more than one input file ('%s')", a);
        } else {
            o->input = a;
        }
    }
    if (!o->input)
        return bad_usage("%s", "no input file");
    if (!o->output)
        return bad_usage("%s", "no output file (-o OUTPUT.bin)");
    if (have_fraction != (o->val_output != NULL))
        return bad_usage("%s", "--val-fraction and --val-output go together");
    return check_outputs(o);
}

static int write_tokens(const char *path, const unsigned char *text, size_t n)
{
    uint16_t *tok = ptc_xmalloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++)
        tok[i] = text[i];
    char err[512];
    int rc = ptrt_data_write(path, tok, n, err, sizeof err);
    free(tok);
    if (rc != 0)
        fprintf(stderr, "ptc-tokenize: %s\n", err);
    return rc;
}

/* 0 when standard output took everything printed on it, else 2 after a message (a full disk
 * must not pass for success). */
static int stdout_status(void)
{
    char err[256];
    if (ptc_file_check_stdout(err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "ptc-tokenize: writing to standard output failed: %s\n", err);
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc == 0 ? stdout_status() : rc;
    size_t n;
    char err[1024];
    /* a token file holds at most INT32_MAX tokens: reading stops one byte past that (an endless
     * pipe is refused there, not read until memory runs out) */
    char *text = ptc_file_read_all(o.input, INT32_MAX, &n, err, sizeof err);
    if (!text) {
        fprintf(stderr, "ptc-tokenize: %s\n", err);
        return 2;
    }
    size_t cut = n;
    if (o.val_fraction > 0) {
        cut = n - (size_t)((double)n * o.val_fraction + 0.5);
        const char *nl = cut < n ? memchr(text + cut, '\n', n - cut) : NULL;
        if (nl && (size_t)(nl - text) + 1 < n)
            cut = (size_t)(nl - text) + 1;
    }
    if (n == 0 || (o.val_fraction > 0 && (cut == 0 || cut == n))) {
        fprintf(stderr, "ptc-tokenize: %s: %s\n", o.input,
                n == 0 ? "is empty"
                       : "too short to split: the training or validation part would be empty");
        free(text);
        return 2;
    }
    const unsigned char *t = (const unsigned char *)text;
    rc = write_tokens(o.output, t, cut);
    if (rc == 0 && o.val_output)
        rc = write_tokens(o.val_output, t + cut, n - cut);
    if (rc == 0) {
        printf("ptc-tokenize: %s: %zu bytes -> %s (%zu tokens)", o.input, n, o.output, cut);
        if (o.val_output)
            printf(", %s (%zu tokens)", o.val_output, n - cut);
        printf("\n");
    }
    free(text);
    return rc == 0 ? stdout_status() : 2;
}
