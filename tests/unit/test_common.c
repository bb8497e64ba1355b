/* test_common.c - common/: the glob matcher of --place patterns, checked against the plain
 * recursive definition on many small cases and timed on the patterns that make backtracking
 * matchers exponential. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* The definition: '*' matches any run, everything else itself (exponential, fine for short). */
static bool glob_ref(const char *p, const char *s)
{
    if (!*p)
        return !*s;
    if (*p == '*')
        return glob_ref(p + 1, s) || (*s && glob_ref(p, s + 1));
    return *s == *p && glob_ref(p + 1, s + 1);
}

Test(glob, examples)
{
    cr_assert(ptc_glob_match("wte", "wte"));
    cr_assert(!ptc_glob_match("wte", "wpe"));
    cr_assert(!ptc_glob_match("wte", "wte2"));
    cr_assert(ptc_glob_match("*", ""));
    cr_assert(ptc_glob_match("*", "h.0.attn.w_qkv"));
    cr_assert(ptc_glob_match("h.*.mlp.w_fc", "h.11.mlp.w_fc"));
    cr_assert(!ptc_glob_match("h.*.mlp.w_fc", "h.11.mlp.w_fc2"));
    cr_assert(ptc_glob_match("h.*.*.w_*", "h.3.attn.w_o"));
    cr_assert(ptc_glob_match("*a*a", "aa"));
    cr_assert(!ptc_glob_match("*a*a", "a"));
    cr_assert(ptc_glob_match("a*a", "aa"));
    cr_assert(!ptc_glob_match("aa*aa", "aaa"));
    cr_assert(ptc_glob_match("**", "x"));
    cr_assert(ptc_glob_match("", ""));
    cr_assert(!ptc_glob_match("", "x"));
}

/* Every pattern over {a, b, *} of length <= 6 against every name over {a, b} of length <= 7. */
Test(glob, agrees_with_the_definition)
{
    const char alpha[] = "ab*";
    char p[8], s[9];
    long checked = 0;
    for (int pl = 0; pl <= 6; pl++) {
        long np = 1;
        for (int i = 0; i < pl; i++)
            np *= 3;
        for (long pi = 0; pi < np; pi++) {
            long x = pi;
            for (int i = 0; i < pl; i++, x /= 3)
                p[i] = alpha[x % 3];
            p[pl] = 0;
            for (int sl = 0; sl <= 7; sl++)
                for (long si = 0; si < (1L << sl); si++) {
                    for (int i = 0; i < sl; i++)
                        s[i] = (si >> i) & 1 ? 'b' : 'a';
                    s[sl] = 0;
                    cr_assert_eq(ptc_glob_match(p, s), glob_ref(p, s), "pattern '%s', name '%s'", p,
                                 s);
                    checked++;
                }
        }
    }
    cr_assert_gt(checked, 100000);
}

/* "*a*a*...*a*b" against "aaa...a": a backtracking matcher tries every way to place the stars.
 * Here a 2,000-star pattern against a 100,000-byte name must take well under a second. */
Test(glob, pathological_patterns_are_linear)
{
    size_t stars = 2000, n = 100000;
    char *p = malloc(2 * stars + 2), *s = malloc(n + 1);
    for (size_t i = 0; i < stars; i++)
        memcpy(p + 2 * i, "*a", 2);
    memcpy(p + 2 * stars, "b", 2);
    memset(s, 'a', n);
    s[n] = 0;
    clock_t t0 = clock();
    cr_assert(!ptc_glob_match(p, s));
    s[n - 1] = 'b';
    cr_assert(ptc_glob_match(p, s));
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    cr_assert_lt(secs, 1.0, "took %.3f s", secs);
    free(p);
    free(s);
}
