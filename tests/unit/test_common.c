/* test_common.c - common/: the glob matcher of --place patterns, checked against the plain
 * recursive definition on many small cases and timed on the patterns that make backtracking
 * matchers exponential; and how file.c writes and reads what a path names (devices, FIFOs,
 * directories, links, endless streams). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "file.h"
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

/* ---- file.c: what an output path names decides how it is written ---- */

static char dir[256];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/ptc-test-common.%ld", (long)getpid());
    mkdir(dir, 0755);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static char *at(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

TestSuite(file, .init = make_dir, .fini = remove_dir);

/* /dev/null is written straight through and stays a character device; nothing is left behind. */
Test(file, a_character_device_is_written_in_place)
{
    char err[512];
    cr_assert_eq(ptc_file_write_file("/dev/null", "x", 1, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert_eq(stat("/dev/null", &st), 0);
    cr_assert(S_ISCHR(st.st_mode), "/dev/null is still a character device");
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/dev/null.tmp.%ld", (long)getpid());
    cr_assert_neq(access(tmp, F_OK), 0, "no temporary file beside the device");
    /* a write error on a device is reported, naming it */
    cr_assert_eq(ptc_file_write_file("/dev/full", "x", 1, err, sizeof err), -1);
    cr_assert(strstr(err, "/dev/full: write failed: No space left on device"), "%s", err);
    cr_assert_eq(ptc_file_check_output("/dev/null", err, sizeof err), 0, "%s", err);
}

/* A FIFO gets the bytes (its reader sees them); it is not replaced by a regular file. */
Test(file, a_fifo_is_written_in_place)
{
    char *fifo = at("fifo"), err[512];
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    pid_t pid = fork();
    if (pid == 0) { /* the reader */
        char buf[16] = {0};
        int fd = open(fifo, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        _exit(n == 5 && memcmp(buf, "hello", 5) == 0 ? 0 : 1);
    }
    cr_assert_eq(ptc_file_write_file(fifo, "hello", 5, err, sizeof err), 0, "%s", err);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the reader got the bytes");
    struct stat st;
    cr_assert(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "still a FIFO");
}

Test(file, directories_and_sockets_are_refused)
{
    char err[512];
    cr_assert_eq(ptc_file_write_file(dir, "x", 1, err, sizeof err), -1);
    cr_assert(strstr(err, ": is a directory"), "%s", err);
    cr_assert_eq(ptc_file_check_output(dir, err, sizeof err), -1);
    cr_assert(strstr(err, ": is a directory"), "%s", err);
    cr_assert_eq(ptc_file_write_file("", "x", 1, err, sizeof err), -1);
    cr_assert(strstr(err, "empty file name"), "%s", err);
    /* a new file in a directory that does not exist, or under a regular file */
    cr_assert_eq(ptc_file_check_output(at("nodir/x"), err, sizeof err), -1);
    cr_assert(strstr(err, "nodir/x: cannot create it in directory"), "%s", err);
    cr_assert_eq(ptc_file_write_file(at("plain"), "x", 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(ptc_file_check_output(at("plain/x"), err, sizeof err), -1);
    cr_assert(strstr(err, "plain/x: cannot write: Not a directory"), "%s", err);
    cr_assert_eq(ptc_file_check_output(at("new"), err, sizeof err), 0, "%s", err);
}

/* A symbolic link to a regular file: the target gets the new bytes, the link stays a link. */
Test(file, a_symlink_keeps_pointing_at_the_replaced_file)
{
    char err[512];
    cr_assert_eq(ptc_file_write_file(at("target"), "old", 3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(symlink("target", at("link")), 0);
    cr_assert_eq(ptc_file_write_file(at("link"), "new!", 4, err, sizeof err), 0, "%s", err);
    struct stat st;
    cr_assert(lstat(at("link"), &st) == 0 && S_ISLNK(st.st_mode), "the link is still a link");
    size_t n;
    char *text = ptc_read_file(at("target"), &n);
    cr_assert(text && n == 4 && memcmp(text, "new!", 4) == 0);
    free(text);
    cr_assert(ptc_file_same(at("link"), at("target")));
    cr_assert(!ptc_file_same(at("link"), at("nothing")));
    cr_assert(!ptc_file_same("/dev/null", "/dev/null"), "only regular files count");
    /* two outputs not made yet: the same name in the same directory, however it is spelt */
    char other[500];
    snprintf(other, sizeof other, "%s/../%s/new.bin", dir, strrchr(dir, '/') + 1);
    cr_assert(ptc_file_same(at("new.bin"), other), "%s", other);
    cr_assert(!ptc_file_same(at("new.bin"), at("new2.bin")));
}

/* Reading: FIFOs without a writer do not block, endless devices are refused, a bound holds. */
Test(file, bounded_reads)
{
    char err[512];
    size_t n;
    cr_assert_null(ptc_file_read_all("/dev/zero", 1 << 20, &n, err, sizeof err));
    cr_assert(strstr(err, "/dev/zero: cannot read a character device"), "%s", err);
    char *fifo = at("rfifo");
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    char *text = ptc_file_read_all(fifo, 100, &n, err, sizeof err); /* no writer: empty */
    cr_assert(text && n == 0, "%s", err);
    free(text);
    cr_assert_null(ptc_file_read_all(dir, 100, &n, err, sizeof err));
    cr_assert(strstr(err, "Is a directory"), "%s", err);
    cr_assert_eq(ptc_file_write_file(at("ten"), "0123456789", 10, err, sizeof err), 0);
    cr_assert_null(ptc_file_read_all(at("ten"), 9, &n, err, sizeof err));
    cr_assert(strstr(err, "ten: larger than the limit of 9 bytes"), "%s", err);
    text = ptc_file_read_all(at("ten"), 10, &n, err, sizeof err);
    cr_assert(text && n == 10 && strcmp(text, "0123456789") == 0, "%s", err);
    free(text);
    /* a pipe that never ends stops at the bound */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        char buf[4096];
        memset(buf, 'y', sizeof buf);
        while (write(fds[1], buf, sizeof buf) > 0)
            ;
        _exit(0);
    }
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    cr_assert_null(ptc_file_read_all(path, 1 << 20, &n, err, sizeof err));
    cr_assert(strstr(err, "larger than the limit of 1048576 bytes"), "%s", err);
    close(fds[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int fd;
    cr_assert_eq(ptc_file_open_regular(fifo, &n, err, sizeof err), -1);
    cr_assert(strstr(err, "not a regular file (it is a FIFO)"), "%s", err);
    fd = ptc_file_open_regular(at("ten"), &n, err, sizeof err);
    cr_assert(fd >= 0 && n == 10, "%s", err);
    close(fd);
}
