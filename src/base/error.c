/* error.c - per-thread error messages and status names. */
#include "base.h"

#include <pthread.h>
#include <string.h>

static _Thread_local char g_msg[2048];

const char *kiln_last_error(void) { return g_msg; }

void kb_clear_error(void) { g_msg[0] = 0; }

kiln_status kb_fail(kiln_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return code;
}

/* the runs: a thread's begun one, else its own record */
static pthread_mutex_t g_run_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local kb_run g_own;
static _Thread_local kb_run *g_run;

kb_run *kb_run_begin(kb_run *r) {
    kb_run *prev = g_run;
    memset(r, 0, sizeof *r);
    g_run = r;
    return prev;
}

void kb_run_end(kb_run *prev) { g_run = prev; }

kb_run *kb_run_current(void) { return g_run ? g_run : &g_own; }

static void run_record(kb_run *r, kiln_status code, const char *fmt, va_list ap) {
    char msg[sizeof r->msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    pthread_mutex_lock(&g_run_lock); /* a run's kernels fail on several threads at once */
    if (r->failures == r->open) {
        memcpy(r->msg, msg, sizeof msg);
        r->code = code;
    }
    r->failures++;
    pthread_mutex_unlock(&g_run_lock);
    kb_log(KILN_LOG_DEBUG, "deferred failure: %s", msg);
}

void kb_run_fail(kb_run *r, kiln_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    run_record(r ? r : kb_run_current(), code, fmt, ap);
    va_end(ap);
}

void kb_defer_failure(kiln_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    run_record(kb_run_current(), code, fmt, ap);
    va_end(ap);
}

kiln_status kb_run_status(const kb_run *r) {
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&g_run_lock);
    if (r->failures != r->open) st = kb_fail(r->code, "%s", r->msg);
    pthread_mutex_unlock(&g_run_lock);
    return st;
}

unsigned long kb_deferred_mark(void) {
    kb_run *r = kb_run_current();
    pthread_mutex_lock(&g_run_lock);
    unsigned long mark = r->open = r->failures;
    pthread_mutex_unlock(&g_run_lock);
    return mark;
}

kiln_status kb_deferred_since(unsigned long mark) {
    kb_run *r = kb_run_current();
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&g_run_lock);
    if (r->failures != mark) st = kb_fail(r->code, "%s", r->msg);
    pthread_mutex_unlock(&g_run_lock);
    return st;
}

kiln_status kb_wrap(kiln_status code, const char *fmt, ...) {
    char prefix[1024], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* prefix, ": ", old message; truncated to fit */
    size_t lp = strnlen(prefix, sizeof g_msg - 3), lo = strnlen(old, sizeof old);
    memcpy(g_msg, prefix, lp);
    memcpy(g_msg + lp, ": ", 2);
    if (lo > sizeof g_msg - lp - 3) lo = sizeof g_msg - lp - 3;
    memcpy(g_msg + lp + 2, old, lo);
    g_msg[lp + 2 + lo] = 0;
    return code;
}

const char *kiln_status_name(kiln_status s) {
    switch (s) {
    case KILN_OK: return "ok";
    case KILN_ERR_INVALID_ARG: return "invalid argument";
    case KILN_ERR_IO: return "i/o";
    case KILN_ERR_FORMAT: return "format";
    case KILN_ERR_CONFIG: return "config";
    case KILN_ERR_MISSING: return "missing";
    case KILN_ERR_UNEXPECTED: return "unexpected";
    case KILN_ERR_SHAPE: return "shape";
    case KILN_ERR_DTYPE: return "dtype";
    case KILN_ERR_RANGE: return "range";
    case KILN_ERR_NOMEM: return "out of memory";
    case KILN_ERR_UNSUPPORTED: return "unsupported";
    case KILN_ERR_CACHE_MISSING: return "missing cache";
    case KILN_ERR_CORRUPT: return "corrupt";
    case KILN_ERR_NONFINITE: return "non-finite";
    case KILN_ERR_UNTRUSTED: return "untrusted";
    }
    return "unknown";
}

/* the library's own version, which a program compiled against another
 * kiln.h can compare with its KILN_VERSION */
const char *kiln_version(void) { return KILN_VERSION; }
