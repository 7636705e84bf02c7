/* timing.c - the timing ledger: seconds and counts per category, plus the
 * last note per category (cache hit/miss reasons and the like). */
#include "base.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#define LEDGER_MAX 64

typedef struct {
    char category[48];
    double seconds;
    long count, hits, misses;
    char note[160];
} ledger_row;

static ledger_row g_rows[LEDGER_MAX];
static int g_nrows;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

double kb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ledger(const char *category, double seconds, int hit, const char *note) {
    pthread_mutex_lock(&g_lock);
    ledger_row *r = NULL;
    for (int i = 0; i < g_nrows; i++)
        if (!strcmp(g_rows[i].category, category)) r = &g_rows[i];
    if (!r && g_nrows < LEDGER_MAX) {
        r = &g_rows[g_nrows++];
        memset(r, 0, sizeof *r);
        snprintf(r->category, sizeof r->category, "%s", category);
    }
    if (r) {
        r->seconds += seconds;
        r->count++;
        if (hit == 1) r->hits++;
        if (hit == 0) r->misses++;
        if (note) snprintf(r->note, sizeof r->note, "%s", note);
    }
    pthread_mutex_unlock(&g_lock);
}

void kb_ledger_add(const char *category, double seconds, const char *note) { ledger(category, seconds, -1, note); }

void kb_ledger_event(const char *category, double seconds, int hit, const char *note) {
    ledger(category, seconds, hit ? 1 : 0, note);
}

void kiln_timings_print(void *file) {
    FILE *f = file ? (FILE *)file : stderr;
    pthread_mutex_lock(&g_lock);
    fprintf(f, "%-22s %10s %7s %5s %6s  %s\n", "category", "seconds", "count", "hits", "misses", "last note");
    for (int i = 0; i < g_nrows; i++) {
        const ledger_row *r = &g_rows[i];
        char hits[16] = "-", misses[16] = "-";
        if (r->hits || r->misses) {
            snprintf(hits, sizeof hits, "%ld", r->hits);
            snprintf(misses, sizeof misses, "%ld", r->misses);
        }
        fprintf(f, "%-22s %10.4f %7ld %5s %6s  %s\n", r->category, r->seconds, r->count, hits, misses, r->note);
    }
    pthread_mutex_unlock(&g_lock);
}

void kiln_timings_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_nrows = 0;
    pthread_mutex_unlock(&g_lock);
}
