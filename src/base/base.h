/* base.h - errors, logging, the timing ledger and small file-system helpers.
 * Everything above src/base may use these; base knows nothing above it. */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include "kiln.h"
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KB_PRINTF(a, b)
#endif

/* ---- errors: set the thread's message and return the code -------------- */
kiln_status kb_fail(kiln_status code, const char *fmt, ...) KB_PRINTF(2, 3);
/* Prefix the current message with context ("loading x: <old message>"). */
kiln_status kb_wrap(kiln_status code, const char *fmt, ...) KB_PRINTF(2, 3);
void kb_clear_error(void);
/* A run's failures, where no code can be returned: the kernels return
 * nothing and run on OpenMP's worker threads. A kernel that cannot do its
 * work (no memory for its buffers, a oneDNN primitive that failed, an index
 * outside its table) records the failure in the run that called it, and the
 * forward that began the run (kb_run_begin, per step of the execution
 * chain) fails that step with kb_run_status: it then falls back or returns
 * the error, never the numbers the kernel did not write. Each run is its
 * own, so forwards of two models at once, on two threads (and later a
 * device's streams), keep their own failures. The message kept is the
 * first since the last mark (the cause, when one failure brings down
 * others). */
typedef struct kb_run {
    unsigned long failures, open; /* failures so far; the count at the last mark */
    kiln_status code;             /* the first failure's since the mark */
    char msg[1024];
} kb_run;
/* Begin r (zeroed) as the calling thread's run; returns the one it replaces,
 * for kb_run_end. */
kb_run *kb_run_begin(kb_run *r);
void kb_run_end(kb_run *prev);
/* The calling thread's run: the one begun on it, else the thread's own
 * record. A kernel that reports from inside an OpenMP parallel region takes
 * it before the region (worker threads have runs of their own) and reports
 * with kb_run_fail. */
kb_run *kb_run_current(void);
void kb_run_fail(kb_run *r, kiln_status code, const char *fmt, ...) KB_PRINTF(3, 4);
/* KILN_OK when r recorded nothing since its last mark; else the code of the
 * failure kept, with its message set as this thread's (kb_fail) */
kiln_status kb_run_status(const kb_run *r);
/* kb_run_fail on the calling thread's run */
void kb_defer_failure(kiln_status code, const char *fmt, ...) KB_PRINTF(2, 3);
/* a mark in the calling thread's run, and what it recorded since (tests
 * that call kernels directly) */
unsigned long kb_deferred_mark(void);
kiln_status kb_deferred_since(unsigned long mark);

/* ---- logging (stderr) --------------------------------------------------- */
void kb_log(kiln_log_level level, const char *fmt, ...) KB_PRINTF(2, 3);
kiln_log_level kb_log_level(void);

/* ---- timing ledger ------------------------------------------------------ */
double kb_now(void); /* monotonic seconds */
/* Add seconds to a category; note may be NULL or a short reason ("miss: ..."). */
void kb_ledger_add(const char *category, double seconds, const char *note);
/* The same, counting a cache hit (hit = 1) or miss (hit = 0). */
void kb_ledger_event(const char *category, double seconds, int hit, const char *note);

/* ---- memory ------------------------------------------------------------- */
void *kb_malloc(size_t n);              /* sets a NOMEM message on failure */
void *kb_calloc(size_t n, size_t size); /* checks n*size overflow */
char *kb_strdup(const char *s);
char *kb_strfmt(const char *fmt, ...) KB_PRINTF(1, 2); /* malloc'd */
/* 64-byte aligned allocation for tensors; free with kb_free_aligned. From
 * 2 MiB up: 2 MiB aligned (transparent huge pages where THP is "always";
 * asked for with KILN_HUGE=1, mem.c). */
void *kb_alloc_aligned(size_t n);
/* 0 when KILN_NO_HUGE is set (not "0"): small pages everywhere */
int kb_huge_pages(void);
/* 1 when KILN_HUGE=1 asks for them on large buffers (madvise MADV_HUGEPAGE; mem.c says why it is opt-in) */
int kb_huge_pages_asked(void);
/* The tests' seam for out-of-memory paths: kb_alloc_aligned fails a request
 * of n bytes, as if memory ran out, when this returns nonzero. The library's
 * own definition (weak, mem.c) never does; a test program defines its own. */
int kb_alloc_fault(size_t n);
void kb_free_aligned(void *p);
/* The machine's physical memory in bytes (0 when the system cannot say). */
uint64_t kb_phys_bytes(void);
/* A memory budget by default: a quarter of the physical memory (4 GiB when unknown). */
uint64_t kb_default_budget(void);
/* a*b and a+b with overflow check: return 0 on overflow */
int kb_mul_ok(size_t a, size_t b, size_t *out);

/* ---- files -------------------------------------------------------------- */
int kb_is_dir(const char *path);
int kb_is_file(const char *path);
char *kb_path_join(const char *a, const char *b); /* malloc'd */
char *kb_dirname(const char *path);               /* malloc'd */
/* The JSON values in text[0..n), counted by the separators outside strings:
 * an upper bound (within a few) of the nodes a parser makes, so that a
 * hostile file's parse is refused by its count before it costs memory. */
long kb_json_values(const char *text, size_t n);
/* Read a whole (small) file into a NUL-terminated buffer. */
kiln_status kb_read_file(const char *path, char **out, size_t *len);
/* Write a whole file atomically: tmp file in the same folder, fsync, rename. */
kiln_status kb_write_file_atomic(const char *path, const void *data, size_t len);
kiln_status kb_mkdir_p(const char *path);
/* Delete a folder and everything in it (a missing folder is fine). */
kiln_status kb_remove_tree(const char *dir);
/* Rename a folder aside first, then delete it: readers never see it half gone. */
kiln_status kb_remove_dir(const char *dir);

/* A read-only mapping of a whole file. */
/* Give back the pages of a read-only file mapping that hold [p, p + n)
 * (they are read from the file again if touched): a conversion's RSS stays
 * at the tensor it works on. Only for kb_map_file memory. */
void kb_drop_pages(const void *p, size_t n);
typedef struct kb_map {
    const uint8_t *data;
    size_t size;
} kb_map;
/* KILN_ERR_NOMEM when memory, address space or file handles ran out (the
 * file may be fine: callers must not treat it as damaged), else KILN_ERR_IO */
kiln_status kb_map_file(const char *path, kb_map *m);
void kb_unmap(kb_map *m);

/* SHA-256 as 64 lowercase hex digits (src/base/sha256.c). */
void kb_sha256(const void *data, size_t n, char hex[65]);
kiln_status kb_sha256_file(const char *path, char hex[65]);
/* The same in steps (a file read through a descriptor, say). */
typedef struct kb_sha256_ctx {
    uint32_t h[8];
    uint64_t n;
    uint8_t buf[64];
    size_t len;
} kb_sha256_ctx;
void kb_sha256_init(kb_sha256_ctx *c);
void kb_sha256_update(kb_sha256_ctx *c, const void *data, size_t n);
void kb_sha256_final(kb_sha256_ctx *c, uint8_t out[32]);
/* HMAC-SHA256 (RFC 2104), whole or in steps. */
typedef struct kb_hmac_ctx {
    kb_sha256_ctx inner, outer;
} kb_hmac_ctx;
void kb_hmac_init(kb_hmac_ctx *c, const void *key, size_t klen);
void kb_hmac_update(kb_hmac_ctx *c, const void *data, size_t n);
void kb_hmac_final(kb_hmac_ctx *c, uint8_t out[32]);
void kb_hmac_sha256(const void *key, size_t klen, const void *data, size_t n, uint8_t out[32]);
/* n bytes as 2n lowercase hex digits and a NUL */
void kb_hex(const uint8_t *b, size_t n, char *hex);
/* 1 when a and b are equal, in time independent of where they differ */
int kb_const_eq(const void *a, const void *b, size_t n);

/* ---- the trust key (src/base/trust.c, docs/package.md) ------------------ */
/* The secret that signs compiled packages and cache manifests: the file
 * $KILN_PACKAGE_KEY_FILE (it must exist: a fleet that shares packages
 * shares this file), else $XDG_CONFIG_HOME/kiln/package.key (else
 * ~/.config/kiln/package.key), created on first use with 32 random bytes as
 * 64 hex digits, mode 0600, its folder 0700. Refused unless it is a regular
 * file owned by this user (or root), not readable or writable by group or
 * others, holding at least 32 bytes. Read once per process (again when the
 * path changes); the key is the file's bytes, trailing whitespace removed. */
#define KB_KEY_MAX 256
kiln_status kb_trust_key(uint8_t key[KB_KEY_MAX], size_t *len);
/* The path kb_trust_key reads (malloc'd), or NULL with a message. */
char *kb_trust_key_path(void);
/* HMAC-SHA256 of data under the trust key, as 64 hex digits. */
kiln_status kb_sign(const void *data, size_t n, char hex[65]);
/* KILN_OK when sig (64 hex digits) is data's signature under the trust key;
 * KILN_ERR_CORRUPT (message: what failed) when not. */
kiln_status kb_verify_sig(const void *data, size_t n, const char *sig);

/* ||a - b|| / ||b|| accumulated in double (||a - b|| when b is all zero);
 * NaN anywhere gives NaN, which fails every "<=" gate. */
double kb_rel_l2(const float *a, const float *b, size_t n);

/* Human-readable byte count, e.g. "1.5 GiB", into buf. */
const char *kb_human_bytes(double bytes, char *buf, size_t cap);

#endif
