/* test_cache_crash.c - the weight cache under crashes and races:
 *
 *   kill_during_publish        `kiln cache build` SIGKILLed at pseudo-random
 *                              moments, again and again: the key folder is
 *                              either absent or a complete, verified cache;
 *                              a final build sweeps the staging and trash
 *                              leftovers and maps bytes that give the
 *                              reference output
 *   racing_processes           8 processes load one cold key at once: one
 *                              converts ("miss"), 7 map its publish ("hit")
 *   converter_dies_waiter_takes_over
 *                              the converter dies holding the key's lock; the
 *                              waiter gets the lock, converts and publishes
 *   waiter_maps_what_the_converter_published
 *                              a waiter blocks on a slow converter and maps
 *                              its publish without converting again
 *
 * Forward passes run with one kernel thread (kiln_set_threads(1) in main):
 * libgomp is not fork-safe once it has started its worker pool, and this
 * test forks after running forwards in the parent. */
#include "base/base.h"
#include "cache/cache.h"
#include "format/safetensors.h"
#include "test.h"
#include "cli_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- shared fixtures ------------------------------------------------------------ */

static char g_tmp[512];       /* scratch root of the whole test */
static char g_model[600];     /* the seeded diffusers folder */
static char g_st_path[700];   /* its diffusion_pytorch_model.safetensors */
static char *g_cfg_json;      /* its config.json text */
static float *g_ref;          /* reference forward output */
static size_t g_nout;         /* floats in a forward output */

#define LAT 8
#define CTX_T 4
#define SOURCE_ID "seeded-crash-test-v1"

static kiln_config test_config(void) {
    kiln_config c = kiln_config_demo();
    c.attention_head_dim = 64;
    c.num_attention_heads = 4;
    c.caption_projection_dim = 256;
    c.num_layers = 4;
    c.joint_attention_dim = 64;
    c.pooled_projection_dim = 64;
    c.pos_embed_max_size = 48;
    return c;
}

#define bin kiln_bin /* cli_util.h */

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* One forward on small deterministic inputs; out holds g_nout floats. */
static kiln_status run_forward(kiln_model *m, float *out) {
    const kiln_config *c = kiln_model_config(m);
    size_t nh = (size_t)c->in_channels * LAT * LAT, nc = (size_t)CTX_T * (size_t)c->joint_attention_dim,
           np = (size_t)c->pooled_projection_dim;
    float *hidden = malloc(nh * sizeof *hidden), *ctx = malloc(nc * sizeof *ctx), *pooled = malloc(np * sizeof *pooled);
    float ts = 437.0f;
    kiln_status st = KILN_ERR_NOMEM;
    if (hidden && ctx && pooled) {
        kiln_noise(11, hidden, nh);
        kiln_noise(12, ctx, nc);
        kiln_noise(13, pooled, np);
        kiln_forward_args a = {.batch = 1, .height = LAT, .width = LAT, .context_len = CTX_T,
                               .hidden = hidden, .context = ctx, .pooled = pooled, .timestep = &ts};
        st = kiln_forward(m, &a, out);
    }
    free(hidden);
    free(ctx);
    free(pooled);
    return st;
}

static kiln_load_opts path_opts(const char *root, const char *name) {
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = name;
    o.cache_root = root;
    o.source = g_model;
    o.dtype = KILN_F32;
    return o;
}

/* ---- a source callback over the seeded model's tensors ------------------------- */

typedef struct cb_ctx {
    const char *st_path;
    int signal_fd;     /* >= 0: write one byte here when half the tensors are out */
    double pause_s;    /* then sleep this long (the lock is held all the while) */
    int die;           /* then write kb_now() (a double) to signal_fd and SIGKILL this process */
    int calls;         /* how often the callback ran */
    double t_done;     /* kb_now() when every tensor was out (CLOCK_MONOTONIC: comparable across processes) */
} cb_ctx;

static kiln_status emit_seeded(void *user, kiln_emit_fn emit, void *ctx) {
    cb_ctx *c = user;
    c->calls++;
    st_file *f = NULL;
    kiln_status st = st_open(c->st_path, &f);
    if (st) return st;
    size_t n = st_count(f);
    for (size_t i = 0; i < n && !st; i++) {
        if (i == n / 2) {
            if (c->signal_fd >= 0) {
                char b = 'x';
                if (write(c->signal_fd, &b, 1) != 1) _exit(90);
            }
            sleep_s(c->pause_s);
            if (c->die) {
                double t = kb_now();
                if (write(c->signal_fd, &t, sizeof t) != (ssize_t)sizeof t) _exit(91);
                kill(getpid(), SIGKILL);
            }
        }
        const st_tensor *t = st_at(f, i);
        kiln_source_tensor s = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(s.shape, t->shape, sizeof s.shape);
        st = emit(ctx, &s);
    }
    c->t_done = kb_now();
    st_close(f);
    return st;
}

static kiln_load_opts cb_opts(const char *root, cb_ctx *c) {
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = "cb";
    o.dtype = KILN_F32;
    o.cache_root = root;
    o.source_fn = emit_seeded;
    o.source_user = c;
    o.source_config_json = g_cfg_json;
    o.source_id = SOURCE_ID;
    return o;
}

/* ---- child processes ----------------------------------------------------------- */

/* What a forked loader reports through its result file. */
typedef struct res_hdr {
    int status;
    char origin[16];
    char cache_path[1024];
    double elapsed;
    double cb_done; /* the source callback's t_done (0 without one) */
    uint64_t nout;
} res_hdr;

/* In a forked child: load, forward, write hdr + output to path, _exit. Never
 * returns into the harness. */
static void child_load_report(const kiln_load_opts *o, const cb_ctx *c, const char *path) {
    res_hdr h;
    memset(&h, 0, sizeof h);
    float *out = calloc(g_nout, sizeof *out);
    double t0 = kb_now();
    kiln_model *m = NULL;
    h.status = kiln_load_model(o, &m);
    h.elapsed = kb_now() - t0;
    h.cb_done = c ? c->t_done : 0;
    if (!h.status) {
        snprintf(h.origin, sizeof h.origin, "%s", kiln_model_origin(m));
        snprintf(h.cache_path, sizeof h.cache_path, "%s", kiln_model_cache_path(m));
        h.status = out ? run_forward(m, out) : KILN_ERR_NOMEM;
        if (!h.status) h.nout = g_nout;
    }
    if (h.status) fprintf(stderr, "  child %ld: %s\n", (long)getpid(), kiln_last_error());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, &h, sizeof h) == (ssize_t)sizeof h &&
             (!h.nout || write(fd, out, g_nout * sizeof *out) == (ssize_t)(g_nout * sizeof *out));
    if (fd >= 0) close(fd);
    _exit(ok && !h.status ? 0 : 1);
}

/* Read a child's result; out (g_nout floats) gets the output. 0 on success. */
static int read_report(const char *path, res_hdr *h, float *out) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int ok = read(fd, h, sizeof *h) == (ssize_t)sizeof *h;
    if (ok && h->nout) ok = h->nout == g_nout && read(fd, out, g_nout * sizeof *out) == (ssize_t)(g_nout * sizeof *out);
    close(fd);
    return ok ? 0 : -1;
}

/* Wait up to timeout_s for one byte on fd. 1 if it came. */
static int wait_byte(int fd, double timeout_s) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(timeout_s * 1000)) != 1) return 0;
    char b;
    return read(fd, &b, 1) == 1;
}

/* ---- `kiln cache build` as a child process ------------------------------------------ */

static pid_t spawn_build(const char *root, const char *out_path) {
    /* --dtype f32: the library's default (kiln_load_defaults), so both use one key */
    char *argv[] = {(char *)bin(), "cache", "build", g_model, "--cache-dir", (char *)root,
                    "--name", "crash", "--dtype", "f32", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e) {
        fprintf(stderr, "  cannot spawn %s: %s\n", argv[0], strerror(e));
        return -1;
    }
    return pid;
}

/* Wait for pid, killing it with SIGKILL after delay seconds (never when delay
 * < 0). 1 if it exited on its own before the kill. */
static int wait_or_kill(pid_t pid, double delay, int *ws) {
    double end = kb_now() + delay;
    for (;;) {
        pid_t r = waitpid(pid, ws, delay < 0 ? 0 : WNOHANG);
        if (r == pid) return 1;
        if (r < 0 && errno != EINTR) return 0;
        double left = end - kb_now();
        if (delay >= 0 && left <= 0) break;
        if (delay >= 0) sleep_s(left < 0.001 ? left : 0.001);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, ws, 0) < 0 && errno == EINTR) {
    }
    return 0;
}

/* Run a build to completion: its exit status (-1 if it did not exit). */
static int run_build(const char *root, const char *out_path, double *secs) {
    double t0 = kb_now();
    pid_t pid = spawn_build(root, out_path);
    if (pid < 0) return -1;
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (secs) *secs = kb_now() - t0;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* Entries of dir whose name contains sub (names optional, one per line). */
static int count_entries(const char *dir, const char *sub, char *names, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    if (names && cap) names[0] = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strstr(e->d_name, sub)) continue;
        n++;
        if (names && strlen(names) + strlen(e->d_name) + 2 < cap) {
            strcat(names, e->d_name);
            strcat(names, "\n");
        }
    }
    closedir(d);
    return n;
}

/* Key folders of a group: folders that are not staging or trash (locks are files). */
static int count_key_folders(const char *dir, char *names, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    names[0] = 0;
    while ((e = readdir(d))) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || strstr(e->d_name, ".staging.") || strstr(e->d_name, ".trash.") || !kb_is_dir(path))
            continue;
        n++;
        if (strlen(names) + strlen(e->d_name) + 2 < cap) {
            strcat(names, e->d_name);
            strcat(names, "\n");
        }
    }
    closedir(d);
    return n;
}

/* the median of the last k of v[0..n) */
static double median_last(const double *v, int n, int k) {
    double w[16];
    int m = n < k ? n : k;
    if (m > 16) m = 16;
    for (int i = 0; i < m; i++) w[i] = v[n - m + i];
    for (int i = 1; i < m; i++) /* insertion sort */
        for (int j = i; j > 0 && w[j - 1] > w[j]; j--) {
            double t = w[j];
            w[j] = w[j - 1];
            w[j - 1] = t;
        }
    return m ? w[m / 2] : 0;
}

/* splitmix64: a deterministic schedule of kill times */
static uint64_t g_rng = 0x6b696c6e2d6b696cull;
static double rand01(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ---- the tests ----------------------------------------------------------------------- */

TEST(kill_during_publish) {
    char root[700], group[800], out_path[700], key_path[1100] = "";
    snprintf(root, sizeof root, "%s/kill-root", g_tmp);
    snprintf(group, sizeof group, "%s/crash/transformer", root);
    snprintf(out_path, sizeof out_path, "%s/build.out", g_tmp);

    /* the reference build: its duration and where it publishes */
    double d_cold = 0;
    int rc = run_build(root, out_path, &d_cold);
    char *text = NULL;
    size_t len;
    CHECK_MSG(rc == 0, "reference build exit %d", rc);
    CHECK_OK(kb_read_file(out_path, &text, &len));
    if (rc || !text) {
        free(text);
        return;
    }
    const char *p = strstr(text, "miss: ");
    CHECK_MSG(p != NULL, "build output lacks \"miss: \": %s", text);
    if (p) {
        p += 6;
        const char *q = strstr(p, " (");
        if (q && (size_t)(q - p) < sizeof key_path) snprintf(key_path, sizeof key_path, "%.*s", (int)(q - p), p);
    }
    free(text);
    CHECK_MSG(!strncmp(key_path, group, strlen(group)) && key_path[strlen(group)] == '/',
              "cache path \"%s\" not under %s", key_path, group);
    char names[4096];
    int nkeys = count_key_folders(group, names, sizeof names);
    CHECK_MSG(nkeys == 1, "%d key folders in %s:\n%s", nkeys, group, names);
    if (!kb_is_dir(key_path)) return;

    /* the reference output, through the load flow on the CLI's cache */
    float *ref = calloc(g_nout, sizeof *ref), *got = calloc(g_nout, sizeof *got);
    kiln_load_opts o = path_opts(root, "crash");
    o.verify = 1;
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    if (!m) {
        free(ref);
        free(got);
        return;
    }
    CHECK_MSG(!strcmp(kiln_model_origin(m), "hit"), "origin %s", kiln_model_origin(m));
    CHECK_MSG(!strcmp(kiln_model_cache_path(m), key_path), "%s vs %s", kiln_model_cache_path(m), key_path);
    CHECK_OK(run_forward(m, ref));
    kiln_model_free(m);
    CHECK_MSG(!memcmp(ref, g_ref, g_nout * sizeof *ref), "the CLI's cache and the library's give different outputs");

    /* two more builds. D, the duration the trials scale their kill times by,
     * is the median of the last 5 complete builds: these three, every 10th
     * trial (a calibration, not killed) and trials that finished before their
     * kill. So D follows the machine's load: a build's fsync and its sweep of
     * leftovers wait for writeback, ours and other processes', and some builds
     * take several times as long as others. */
    char wpath[1200];
    struct stat wsb;
    snprintf(wpath, sizeof wpath, "%s/" KCACHE_DATA, key_path);
    double mb = stat(wpath, &wsb) == 0 ? (double)wsb.st_size / (1 << 20) : 0;
    double d[3] = {d_cold, 0, 0};
    for (int i = 1; i < 3; i++) {
        CHECK_OK(kcache_remove(key_path));
        rc = run_build(root, NULL, &d[i]);
        CHECK_MSG(rc == 0 && kb_is_dir(key_path), "build exit %d", rc);
    }
    double dur[256] = {d[0], d[1], d[2]};
    int ndur = 3;
    double D = median_last(dur, ndur, 5);
    CHECK_OK(kcache_remove(key_path));

    /* `trials` kills at uniform times in [0, 1.3 D] (MIN_TRIALS, and up to
     * MAX_TRIALS while they take under BUDGET_S); then, if no staging folder is
     * left over, up to EXTRA more until one is, so that the final build has
     * leftovers to sweep: their kill times search [lo, hi] (too early: no
     * staging folder yet, lo moves up; too late: published, hi moves down) */
    enum { MIN_TRIALS = 50, MAX_TRIALS = 100, EXTRA = 30 };
    const double BUDGET_S = 8;
    int completed = 0, killed = 0, k_before = 0, k_staging = 0, k_after = 0, max_staging = 0, extra = 0, calib = 0;
    int trials = MAX_TRIALS;
    double t_trials = kb_now(), lo = 0, hi = 0;
    for (int trial = 0; trial < trials + EXTRA; trial++) {
        if (trial >= MIN_TRIALS && trial < trials && kb_now() - t_trials > BUDGET_S) trials = trial;
        if (trial >= trials && count_entries(group, ".staging.", NULL, 0)) break;
        extra += trial >= trials;
        int calibrate = trial < trials && trial % 10 == 9;
        if (trial == trials) hi = 1.3 * D;
        if (trial >= trials && hi - lo < 0.1 * D) hi = lo + 0.5 * D; /* a window that closed: widen */
        double delay = trial < trials ? rand01() * 1.3 * D : lo + (0.25 + 0.5 * rand01()) * (hi - lo);
        double t0 = kb_now(), took = 0;
        pid_t pid = spawn_build(root, NULL);
        if (pid < 0) {
            CHECK(pid >= 0);
            break;
        }
        int ws;
        int exited = wait_or_kill(pid, calibrate ? -1 : delay, &ws);
        took = kb_now() - t0;
        int was_killed = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
        if (exited && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && ndur < 256) {
            dur[ndur++] = took;
            D = median_last(dur, ndur, 5);
        }
        if (calibrate) {
            CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "trial %d (calibration): build status 0x%x", trial, ws);
            calib++;
        }
        CHECK_MSG(was_killed || (WIFEXITED(ws) && WEXITSTATUS(ws) == 0), "trial %d: build status 0x%x", trial, ws);

        /* the invariant: no folder, or a complete cache that verifies */
        struct stat sb;
        int exists = lstat(key_path, &sb) == 0;
        if (exists) {
            kcache_entry *e = NULL;
            kiln_status st = S_ISDIR(sb.st_mode) ? kcache_open(key_path, 1, &e) : KILN_ERR_CORRUPT;
            CHECK_MSG(st == KILN_OK, "trial %d (delay %.0f ms, %s): the key folder exists but is no complete cache "
                      "(a partial hit): %s", trial, delay * 1e3, was_killed ? "killed" : "exited",
                      kiln_last_error());
            kcache_close(e);
        }
        char mine[64];
        snprintf(mine, sizeof mine, ".staging.%ld.", (long)pid);
        int staging = count_entries(group, ".staging.", NULL, 0);
        if (staging > max_staging) max_staging = staging;
        if (!was_killed) completed++;
        else {
            killed++;
            if (exists) k_after++;
            else if (count_entries(group, mine, NULL, 0)) k_staging++;
            else k_before++;
        }
        CHECK_MSG(was_killed || exists, "trial %d: the build finished but published nothing", trial);
        if (trial >= trials) {
            if (exists) hi = delay; /* too late */
            else if (!count_entries(group, ".staging.", NULL, 0)) lo = delay; /* too early */
        }
        if (exists) CHECK_OK(kcache_remove(key_path)); /* the next trial converts again */
    }
    t_trials = kb_now() - t_trials;

    /* a last build to completion: it sweeps the leftovers and publishes */
    char left[4096];
    int staging_before = count_entries(group, ".staging.", NULL, 0);
    if (staging_before == 0) {
        /* no kill landed while staging this time (timing on a loaded machine):
         * plant what such a kill leaves, so the sweep is always exercised */
        char t[1200];
        snprintf(t, sizeof t, "%s.staging.999999.0/" KCACHE_DATA, key_path);
        char *dir = kb_dirname(t);
        CHECK_OK(kb_mkdir_p(dir));
        free(dir);
        CHECK_OK(kb_write_file_atomic(t, "partial", 7));
        fprintf(stderr, "  (no kill landed while staging; planted a staging leftover)\n");
    }
    /* and trash of processes killed while removing (two: a sweep must take all) */
    const char *trash[] = {".trash.1.0", ".staging.1.0.trash.2.0"};
    for (int i = 0; i < 2; i++) {
        char t[1200];
        snprintf(t, sizeof t, "%s%s/sub", key_path, trash[i]);
        CHECK_OK(kb_mkdir_p(t));
        snprintf(t, sizeof t, "%s%s/sub/f", key_path, trash[i]);
        CHECK_OK(kb_write_file_atomic(t, "x", 1));
    }
    rc = run_build(root, NULL, NULL);
    CHECK_MSG(rc == 0, "final build exit %d", rc);
    int staging_after = count_entries(group, ".staging.", left, sizeof left);
    CHECK_MSG(staging_after == 0, "staging leftovers after a complete build:\n%s", left);
    int trash_after = count_entries(group, ".trash.", left, sizeof left);
    CHECK_MSG(trash_after == 0, "trash leftovers after a complete build:\n%s", left);
    m = NULL;
    CHECK_OK(kiln_load_model(&o, &m)); /* verify = 1 */
    if (m) {
        CHECK_MSG(!strcmp(kiln_model_origin(m), "hit"), "origin %s", kiln_model_origin(m));
        CHECK_OK(run_forward(m, got));
        CHECK_MSG(!memcmp(got, ref, g_nout * sizeof *got), "the rebuilt cache gives a different output");
        kiln_model_free(m);
    }
    fprintf(stderr,
            "  build of %.1f MiB: %.0f, %.0f, %.0f ms (D = %.0f ms); %d+%d trials in %.1f s: %d killed mid-way "
            "(%d before publishing, %d while staging, %d after the rename), %d completed (%d not killed: "
            "calibrations); at most %d staging "
            "folders at once, %d before the final build\n",
            mb, d[0] * 1e3, d[1] * 1e3, d[2] * 1e3, D * 1e3, trials, extra, t_trials, killed, k_before, k_staging,
            k_after, completed, calib, max_staging, staging_before);
    CHECK_MSG(killed >= trials / 4, "only %d of %d trials were killed mid-way", killed, trials);
    /* whether a kill lands inside the staging window is timing; the sweep
     * of its leftovers is exercised either way (planted above if needed) */
    if (k_staging == 0) fprintf(stderr, "  note: no trial was killed while staging (D = %.0f ms)\n", D * 1e3);
    fprintf(stderr, "  complete builds (ms):");
    for (int i = 0; i < ndur; i++) fprintf(stderr, " %.0f", dur[i] * 1e3);
    fputc('\n', stderr);
    free(ref);
    free(got);
}

TEST(racing_processes) {
    enum { N = 8 };
    char root[700], res[N][720];
    snprintf(root, sizeof root, "%s/race-root", g_tmp);
    kiln_load_opts o = path_opts(root, "race");
    int gate[2];
    CHECK(pipe(gate) == 0);
    pid_t pids[N];
    fflush(NULL);
    for (int i = 0; i < N; i++) {
        snprintf(res[i], sizeof res[i], "%s/race-%d.res", g_tmp, i);
        pids[i] = fork();
        if (pids[i] == 0) {
            close(gate[1]);
            char b;
            while (read(gate[0], &b, 1) < 0 && errno == EINTR) {
            } /* EOF: the parent opened the gate */
            child_load_report(&o, NULL, res[i]);
        }
        CHECK(pids[i] > 0);
    }
    close(gate[0]);
    close(gate[1]); /* everyone starts now */
    double t0 = kb_now();
    int misses = 0, hits = 0;
    float *out = calloc(g_nout, sizeof *out);
    char path0[1024] = "";
    for (int i = 0; i < N; i++) {
        int ws;
        if (pids[i] <= 0) continue;
        while (waitpid(pids[i], &ws, 0) < 0 && errno == EINTR) {
        }
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child %d status 0x%x", i, ws);
        res_hdr h;
        if (read_report(res[i], &h, out)) {
            CHECK_MSG(0, "child %d wrote no report", i);
            continue;
        }
        misses += !strcmp(h.origin, "miss");
        hits += !strcmp(h.origin, "hit");
        CHECK_MSG(h.nout == g_nout && !memcmp(out, g_ref, g_nout * sizeof *out), "child %d (%s): output differs", i,
                  h.origin);
        if (!*path0) snprintf(path0, sizeof path0, "%s", h.cache_path);
        CHECK_MSG(!strcmp(h.cache_path, path0), "child %d mapped %s, child 0 %s", i, h.cache_path, path0);
    }
    CHECK_MSG(misses == 1 && hits == N - 1, "%d misses, %d hits (want 1 and %d)", misses, hits, N - 1);
    fprintf(stderr, "  %d processes: %d miss, %d hits in %.2f s\n", N, misses, hits, kb_now() - t0);
    free(out);
}

TEST(converter_dies_waiter_takes_over) {
    char root[700];
    snprintf(root, sizeof root, "%s/dies-root", g_tmp);
    int sig[2];
    CHECK(pipe(sig) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(sig[0]);
        cb_ctx c = {.st_path = g_st_path, .signal_fd = sig[1], .pause_s = 0.3, .die = 1};
        kiln_load_opts o = cb_opts(root, &c);
        kiln_model *m;
        kiln_load_model(&o, &m);
        _exit(3); /* never here: the callback kills the process */
    }
    CHECK(pid > 0);
    close(sig[1]);
    /* the child holds the key's lock now, half-way through its conversion */
    int got_byte = wait_byte(sig[0], 120);
    CHECK_MSG(got_byte, "the converter never reached half-way");
    cb_ctx c = {.st_path = g_st_path, .signal_fd = -1};
    kiln_load_opts o = cb_opts(root, &c);
    double t0 = kb_now();
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    double t1 = kb_now(), t_death = 0;
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    CHECK_MSG(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "the converter's status 0x%x", ws);
    CHECK_MSG(read(sig[0], &t_death, sizeof t_death) == (ssize_t)sizeof t_death, "the converter sent no time of death");
    close(sig[0]);
    if (!m) return;
    CHECK_MSG(!strcmp(kiln_model_origin(m), "miss"), "origin %s", kiln_model_origin(m));
    CHECK_MSG(c.calls == 1, "the waiter converted %d times", c.calls);
    /* it began while the converter held the lock, so it blocked until the death */
    CHECK_MSG(t0 < t_death && t1 > t_death, "the waiter ran from %+.0f to %+.0f ms of the converter's death: it "
              "did not overlap the converter (a loaded machine?)", (t0 - t_death) * 1e3, (t1 - t_death) * 1e3);
    float *out = calloc(g_nout, sizeof *out);
    CHECK_OK(run_forward(m, out));
    CHECK_MSG(!memcmp(out, g_ref, g_nout * sizeof *out), "output differs from the reference");
    kcache_entry *e = NULL;
    CHECK_OK(kcache_open(kiln_model_cache_path(m), 1, &e));
    kcache_close(e);
    fprintf(stderr, "  waiter blocked %.0f ms until the converter died, then converted in %.0f ms\n",
            (t_death - t0) * 1e3, (t1 - t_death) * 1e3);
    free(out);
    kiln_model_free(m);
}

TEST(waiter_maps_what_the_converter_published) {
    char root[700], res[720];
    snprintf(root, sizeof root, "%s/wait-root", g_tmp);
    snprintf(res, sizeof res, "%s/wait-converter.res", g_tmp);
    int sig[2];
    CHECK(pipe(sig) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(sig[0]);
        cb_ctx c = {.st_path = g_st_path, .signal_fd = sig[1], .pause_s = 0.3};
        kiln_load_opts o = cb_opts(root, &c);
        child_load_report(&o, &c, res);
    }
    CHECK(pid > 0);
    close(sig[1]);
    int got_byte = wait_byte(sig[0], 120);
    close(sig[0]);
    CHECK_MSG(got_byte, "the converter never reached half-way");
    sleep_s(0.05);
    cb_ctx c = {.st_path = g_st_path, .signal_fd = -1};
    kiln_load_opts o = cb_opts(root, &c);
    double t0 = kb_now();
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    double waited = kb_now() - t0;
    int ws;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the converter's status 0x%x", ws);
    float *out = calloc(g_nout, sizeof *out), *cout = calloc(g_nout, sizeof *cout);
    res_hdr h;
    memset(&h, 0, sizeof h);
    CHECK_MSG(!read_report(res, &h, cout), "the converter wrote no report");
    CHECK_MSG(!strcmp(h.origin, "miss"), "the converter's origin %s", h.origin);
    CHECK_MSG(!memcmp(cout, g_ref, g_nout * sizeof *cout), "the converter's output differs from the reference");
    if (m) {
        CHECK_MSG(!strcmp(kiln_model_origin(m), "hit"), "the waiter's origin %s", kiln_model_origin(m));
        CHECK_MSG(c.calls == 0, "the waiter converted too (%d calls)", c.calls);
        CHECK_MSG(!strcmp(kiln_model_cache_path(m), h.cache_path), "%s vs %s", kiln_model_cache_path(m),
                  h.cache_path);
        /* it began while the converter still converted (holding the lock) and got
         * what the converter published: it must have blocked */
        CHECK_MSG(t0 < h.cb_done && t0 + waited > h.cb_done,
                  "the waiter ran from %+.0f to %+.0f ms of the converter's end of conversion: it did not "
                  "overlap the converter (a loaded machine?)", (t0 - h.cb_done) * 1e3, (t0 + waited - h.cb_done) * 1e3);
        CHECK_OK(run_forward(m, out));
        CHECK_MSG(!memcmp(out, g_ref, g_nout * sizeof *out), "the waiter's output differs from the reference");
        kiln_model_free(m);
    }
    fprintf(stderr, "  waiter blocked %.0f ms (the converter ended its conversion %.0f ms in), then mapped the publish\n",
            waited * 1e3, (h.cb_done - t0) * 1e3);
    free(out);
    free(cout);
}

int main(void) {
    kiln_set_threads(1); /* see the top: no OpenMP worker pool across fork() */
    test_tmpdir(g_tmp, sizeof g_tmp, "cache-crash");
    snprintf(g_model, sizeof g_model, "%s/model", g_tmp);
    snprintf(g_st_path, sizeof g_st_path, "%s/diffusion_pytorch_model.safetensors", g_model);
    kiln_config cfg = test_config();
    g_nout = (size_t)cfg.out_channels * LAT * LAT;
    kiln_status st = kiln_write_seeded_model(g_model, &cfg, 2024, KILN_F32);
    char cfg_path[700];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", g_model);
    size_t len;
    if (st || kb_read_file(cfg_path, &g_cfg_json, &len)) {
        fprintf(stderr, "cannot write the seeded model: %s\n", kiln_last_error());
        test_rmrf(g_tmp);
        return 1;
    }
    /* the reference output: the library's own cache of the same model */
    char root[700];
    snprintf(root, sizeof root, "%s/ref-root", g_tmp);
    kiln_load_opts o = path_opts(root, "ref");
    kiln_model *m = NULL;
    g_ref = calloc(g_nout, sizeof *g_ref);
    if ((st = kiln_load_model(&o, &m)) || (st = run_forward(m, g_ref))) {
        fprintf(stderr, "cannot compute the reference: %s\n", kiln_last_error());
        test_rmrf(g_tmp);
        return 1;
    }
    kiln_model_free(m);

    RUN(kill_during_publish);
    RUN(racing_processes);
    RUN(converter_dies_waiter_takes_over);
    RUN(waiter_maps_what_the_converter_published);
    free(g_ref);
    free(g_cfg_json);
    test_rmrf(g_tmp);
    return TEST_SUMMARY();
}
