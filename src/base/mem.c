/* mem.c - allocation helpers that leave an error message on failure. */
#include "base.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int kb_mul_ok(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

void *kb_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) kb_fail(KILN_ERR_NOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *kb_calloc(size_t n, size_t size) {
    size_t total;
    if (!kb_mul_ok(n, size, &total)) {
        kb_fail(KILN_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) kb_fail(KILN_ERR_NOMEM, "out of memory allocating %zu bytes", total);
    return p;
}

char *kb_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = kb_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *kb_strfmt(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? kb_malloc((size_t)n + 1) : NULL;
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

/* Buffers of 2 MiB and more (the arena, the GEMMs' work buffers, packed
 * weights) start on a 2 MiB boundary, so that where the kernel's THP mode
 * is "always" they can sit on transparent huge pages. A GEMM's epilogue
 * writes its output rows 3-24 KiB apart, each on its own 4 KiB page, so
 * with small pages nearly every row it writes misses the TLB: huge pages
 * made the 1024x1536x6144 GEMM 1.05-1.07x faster in a warm process (paired,
 * docs/PERFORMANCE.md). Asking for them (madvise MADV_HUGEPAGE) is opt-in,
 * KILN_HUGE=1: with THP's usual defrag mode an advised fault compacts
 * memory until a huge page is free, and a fresh process's first touch of
 * its activations paid for it: a 1024x1024 VAE decode spent 8-9 s of CPU in
 * the kernel against 2.1-2.4 s without the advice, 17.1-17.6 s against
 * 12.7-13.4 s of wall time (AMD Zen 5, 2 threads, paired). KILN_NO_HUGE=1:
 * no 2 MiB alignment, no advice (and none for the cache mapping, fs.c). */
#define KB_HUGE ((size_t)2 << 20)

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

int kb_huge_pages(void) { return !env_on("KILN_NO_HUGE"); }

int kb_huge_pages_asked(void) { return env_on("KILN_HUGE") && kb_huge_pages(); }

__attribute__((weak)) int kb_alloc_fault(size_t n) {
    (void)n;
    return 0;
}

void *kb_alloc_aligned(size_t n) {
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    int huge = rounded >= KB_HUGE && kb_huge_pages();
    if (huge) rounded = (n + 4095) & ~(size_t)4095; /* whole pages, for madvise */
    if (rounded < n || kb_alloc_fault(n) || posix_memalign(&p, huge ? KB_HUGE : 64, rounded ? rounded : 64) != 0) {
        kb_fail(KILN_ERR_NOMEM, "out of memory allocating %zu bytes", n);
        return NULL;
    }
    if (huge && kb_huge_pages_asked()) madvise(p, rounded, MADV_HUGEPAGE);
    return p;
}

void kb_free_aligned(void *p) { free(p); }

double kb_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

uint64_t kb_phys_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

uint64_t kb_default_budget(void) {
    uint64_t b = kb_phys_bytes();
    return b ? b / 4 : (uint64_t)4 << 30;
}
