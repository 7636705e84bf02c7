/* test.h - a tiny assertion harness for CTest: each tests/test_*.c is one
 * executable; TEST(name) functions are run by RUN(name) in main, and main
 * returns TEST_SUMMARY() (non-zero when anything failed). */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include "kiln.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failures, t_checks, t_current_failed;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
            t_failures++;                                                           \
            t_current_failed = 1;                                                   \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            t_failures++;                                                           \
            t_current_failed = 1;                                                   \
        }                                                                           \
    } while (0)

/* a kiln call that must succeed */
#define CHECK_OK(expr)                                                              \
    do {                                                                            \
        kiln_status s_ = (expr);                                                    \
        CHECK_MSG(s_ == KILN_OK, "%s -> %s: %s", #expr, kiln_status_name(s_),       \
                  kiln_last_error());                                               \
    } while (0)

/* a kiln call that must fail with code and a message containing substr */
#define CHECK_FAILS(expr, code, substr)                                             \
    do {                                                                            \
        kiln_status s_ = (expr);                                                    \
        CHECK_MSG(s_ == (code), "%s -> %s (want %s): %s", #expr,                    \
                  kiln_status_name(s_), kiln_status_name(code), kiln_last_error()); \
        CHECK_MSG(strstr(kiln_last_error(), (substr)) != NULL,                      \
                  "message \"%s\" lacks \"%s\"", kiln_last_error(), (substr));     \
    } while (0)

#define TEST(name) static void name(void)
#define RUN(name)                                                                   \
    do {                                                                            \
        t_current_failed = 0;                                                       \
        name();                                                                     \
        fprintf(stderr, "%s %s\n", t_current_failed ? "FAIL" : "ok  ", #name);      \
    } while (0)
#define TEST_SUMMARY()                                                              \
    (fprintf(stderr, "%d checks, %d failed\n", t_checks, t_failures), t_failures ? 1 : 0)

/* The exit code CTest reads as "skipped" (SKIP_RETURN_CODE in CMakeLists.txt):
 * a test of something this machine cannot run (a kernel for a CPU feature it
 * lacks) must say so, not pass. */
#define TEST_SKIPPED 77
static inline int test_skip(const char *why) {
    fprintf(stderr, "SKIPPED: %s\n", why);
    return TEST_SKIPPED;
}

/* A test run for a lower CPU class (CMakeLists.txt's <test>_<class>
 * variants set KILN_TEST_CLASS and KILN_MAX_ISA to the class): skipped,
 * before main, on a machine below that class (its kernels cannot run here)
 * and on one of exactly that class (the test without the suffix ran it). */
__attribute__((constructor)) static void test_class_gate(void) {
    static const char *const order[] = {"sse41", "avx2", "avx512", "avx512_bf16", "avx512_fp16", "amx"};
    const char *want = getenv("KILN_TEST_CLASS");
    if (!want || !*want) return;
    const char *hw = kiln_cpu_class(1);
    int w = -1, h = -1;
    for (int i = 0; i < 6; i++) {
        if (!strcmp(want, order[i])) w = i;
        if (!strcmp(hw, order[i])) h = i;
    }
    if (w < 0) {
        fprintf(stderr, "KILN_TEST_CLASS=%s is not a CPU class\n", want);
        exit(2);
    }
    if (w > h) {
        fprintf(stderr, "SKIPPED: class %s is above this CPU's (%s): its kernels cannot run here\n", want, hw);
        exit(77);
    }
    if (w == h) {
        fprintf(stderr, "SKIPPED: class %s is this CPU's own: the test without the suffix ran it\n", want);
        exit(77);
    }
    fprintf(stderr, "running as CPU class %s (this CPU's is %s)\n", kiln_cpu_class(0), hw);
    if (strcmp(kiln_cpu_class(0), want)) {
        fprintf(stderr, "KILN_MAX_ISA=%s did not cap the class to %s\n", getenv("KILN_MAX_ISA"), want);
        exit(1);
    }
}

/* Test data folder (tests/data), set by CTest through KILN_TEST_DATA. */
static inline const char *test_data_dir(void) {
    const char *d = getenv("KILN_TEST_DATA");
    return d ? d : "tests/data";
}

/* A fresh scratch folder under $TMPDIR, removed by the caller with rm -rf. */
static inline void test_tmpdir(char *buf, size_t cap, const char *tag) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/kiln-test-%s-XXXXXX", t ? t : "/tmp", tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(2);
    }
}

static inline void test_rmrf(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* Out of memory on demand: base.h's seam kb_alloc_fault, defined here for
 * every test program (each is one file; the library's own never fails).
 * t_alloc_arm(k): the first k aligned allocations (kb_alloc_aligned) from
 * now succeed and every one after fails, until t_alloc_disarm(), which
 * returns how many were asked for meanwhile. */
static long t_alloc_ok = -1, t_alloc_seen;
int kb_alloc_fault(size_t n);
int kb_alloc_fault(size_t n) {
    (void)n;
    long ok = __atomic_load_n(&t_alloc_ok, __ATOMIC_RELAXED);
    return ok >= 0 && __atomic_fetch_add(&t_alloc_seen, 1, __ATOMIC_RELAXED) >= ok;
}
static inline void t_alloc_arm(long k) {
    __atomic_store_n(&t_alloc_seen, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t_alloc_ok, k, __ATOMIC_RELAXED);
}
static inline long t_alloc_disarm(void) {
    __atomic_store_n(&t_alloc_ok, -1, __ATOMIC_RELAXED);
    return __atomic_load_n(&t_alloc_seen, __ATOMIC_RELAXED);
}

/* ||a - b|| / ||b|| in double */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        if (isnan(a[i])) return INFINITY;
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
