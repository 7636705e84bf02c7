/* cli_util.h - run the kiln binary from a test ($KILN_BIN, set by CTest) and
 * capture what it prints: one definition for every test of the command. */
#ifndef KILN_CLI_UTIL_H
#define KILN_CLI_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static inline const char *kiln_bin(void) {
    const char *b = getenv("KILN_BIN");
    return b ? b : "build/kiln";
}

/* stdout+stderr of a shell command into *out (malloc'd; freed when out is
 * NULL); the exit status, -1 when killed */
static inline int kiln_popen(char **out, const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) exit(2);
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `kiln ARGS` (a shell line of arguments) */
static inline int run_kiln(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int run_kiln(char **out, const char *fmt, ...) {
    char cmd[12288], line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", kiln_bin(), line);
    return kiln_popen(out, cmd);
}

/* a shell line in which $K is the kiln binary (environment assignments,
 * pipes, several commands) */
static inline int kiln_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int kiln_sh(char **out, const char *fmt, ...) {
    char cmd[12288], line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "K='%s'; %s 2>&1", kiln_bin(), line);
    return kiln_popen(out, cmd);
}

/* a shell line without kiln's output (files, flock, chmod ...): its exit status, -1 when killed */
static inline int test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int test_sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* run with RUNNER (run_kiln or kiln_sh): the exit status and a substring of the output */
#define CHECK_RUN_WITH(RUNNER, want_rc, substr, ...)                                    \
    do {                                                                                 \
        char *o_ = NULL;                                                                 \
        int rc_ = RUNNER(&o_, __VA_ARGS__);                                              \
        CHECK_MSG(rc_ == (want_rc), "exit %d (want %d): %s", rc_, (want_rc), o_);        \
        CHECK_MSG(strstr(o_, (substr)) != NULL, "output lacks \"%s\": %s", (substr), o_); \
        free(o_);                                                                        \
    } while (0)

#endif
