/* run.c - a forward of any family by named tensors: kiln_run and the
 * model's description (family, config as JSON, input and output names).
 * The family's table says what the inputs are; the shapes given solve its
 * symbols, every input is checked against the shapes they imply, and
 * NaN/Inf is refused going in and coming out. */
#include "base/base.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <stdlib.h>
#include <string.h>

const char *kiln_model_family(const kiln_model *m) { return m ? m->arch->name : ""; }

char *kiln_model_config_json(const kiln_model *m) { return m ? m->arch->config_to_json(m->cfg) : NULL; }

int kiln_model_n_inputs(const kiln_model *m) { return m ? m->arch->n_in : 0; }
int kiln_model_n_outputs(const kiln_model *m) { return m ? m->n_out : 0; }
const char *kiln_model_input_name(const kiln_model *m, int i) {
    return m && i >= 0 && i < m->arch->n_in ? m->arch->in[i].name : NULL;
}
const char *kiln_model_output_name(const kiln_model *m, int i) {
    return m && i >= 0 && i < m->n_out ? m->out[i].name : NULL;
}

kiln_status km_solve(const kiln_model *m, const int64_t (*in)[4], int64_t *s, int64_t (*out)[4], const char *who) {
    const ka_arch *a = m->arch;
    int64_t ish[KA_MAX_IO][4] = {{0}}, osh[KA_MAX_OUT][4] = {{0}};
    memset(s, 0, sizeof(int64_t) * KA_MAX_SYMS);
    kiln_status st = a->solve(m->cfg, in, s);
    if (st) return kb_wrap(st, "%s", who);
    if ((st = ka_check_inputs(a, m->cfg, in, s, who))) return st;
    a->io_shapes(m->cfg, s, ish, osh);
    for (int k = 0; k < a->n_in + m->n_out; k++) {
        const ka_io *io = k < a->n_in ? &a->in[k] : &m->out[k - a->n_in];
        const int64_t *sh = k < a->n_in ? ish[k] : osh[k - a->n_in];
        size_t n = ka_numel(io->ndim, sh), bytes;
        if (!n || !kb_mul_ok(n, sizeof(float), &bytes))
            return kb_fail(KILN_ERR_RANGE, "%s: %s %s is empty or too large to address", who,
                           k < a->n_in ? "input" : "output", io->name);
    }
    if (out) memcpy(out, osh, sizeof(int64_t) * 4 * (size_t)m->n_out);
    return KILN_OK;
}

kiln_status km_run(kiln_model *m, const int64_t (*in_shape)[4], const float *const *in, float *const *out, const char *who) {
    const ka_arch *a = m->arch;
    int64_t s[KA_MAX_SYMS], osh[KA_MAX_OUT][4];
    kiln_status st = km_solve(m, in_shape, s, osh, who);
    if (st) return st;
    /* NaN or Inf in, error out: one fast scan of each input (finite.c) */
    for (int k = 0; k < a->n_in; k++) {
        char what[128];
        snprintf(what, sizeof what, "%s: input %s", who, a->in[k].name);
        if ((st = kt_check_finite(what, in[k], ka_numel(a->in[k].ndim, in_shape[k])))) return st;
    }
    st = m->mesh ? km_exec_run_dist(m, s, in, out) : km_exec_run(m, s, in, out);
    for (int k = 0; !st && k < m->n_out; k++) {
        size_t n = ka_numel(m->out[k].ndim, osh[k]), bad = kt_find_nonfinite(out[k], n);
        if (bad < n)
            st = kb_fail(KILN_ERR_NONFINITE, "forward (%s) gave a non-finite output %s (%s at index %zu)",
                         kiln_model_last_exec(m), m->out[k].name, kt_nonfinite_name(out[k][bad]), bad);
    }
    return st;
}

/* kiln_run's names: every input given once, every output known */
static kiln_status match_names(const kiln_model *m, const kiln_tensor *in, size_t n_in, const kiln_output *out,
                               size_t n_out, int *in_of, int *out_of) {
    const ka_arch *a = m->arch;
    char names[2048] = "";
    for (int k = 0; k < a->n_in; k++) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", a->in[k].name);
    for (int k = 0; k < a->n_in; k++) in_of[k] = -1;
    for (size_t i = 0; i < n_in; i++) {
        int k = 0;
        while (k < a->n_in && (!in[i].name || strcmp(in[i].name, a->in[k].name))) k++;
        if (k == a->n_in)
            return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: %s model has no input %s (its inputs: %s)", a->name,
                           in[i].name ? in[i].name : "(unnamed)", names);
        if (in_of[k] >= 0) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: input %s is given twice", a->in[k].name);
        if (in[i].dtype != KILN_F32 || !in[i].data)
            return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: input %s must be F32 with data, not %s%s", a->in[k].name,
                           kiln_dtype_name(in[i].dtype), in[i].data ? "" : " without data");
        if (in[i].ndim != a->in[k].ndim)
            return kb_fail(KILN_ERR_SHAPE, "kiln_run: input %s has %d dimensions, the model needs %d", a->in[k].name,
                           in[i].ndim, a->in[k].ndim);
        in_of[k] = (int)i;
    }
    for (int k = 0; k < a->n_in; k++)
        if (in_of[k] < 0) return kb_fail(KILN_ERR_MISSING, "kiln_run: input %s is missing (the inputs: %s)", a->in[k].name, names);
    names[0] = 0;
    for (int k = 0; k < m->n_out; k++) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", m->out[k].name);
    for (int k = 0; k < m->n_out; k++) out_of[k] = -1;
    for (size_t i = 0; i < n_out; i++) {
        int k = 0;
        while (k < m->n_out && (!out[i].name || strcmp(out[i].name, m->out[k].name))) k++;
        if (k == m->n_out)
            return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: %s model has no output %s (its outputs: %s)", a->name,
                           out[i].name ? out[i].name : "(unnamed)", names);
        if (out_of[k] >= 0) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: output %s is asked for twice", m->out[k].name);
        out_of[k] = (int)i;
    }
    return KILN_OK;
}

kiln_status kiln_run(kiln_model *m, const kiln_tensor *in, size_t n_in, kiln_output *out, size_t n_out) {
    if (!m || (n_in && !in) || (n_out && !out))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: model, inputs and outputs are required");
    const ka_arch *a = m->arch;
    int in_of[KA_MAX_IO], out_of[KA_MAX_OUT];
    kiln_status st = match_names(m, in, n_in, out, n_out, in_of, out_of);
    if (st) return st;
    int64_t ish[KA_MAX_IO][4] = {{0}}, s[KA_MAX_SYMS], osh[KA_MAX_OUT][4];
    const float *ip[KA_MAX_IO];
    for (int k = 0; k < a->n_in; k++) {
        const kiln_tensor *t = &in[in_of[k]];
        memcpy(ish[k], t->shape, sizeof(int64_t) * (size_t)t->ndim);
        ip[k] = t->data;
    }
    if ((st = km_solve(m, (const int64_t(*)[4])ish, s, osh, "kiln_run"))) return st;
    int query = 0;
    for (size_t i = 0; i < n_out; i++) query |= !out[i].data;
    for (int k = 0; k < m->n_out; k++) {
        if (out_of[k] < 0) continue;
        kiln_output *o = &out[out_of[k]];
        o->ndim = m->out[k].ndim;
        memset(o->shape, 0, sizeof o->shape);
        memcpy(o->shape, osh[k], sizeof(int64_t) * (size_t)o->ndim);
        size_t need = ka_numel(o->ndim, osh[k]);
        if (!query && o->capacity < need)
            return kb_fail(KILN_ERR_INVALID_ARG, "kiln_run: output %s needs %zu floats, its buffer holds %zu", o->name, need,
                           o->capacity);
    }
    if (query) return KILN_OK; /* a data pointer left NULL: the shapes only */
    /* outputs not asked for still get a buffer: every executor writes all.
     * The model's spare buffers from the call before are taken for this
     * call (grown where too small) and given back after it */
    float *op[KA_MAX_OUT] = {0}, *own[KA_MAX_OUT] = {0};
    size_t own_n[KA_MAX_OUT] = {0};
    km_exec *x = &m->exec;
    pthread_mutex_lock(&x->lock);
    for (int k = 0; k < m->n_out; k++) {
        own[k] = x->spare[k];
        own_n[k] = x->spare_n[k];
        x->spare[k] = NULL;
        x->spare_n[k] = 0;
    }
    pthread_mutex_unlock(&x->lock);
    for (int k = 0; k < m->n_out && !st; k++) {
        size_t need = ka_numel(m->out[k].ndim, osh[k]);
        if (out_of[k] >= 0) {
            op[k] = out[out_of[k]].data;
            continue;
        }
        if (own_n[k] < need) {
            kb_free_aligned(own[k]);
            own_n[k] = 0;
            if (!(own[k] = kb_alloc_aligned(sizeof(float) * need)))
                st = kb_fail(KILN_ERR_NOMEM, "kiln_run: out of memory for output %s", m->out[k].name);
            else own_n[k] = need;
        }
        op[k] = own[k];
    }
    if (!st) st = km_run(m, (const int64_t(*)[4])ish, ip, op, "kiln_run");
    pthread_mutex_lock(&x->lock);
    for (int k = 0; k < m->n_out; k++) {
        if (!x->spare[k]) { /* another call may have given its own back meanwhile: keep one */
            x->spare[k] = own[k];
            x->spare_n[k] = own_n[k];
        } else {
            kb_free_aligned(own[k]);
        }
    }
    pthread_mutex_unlock(&x->lock);
    return st;
}
