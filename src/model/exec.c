/* exec.c - how a forward runs: the fallback chain over compiled packages,
 * the planned executor and eager execution, and kiln_compile, which hands
 * the model's one graph definition to the compiler. Every step computes
 * the same function with the same kernels; a step that cannot run logs
 * why and the next one takes over. */
#include "base/base.h"
#include "cache/cache.h"
#include "compile/compile.h"
#include "dist/dist.h"
#include "model/model.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_steps[KM_MAX_STEPS] = {[KM_STEP_DYNAMIC] = "dynamic", [KM_STEP_FIXED] = "fixed",
                                                  [KM_STEP_PLANNED] = "planned", [KM_STEP_EAGER] = "eager"};
#define DEFAULT_CHAIN "dynamic,fixed,planned,eager"

static kiln_status parse_chain(const char *text, int *chain, int *n) {
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text ? text : "");
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        int k = 0;
        while (k < KM_MAX_STEPS && strcmp(t, k_steps[k])) k++;
        if (k == KM_MAX_STEPS)
            return kb_fail(KILN_ERR_INVALID_ARG, "unknown execution step '%s' (the steps are dynamic, fixed, planned, eager)", t);
        for (int j = 0; j < *n; j++)
            if (chain[j] == k) return kb_fail(KILN_ERR_INVALID_ARG, "execution step '%s' is named twice", t);
        chain[(*n)++] = k;
    }
    if (!*n) return kb_fail(KILN_ERR_INVALID_ARG, "the execution chain is empty (e.g. %s)", DEFAULT_CHAIN);
    return KILN_OK;
}

void km_exec_init(kiln_model *m) {
    km_exec *x = &m->exec;
    pthread_mutex_init(&x->lock, NULL);
    const char *env = getenv("KILN_EXEC");
    if (env && *env && parse_chain(env, x->chain, &x->n_steps)) {
        kb_log(KILN_LOG_WARN, "KILN_EXEC: %s; using %s", kiln_last_error(), DEFAULT_CHAIN);
        env = NULL;
    }
    if (!env || !*env) parse_chain(DEFAULT_CHAIN, x->chain, &x->n_steps);
}

void km_exec_free(kiln_model *m) {
    km_exec *x = &m->exec;
    for (int i = 0; i < x->n_pkgs; i++) kx_package_close(x->pkgs[i]);
    free(x->pkgs);
    kk_buf_free(m->backend, x->arena);
    kx_consts_free(&x->consts, m->backend);
    for (int k = 0; k < KA_MAX_OUT; k++) kb_free_aligned(x->spare[k]);
    free(x->package_dir);
    free(x->cache_root);
    pthread_mutex_destroy(&x->lock);
}

kiln_status kiln_model_set_exec(kiln_model *m, const char *chain) {
    if (!m) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_set_exec: model is required");
    int c[KM_MAX_STEPS], n;
    kiln_status st = parse_chain(chain, c, &n);
    if (st) return st;
    pthread_mutex_lock(&m->exec.lock);
    memcpy(m->exec.chain, c, sizeof c);
    m->exec.n_steps = n;
    pthread_mutex_unlock(&m->exec.lock);
    return KILN_OK;
}

kiln_status kiln_model_set_package_dir(kiln_model *m, const char *dir) {
    if (!m) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_set_package_dir: model is required");
    char *d = dir && *dir ? kb_strdup(dir) : NULL;
    if (dir && *dir && !d) return KILN_ERR_NOMEM;
    pthread_mutex_lock(&m->exec.lock);
    free(m->exec.package_dir);
    m->exec.package_dir = d;
    for (int i = 0; i < m->exec.n_pkgs; i++) kx_package_close(m->exec.pkgs[i]);
    m->exec.n_pkgs = 0;
    pthread_mutex_unlock(&m->exec.lock);
    return KILN_OK;
}

kiln_status kiln_model_set_compile(kiln_model *m, int on) {
    if (!m) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_set_compile: model is required");
    pthread_mutex_lock(&m->exec.lock);
    m->exec.compile = on != 0;
    pthread_mutex_unlock(&m->exec.lock);
    return KILN_OK;
}

const char *kiln_model_last_exec(const kiln_model *m) { return m && m->exec.last ? m->exec.last : ""; }
const char *kiln_model_exec_note(const kiln_model *m) { return m ? m->exec.note : ""; }

/* ---- the model's side of compiling ------------------------------------------------ */

/* the model's own setting, else $KILN_PACKAGE_DIR, else <cache root>/packages (malloc'd; NULL: none) */
static char *package_root(const kiln_model *m) {
    return kcache_package_root(m->exec.package_dir, m->exec.cache_root);
}

/* Everything a package depends on except its dimensions: architecture,
 * compute dtype, quantization, the CPU layout of the packed weights, the
 * rank's place on a mesh, kiln. None of it changes after loading, so it is
 * made once per model. */
static const char *family(kiln_model *m) {
    if (m->exec.family[0]) return m->exec.family;
    char *buf = m->exec.family;
    size_t cap = sizeof m->exec.family;
    char *cfg = m->arch->config_to_json(m->cfg);
    uint64_t h = cfg ? kcache_hash_bytes(cfg, strlen(cfg), 7) : 0;
    free(cfg);
    const char *layout = km_compute_layout(m->compute);
    char q[64];
    km_quant_tag(&m->compute, q, sizeof q);
    char mesh[96] = ""; /* on a mesh, each rank's graph is its own part */
    if (m->mesh) {
        const kd_mesh *d = m->mesh;
        snprintf(mesh, sizeof mesh, "-mesh%dx%d-cfg%d.%d-tp%d.%d-sp%d.%d-fsdp%d.%d", d->rows, d->cols, d->size[KD_CFG],
                 d->index[KD_CFG], d->size[KD_TP], d->index[KD_TP], d->size[KD_SP], d->index[KD_SP], d->size[KD_FSDP],
                 d->index[KD_FSDP]);
    }
    snprintf(buf, cap, "%s-%012llx-%s-%s-q%s%s-kiln%s", m->arch->name, (unsigned long long)(h & 0xffffffffffffULL),
             m->compute.dtype == KILN_BF16 ? "bf16" : "f32", *layout ? layout : "ref", *q ? q : "0", mesh, KILN_VERSION);
    return buf;
}

/* the collectives' context of a model on a mesh (NULL: a single process) */
static const kg_dist *dist_of(kiln_model *m) {
    if (!m->mesh) return NULL;
    m->exec.dist = (kg_dist){m->mesh, m->compute.fsdp > 1 ? km_fsdp_gather : NULL, m};
    return &m->exec.dist;
}

/* the model's graph for symbol values s: this rank's part on a mesh. With
 * `passes`, the compiler's graph passes run on it (kg_fuse: GELU into the
 * GEMM epilogue, layernorm + modulate in one kernel; kg_plan_bf16: bf16
 * activations between the ops that take them), as for every planned and
 * compiled executor; eager runs the model's ops as written, one kernel each,
 * with f32 activations between them. */
static kiln_status model_graph(kiln_model *m, const int64_t *s, kg_graph *g, int passes) {
    kg_init(g, km_resolve, m);
    ka_par par = {1, 1, 0, 0};
    if (m->mesh) {
        par = (ka_par){m->mesh->size[KD_TP], m->mesh->size[KD_SP], m->mesh->index[KD_SP], m->compute.fsdp > 1};
        g->dist = dist_of(m);
    }
    kiln_status st = m->arch->build(m->cfg, g, s, m->mesh ? &par : NULL);
    if (!st && passes) {
        kg_fuse(g);
        kg_plan_bf16(g, m->backend);
    }
    return st ? st : g->status;
}

/* the graph every compiled package and the planned executor are built from */
static kiln_status build_graph(void *user, const int64_t *s, kg_graph *g) { return model_graph(user, s, g, 1); }

static int bind_weight(void *user, const char *name, kx_bound *b) {
    const km_weight *w = km_find(user, name);
    if (!w) return 0;
    b->ndim = w->ndim;
    memcpy(b->shape, w->shape, sizeof b->shape);
    b->kw = &w->kw;
    b->data = w->view;
    b->dtype = w->packed ? w->kw.packed_dtype : KILN_F32;
    b->layout = w->layout;
    return 1;
}

/* the shapes of every input and output for symbol values s */
static void io_shapes(const kiln_model *m, const int64_t *s, int64_t in[KA_MAX_IO][4], int64_t out[KA_MAX_OUT][4]) {
    memset(in, 0, sizeof(int64_t) * KA_MAX_IO * 4);
    memset(out, 0, sizeof(int64_t) * KA_MAX_OUT * 4);
    m->arch->io_shapes(m->cfg, s, in, out);
}

/* A forward's inputs and outputs as buffers of the model's backend, which
 * every executor takes: the caller's own where the backend's memory is the
 * host's; else the backend's, the inputs copied in (io_stage) and the
 * outputs copied out (io_unstage) once per forward, whichever step runs */
typedef struct io_bufs {
    const float *in[KA_MAX_IO];
    float *out[KA_MAX_OUT];
    size_t out_bytes[KA_MAX_OUT];
    int n_in, n_out, own;
} io_bufs;

static void io_free(const kiln_model *m, io_bufs *b) {
    if (!b->own) return;
    for (int k = 0; k < b->n_in; k++) kk_buf_free(m->backend, (void *)b->in[k]);
    for (int k = 0; k < b->n_out; k++) kk_buf_free(m->backend, b->out[k]);
    b->own = 0;
}

static kiln_status io_stage(const kiln_model *m, const int64_t (*ish)[4], const int64_t (*osh)[4],
                            const float *const *in, float *const *out, io_bufs *b) {
    const ka_arch *a = m->arch;
    memset(b, 0, sizeof *b);
    b->n_in = a->n_in;
    b->n_out = m->n_out;
    b->own = !kk_host_memory(m->backend);
    for (int k = 0; k < b->n_in; k++) {
        size_t bytes = sizeof(float) * ka_numel(a->in[k].ndim, ish[k]);
        float *d = b->own ? kk_buf_alloc(m->backend, bytes) : (float *)in[k];
        if (!d) break;
        if (b->own) kk_copy_from_host(m->backend, d, in[k], bytes);
        b->in[k] = d;
    }
    for (int k = 0; k < b->n_out; k++) {
        b->out_bytes[k] = sizeof(float) * ka_numel(m->out[k].ndim, osh[k]);
        b->out[k] = b->own ? kk_buf_alloc(m->backend, b->out_bytes[k]) : out[k];
    }
    for (int k = 0; k < b->n_in; k++)
        if (!b->in[k]) goto nomem;
    for (int k = 0; k < b->n_out; k++)
        if (!b->out[k]) goto nomem;
    return KILN_OK;
nomem:
    io_free(m, b);
    return kb_fail(KILN_ERR_NOMEM, "the %s backend has no memory for a forward's inputs and outputs", m->backend->name);
}

/* the outputs copied out when st is KILN_OK; the staging buffers freed */
static void io_unstage(const kiln_model *m, io_bufs *b, float *const *out, kiln_status st) {
    for (int k = 0; b->own && !st && k < b->n_out; k++) kk_copy_to_host(m->backend, out[k], b->out[k], b->out_bytes[k]);
    io_free(m, b);
}

typedef struct capture {
    kiln_model *m;
    int64_t s[KX_MAX_SYMS];
    double rel_err;
} capture;

static void free_bufs(float **b, int n) {
    for (int k = 0; b && k < n; k++) free(b[k]);
    free(b);
}

/* n buffers of the given shapes (malloc'd; NULL out of memory) */
static float **alloc_bufs(const ka_io *io, int n, const int64_t (*shape)[4]) {
    float **b = calloc((size_t)n, sizeof *b);
    for (int k = 0; b && k < n; k++) {
        size_t c = ka_numel(io[k].ndim, shape[k]);
        if (!c || !(b[k] = malloc(sizeof(float) * c))) {
            free_bufs(b, k);
            return NULL;
        }
    }
    return b;
}

/* --capture: the package in staging must reproduce an eager forward of the
 * family's example inputs (every output) */
static kiln_status check_capture(void *user, const char *staging) {
    capture *cap = user;
    kiln_model *m = cap->m;
    const ka_arch *a = m->arch;
    const int64_t *s = cap->s;
    int64_t ish[KA_MAX_IO][4], osh[KA_MAX_OUT][4];
    io_shapes(m, s, ish, osh);
    float **in = alloc_bufs(a->in, a->n_in, (const int64_t(*)[4])ish);
    float **want = alloc_bufs(m->out, m->n_out, (const int64_t(*)[4])osh);
    float **got = alloc_bufs(m->out, m->n_out, (const int64_t(*)[4])osh);
    for (int k = 0; in && k < a->n_in; k++) a->example_input(m->cfg, k, in[k], ka_numel(a->in[k].ndim, ish[k]));
    kx_package *pkg = NULL;
    io_bufs b;
    kiln_status st = in && want && got ? KILN_OK : KILN_ERR_NOMEM;
    if (!st && !(st = io_stage(m, (const int64_t(*)[4])ish, (const int64_t(*)[4])osh, (const float *const *)in, want, &b))) {
        kg_graph g;
        if (!(st = build_graph(m, s, &g))) st = kg_run_eager(&g, m->backend, b.in, b.out);
        kg_free(&g);
        io_unstage(m, &b, want, st);
    }
    if (!st) st = kx_package_open(staging, &pkg);
    if (!st) st = kx_package_load(pkg, m->backend, dist_of(m), bind_weight, m);
    if (!st && !(st = io_stage(m, (const int64_t(*)[4])ish, (const int64_t(*)[4])osh, (const float *const *)in, got, &b))) {
        st = kx_package_run(pkg, s, b.in, b.out);
        io_unstage(m, &b, got, st);
    }
    cap->rel_err = 0;
    for (int k = 0; !st && k < m->n_out; k++) {
        double e = kb_rel_l2(got[k], want[k], ka_numel(m->out[k].ndim, osh[k]));
        if (!(e <= cap->rel_err)) cap->rel_err = e;
    }
    if (!st && !(cap->rel_err <= 1e-6))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "compile: the package does not reproduce the eager forward on the captured "
                                           "example (relative L2 %.3g); not published", cap->rel_err);
    kx_package_close(pkg);
    free_bufs(in, a->n_in);
    free_bufs(want, m->n_out);
    free_bufs(got, m->n_out);
    return st;
}

static kiln_status compile_syms(kiln_model *m, const kx_sym *syms, int regional, capture *cap, double quality,
                                kx_compile_info *info) {
    const char *fam = family(m);
    const ka_arch *a = m->arch;
    char *model_json = NULL, *cfg = a->config_to_json(m->cfg);
    char *root = package_root(m);
    if (!root) {
        free(cfg);
        return kb_fail(KILN_ERR_INVALID_ARG, "compile: no package folder: set KILN_PACKAGE_DIR or KILN_CACHE_DIR "
                                             "(or pass --package-dir)");
    }
    char example[300] = "", qual[200] = "";
    for (int i = 0; cap && i < a->nsym; i++) {
        size_t l = strlen(example);
        snprintf(example + l, sizeof example - l, "%s\"%s\":%lld", i ? "," : ",\"example\":{", a->sym[i], (long long)cap->s[i]);
    }
    if (cap) snprintf(example + strlen(example), sizeof example - strlen(example), "}");
    if (m->compute.quant)
        snprintf(qual, sizeof qual, ",\"quant\":\"%s\",\"quality_final_rel_l2\":%.6g", kiln_quant_name(m->compute.quant),
                 quality);
    if (cfg) model_json = kb_strfmt("{\"config\":%s%s%s}", cfg, example, qual);
    const char *layout = km_compute_layout(m->compute);
    char isa[24] = "";
    snprintf(isa, sizeof isa, "%.*s", (int)strcspn(layout, "-"), layout);
    kx_compile_req r = {.build = build_graph, .build_user = m, .weight = bind_weight, .weight_user = m, .nsym = a->nsym,
                        .regional = regional, .root = root, .family = fam,
                        .dtype = m->compute.dtype == KILN_BF16 ? "bf16" : "f32",
                        .quant = kiln_quant_name(m->compute.quant), .cpu_isa = isa, .be = m->backend,
                        .model_json = model_json, .check = cap ? check_capture : NULL, .check_user = cap};
    memcpy(r.sym, syms, sizeof r.sym);
    double t0 = kb_now();
    kiln_status st = kx_compile(&r, info);
    if (!st) kb_ledger_add("compile", kb_now() - t0, info->reused ? "reused" : "built");
    free(root);
    free(cfg);
    free(model_json);
    return st;
}

kiln_compile_opts kiln_compile_defaults(void) {
    kiln_compile_opts o;
    memset(&o, 0, sizeof o);
    return o;
}

static kiln_status parse_dims(const ka_arch *a, const char *dims, kx_sym *syms) {
    char names[160] = "";
    for (int i = 0; i < a->nsym; i++) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", a->sym[i]);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", dims ? dims : "");
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) return kb_fail(KILN_ERR_INVALID_ARG, "--dim %s: expected name=min:max or name=value", t);
        *eq = 0;
        int k = 0;
        while (k < a->nsym && strcmp(t, a->sym[k])) k++;
        if (k == a->nsym)
            return kb_fail(KILN_ERR_INVALID_ARG, "--dim %s: unknown dimension (the dimensions are %s)", t, names);
        char *end;
        long long lo = strtoll(eq + 1, &end, 10), hi = lo;
        if (*end == ':') hi = strtoll(end + 1, &end, 10);
        if (*end || end == eq + 1 || lo < 1 || hi < lo)
            return kb_fail(KILN_ERR_INVALID_ARG, "--dim %s=%s: expected a positive value or range min:max with min <= max", t, eq + 1);
        syms[k].lo = lo;
        syms[k].hi = hi;
    }
    return KILN_OK;
}

kiln_status km_compile(kiln_model *m, const kiln_compile_opts *o, double quality_rel_l2, kiln_compile_result *res) {
    if (!m || !o || !res) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_compile: model, options and result are required");
    memset(res, 0, sizeof *res);
    const ka_arch *a = m->arch;
    int64_t ex[KX_MAX_SYMS] = {0};
    a->example(m->cfg, ex);
    kiln_status st = KILN_OK;
    if (o->batch) ex[0] = o->batch; /* symbol 0 is every family's batch */
    if (a->example_opts) {
        if ((st = a->example_opts(m->cfg, o, ex))) st = kb_wrap(st, "compile: the example request");
    } else if (o->height || o->width || o->context_len)
        st = kb_fail(KILN_ERR_INVALID_ARG, "compile: %s models take no example height, width or context length; "
                     "give the dimensions with --dim (%s...)", a->name, a->sym[0]);
    if (st) return st;
    if (m->mesh && m->mesh->size[KD_CFG] > 1) { /* a rank's graph takes its share of the batch */
        int cfg = m->mesh->size[KD_CFG];
        if (ex[0] % cfg)
            return kb_fail(KILN_ERR_SHAPE, "compile: CFG parallel %d splits the batch, but the example batch is %lld", cfg,
                           (long long)ex[0]);
        ex[0] /= cfg;
    }
    if ((st = a->check(m->cfg, ex))) return kb_wrap(st, "compile: the example request");
    kx_sym syms[KX_MAX_SYMS];
    memset(syms, 0, sizeof syms);
    for (int i = 0; i < a->nsym; i++) {
        snprintf(syms[i].name, sizeof syms[i].name, "%s", a->sym[i]);
        syms[i].lo = syms[i].hi = ex[i];
    }
    if ((st = parse_dims(a, o->dims, syms))) return st;
    capture cap = {m, {0}, 0};
    for (int i = 0; i < a->nsym; i++) /* the example inside every range */
        cap.s[i] = ex[i] < syms[i].lo ? syms[i].lo : ex[i] > syms[i].hi ? syms[i].hi : ex[i];
    if (o->package_dir && (st = kiln_model_set_package_dir(m, o->package_dir))) return st;
    double t0 = kb_now();
    /* a quantized backbone is published only after the quality gate, which
     * the caller runs (kiln_compile in src/sample/quality.c) */
    res->quality_rel_l2 = quality_rel_l2;
    kx_compile_info info;
    pthread_mutex_lock(&m->exec.lock);
    st = compile_syms(m, syms, !o->whole_graph, o->capture ? &cap : NULL, res->quality_rel_l2, &info);
    pthread_mutex_unlock(&m->exec.lock);
    if (st) return st;
    snprintf(res->path, sizeof res->path, "%s", info.path);
    res->reused = info.reused;
    res->block_kinds = info.n_kinds;
    res->regions = info.n_regions;
    res->nodes = info.n_nodes;
    res->seconds = kb_now() - t0;
    res->cc_seconds = info.cc_s;
    res->so_bytes = info.so_bytes;
    res->arena_bytes = info.arena_bytes;
    res->capture_rel_err = cap.rel_err;
    return KILN_OK;
}

/* ---- the fallback chain ------------------------------------------------------------- */

static kiln_status open_new_packages(kiln_model *m, const char *famdir) {
    DIR *d = opendir(famdir);
    if (!d) return KILN_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".trash.")) continue;
        char *path = kb_path_join(famdir, e->d_name);
        if (!path) break;
        int known = 0;
        for (int i = 0; i < m->exec.n_pkgs && !known; i++) known = !strcmp(kx_package_dir(m->exec.pkgs[i]), path);
        kx_package *p = NULL;
        if (!known && kb_is_dir(path)) {
            if (kx_package_open(path, &p)) kb_log(KILN_LOG_WARN, "%s; skipped", kiln_last_error());
            kx_package **v = p ? realloc(m->exec.pkgs, sizeof *v * (size_t)(m->exec.n_pkgs + 1)) : NULL;
            if (v) {
                m->exec.pkgs = v;
                v[m->exec.n_pkgs++] = p;
            } else {
                kx_package_close(p);
            }
        }
        free(path);
    }
    closedir(d);
    return KILN_OK;
}

kiln_status kiln_model_open_packages(kiln_model *m, int *n) {
    if (!m) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_open_packages: model is required");
    pthread_mutex_lock(&m->exec.lock);
    char *root = package_root(m), *famdir = NULL;
    if (root && !(famdir = kb_path_join(root, family(m)))) {
        pthread_mutex_unlock(&m->exec.lock);
        free(root);
        return KILN_ERR_NOMEM;
    }
    if (famdir) open_new_packages(m, famdir);
    if (n) *n = m->exec.n_pkgs;
    pthread_mutex_unlock(&m->exec.lock);
    free(root);
    free(famdir);
    return KILN_OK;
}

/* A package of the wanted kind (fixed or dynamic) with the model's named
 * inputs and outputs whose guards pass; why not, in reason. */
static kx_package *find_package(kiln_model *m, const char *famdir, int fixed, const int64_t (*sh)[4], int64_t *s,
                                char *reason, size_t cap, int *any) {
    const ka_arch *a = m->arch;
    const char *in[KA_MAX_IO], *out[KA_MAX_OUT];
    for (int i = 0; i < a->n_in; i++) in[i] = a->in[i].name;
    for (int i = 0; i < m->n_out; i++) out[i] = m->out[i].name;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) open_new_packages(m, famdir); /* published since we last looked */
        int seen = 0;
        for (int i = 0; i < m->exec.n_pkgs; i++) {
            kx_package *p = m->exec.pkgs[i];
            if (kx_package_fixed(p) != fixed) continue;
            seen++;
            *any = 1;
            if (!kx_package_check_io(p, a->n_in, in, m->n_out, out) && !kx_package_solve(p, a->n_in, sh, s)) return p;
            snprintf(reason, cap, "%s", kiln_last_error());
        }
        if (!seen) snprintf(reason, cap, "no %s package for this model in %s", fixed ? "fixed-shape" : "dynamic", famdir);
    }
    return NULL;
}

static kiln_status run_package(kiln_model *m, kx_package *p, const int64_t *s, const float *const *in, float *const *out) {
    kiln_status st = kx_package_load(p, m->backend, dist_of(m), bind_weight, m);
    return st ? st : kx_package_run(p, s, in, out);
}

/* the graph of one forward's symbol values (g is always initialised) */
static kiln_status graph_for(kiln_model *m, const int64_t *s, kg_graph *g, int passes) {
    kiln_status st = m->arch->check(m->cfg, s);
    if (st) kg_init(g, NULL, NULL);
    return st ? st : model_graph(m, s, g, passes);
}

static kiln_status run_planned(kiln_model *m, const int64_t *s, const float *const *in, float *const *out) {
    kg_graph g;
    kx_plan plan = {0};
    kiln_status st = graph_for(m, s, &g, 1);
    if (!st) st = kx_plan_graph(&g, &plan);
    if (!st && plan.arena_bytes > m->exec.arena_bytes) { /* grows to the largest shape seen, then stays */
        kk_buf_free(m->backend, m->exec.arena);
        m->exec.arena_bytes = 0;
        if (!(m->exec.arena = kk_buf_alloc(m->backend, plan.arena_bytes)))
            st = kb_fail(KILN_ERR_NOMEM, "planned executor: cannot allocate a %zu-byte arena", plan.arena_bytes);
        else {
            m->exec.arena_bytes = plan.arena_bytes;
            kb_log(KILN_LOG_DEBUG, "planned executor: a %.1f MiB arena", (double)plan.arena_bytes / (1 << 20));
        }
    }
    /* the shape constants (a cropped position table) are kept from the
     * forward before while the shape is the same */
    if (!st) st = kx_run_planned(&g, &plan, m->backend, m->exec.arena, &m->exec.consts, in, out);
    kx_plan_free(&plan);
    kg_free(&g);
    return st;
}

kiln_status km_exec_arena_bytes(kiln_model *m, const int64_t *s, size_t *bytes) {
    kg_graph g;
    kx_plan plan = {0};
    kiln_status st = graph_for(m, s, &g, 1);
    if (!st) st = kx_plan_graph(&g, &plan);
    if (!st) *bytes = plan.arena_bytes;
    kx_plan_free(&plan);
    kg_free(&g);
    return st;
}

static kiln_status run_eager(kiln_model *m, const int64_t *s, const float *const *in, float *const *out) {
    kg_graph g;
    kiln_status st = graph_for(m, s, &g, 0);
    if (!st) st = kg_run_eager(&g, m->backend, in, out);
    kg_free(&g);
    return st;
}

kiln_status km_exec_run(kiln_model *m, const int64_t *sym, const float *const *in, float *const *out) {
    double t0 = kb_now();
    const ka_arch *a = m->arch;
    int64_t sh[KA_MAX_IO][4], osh[KA_MAX_OUT][4];
    io_shapes(m, sym, sh, osh);
    pthread_mutex_lock(&m->exec.lock);
    char reason[1024] = "";
    char *root = NULL, *famdir = NULL;
    int need_pkg = 0;
    for (int i = 0; i < m->exec.n_steps; i++) need_pkg |= m->exec.chain[i] < KM_STEP_PLANNED;
    if (need_pkg && (root = package_root(m))) famdir = kb_path_join(root, family(m));
    kiln_status st = KILN_ERR_UNSUPPORTED;
    m->exec.last = NULL;
    m->exec.note[0] = 0;
    /* invalid shapes fail the same way on every path: let eager/planned say
     * why (before they read an input) */
    int shape_ok = a->check(m->cfg, sym) == KILN_OK, staged = 1;
    io_bufs b;
    memset(&b, 0, sizeof b);
    if (shape_ok && (st = io_stage(m, (const int64_t(*)[4])sh, (const int64_t(*)[4])osh, in, out, &b))) {
        snprintf(reason, sizeof reason, "%s", kiln_last_error());
        staged = 0;
    }
    if (!shape_ok && kk_host_memory(m->backend)) { /* (read by no step) */
        for (int k = 0; k < a->n_in; k++) b.in[k] = in[k];
        for (int k = 0; k < m->n_out; k++) b.out[k] = out[k];
    }
    kb_clear_error();
    float *const *host_out = out;
    in = b.in;
    out = b.out;
    for (int k = 0; staged && k < m->exec.n_steps; k++) {
        int step = m->exec.chain[k], warn = 0, had = 0; /* had: a package of this kind exists */
        int64_t s[KX_MAX_SYMS];
        kx_package *p = NULL;
        if (step < KM_STEP_PLANNED && !shape_ok) {
            snprintf(reason, sizeof reason, "the shape is invalid");
            continue;
        }
        kb_run run; /* a kernel that could not do its work fails this step, and no other forward's */
        kb_run *outer = kb_run_begin(&run);
        if (step < KM_STEP_PLANNED && !famdir) {
            snprintf(reason, sizeof reason, "no package folder (set KILN_PACKAGE_DIR or KILN_CACHE_DIR)");
            st = KILN_ERR_UNSUPPORTED;
        } else if (step == KM_STEP_DYNAMIC) {
            p = find_package(m, famdir, 0, (const int64_t(*)[4])sh, s, reason, sizeof reason, &had);
            st = p ? run_package(m, p, s, in, out) : KILN_ERR_RANGE;
            warn = p != NULL;
        } else if (step == KM_STEP_FIXED) {
            p = find_package(m, famdir, 1, (const int64_t(*)[4])sh, s, reason, sizeof reason, &had);
            if (!p && m->exec.fixed_fail[0]) { /* failed before: said once, not again */
                snprintf(reason, sizeof reason, "%s", m->exec.fixed_fail);
            } else if (!p && (m->exec.compile || kb_is_dir(famdir))) { /* compiled here before, or asked to: this shape */
                kx_sym fixed[KX_MAX_SYMS];
                memset(fixed, 0, sizeof fixed);
                for (int i = 0; i < a->nsym; i++) {
                    snprintf(fixed[i].name, sizeof fixed[i].name, "%s", a->sym[i]);
                    fixed[i].lo = fixed[i].hi = sym[i];
                }
                kx_compile_info info;
                kb_log(KILN_LOG_INFO, "forward: compiling a fixed-shape package (%s)", reason);
                if (!compile_syms(m, fixed, 1, NULL, -1, &info)) {
                    p = find_package(m, famdir, 1, (const int64_t(*)[4])sh, s, reason, sizeof reason, &had);
                } else {
                    snprintf(reason, sizeof reason, "%s", kiln_last_error());
                    snprintf(m->exec.fixed_fail, sizeof m->exec.fixed_fail,
                             "compiling a fixed-shape package failed before (%.400s)", reason);
                }
                warn = 1;
            }
            st = p ? run_package(m, p, s, in, out) : KILN_ERR_RANGE;
            warn |= p != NULL;
        } else if (step == KM_STEP_PLANNED) {
            st = run_planned(m, sym, in, out);
        } else {
            st = run_eager(m, sym, in, out);
        }
        kb_run_end(outer);
        if (!st) st = kb_run_status(&run);
        if (!st) {
            m->exec.last = k_steps[step];
            break;
        }
        if (p || step >= KM_STEP_PLANNED) snprintf(reason, sizeof reason, "%s", kiln_last_error());
        if (had || p || step >= KM_STEP_PLANNED) { /* a package there but not usable, or a step that failed */
            size_t l = strlen(m->exec.note);
            snprintf(m->exec.note + l, sizeof m->exec.note - l, "%s%s: %s", l ? "; " : "", k_steps[step], reason);
        }
        if (k + 1 < m->exec.n_steps)
            kb_log(warn ? KILN_LOG_WARN : KILN_LOG_INFO, "forward: %s: %s; falling back to %s", k_steps[step], reason,
                   k_steps[m->exec.chain[k + 1]]);
    }
    if (st && !m->exec.last) st = kb_fail(st, "forward: %s", reason);
    io_unstage(m, &b, host_out, st);
    pthread_mutex_unlock(&m->exec.lock);
    free(root);
    free(famdir);
    if (!st) kb_ledger_add("forward", kb_now() - t0, m->exec.last);
    return st;
}
