/* outputs.c - a run's output files, all or none: each written under a
 * temporary name beside its final one (".<name>.partial-<pid>"), renamed
 * into place once every one is written; a SIGINT, SIGTERM or SIGHUP before
 * that removes the temporary files (unlink is async-signal-safe) and ends
 * the process as the signal would have, so an interrupted run leaves no
 * image of its own behind and every earlier file as it was. */
#define _GNU_SOURCE
#include "cli.h"
#include "base/base.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cli_outputs *volatile g_active; /* the run the signal handler cleans up after */
static struct sigaction g_old[3];
static const int k_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static void on_signal(int sig) {
    cli_outputs *o = g_active;
    for (int i = 0; o && i < o->n; i++)
        if (o->tmp[i]) unlink(o->tmp[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* <dir>/.<stem>.partial-<pid><ext> for <dir>/<stem><ext> */
static char *tmp_base(const char *output) {
    const char *slash = strrchr(output, '/'), *name = slash ? slash + 1 : output;
    const char *dot = strrchr(name, '.');
    if (dot == name) dot = NULL;
    int dl = (int)(name - output), sl = dot ? (int)(dot - name) : (int)strlen(name);
    return kb_strfmt("%.*s.%.*s.partial-%ld%s", dl, output, sl, name, (long)getpid(), dot ? dot : "");
}

int cli_outputs_begin(cli_outputs *o, const char *output, int n) {
    memset(o, 0, sizeof *o);
    char *base = tmp_base(output);
    o->final = calloc((size_t)(n > 0 ? n : 1), sizeof *o->final);
    o->tmp = calloc((size_t)(n > 0 ? n : 1), sizeof *o->tmp);
    int ok = base && o->final && o->tmp;
    for (int i = 0; ok && i < n; i++)
        ok = (o->final[i] = kiln_image_path(output, i, n)) && (o->tmp[i] = kiln_image_path(base, i, n));
    free(base);
    o->n = n;
    if (!ok) {
        cli_outputs_abort(o);
        return -1;
    }
    o->tmp_base = tmp_base(output);
    g_active = o;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++) sigaction(k_signals[k], &sa, &g_old[k]);
    return o->tmp_base ? 0 : -1;
}

static void end(cli_outputs *o) {
    if (g_active == o) {
        for (int k = 0; k < 3; k++) sigaction(k_signals[k], &g_old[k], NULL);
        g_active = NULL;
    }
    for (int i = 0; i < o->n; i++) {
        if (o->final) free(o->final[i]);
        if (o->tmp) free(o->tmp[i]);
    }
    free(o->final);
    free(o->tmp);
    free(o->tmp_base);
    memset(o, 0, sizeof *o);
}

void cli_outputs_abort(cli_outputs *o) {
    for (int i = 0; o->tmp && i < o->n; i++)
        if (o->tmp[i]) unlink(o->tmp[i]);
    end(o);
}

int cli_outputs_commit(cli_outputs *o, const char *cmd, int quiet) {
    /* no signal between two renames: every file, or (on a failure) none */
    sigset_t block, old;
    sigemptyset(&block);
    for (int k = 0; k < 3; k++) sigaddset(&block, k_signals[k]);
    sigprocmask(SIG_BLOCK, &block, &old);
    int replaced = 0, i, rc = 0;
    const char *first = NULL;
    for (i = 0; i < o->n; i++) {
        if (!first && kb_is_file(o->final[i])) first = o->final[i];
        replaced += kb_is_file(o->final[i]);
        if (rename(o->tmp[i], o->final[i]) != 0) break;
    }
    if (i < o->n) {
        rc = cli_error(cmd, "cannot rename %s to %s: %s", o->tmp[i], o->final[i], strerror(errno));
        for (int k = 0; k < i; k++) unlink(o->final[k]); /* none: the renamed ones go too */
    }
    if (!rc && replaced && !quiet)
        fprintf(stderr, "%s: replaced %d existing file%s (%s%s)\n", cmd, replaced, replaced == 1 ? "" : "s", first,
                replaced > 1 ? " ..." : "");
    if (rc) cli_outputs_abort(o);
    else end(o);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}
