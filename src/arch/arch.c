/* arch.c - the list of model families and what every family shares: the
 * lookup by name and by config.json, tensor-parallel shapes of a spec, the
 * input checks against a family's shapes. */
#include "arch/arch.h"
#include "arch/clip/clip.h"
#include "arch/flux/flux.h"
#include "arch/sd3/sd3.h"
#include "arch/t5/t5.h"
#include "arch/vae/vae.h"
#include "base/base.h"
#include "dist/dist.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KA_MAX_FAMILIES 32

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* the built-in families first (the first is the default for a config no
 * family claims: its parser names what is wrong), then registered ones */
static const ka_arch *g_arch[KA_MAX_FAMILIES] = {&ka_sd3,        &ka_vae_decoder, &ka_clip,        &ka_t5,
                                                 &ka_vae_encoder, &ka_flux,        &ka_flux_schnell};
static int g_n = 7;
static const kc_renamer *g_ren[KA_MAX_FAMILIES + 1];

int ka_count(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_n;
    pthread_mutex_unlock(&g_lock);
    return n;
}

const ka_arch *ka_at(int i) {
    pthread_mutex_lock(&g_lock);
    const ka_arch *a = i >= 0 && i < g_n ? g_arch[i] : NULL;
    pthread_mutex_unlock(&g_lock);
    return a;
}

const ka_arch *ka_find(const char *name) {
    for (int i = 0, n = ka_count(); i < n; i++)
        if (name && !strcmp(ka_at(i)->name, name)) return ka_at(i);
    return NULL;
}

kiln_status ka_register(const ka_arch *a) {
    if (!a || !a->name || !*a->name || !a->config_size || !a->claims || !a->config_parse || !a->config_validate ||
        !a->config_to_json || !a->weight_spec || !a->io_shapes || !a->solve || !a->check || !a->example ||
        !a->example_input || !a->build)
        return kb_fail(KILN_ERR_INVALID_ARG, "ka_register: family %s lacks a name or a function every family needs",
                       a && a->name ? a->name : "(unnamed)");
    if (a->nsym < 1 || a->nsym > KA_MAX_SYMS || a->n_in < 1 || a->n_in > KA_MAX_IO || a->n_out < 1 ||
        a->n_out > KA_MAX_IO)
        return kb_fail(KILN_ERR_INVALID_ARG, "ka_register: family %s has %d symbols, %d inputs, %d outputs (1 to %d, %d, %d)",
                       a->name, a->nsym, a->n_in, a->n_out, KA_MAX_SYMS, KA_MAX_IO, KA_MAX_IO);
    for (int i = 0; i < a->n_in + a->n_out; i++) {
        const ka_io *io = i < a->n_in ? &a->in[i] : &a->out[i - a->n_in];
        if (!io->name || !*io->name || strlen(io->name) >= 48 || io->ndim < 1 || io->ndim > 4)
            return kb_fail(KILN_ERR_INVALID_ARG, "ka_register: family %s: %s %d needs a name (under 48 characters) and "
                           "1 to 4 dimensions", a->name, i < a->n_in ? "input" : "output", i < a->n_in ? i : i - a->n_in);
    }
    for (int i = 0; i < a->nsym; i++)
        if (!a->sym[i] || !*a->sym[i] || strlen(a->sym[i]) >= 16)
            return kb_fail(KILN_ERR_INVALID_ARG, "ka_register: family %s: symbol %d needs a name under 16 characters",
                           a->name, i);
    pthread_mutex_lock(&g_lock);
    kiln_status st = KILN_OK;
    for (int i = 0; i < g_n && !st; i++)
        if (g_arch[i] == a || !strcmp(g_arch[i]->name, a->name))
            st = kb_fail(KILN_ERR_INVALID_ARG, "ka_register: a family named %s is already known", a->name);
    if (!st && g_n == KA_MAX_FAMILIES)
        st = kb_fail(KILN_ERR_INVALID_ARG, "ka_register: at most %d families", KA_MAX_FAMILIES);
    if (!st) g_arch[g_n++] = a;
    pthread_mutex_unlock(&g_lock);
    return st;
}

const ka_arch *ka_for_config(const char *json) {
    for (int i = 0, n = ka_count(); i < n; i++)
        if (ka_at(i)->claims(json ? json : "")) return ka_at(i);
    /* a class no family claims is named as such; a config that names none
     * goes to the first family, whose parser says what is wrong with it */
    cJSON *r = cJSON_Parse(json ? json : "");
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(r, "_class_name"),
                *arch = cJSON_GetObjectItemCaseSensitive(r, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *named = cJSON_IsString(cls) ? cls->valuestring : cJSON_IsString(a0) ? a0->valuestring : NULL;
    if (!named) {
        cJSON_Delete(r);
        return ka_at(0);
    }
    char known[512] = "";
    for (int i = 0, n = ka_count(); i < n; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s (%s)", i ? "; " : "", ka_at(i)->name,
                 ka_at(i)->title);
    kb_fail(KILN_ERR_UNSUPPORTED, "config.json describes %s, which no model family of kiln runs (it runs: %s)", named,
            known);
    cJSON_Delete(r);
    return NULL;
}

const kc_renamer *const *ka_renamers(void) {
    pthread_mutex_lock(&g_lock);
    int k = 0;
    for (int i = 0; i < g_n; i++)
        if (g_arch[i]->renamer) g_ren[k++] = g_arch[i]->renamer;
    g_ren[k] = NULL;
    pthread_mutex_unlock(&g_lock);
    return g_ren;
}

kg_id ka_linear_fmt(kg_graph *g, kg_id x, const char *fmt, int i) {
    char base[112];
    snprintf(base, sizeof base, fmt, i);
    return kg_linear_named(g, x, base);
}

kg_id ka_row_linear_fmt(kg_graph *g, const ka_par *par, kg_id x, const char *fmt, int i) {
    kg_id y = ka_linear_fmt(g, x, fmt, i);
    return par && par->tp > 1 ? kg_allreduce(g, y, KD_TP) : y;
}

kg_id ka_weight_fmt(kg_graph *g, const char *fmt, int i) {
    char name[128];
    snprintf(name, sizeof name, fmt, i);
    return kg_weight(g, name);
}

void ka_shard_spec(int tp, ka_spec *spec, size_t n) {
    if (tp <= 1) return;
    for (size_t i = 0; i < n; i++) {
        if (spec[i].split == KA_SPLIT_ROWS) spec[i].shape[0] /= tp;
        if (spec[i].split == KA_SPLIT_COLS || spec[i].split == KA_SPLIT_COLS_1_4) spec[i].shape[1] /= tp;
    }
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++) len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

kiln_status ka_check_inputs(const ka_arch *a, const void *cfg, const int64_t (*in)[4], const int64_t *s, const char *who) {
    int64_t want[KA_MAX_IO][4] = {{0}}, out[KA_MAX_OUT][4];
    a->io_shapes(cfg, s, want, out);
    for (int i = 0; i < a->n_in; i++)
        if (memcmp(in[i], want[i], sizeof(int64_t) * (size_t)a->in[i].ndim)) {
            char got[96], exp[96];
            shape_str(got, sizeof got, a->in[i].ndim, in[i]);
            shape_str(exp, sizeof exp, a->in[i].ndim, want[i]);
            return kb_fail(KILN_ERR_SHAPE, "%s: input %s has shape %s, the model needs %s", who, a->in[i].name, got, exp);
        }
    return KILN_OK;
}

const char *kiln_family_title(const char *family) {
    const ka_arch *a = ka_find(family);
    return a ? a->title : NULL;
}

const char *kiln_family_quant_layers(const char *family) {
    const ka_arch *a = ka_find(family);
    return a ? (a->quant_layers ? a->quant_layers : "") : NULL;
}
