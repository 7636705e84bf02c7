/* model.c - kiln_model: open a checkpoint, find its family (the
 * architecture table), check it against the weights the config needs,
 * convert them to the compute weights, and run forwards by named tensors. */
#include "base/base.h"
#include "cache/cache.h"
#include "dist/dist.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <stdlib.h>
#include <string.h>

static int cmp_weight(const void *a, const void *b) {
    return strcmp(((const km_weight *)a)->name, ((const km_weight *)b)->name);
}

const km_weight *km_find(const kiln_model *m, const char *name) {
    km_weight key = {.name = (char *)name};
    return bsearch(&key, m->w, m->nw, sizeof *m->w, cmp_weight);
}

int km_resolve(void *user, const char *name, int *ndim, int64_t shape[4], const float **data,
               const kk_weight **kw) {
    const km_weight *w = km_find(user, name);
    if (!w) return 0;
    *ndim = w->ndim;
    memcpy(shape, w->shape, sizeof w->shape);
    *data = w->view;
    *kw = &w->kw;
    return w->fsdp ? 2 : 1;
}

/* the kernels' view: W [shape[0], product of the rest], on the host (the
 * backend's view comes with km_map_weights) */
static void set_view(km_weight *w, kiln_dtype packed_dtype) {
    int64_t K = 1, M = w->ndim ? w->shape[0] : 1;
    for (int d = 1; d < w->ndim; d++) K *= w->shape[d];
    if (w->packed) packed_dtype = w->packed_dtype;
    w->kw = (kk_weight){.M = M, .K = K, .f32 = w->data, .packed = w->packed, .packed_dtype = packed_dtype,
                        .scales = kk_weight_scales(w->packed, w->packed_bytes, M, packed_dtype)};
    w->view = w->data;
}

/* The backend's view of every weight (kk_buf_map): the weights themselves
 * where its memory is the host's; else its copies, made once per model
 * (what a device backend uploads from the mapped cache). An FSDP block
 * weight gets a buffer that km_fsdp_gather fills from the host workspace. */
static kiln_status map_weights(kiln_model *m) {
    const kk_backend *be = m->backend;
    if (kk_host_memory(be)) return KILN_OK;
    for (size_t i = 0; i < m->nw; i++) {
        km_weight *w = &m->w[i];
        size_t fb = sizeof(float) * (size_t)(w->kw.M * w->kw.K);
        float *d = w->dev_f32 = w->fsdp ? (w->data ? kk_buf_alloc(be, fb) : NULL) : kk_buf_map(be, w->data, fb);
        if (d) w->view = w->kw.f32 = d;
        void *p = w->dev_packed = w->fsdp ? (w->packed ? kk_buf_alloc(be, w->packed_bytes) : NULL)
                                          : kk_buf_map(be, w->packed, w->packed_bytes);
        if (p) {
            w->kw.packed = p;
            w->kw.scales = kk_weight_scales(p, w->packed_bytes, w->kw.M, w->kw.packed_dtype);
        }
        if ((w->data && !d) || (w->packed && !p))
            return kb_fail(KILN_ERR_NOMEM, "the %s backend has no memory for weight %s", be->name, w->name);
    }
    return KILN_OK;
}

kiln_status km_compute_resolve(kiln_dtype dtype, int reference, const char *backend, km_compute *out) {
    /* $KILN_BACKEND runs every model of the process on its backend (the
     * reference kernels' requests included: the test suite on the check
     * backend), unless the caller names one */
    const char *env = getenv("KILN_BACKEND");
    int forced = !backend && env && *env;
    if (forced) {
        backend = env;
    } else {
        if (reference && backend && strcmp(backend, "reference"))
            return kb_fail(KILN_ERR_INVALID_ARG, "the reference kernels and the %s backend were both asked for; pick one",
                           backend);
        if (reference) backend = "reference";
        if (!backend) backend = "cpu";
    }
    if (!kk_backend_get(backend, KILN_F32) && !kk_backend_get(backend, KILN_BF16) && strcmp(backend, "cpu"))
        return kb_fail(KILN_ERR_INVALID_ARG, "backend %s is unknown%s (the backends: %s)", backend,
                       forced ? " (KILN_BACKEND)" : "", kk_backend_names());
    int cpu = !strcmp(backend, "cpu");
    if (dtype == KILN_DTYPE_INVALID) dtype = cpu || forced ? KILN_BF16 : KILN_F32; /* bf16: the default, as the CLI's */
    if (dtype != KILN_F32 && dtype != KILN_BF16)
        return kb_fail(KILN_ERR_UNSUPPORTED, "compute dtype %s is not supported (F32 or BF16)", kiln_dtype_name(dtype));
    if (dtype == KILN_BF16 && !kk_backend_get(backend, KILN_BF16)) {
        if (!cpu && !forced)
            return kb_fail(KILN_ERR_UNSUPPORTED, "the %s kernels compute in F32 only, not %s", backend,
                           kiln_dtype_name(dtype));
        static int warned; /* once a process: a pipeline resolves five components */
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
            if (cpu)
                kb_log(KILN_LOG_WARN, "this CPU (class %s) has no bf16 GEMM (AVX-512 BF16 / AMX); computing in f32 on "
                       "f32 weights", kiln_cpu_class(0));
            else
                kb_log(KILN_LOG_WARN, "the %s backend computes in f32 only; computing in f32 on f32 weights", backend);
        }
        dtype = KILN_F32;
    }
    const kk_backend *be = kk_backend_get(backend, dtype);
    if (!be) {
        kb_log(KILN_LOG_WARN, "the %s backend is not available here; using the reference kernels", backend);
        be = kk_backend_get("reference", KILN_F32);
        dtype = KILN_F32;
    }
    *out = (km_compute){.dtype = dtype, .be = be};
    return KILN_OK;
}

const char *km_compute_layout(km_compute cp) { return kk_weights_tag(cp.be); }

/* Replace a weight's f32 data by the backend's packed layout in dt: a
 * linear's [M, K...] for the GEMM (quantized where the compute choice's
 * scheme selects the layer), or with conv a convolution's [Cout,Cin,kh,kw]
 * for the convolution. */
static kiln_status pack_one(const kk_backend *be, km_weight *w, kiln_dtype dt, int conv) {
    const int64_t *s = w->shape;
    int64_t K = 1;
    for (int d = 1; d < w->ndim; d++) K *= s[d];
    const int64_t sh[4] = {w->ndim ? s[0] : 1, conv ? s[1] : K, conv ? s[2] : 1, conv ? s[3] : 1};
    size_t bytes;
    kiln_status st = kk_pack_layout(be, sh, conv, dt, w->layout, &bytes);
    if (st) return st;
    void *p = kb_alloc_aligned(bytes);
    if (!p) return KILN_ERR_NOMEM;
    if ((st = kk_pack(be, w->data, sh, conv, dt, p))) {
        kb_free_aligned(p);
        return st;
    }
    kb_free_aligned(w->data);
    w->data = NULL;
    w->packed = p;
    w->packed_bytes = bytes;
    w->packed_dtype = dt;
    return KILN_OK;
}

/* Append "name, name, ..." (at most 12, then a count) to a message buffer. */
static void list_names(char *buf, size_t cap, const char *const *names, size_t n) {
    size_t len = strlen(buf);
    for (size_t i = 0; i < n && i < 12; i++) {
        snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
        len = strlen(buf);
    }
    if (n > 12) snprintf(buf + len, cap - len, " ... and %zu more", n - 12);
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && len < cap; i++) {
        snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "[", (long long)s[i]);
        len = strlen(buf);
    }
    snprintf(buf + len, cap - len, ndim ? "]" : "[]");
}

/* Check the checkpoint holds exactly the expected tensors with exact shapes. */
static kiln_status check_tensors(const kc_checkpoint *c, const ka_spec *spec, size_t ns) {
    const char **missing = malloc(sizeof(char *) * (ns + 1));
    const char **unexpected = malloc(sizeof(char *) * (c->n + 1));
    char *used = calloc(c->n + 1, 1);
    kiln_status st = KILN_OK;
    if (!missing || !unexpected || !used) {
        st = kb_fail(KILN_ERR_NOMEM, "out of memory checking tensors");
        goto done;
    }
    size_t nm = 0, nu = 0;
    for (size_t i = 0; i < ns; i++) {
        const kc_tensor *t = kc_find(c, spec[i].name);
        if (!t) {
            missing[nm++] = spec[i].name;
            continue;
        }
        used[t - c->t] = 1;
        int same = t->ndim == spec[i].ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == spec[i].shape[d];
        if (!same && st == KILN_OK) {
            char got[96], want[96];
            shape_str(got, sizeof got, t->ndim, t->shape);
            shape_str(want, sizeof want, spec[i].ndim, spec[i].shape);
            st = kb_fail(KILN_ERR_SHAPE, "%s: tensor %s has shape %s, the config needs %s", c->path,
                         spec[i].name, got, want);
        }
    }
    for (size_t i = 0; i < c->n; i++)
        if (!used[i]) unexpected[nu++] = c->t[i].source_name;
    if (nm) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s: %zu expected tensor%s missing: ", c->path, nm,
                 nm == 1 ? " is" : "s are");
        list_names(msg, sizeof msg, missing, nm);
        st = kb_fail(KILN_ERR_MISSING, "%s", msg);
    } else if (nu) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s: %zu unexpected tensor%s: ", c->path, nu, nu == 1 ? "" : "s");
        list_names(msg, sizeof msg, unexpected, nu);
        st = kb_fail(KILN_ERR_UNEXPECTED, "%s", msg);
    }
done:
    free(missing);
    free(unexpected);
    free(used);
    return st;
}

kiln_status km_convert_tensor(const kc_checkpoint *c, const ka_spec *s, const km_compute *cp, km_weight *w,
                              int64_t *n_params) {
    memset(w, 0, sizeof *w);
    const kc_tensor *t = kc_find(c, s->name);
    if (!t) return kb_fail(KILN_ERR_MISSING, "%s: no tensor %s", c->path, s->name);
    if (!(w->name = kb_strdup(s->name))) return KILN_ERR_NOMEM;
    w->ndim = s->ndim;
    memcpy(w->shape, s->shape, sizeof w->shape);
    w->src_dtype = t->dtype;
    int64_t n = kc_numel(t);
    if (!(w->data = kb_alloc_aligned(sizeof(float) * (size_t)(n ? n : 1)))) return KILN_ERR_NOMEM;
    kiln_status st = kc_read_f32(t, w->data);
    snprintf(w->layout, sizeof w->layout, "rowmajor");
    if (n_params) *n_params += n;
    if (!st && s->up2 && s->ndim == 4) { /* a conv after a 2x upsample: its sub-pixel form (kernels.h) */
        if (s->shape[2] != 3 || s->shape[3] != 3)
            st = kb_fail(KILN_ERR_SHAPE, "%s: %s is folded with its upsample only as a 3x3 conv", c->path, s->name);
        float *sub = st ? NULL : kb_alloc_aligned(sizeof(float) * (size_t)(16 * s->shape[0] * s->shape[1]));
        if (!st && !sub) st = KILN_ERR_NOMEM;
        if (!st) {
            kk_conv_up2_weight(w->data, s->shape[0], s->shape[1], sub);
            kb_free_aligned(w->data);
            w->data = sub;
            ka_stored_shape(s, w->shape);
        }
    }
    if (!st && cp->tp > 1 && s->split != KA_SPLIT_NONE) st = km_shard_weight(w, s->split, cp->tp, cp->tp_index, n_params);
    if (!st && s->linear && kk_packs(cp->be)) st = pack_one(cp->be, w, km_spec_dtype(cp, s), 0);
    if (!st && s->conv && s->ndim == 4 && kk_packs(cp->be)) st = pack_one(cp->be, w, s->keep_f32 ? KILN_F32 : cp->dtype, 1);
    set_view(w, w->packed ? w->packed_dtype : KILN_F32);
    return st;
}

void km_weight_free(km_weight *w) {
    free(w->name);
    kb_free_aligned(w->data);
    kb_free_aligned(w->packed);
    memset(w, 0, sizeof *w);
}

kiln_status km_family_named(const char *name, const ka_arch **out) {
    *out = NULL;
    if (!name) return KILN_OK;
    if ((*out = ka_find(name))) return KILN_OK;
    char known[512] = "";
    for (int i = 0, n = ka_count(); i < n; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", ka_at(i)->name);
    return kb_fail(KILN_ERR_INVALID_ARG, "model family %s is unknown (the families: %s)", name, known);
}

kiln_status km_config_parse(const char *json, const ka_arch *force, const ka_arch **arch, void **cfg) {
    const ka_arch *a = force ? force : ka_for_config(json);
    if (!a) return KILN_ERR_UNSUPPORTED; /* the message names the class */
    void *c = kb_calloc(1, a->config_size);
    if (!c) return KILN_ERR_NOMEM;
    kiln_status st = a->config_parse(json ? json : "", c);
    if (st) {
        free(c);
        return st;
    }
    *arch = a;
    *cfg = c;
    return KILN_OK;
}

/* A single file without a config.json: the family whose original names it
 * uses, else the first whose inference from the tensor shapes succeeds
 * (the first family's error otherwise). */
static kiln_status infer_family(const kc_checkpoint *c, const ka_arch **arch, void **cfg) {
    kiln_status first = KILN_ERR_UNSUPPORTED;
    char why[1024] = "";
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0, n = ka_count(); i < n; i++) {
            const ka_arch *a = ka_at(i);
            int named = a->renamer && !strcmp(a->renamer->layout, c->layout);
            if (!a->config_infer || (pass == 0) != named) continue;
            void *x = kb_calloc(1, a->config_size);
            if (!x) return KILN_ERR_NOMEM;
            kiln_status st = a->config_infer(c, x);
            if (!st) {
                *arch = a;
                *cfg = x;
                return KILN_OK;
            }
            free(x);
            if (!why[0]) {
                first = st;
                snprintf(why, sizeof why, "%s", kiln_last_error());
            }
        }
    return why[0] ? kb_fail(first, "%s", why)
                  : kb_fail(KILN_ERR_UNSUPPORTED, "%s: no config.json, and no model family infers one from its tensors", c->path);
}

kiln_status km_bind_outputs(kiln_model *m) {
    const ka_arch *a = m->arch;
    if (!a->outputs) {
        m->n_out = a->n_out;
        for (int i = 0; i < a->n_out; i++) m->out[i] = a->out[i];
        return KILN_OK;
    }
    m->n_out = a->outputs(m->cfg, m->out, m->out_names);
    if (m->n_out < 1 || m->n_out > KA_MAX_OUT)
        return kb_fail(KILN_ERR_CONFIG, "%s model: its config gives %d outputs (1 to %d)", a->name, m->n_out, KA_MAX_OUT);
    return KILN_OK;
}

static kiln_model *model_new(km_compute cp) {
    kiln_model *m = kb_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->compute = cp;
    m->backend = cp.be;
    m->refs = 1;
    snprintf(m->origin, sizeof m->origin, "open");
    km_exec_init(m);
    return m;
}

kiln_status km_prepare(const kc_checkpoint *c, const char *config_label, km_compute cp, kiln_model **out,
                       ka_spec **spec_out, size_t *ns_out) {
    *out = NULL;
    *spec_out = NULL;
    kiln_model *m = model_new(cp);
    ka_spec *spec = NULL;
    size_t ns = 0;
    kiln_status st = m ? KILN_OK : KILN_ERR_NOMEM;
    if (!st) {
        if (c->config_json) {
            st = km_config_parse(c->config_json, cp.family, &m->arch, &m->cfg);
            if (st) st = kb_wrap(st, "%s", config_label ? config_label : c->path);
        } else {
            st = infer_family(c, &m->arch, &m->cfg);
        }
    }
    if (!st) km_compute_for_arch(&m->compute, m->arch);
    if (!st) st = km_bind_outputs(m);
    if (!st) st = m->arch->weight_spec(m->cfg, &spec, &ns);
    if (!st) st = check_tensors(c, spec, ns);
    /* shapes alone cannot tell every architecture apart (the head count of a
     * width, say): a guess that does not fit is the config's fault */
    if (st && !c->config_json && (st == KILN_ERR_SHAPE || st == KILN_ERR_MISSING || st == KILN_ERR_UNEXPECTED)) {
        char why[1536];
        snprintf(why, sizeof why, "%s", kiln_last_error());
        st = kb_fail(st, "%s (the architecture was inferred from the tensor shapes of this single file; pass "
                         "its config.json: --config FILE, or the config_path option)", why);
    }
    if (!st && cp.tp > 1)
        st = m->arch->check_parallel ? m->arch->check_parallel(m->cfg, cp.tp, 1)
                                     : kb_fail(KILN_ERR_UNSUPPORTED, "%s models do not run tensor parallel", m->arch->name);
    if (st) {
        free(spec);
        km_destroy(m);
        return st;
    }
    *out = m;
    *spec_out = spec;
    *ns_out = ns;
    return KILN_OK;
}

kiln_status km_from_checkpoint(const kc_checkpoint *c, const char *config_label, km_compute cp,
                               kiln_model **out) {
    *out = NULL;
    kiln_model *m = NULL;
    ka_spec *spec = NULL;
    size_t ns = 0;
    kiln_status st = km_prepare(c, config_label, cp, &m, &spec, &ns);
    if (st) return st;
    if (!(m->w = kb_calloc(ns ? ns : 1, sizeof *m->w))) st = KILN_ERR_NOMEM;
    for (size_t i = 0; !st && i < ns; i++) {
        st = km_convert_tensor(c, &spec[i], &m->compute, &m->w[m->nw], &m->info.n_params);
        m->info.n_by_dtype[m->w[m->nw].src_dtype]++;
        m->nw++;
    }
    if (!st) {
        m->info.n_tensors = (int64_t)m->nw;
        qsort(m->w, m->nw, sizeof *m->w, cmp_weight);
        m->info.bytes_on_disk = c->bytes_on_disk;
        snprintf(m->layout, sizeof m->layout, "%s", c->layout);
        m->info.layout = m->layout;
        st = map_weights(m);
    }
    free(spec);
    if (st) {
        km_destroy(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

/* "[1536, 64]" */
static void km_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t l = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && l < cap; d++) l += (size_t)snprintf(buf + l, cap - l, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (l < cap) snprintf(buf + l, cap - l, "]");
}

kiln_status km_from_cache(kcache_entry *e, km_compute cp, kiln_model **out) {
    *out = NULL;
    kiln_model *m = model_new(cp);
    ka_spec *spec = NULL;
    size_t ns = 0;
    kiln_status st = m ? KILN_OK : KILN_ERR_NOMEM;
    if (!st && (st = km_config_parse(e->config_json ? e->config_json : "", cp.family, &m->arch, &m->cfg)))
        st = kb_wrap(KILN_ERR_CORRUPT, "cache %s: its config", e->path);
    if (!st) {
        km_compute_for_arch(&m->compute, m->arch);
        cp = m->compute;
        if (!(st = km_bind_outputs(m))) st = m->arch->weight_spec(m->cfg, &spec, &ns);
    }
    if (!st && cp.tp > 1) {
        st = m->arch->check_parallel ? m->arch->check_parallel(m->cfg, cp.tp, 1)
                                     : kb_fail(KILN_ERR_UNSUPPORTED, "%s models do not run tensor parallel", m->arch->name);
        if (!st) ka_shard_spec(cp.tp, spec, ns);
    }
    if (!st && ns != e->n)
        st = kb_fail(KILN_ERR_CORRUPT, "cache %s holds %zu tensors, its config needs %zu", e->path, e->n, ns);
    if (!st && !(m->w = kb_calloc(ns, sizeof *m->w))) st = KILN_ERR_NOMEM;
    /* the cache stores the spec's tensors in spec order: linear weights packed
     * for the fast GEMM and convolution weights for the fast convolution (or
     * f32 row-major for the reference), the rest f32 */
    for (size_t i = 0; !st && i < ns; i++) {
        const kcache_tensor *t = &e->t[i];
        int conv = spec[i].conv && spec[i].ndim == 4 && kk_packs(cp.be), packed = (spec[i].linear && kk_packs(cp.be)) || conv;
        char want_layout[40] = "rowmajor";
        size_t want_bytes = 0;
        int64_t numel = 1, sh[4]; /* sh: the stored shape */
        ka_stored_shape(&spec[i], sh);
        for (int d = 0; d < spec[i].ndim; d++) numel *= sh[d];
        kiln_dtype want_dt = conv ? (spec[i].keep_f32 ? KILN_F32 : cp.dtype) : packed ? km_spec_dtype(&cp, &spec[i]) : KILN_F32;
        const int64_t psh[4] = {sh[0], conv ? sh[1] : numel / sh[0], conv ? sh[2] : 1, conv ? sh[3] : 1};
        if (packed && (st = kk_pack_layout(cp.be, psh, conv, want_dt, want_layout, &want_bytes))) break;
        if (cp.fsdp > 1 && spec[i].block >= 0) { /* FSDP: a byte range (shard.c) */
            if ((st = km_fsdp_map(&m->w[m->nw], &spec[i], e, i, cp))) break;
            m->info.n_params += numel;
            m->info.bytes_on_disk += (int64_t)t->nbytes;
            m->nw++;
            continue;
        }
        int same = !strcmp(t->name, spec[i].name) && t->dtype == want_dt && t->ndim == spec[i].ndim &&
                   !strcmp(t->layout, want_layout) && (!packed || t->nbytes == want_bytes);
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == sh[d];
        if (!same) {
            char have_sh[96], want_sh[96];
            km_shape_str(t->shape, t->ndim, have_sh, sizeof have_sh);
            km_shape_str(sh, spec[i].ndim, want_sh, sizeof want_sh);
            st = kb_fail(KILN_ERR_CORRUPT, "cache %s: tensor %zu is %s %s %s %s (%zu bytes), this build needs %s %s %s %s", e->path,
                         i, t->name, kiln_dtype_name(t->dtype), have_sh, t->layout, t->nbytes, spec[i].name,
                         kiln_dtype_name(want_dt), want_sh, want_layout);
            break;
        }
        km_weight *w = &m->w[m->nw++];
        w->name = kb_strdup(t->name);
        if (!w->name) st = KILN_ERR_NOMEM;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->src_dtype = t->dtype;
        snprintf(w->layout, sizeof w->layout, "%s", t->layout);
        if (packed) {
            w->packed = (void *)t->data;
            w->packed_bytes = t->nbytes;
            w->packed_dtype = want_dt;
        } else {
            w->data = (float *)t->data;
        }
        int64_t n = 1; /* the checkpoint's count (an up2 weight is stored larger) */
        for (int d = 0; d < spec[i].ndim; d++) n *= spec[i].shape[d];
        m->info.n_params += n;
        m->info.n_by_dtype[t->dtype]++;
        m->info.bytes_on_disk += (int64_t)t->nbytes;
    }
    free(spec);
    if (st) {
        /* the weights so far point into the mapping: not ours to free */
        for (size_t i = 0; m && i < m->nw; i++) m->w[i].data = NULL, m->w[i].packed = NULL;
        km_destroy(m);
        return st;
    }
    m->info.n_tensors = (int64_t)m->nw;
    qsort(m->w, m->nw, sizeof *m->w, cmp_weight);
    if (cp.fsdp > 1 && (st = km_fsdp_finish(m))) {
        for (size_t i = 0; i < m->nw; i++) m->w[i].data = NULL, m->w[i].packed = NULL; /* mapped, not owned */
        km_destroy(m);
        return st;
    }
    for (size_t i = 0; i < m->nw; i++) set_view(&m->w[i], cp.dtype);
    snprintf(m->layout, sizeof m->layout, "kiln-cache");
    m->info.layout = m->layout;
    m->cache = e;
    if ((st = map_weights(m))) {
        m->cache = NULL; /* the caller closes the entry */
        for (size_t i = 0; i < m->nw; i++) m->w[i].data = NULL, m->w[i].packed = NULL; /* mapped, not owned */
        km_destroy(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_model_open(const char *path, const kiln_open_opts *opts, kiln_model **out) {
    if (!path || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_open: path and out are required");
    *out = NULL;
    double t0 = kb_now();
    kc_checkpoint *c = NULL;
    const char *cfg = opts ? opts->config_path : NULL;
    km_compute cp;
    kiln_status st = km_compute_resolve(opts ? opts->dtype : KILN_DTYPE_INVALID, opts ? opts->reference : 0,
                                        opts ? opts->backend : NULL, &cp);
    if (!st) st = km_compute_set_quant(&cp, opts ? opts->quant : KILN_QUANT_NONE, opts ? opts->quant_layers : NULL);
    if (!st) st = km_family_named(opts ? opts->family : NULL, &cp.family);
    if (!st) st = kc_open(path, cfg, ka_renamers(), &c);
    if (!st) st = km_from_checkpoint(c, cfg ? cfg : path, cp, out);
    kc_close(c);
    if (!st) kb_ledger_add("weight_load", kb_now() - t0, "converted from checkpoint");
    return st;
}

void km_destroy(kiln_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->nw; i++) {
        free(m->w[i].name);
        if (m->w[i].fsdp) {
            kk_buf_free(m->backend, m->w[i].dev_f32);
            kk_buf_free(m->backend, m->w[i].dev_packed);
        } else {
            kk_buf_unmap(m->backend, m->w[i].dev_f32, NULL);
            kk_buf_unmap(m->backend, m->w[i].dev_packed, NULL);
        }
        if (!m->cache) {
            kb_free_aligned(m->w[i].data);
            kb_free_aligned(m->w[i].packed);
        }
    }
    km_exec_free(m);
    free(m->w);
    kcache_close(m->cache);
    free(m->cfg);
    kd_mesh_free(m->mesh);
    kb_free_aligned(m->fsdp_ws);
    free(m->cache_path);
    free(m->registry_key);
    free(m);
}

const char *kiln_model_origin(const kiln_model *m) { return m ? m->origin : ""; }

const char *kiln_model_cache_path(const kiln_model *m) { return m && m->cache_path ? m->cache_path : ""; }

kiln_status kiln_model_get_info(const kiln_model *m, kiln_model_info *out) {
    if (!m || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_model_get_info: model and out are required");
    *out = m->info;
    out->weight_bytes = out->n_quantized = out->quantized_bytes = 0;
    for (size_t i = 0; i < m->nw; i++) {
        const km_weight *w = &m->w[i];
        out->weight_bytes += (int64_t)(w->packed ? w->packed_bytes : sizeof(float) * (size_t)(w->kw.M * w->kw.K));
        if (w->packed && kk_dtype_is_quant(w->packed_dtype)) {
            out->n_quantized++;
            out->quantized_bytes += (int64_t)w->packed_bytes;
        }
    }
    return KILN_OK;
}
