/* package.c - weightless compiled packages: a folder holding the generated
 * C source, the shared object built from it, and manifest.json (format
 * version, kiln version, CPU features, compiler and flags, symbols and
 * ranges, guards, inputs, the memory plan, every weight's name, dtype,
 * shape and layout, the SHA-256 of the shared object). Published
 * atomically (staging folder, then rename); opened lazily. docs/package.md
 * describes the format. */
#define _GNU_SOURCE
#include "base/base.h"
#include "compile/compile.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PKG_MAGIC "kiln-package"
#define PKG_LIB "model.so"
#define PKG_SRC "model.c"
#define PKG_MANIFEST "manifest.json"
#define PKG_LOG "build.log"
#define PKG_CFLAGS "-O2 -fPIC -shared"

void kx_rt_init(kx_rt *rt, const kg_ctx *ctx) {
    memset(rt, 0, sizeof *rt);
    rt->abi = KX_ABI;
    rt->ctx = ctx;
    for (int i = 0; i < KG_OP_COUNT; i++) rt->run[i] = kg_ops[i].run;
}

int kx_cpu_has(const char *feature) { return kk_cpu_has(feature); }

static const char *place_name(kx_place_kind k) {
    static const char *names[] = {"none", "arena", "input", "output", "weight"};
    return names[k];
}

/* ---- open, load, run ------------------------------------------------------------- */

typedef struct pkg_weight {
    char *name;
    int node, ndim, gemm;
    int64_t shape[4];
    kiln_dtype dtype;
    char layout[40];
} pkg_weight;

struct kx_package {
    char *dir;
    int nsym, n_in, n_nodes, nw, n_cpu;
    kx_sym sym[KX_MAX_SYMS];
    kx_iospec in[4];
    int in_slot[4];
    kx_place *place;
    size_t arena_bytes;
    pkg_weight *w;
    char so_sha[65], cpu[4][24], summary[256];
    /* loaded on first use, in the process that uses it */
    int loaded;
    kiln_status load_st;
    char *load_err;
    void *dl;
    int (*fwd)(const kx_rt *, const int64_t *, void *const *);
    kg_ctx ctx;
    kx_rt rt;
    void **P;
    void *arena;
};

const char *kx_package_dir(const kx_package *p) { return p->dir; }
const char *kx_package_summary(const kx_package *p) { return p->summary; }

int kx_package_fixed(const kx_package *p) {
    for (int i = 0; i < p->nsym; i++)
        if (p->sym[i].lo != p->sym[i].hi) return 0;
    return 1;
}

void kx_package_close(kx_package *p) {
    if (!p) return;
    if (p->dl) dlclose(p->dl);
    for (int i = 0; i < p->nw; i++) free(p->w[i].name);
    free(p->w);
    free(p->place);
    free(p->P);
    kb_free_aligned(p->arena);
    free(p->load_err);
    free(p->dir);
    free(p);
}

static int get_num(const cJSON *o, const char *key, double *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j)) return 0;
    *v = j->valuedouble;
    return 1;
}

static const char *get_str(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static kiln_status parse_manifest(kx_package *p, const cJSON *m, const char *path) {
#define BAD(what) return kb_fail(KILN_ERR_CORRUPT, "package %s: manifest %s", path, what)
    const char *fmt = get_str(m, "format");
    double v = 0;
    if (!fmt || strcmp(fmt, PKG_MAGIC)) BAD("is not a kiln package manifest");
    if (!get_num(m, "format_version", &v) || v != KX_FORMAT_VERSION)
        return kb_fail(KILN_ERR_UNSUPPORTED, "package %s: format version %g, this kiln reads %d", path, v, KX_FORMAT_VERSION);
    if (!get_num(m, "abi", &v) || v != KX_ABI)
        return kb_fail(KILN_ERR_UNSUPPORTED, "package %s: runtime ABI %g, this kiln has %d", path, v, KX_ABI);
    const char *sha = get_str(m, "library_sha256");
    if (!sha || strlen(sha) != 64) BAD("has no library_sha256");
    snprintf(p->so_sha, sizeof p->so_sha, "%s", sha);
    const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(m, "cpu_features"), *e;
    cJSON_ArrayForEach(e, cpu) {
        if (!cJSON_IsString(e) || p->n_cpu >= 4) BAD("has a bad cpu_features list");
        snprintf(p->cpu[p->n_cpu++], sizeof p->cpu[0], "%s", e->valuestring);
    }
    const cJSON *syms = cJSON_GetObjectItemCaseSensitive(m, "symbols");
    cJSON_ArrayForEach(e, syms) {
        double lo, hi;
        const char *name = get_str(e, "name");
        if (p->nsym >= KX_MAX_SYMS || !name || !get_num(e, "min", &lo) || !get_num(e, "max", &hi) || lo > hi)
            BAD("has a bad symbol");
        kx_sym *s = &p->sym[p->nsym++];
        snprintf(s->name, sizeof s->name, "%s", name);
        s->lo = (int64_t)lo;
        s->hi = (int64_t)hi;
    }
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(m, "inputs");
    cJSON_ArrayForEach(e, ins) {
        const char *name = get_str(e, "name");
        const cJSON *coef = cJSON_GetObjectItemCaseSensitive(e, "coef"), *c;
        if (p->n_in >= 4 || !name || !get_num(e, "slot", &v) || !cJSON_IsArray(coef) || cJSON_GetArraySize(coef) > 4)
            BAD("has a bad input");
        kx_iospec *io = &p->in[p->n_in];
        p->in_slot[p->n_in++] = (int)v;
        snprintf(io->name, sizeof io->name, "%s", name);
        cJSON_ArrayForEach(c, coef) {
            if (cJSON_GetArraySize(c) != KX_NMONO) BAD("has a bad input dimension");
            for (int k = 0; k < KX_NMONO; k++) io->dim[io->ndim].c[k] = (int64_t)cJSON_GetArrayItem(c, k)->valuedouble;
            io->ndim++;
        }
    }
    if (!get_num(m, "arena_bytes", &v) || v < 0) BAD("has no arena_bytes");
    p->arena_bytes = (size_t)v;
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(m, "placement");
    p->n_nodes = cJSON_GetArraySize(pl);
    if (!(p->place = calloc((size_t)p->n_nodes + 1, sizeof *p->place))) return KILN_ERR_NOMEM;
    int i = 0;
    cJSON_ArrayForEach(e, pl) {
        const char *k = cJSON_IsString(cJSON_GetArrayItem(e, 0)) ? cJSON_GetArrayItem(e, 0)->valuestring : "";
        const cJSON *at = cJSON_GetArrayItem(e, 1);
        int kind = -1;
        for (int q = KX_NONE; q <= KX_WEIGHT; q++)
            if (!strcmp(k, place_name((kx_place_kind)q))) kind = q;
        if (kind < 0 || !cJSON_IsNumber(at) || at->valuedouble < 0) BAD("has a bad placement");
        if (kind == KX_ARENA && at->valuedouble >= (double)p->arena_bytes) BAD("places a buffer outside the arena");
        if ((kind == KX_INPUT && at->valuedouble >= 4) || (kind == KX_OUTPUT && at->valuedouble >= 1))
            BAD("names an input or output slot the forward does not have");
        p->place[i++] = (kx_place){(kx_place_kind)kind, (int64_t)at->valuedouble};
    }
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(m, "weights");
    p->nw = cJSON_GetArraySize(ws);
    if (!(p->w = calloc((size_t)p->nw + 1, sizeof *p->w))) return KILN_ERR_NOMEM;
    i = 0;
    cJSON_ArrayForEach(e, ws) {
        pkg_weight *w = &p->w[i++];
        const char *name = get_str(e, "name"), *view = get_str(e, "view"), *dt = get_str(e, "dtype"),
                   *layout = get_str(e, "layout");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape"), *d;
        if (!name || !view || !dt || !layout || !get_num(e, "node", &v) || v < 0 || v >= p->n_nodes ||
            !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > 4)
            BAD("has a bad weight entry");
        if (!(w->name = kb_strdup(name))) return KILN_ERR_NOMEM;
        w->node = (int)v;
        w->gemm = !strcmp(view, "gemm");
        w->dtype = kt_dtype_from_name(dt);
        snprintf(w->layout, sizeof w->layout, "%s", layout);
        cJSON_ArrayForEach(d, shape) w->shape[w->ndim++] = (int64_t)d->valuedouble;
    }
    size_t len = 0;
    for (int s = 0; s < p->nsym; s++) {
        const kx_sym *y = &p->sym[s];
        if (y->lo == y->hi) snprintf(p->summary + len, sizeof p->summary - len, "%s%s=%lld", s ? " " : "", y->name, (long long)y->lo);
        else snprintf(p->summary + len, sizeof p->summary - len, "%s%s=%lld..%lld", s ? " " : "", y->name, (long long)y->lo, (long long)y->hi);
        len = strlen(p->summary);
    }
    const char *mode = get_str(m, "mode"), *dtype = get_str(m, "dtype");
    snprintf(p->summary + len, sizeof p->summary - len, "  %s %s", dtype ? dtype : "?", mode ? mode : "?");
    return KILN_OK;
#undef BAD
}

/* The manifest's executable content (symbols, guards' inputs, arena, every
 * placement, every weight binding) as SHA-256. The shared object carries
 * the digest of the manifest it was generated with, so a manifest edited
 * after the build (a guard widened, a placement moved, a weight view
 * swapped) is refused instead of letting the code run out of bounds. */
static void plan_digest(const kx_package *p, char hex[65]) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        memset(hex, '0', 64);
        hex[64] = 0;
        return;
    }
    for (int i = 0; i < p->nsym; i++) fprintf(f, "s %s %lld %lld\n", p->sym[i].name, (long long)p->sym[i].lo, (long long)p->sym[i].hi);
    for (int i = 0; i < p->n_in; i++) {
        fprintf(f, "i %s %d %d", p->in[i].name, p->in_slot[i], p->in[i].ndim);
        for (int d = 0; d < p->in[i].ndim; d++)
            for (int k = 0; k < KX_NMONO; k++) fprintf(f, " %lld", (long long)p->in[i].dim[d].c[k]);
        fprintf(f, "\n");
    }
    fprintf(f, "a %zu %d\n", p->arena_bytes, p->n_nodes);
    for (int i = 0; i < p->n_nodes; i++) fprintf(f, "%d:%lld ", (int)p->place[i].kind, (long long)p->place[i].at);
    for (int i = 0; i < p->nw; i++) {
        const pkg_weight *w = &p->w[i];
        fprintf(f, "\nw %s %d %d %d %s %d", w->name, w->node, w->gemm, (int)w->dtype, w->layout, w->ndim);
        for (int d = 0; d < w->ndim; d++) fprintf(f, " %lld", (long long)w->shape[d]);
    }
    fclose(f);
    kb_sha256(buf, len, hex);
    free(buf);
}

kiln_status kx_package_open(const char *dir, kx_package **out) {
    *out = NULL;
    kx_package *p = kb_calloc(1, sizeof *p);
    char *path = kb_strfmt("%s/" PKG_MANIFEST, dir), *text = NULL;
    size_t len;
    kiln_status st = p && path ? KILN_OK : KILN_ERR_NOMEM;
    if (!st && !(p->dir = kb_strdup(dir))) st = KILN_ERR_NOMEM;
    if (!st && (st = kb_read_file(path, &text, &len))) st = kb_wrap(KILN_ERR_MISSING, "package %s: no manifest", dir);
    cJSON *m = st ? NULL : cJSON_Parse(text);
    if (!st && !m) st = kb_fail(KILN_ERR_CORRUPT, "package %s: manifest is not valid JSON", dir);
    if (!st) st = parse_manifest(p, m, dir);
    cJSON_Delete(m);
    free(text);
    free(path);
    if (st) {
        kx_package_close(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

kiln_status kx_package_solve(const kx_package *p, int n_in, const int64_t (*shape)[4], int64_t *s) {
    if (n_in != p->n_in)
        return kb_fail(KILN_ERR_SHAPE, "package %s takes %d inputs, not %d", p->dir, p->n_in, n_in);
    int64_t sh[4][4];
    for (int i = 0; i < n_in; i++) memcpy(sh[i], shape[p->in_slot[i]], sizeof sh[i]);
    return kx_solve(p->sym, p->nsym, p->in, p->n_in, (const int64_t(*)[4])sh, s);
}

/* the library's hash and the CPU features, without loading anything */
static kiln_status check_library(const kx_package *p) {
    for (int i = 0; i < p->n_cpu; i++)
        if (!kx_cpu_has(p->cpu[i]))
            return kb_fail(KILN_ERR_UNSUPPORTED, "package %s needs CPU feature %s, which this machine lacks", p->dir, p->cpu[i]);
    char *so = kb_strfmt("%s/" PKG_LIB, p->dir), hex[65];
    if (!so) return KILN_ERR_NOMEM;
    kiln_status st = kb_sha256_file(so, hex);
    if (st) /* out of memory says nothing about the library: that failure passes (kx_package_load) */
        st = kb_wrap(st == KILN_ERR_NOMEM ? st : KILN_ERR_MISSING, "package %s: its shared object", p->dir);
    else if (strcmp(hex, p->so_sha))
        st = kb_fail(KILN_ERR_CORRUPT, "package %s: %s does not match its manifest's SHA-256 (tampered or damaged); refused",
                     p->dir, PKG_LIB);
    free(so);
    return st;
}

kiln_status kx_package_verify(const char *dir) {
    kx_package *p;
    kiln_status st = kx_package_open(dir, &p);
    if (st) return st;
    st = check_library(p);
    kx_package_close(p);
    return st;
}

static kiln_status bind_weights(kx_package *p, kx_weight_fn weight, void *user) {
    char msg[2048] = "";
    size_t len = 0;
    int bad = 0;
    for (int i = 0; i < p->nw; i++) {
        const pkg_weight *w = &p->w[i];
        kx_bound b = {0};
        const char *why = NULL;
        int same = 1;
        if (!weight(user, w->name, &b)) why = "missing";
        else {
            same = b.ndim == w->ndim;
            for (int d = 0; same && d < w->ndim; d++) same = b.shape[d] == w->shape[d];
            if (!same) why = "shape differs";
            else if (w->gemm && (!b.kw || b.dtype != w->dtype || !b.layout || strcmp(b.layout, w->layout)))
                why = "dtype or layout differs";
            else if (!w->gemm && !b.data) why = "no f32 data";
        }
        if (why) {
            if (bad < 12) {
                snprintf(msg + len, sizeof msg - len, "%s%s (%s)", bad ? ", " : "", w->name, why);
                len = strlen(msg);
            }
            bad++;
            continue;
        }
        p->P[w->node] = w->gemm ? (void *)b.kw : (void *)b.data;
    }
    if (bad)
        return kb_fail(KILN_ERR_MISSING, "package %s: %d weight%s cannot be bound: %s%s", p->dir, bad, bad == 1 ? "" : "s",
                       msg, bad > 12 ? " ..." : "");
    return KILN_OK;
}

kiln_status kx_package_load(kx_package *p, const kk_backend *be, const kg_dist *dist, kx_weight_fn weight, void *user) {
    if (p->loaded) return p->load_st ? kb_fail(p->load_st, "%s", p->load_err ? p->load_err : "package failed to load") : KILN_OK;
    kiln_status st = check_library(p);
    char *so = st ? NULL : kb_strfmt("%s/" PKG_LIB, p->dir);
    if (!st && !so) st = kb_fail(KILN_ERR_NOMEM, "package %s: out of memory", p->dir);
    if (!st && !(p->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL)))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: cannot load %s: %s", p->dir, PKG_LIB, dlerror());
    int (*abi)(void) = NULL;
    const char *(*digest)(void) = NULL, *(*ops)(void) = NULL;
    if (!st) {
        *(void **)&abi = dlsym(p->dl, "kiln_pkg_abi");
        *(void **)&digest = dlsym(p->dl, "kiln_pkg_digest");
        *(void **)&ops = dlsym(p->dl, "kiln_pkg_ops");
        *(void **)&p->fwd = dlsym(p->dl, "kiln_pkg_forward");
        if (!abi || !digest || !ops || !p->fwd || abi() != KX_ABI)
            st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: %s does not export the kiln ABI %d", p->dir, PKG_LIB, KX_ABI);
        else if (strcmp(ops(), kg_op_table_names()))
            st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: built against another op table (ops.def) than this kiln's", p->dir);
    }
    if (!st) {
        char want[65];
        plan_digest(p, want);
        if (strcmp(want, digest()))
            st = kb_fail(KILN_ERR_CORRUPT, "package %s: the manifest's plan does not match the one %s was built for "
                                           "(edited after the build); refused", p->dir, PKG_LIB);
    }
    if (!st && !(p->P = calloc((size_t)p->n_nodes + 1, sizeof *p->P)))
        st = kb_fail(KILN_ERR_NOMEM, "package %s: out of memory", p->dir);
    if (!st) st = bind_weights(p, weight, user);
    if (!st && p->arena_bytes && !(p->arena = kb_alloc_aligned(p->arena_bytes)))
        st = kb_fail(KILN_ERR_NOMEM, "package %s: cannot allocate its %zu-byte arena", p->dir, p->arena_bytes);
    if (!st) {
        p->ctx = (kg_ctx){be, dist};
        kx_rt_init(&p->rt, &p->ctx);
        for (int i = 0; i < p->n_nodes; i++)
            if (p->place[i].kind == KX_ARENA) p->P[i] = (char *)p->arena + p->place[i].at;
    }
    free(so);
    if (st) {
        if (p->dl) dlclose(p->dl);
        p->dl = NULL;
    }
    if (st == KILN_ERR_NOMEM) { /* passing: the next forward tries again */
        free(p->P);
        p->P = NULL;
        return st;
    }
    p->loaded = 1; /* a package that cannot load stays refused, with its reason */
    p->load_st = st;
    if (st) p->load_err = kb_strdup(kiln_last_error());
    return st;
}

kiln_status kx_package_run(kx_package *p, const int64_t *s, const float *const *inputs, float *const *outputs) {
    if (!p->loaded || p->load_st) return kb_fail(KILN_ERR_INVALID_ARG, "package %s is not loaded", p->dir);
    for (int i = 0; i < p->n_nodes; i++) {
        if (p->place[i].kind == KX_INPUT) p->P[i] = (void *)inputs[p->place[i].at];
        else if (p->place[i].kind == KX_OUTPUT) p->P[i] = outputs[p->place[i].at];
    }
    if (p->fwd(&p->rt, s, p->P)) return kb_fail(KILN_ERR_INVALID_ARG, "package %s: the compiled forward failed", p->dir);
    return KILN_OK;
}

/* ---- compile ------------------------------------------------------------------- */

static const char *cc_cmd(void) {
    const char *cc = getenv("KILN_CC");
    return cc && *cc ? cc : "cc";
}

/* Run argv (split on spaces from cmd, then extra) with stdout+stderr into
 * log; returns the exit status, 127 when it could not start. */
static int run_tool(const char *cmd, const char *const *extra, const char *log) {
    char *copy = kb_strdup(cmd);
    if (!copy) return -1;
    const char *argv[64];
    int argc = 0;
    for (char *t = strtok(copy, " \t"); t && argc < 40; t = strtok(NULL, " \t")) argv[argc++] = t;
    for (int i = 0; extra[i] && argc < 63; i++) argv[argc++] = extra[i];
    argv[argc] = NULL;
    int rc = -1;
    if (argc) {
        pid_t pid = fork();
        if (pid == 0) { /* only async-signal-safe calls until exec */
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execvp(argv[0], (char *const *)argv);
            _exit(127);
        }
        int ws;
        if (pid > 0 && waitpid(pid, &ws, 0) == pid) rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    }
    free(copy);
    return rc;
}

/* the first line of a file, for error messages */
static void first_line(const char *path, char *buf, size_t cap) {
    char *text = NULL;
    size_t len = 0;
    buf[0] = 0;
    if (kb_read_file(path, &text, &len)) {
        kb_clear_error();
        return;
    }
    const char *p = text;
    while (*p == '\n') p++;
    size_t n = strcspn(p, "\n");
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    free(text);
}

static cJSON *expr_json(const kx_expr *e) {
    double v[KX_NMONO];
    for (int m = 0; m < KX_NMONO; m++) v[m] = (double)e->c[m];
    return cJSON_CreateDoubleArray(v, KX_NMONO);
}


static char *manifest_text(const kx_compile_req *r, const kx_export *x, const kx_plan *p, const char *hash,
                           const char *so_sha, const char *cc_version, int n_kinds) {
    char es[128];
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", PKG_MAGIC);
    cJSON_AddNumberToObject(m, "format_version", KX_FORMAT_VERSION);
    cJSON_AddStringToObject(m, "kiln_version", KILN_VERSION);
    cJSON_AddNumberToObject(m, "abi", KX_ABI);
    cJSON_AddStringToObject(m, "family", r->family);
    cJSON_AddStringToObject(m, "graph_hash", hash);
    cJSON_AddStringToObject(m, "dtype", r->dtype ? r->dtype : "");
    cJSON_AddStringToObject(m, "quant", r->quant ? r->quant : "none");
    cJSON *cpu = cJSON_AddArrayToObject(m, "cpu_features");
    if (r->cpu_isa && *r->cpu_isa) cJSON_AddItemToArray(cpu, cJSON_CreateString(r->cpu_isa));
    cJSON *cc = cJSON_AddObjectToObject(m, "compiler");
    cJSON_AddStringToObject(cc, "command", cc_cmd());
    cJSON_AddStringToObject(cc, "flags", PKG_CFLAGS);
    cJSON_AddStringToObject(cc, "version", cc_version);
    cJSON_AddStringToObject(m, "mode", r->regional ? "regional" : "whole-graph");
    cJSON_AddNumberToObject(m, "block_kinds", n_kinds);
    cJSON_AddNumberToObject(m, "regions", r->regional ? x->g.n_regions : 0);
    if (r->model_json) cJSON_AddItemToObject(m, "model", cJSON_Parse(r->model_json));
    cJSON *syms = cJSON_AddArrayToObject(m, "symbols");
    for (int i = 0; i < x->nsym; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "name", x->sym[i].name);
        cJSON_AddNumberToObject(s, "min", (double)x->sym[i].lo);
        cJSON_AddNumberToObject(s, "max", (double)x->sym[i].hi);
        cJSON_AddItemToArray(syms, s);
    }
    cJSON *guards = cJSON_AddArrayToObject(m, "guards");
    cJSON *ins = cJSON_AddArrayToObject(m, "inputs");
    for (int i = 0; i < x->g.n; i++) {
        const kg_node *n = &x->g.nodes[i];
        if (n->op != KG_INPUT) continue;
        cJSON *in = cJSON_CreateObject();
        cJSON_AddStringToObject(in, "name", n->name);
        cJSON_AddNumberToObject(in, "slot", (double)n->iparam[0]);
        cJSON *dims = cJSON_AddArrayToObject(in, "dims"), *coef = cJSON_AddArrayToObject(in, "coef");
        for (int k = 0; k < n->ndim; k++) {
            kx_expr_str(&x->dim[i][k], x->sym, x->nsym, es, sizeof es);
            cJSON_AddItemToArray(dims, cJSON_CreateString(es));
            cJSON_AddItemToArray(coef, expr_json(&x->dim[i][k]));
            char gs[200];
            snprintf(gs, sizeof gs, "%s[%d] == %s", n->name, k, es);
            cJSON_AddItemToArray(guards, cJSON_CreateString(gs));
        }
        cJSON_AddItemToArray(ins, in);
    }
    for (int i = 0; i < x->nsym; i++) {
        char gs[160];
        snprintf(gs, sizeof gs, "%lld <= %s <= %lld", (long long)x->sym[i].lo, x->sym[i].name, (long long)x->sym[i].hi);
        cJSON_AddItemToArray(guards, cJSON_CreateString(gs));
    }
    cJSON *outs = cJSON_AddArrayToObject(m, "outputs");
    for (int o = 0; o < x->g.n_outputs; o++) {
        kg_id id = x->g.outputs[o];
        cJSON *ob = cJSON_CreateObject(), *dims = cJSON_AddArrayToObject(ob, "dims");
        cJSON_AddStringToObject(ob, "name", "sample");
        for (int k = 0; k < x->g.nodes[id].ndim; k++) {
            kx_expr_str(&x->dim[id][k], x->sym, x->nsym, es, sizeof es);
            cJSON_AddItemToArray(dims, cJSON_CreateString(es));
        }
        cJSON_AddItemToArray(outs, ob);
    }
    cJSON_AddNumberToObject(m, "arena_bytes", (double)p->arena_bytes);
    cJSON *pl = cJSON_AddArrayToObject(m, "placement");
    for (int i = 0; i < p->n; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateString(place_name(p->place[i].kind)));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->place[i].at));
        cJSON_AddItemToArray(pl, e);
    }
    /* a weight an op reads as its GEMM weight (ops.def gemm_src) is bound to its GEMM view, any other to its f32 data */
    char *as_w = calloc((size_t)x->g.n + 1, 1);
    for (int i = 0; as_w && i < x->g.n; i++) {
        int gs = kg_ops[x->g.nodes[i].op].gemm_src;
        if (gs >= 0 && x->g.nodes[i].src[gs] >= 0) as_w[x->g.nodes[i].src[gs]] = 1;
    }
    cJSON *ws = cJSON_AddArrayToObject(m, "weights");
    for (int k = 0; as_w && k < p->n_weights; k++) {
        const kg_node *n = &x->g.nodes[p->weights[k]];
        kx_bound b = {0};
        r->weight(r->weight_user, n->name, &b);
        int gemm = as_w[p->weights[k]];
        cJSON *w = cJSON_CreateObject();
        cJSON_AddStringToObject(w, "name", n->name);
        cJSON_AddNumberToObject(w, "node", p->weights[k]);
        cJSON_AddStringToObject(w, "view", gemm ? "gemm" : "f32");
        cJSON_AddStringToObject(w, "dtype", kiln_dtype_name(gemm ? b.dtype : KILN_F32));
        cJSON_AddStringToObject(w, "layout", gemm && b.layout ? b.layout : "rowmajor");
        double sh[4];
        for (int d = 0; d < n->ndim; d++) sh[d] = (double)n->shape[d];
        cJSON_AddItemToObject(w, "shape", cJSON_CreateDoubleArray(sh, n->ndim));
        cJSON_AddItemToArray(ws, w);
    }
    free(as_w);
    cJSON_AddStringToObject(m, "library", PKG_LIB);
    cJSON_AddStringToObject(m, "library_sha256", so_sha);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

static void dims_label(const kx_sym *s, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        if (s[i].lo == s[i].hi) snprintf(buf + len, cap - len, "%s%s%lld", i ? "." : "", s[i].name, (long long)s[i].lo);
        else snprintf(buf + len, cap - len, "%s%s%lld-%lld", i ? "." : "", s[i].name, (long long)s[i].lo, (long long)s[i].hi);
        len = strlen(buf);
    }
}

/* Staging folders of compilers that died (their pid is gone) and folders
 * a remover renamed aside are deleted; a live compiler's are left alone. */
static void clean_leftovers(const char *famdir) {
    DIR *d = opendir(famdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = 0;
        int stale = strstr(e->d_name, ".trash.") != NULL;
        if (!strncmp(e->d_name, ".staging-", 9) && (pid = strtol(e->d_name + 9, NULL, 10)) > 0)
            stale = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        char *path = stale ? kb_path_join(famdir, e->d_name) : NULL;
        if (path) {
            kb_log(KILN_LOG_INFO, "compile: removing %s, left by a compiler that died", path);
            kb_remove_tree(path);
        }
        free(path);
    }
    closedir(d);
}

kiln_status kx_compile(const kx_compile_req *r, kx_compile_info *info) {
    memset(info, 0, sizeof *info);
    if (!r->root || !*r->root || !r->family || !*r->family)
        return kb_fail(KILN_ERR_INVALID_ARG, "compile: no package folder (set KILN_PACKAGE_DIR or KILN_CACHE_DIR)");
    kx_export x;
    kx_plan p = {0};
    char *src = NULL, *famdir = NULL, *final = NULL, *staging = NULL, *manifest = NULL;
    double t0 = kb_now();
    kiln_status st = kx_export_graph(r->build, r->build_user, r->sym, r->nsym, &x);
    if (st) return st;
    info->export_s = kb_now() - t0;
    info->n_nodes = x.g.n;
    info->n_regions = r->regional ? x.g.n_regions : 0;
    t0 = kb_now();
    char digest[65] = "";
    if (!(st = kx_plan_graph(&x.g, &p))) { /* the manifest as it will be read back, for its digest */
        char *draft = manifest_text(r, &x, &p, "", "0000000000000000000000000000000000000000000000000000000000000000", "", 0);
        cJSON *m = draft ? cJSON_Parse(draft) : NULL;
        kx_package *tmp = kb_calloc(1, sizeof *tmp);
        if (!m || !tmp) st = KILN_ERR_NOMEM;
        else if (!(st = parse_manifest(tmp, m, "(draft)"))) plan_digest(tmp, digest);
        cJSON_Delete(m);
        free(draft);
        kx_package_close(tmp);
    }
    if (!st) st = kx_codegen(&x, &p, r->regional, digest, &src, &info->n_kinds);
    info->codegen_s = kb_now() - t0;
    info->arena_bytes = p.arena_bytes;
    /* the folder: dims, then a hash of everything the code depends on */
    char hex[65], label[160], hash[17];
    if (!st) {
        char *keytext = kb_strfmt("%s\n%s %s\n%s\n%s", r->family, cc_cmd(), PKG_CFLAGS, KILN_VERSION, src);
        if (!keytext) st = KILN_ERR_NOMEM;
        else kb_sha256(keytext, strlen(keytext), hex);
        free(keytext);
        snprintf(hash, sizeof hash, "%.16s", hex);
        dims_label(r->sym, r->nsym, label, sizeof label);
    }
    if (!st && (!(famdir = kb_path_join(r->root, r->family)) || !(final = kb_strfmt("%s/%s-%s", famdir, label, hash))))
        st = KILN_ERR_NOMEM;
    if (!st) snprintf(info->path, sizeof info->path, "%s", final);
    if (!st) clean_leftovers(famdir);
    if (!st && kb_is_file(manifest = kb_strfmt("%s/" PKG_MANIFEST, final))) {
        info->reused = 1; /* the same code, already built and published */
        goto done;
    }
    static int counter;
    if (!st && (st = kb_mkdir_p(famdir))) st = kb_wrap(st, "compile: package folder");
    if (!st && !(staging = kb_strfmt("%s/.staging-%ld-%d", famdir, (long)getpid(),
                                     __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED))))
        st = KILN_ERR_NOMEM;
    if (!st && mkdir(staging, 0755) != 0) st = kb_fail(KILN_ERR_IO, "cannot create %s: %s", staging, strerror(errno));
    char *src_path = NULL, *so_path = NULL, *log_path = NULL, *man_path = NULL;
    if (!st && (!(src_path = kb_strfmt("%s/" PKG_SRC, staging)) || !(so_path = kb_strfmt("%s/" PKG_LIB, staging)) ||
                !(log_path = kb_strfmt("%s/" PKG_LOG, staging)) || !(man_path = kb_strfmt("%s/" PKG_MANIFEST, staging))))
        st = KILN_ERR_NOMEM;
    if (!st) st = kb_write_file_atomic(src_path, src, strlen(src));
    char cc_version[200] = "";
    if (!st) {
        char *vlog = kb_strfmt("%s/cc-version.txt", staging);
        const char *vargs[] = {"--version", NULL};
        if (vlog && run_tool(cc_cmd(), vargs, vlog) == 0) first_line(vlog, cc_version, sizeof cc_version);
        if (vlog) unlink(vlog);
        free(vlog);
        t0 = kb_now();
        kb_log(KILN_LOG_INFO, "compile: building %s with %s", label, cc_cmd());
        const char *args[] = {"-O2", "-fPIC", "-shared", "-o", so_path, src_path, NULL};
        int rc = run_tool(cc_cmd(), args, log_path);
        info->cc_s = kb_now() - t0;
        if (rc != 0) {
            char line[300];
            first_line(log_path, line, sizeof line);
            st = rc == 127 ? kb_fail(KILN_ERR_UNSUPPORTED, "compile: cannot run the C compiler '%s' (set KILN_CC)", cc_cmd())
                           : kb_fail(KILN_ERR_UNSUPPORTED, "compile: the C compiler '%s' failed (exit %d)%s%s", cc_cmd(), rc,
                                     *line ? ": " : "", line);
        } else if (!kb_is_file(so_path)) {
            st = kb_fail(KILN_ERR_UNSUPPORTED, "compile: the C compiler '%s' produced no shared object", cc_cmd());
        }
    }
    char so_sha[65];
    if (!st) st = kb_sha256_file(so_path, so_sha);
    if (!st) {
        struct stat sb;
        if (stat(so_path, &sb) == 0) info->so_bytes = (size_t)sb.st_size;
        char *text = manifest_text(r, &x, &p, hash, so_sha, cc_version, info->n_kinds);
        st = text ? kb_write_file_atomic(man_path, text, strlen(text)) : KILN_ERR_NOMEM;
        free(text);
    }
    if (!st && r->check) st = r->check(r->check_user, staging);
    /* publish: the rename is atomic; losing a race to an identical build is fine */
    if (!st && rename(staging, final) != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY) info->reused = 1;
        else st = kb_fail(KILN_ERR_IO, "cannot publish %s: %s", final, strerror(errno));
        kb_remove_tree(staging);
    } else if (st && staging) {
        kb_remove_tree(staging);
    }
    free(src_path);
    free(so_path);
    free(log_path);
    free(man_path);
done:
    free(src);
    free(famdir);
    free(final);
    free(staging);
    free(manifest);
    kx_plan_free(&p);
    kx_export_free(&x);
    return st;
}
