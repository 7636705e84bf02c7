/* fuzz_common.h - what the libFuzzer harnesses share: a private scratch
 * folder (one per process, removed at exit) and writing an input there as a
 * file, since the readers under test take paths (they mmap whole files). */
#ifndef KILN_FUZZ_COMMON_H
#define KILN_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char kfz_dir[256];

static inline void kfz_cleanup(void) {
    if (!kfz_dir[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", kfz_dir);
    if (system(cmd)) { /* best effort: a scratch folder left in TMPDIR */ }
}

/* The scratch folder: $TMPDIR (else /dev/shm, else /tmp)/kiln-fuzz-XXXXXX.
 * tmpfs keeps the per-input write cheap (a few microseconds). */
static inline const char *kfz_scratch(void) {
    if (kfz_dir[0]) return kfz_dir;
    const char *t = getenv("TMPDIR");
    if (!t || !*t) t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(kfz_dir, sizeof kfz_dir, "%s/kiln-fuzz-XXXXXX", t);
    if (!mkdtemp(kfz_dir)) {
        perror("kiln fuzz: mkdtemp");
        abort();
    }
    atexit(kfz_cleanup);
    return kfz_dir;
}

/* Write data[0..n) to <scratch>/name (replacing it); the path goes to path. */
static inline void kfz_write(const char *name, const uint8_t *data, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", kfz_scratch(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) {
        perror("kiln fuzz: writing the input");
        abort();
    }
}

/* A NUL-terminated copy of the input (the JSON parsers take C strings). */
static inline char *kfz_cstr(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

/* A check the parser's contract promises: a failure is a bug, reported as
 * a crash so libFuzzer keeps the input. */
#define KFZ_ASSERT(cond)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "kiln fuzz: %s:%d: contract broken: %s\n", __FILE__,      \
                    __LINE__, #cond);                                                 \
            abort();                                                                  \
        }                                                                             \
    } while (0)

#endif
