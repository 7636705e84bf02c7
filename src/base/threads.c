/* threads.c - the kernel thread count: the other documented global. */
#include "base.h"

#include <omp.h>
#include <stdlib.h>

static int g_threads; /* 0: not decided yet */

void kiln_set_threads(int n) {
    if (n < 1) n = omp_get_num_procs();
    g_threads = n;
    omp_set_num_threads(n);
}

int kiln_get_threads(void) {
    if (!g_threads) {
        const char *e = getenv("KILN_THREADS");
        int n = e ? atoi(e) : 0;
        if (n >= 1) kiln_set_threads(n);
        else g_threads = omp_get_max_threads();
    }
    return g_threads;
}
