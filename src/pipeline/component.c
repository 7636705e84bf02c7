/* component.c - opening one component of a pipeline (component.h): a
 * folder's, or an all-in-one file's (its config from the tokenizers folder
 * or inferred from the shapes); and checking a pipeline folder's files
 * before anything loads. */
#include "pipeline/component.h"

#include "arch/arch.h"
#include "base/base.h"
#include "format/checkpoint.h"
#include "model/model.h"
#include "pipeline/pipeline_files.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_status kp_open_component(const char *dir, const char *component, const kiln_load_opts *base, kiln_model **out) {
    double t0 = kp_component_start(base, component);
    kiln_status st;
    if (!base) {
        st = kiln_model_open(dir, NULL, out);
    } else {
        kiln_load_opts o = *base;
        o.source = dir;
        o.source_fn = NULL;
        o.config_path = NULL;
        o.component = component;
        st = kiln_load_model(&o, out);
    }
    if (st) return st;
    kp_component_done(base, component, t0, *out);
    return KILN_OK;
}

double kp_component_start(const kiln_load_opts *base, const char *component) {
    if (base && base->on_component) base->on_component(base->component_user, component, NULL, -1);
    return kb_now();
}

void kp_component_done(const kiln_load_opts *base, const char *component, double t0, const kiln_model *m) {
    double dt = kb_now() - t0;
    char what[64];
    snprintf(what, sizeof what, "load %s", component);
    kb_ledger_add(what, dt, kiln_model_origin(m));
    if (base && base->on_component) base->on_component(base->component_user, component, kiln_model_origin(m), dt);
}

/* one component folder's files */
static kiln_status check_part(const char *dir, const char *component) {
    char *d = kb_path_join(dir, component), *w = NULL;
    if (!d) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    if (!strncmp(component, "tokenizer", 9)) {
        static const char *const one[] = {"tokenizer.json", "spiece.model"};
        int ok = 0;
        for (int i = 0; i < 2 && !ok; i++) {
            char *f = kb_path_join(d, one[i]);
            ok = f && kb_is_file(f);
            free(f);
        }
        char *v = kb_path_join(d, "vocab.json"), *m = kb_path_join(d, "merges.txt");
        ok = ok || (v && m && kb_is_file(v) && kb_is_file(m));
        free(v);
        free(m);
        if (!ok)
            st = kb_fail(KILN_ERR_MISSING, "%s has none of tokenizer.json, vocab.json + merges.txt, spiece.model "
                         "(the files kiln reads a tokenizer from)", d);
    } else if (!strcmp(component, "scheduler")) {
        /* optional: the pipeline reads scheduler_config.json when it is there */
    } else {
        char *c = kb_path_join(d, "config.json");
        if (!c) st = KILN_ERR_NOMEM;
        else if (!kb_is_file(c)) st = kb_fail(KILN_ERR_MISSING, "%s has no config.json", d);
        else if ((st = kc_find_weights(d, &w))) st = kb_wrap(st, "%s", component);
        free(c);
        free(w);
    }
    free(d);
    return st;
}

const char *const kp_sd3_parts[] = {"transformer",    "text_encoder",  "tokenizer",    "text_encoder_2",
                                    "tokenizer_2",    "?text_encoder_3", "?tokenizer_3", "?vae",
                                    "?scheduler",     NULL};

kiln_status kp_check_folder(const kp_source *s, const char *const *need) {
    if (!s->dir) return KILN_OK;
    char *ip = kb_path_join(s->dir, "model_index.json"), *text = NULL;
    size_t len = 0;
    kp_index ix;
    memset(&ix, 0, sizeof ix);
    kiln_status st = KILN_OK;
    if (!ip) return KILN_ERR_NOMEM;
    if (kb_is_file(ip) && !(st = kb_read_file(ip, &text, &len))) st = kp_index_parse(text, len, ip, &ix);
    free(ip);
    free(text);
    /* every component the index lists is there */
    for (int i = 0; i < ix.n && !st; i++) {
        char *d = kb_path_join(s->dir, ix.part[i].name);
        if (!d) st = KILN_ERR_NOMEM;
        else if (!kb_is_dir(d))
            st = kb_fail(KILN_ERR_MISSING, "%s: model_index.json lists %s (%s), but there is no %s/ folder", s->dir,
                         ix.part[i].name, ix.part[i].cls, ix.part[i].name);
        free(d);
    }
    /* and what the pipeline reads, with its files */
    for (size_t i = 0; need && need[i] && !st; i++) {
        const char *c = need[i][0] == '?' ? need[i] + 1 : need[i];
        char *d = kb_path_join(s->dir, c);
        int there = d && kb_is_dir(d);
        free(d);
        if (need[i][0] == '?' && !there && !kp_index_lists(&ix, c, NULL)) continue;
        if (!there) st = kb_fail(KILN_ERR_MISSING, "%s: no %s/ folder (a pipeline folder holds one)", s->dir, c);
        else st = check_part(s->dir, c);
    }
    return st;
}

/* ---- an all-in-one file's components (single_file.c finds them) ---- */

/* the config of a file's component as kp_part_config says, and (when it
 * comes from aux) its path */
static kiln_status part_config(const char *file, const char *component, const char *aux, char **json, char **path) {
    *json = NULL;
    if (path) *path = NULL;
    const char *prefix = NULL, *family = NULL, *assume = NULL;
    if (!kp_part_lookup(file, component, &prefix, &family, &assume))
        return kb_fail(KILN_ERR_INVALID_ARG, "%s is no component of an all-in-one file", component);
    char *cp = aux ? kb_strfmt("%s/%s/config.json", aux, component) : NULL;
    if (aux && !cp) return KILN_ERR_NOMEM;
    if (cp && kb_is_file(cp)) {
        kiln_status st = kb_read_file(cp, json, NULL);
        if (!st && path) *path = cp;
        else free(cp);
        return st;
    }
    free(cp);
    const ka_arch *a = ka_find(family);
    kc_checkpoint *c = NULL;
    void *x = a ? kb_calloc(1, a->config_size) : NULL;
    if (!x) return a ? KILN_ERR_NOMEM : kb_fail(KILN_ERR_UNSUPPORTED, "no %s family in this build", family);
    kiln_status st = kc_open_part(file, prefix, NULL, NULL, ka_renamers(), &c);
    if (!st) st = a->config_infer ? a->config_infer(c, x)
                                  : kb_fail(KILN_ERR_UNSUPPORTED, "the %s family infers no config", a->name);
    char *text = st ? NULL : a->config_to_json(x);
    if (!st && !text) st = KILN_ERR_NOMEM;
    /* what no shape tells (CLIP-L's and CLIP-G's activations, a Flux VAE's
     * latent scale and shift): the part's assumptions over the inferred config */
    if (!st && assume) {
        cJSON *j = cJSON_Parse(text), *over = cJSON_Parse(assume);
        int ok = j && over;
        for (cJSON *it = over ? over->child : NULL; ok && it; it = it->next) {
            cJSON *v = cJSON_Duplicate(it, 1);
            ok = v && (cJSON_HasObjectItem(j, it->string) ? cJSON_ReplaceItemInObjectCaseSensitive(j, it->string, v)
                                                           : cJSON_AddItemToObject(j, it->string, v));
            if (!ok) cJSON_Delete(v); /* not attached */
        }
        free(text);
        text = ok ? cJSON_Print(j) : NULL;
        cJSON_Delete(j);
        cJSON_Delete(over);
        if (!text) st = KILN_ERR_NOMEM;
    }
    kc_close(c);
    free(x);
    if (st)
        return kb_wrap(st, "%s (%s*) has no config.json in %s and inferring one from its tensors failed (put its "
                       "config.json at %s/%s/config.json)", component, prefix,
                       aux ? aux : "--tokenizers DIR", aux ? aux : "DIR", component);
    *json = text;
    return KILN_OK;
}

kiln_status kp_part_config(const char *file, const char *component, const char *aux, char **json, int *inferred) {
    char *path = NULL;
    kiln_status st = part_config(file, component, aux, json, &path);
    if (inferred) *inferred = !st && !path;
    free(path);
    return st;
}

kiln_status kp_component_config(const kp_source *s, const char *component, char **json) {
    *json = NULL;
    char rel[64];
    snprintf(rel, sizeof rel, "%s/config.json", component);
    char *path = kp_aux_path(s, rel);
    kiln_status st = KILN_OK;
    if (path && kb_is_file(path)) st = kb_read_file(path, json, NULL);
    else if (s->file && kp_has_component(s, component)) st = kp_part_config(s->file, component, s->aux, json, NULL);
    free(path);
    return st;
}

/* no weight cache (base NULL): converted in memory, as kiln_model_open does */
static kiln_status open_uncached(const char *file, const char *prefix, const char *json, const char *label, kiln_model **out) {
    km_compute cp;
    kc_checkpoint *c = NULL;
    kiln_status st = km_compute_resolve(KILN_DTYPE_INVALID, 0, NULL, &cp);
    if (!st) st = kc_open_part(file, prefix, NULL, json, ka_renamers(), &c);
    if (!st) st = km_from_checkpoint(c, label, cp, out);
    kc_close(c);
    return st;
}

kiln_status kp_open_part(const kp_source *s, const char *component, const kiln_load_opts *base, kiln_model **out) {
    *out = NULL;
    if (s->dir) {
        char *d = kb_path_join(s->dir, component);
        if (!d) return KILN_ERR_NOMEM;
        kiln_status st = kp_open_component(d, component, base, out);
        free(d);
        return st;
    }
    const char *prefix = NULL;
    if (!kp_part_lookup(s->file, component, &prefix, NULL, NULL))
        return kb_fail(KILN_ERR_INVALID_ARG, "%s is no component of an all-in-one file", component);
    double t0 = kp_component_start(base, component);
    char *json = NULL, *path = NULL;
    kiln_status st = part_config(s->file, component, s->aux, &json, &path);
    if (!st && base) {
        kiln_load_opts o = *base;
        o.source = s->file;
        o.source_fn = NULL;
        o.source_prefix = prefix;
        o.config_path = path;                        /* a config.json of the tokenizers folder ... */
        o.source_config_text = path ? NULL : json;   /* ... or the inferred one */
        o.component = component;
        st = kiln_load_model(&o, out);
    } else if (!st) {
        st = open_uncached(s->file, prefix, json, path ? path : s->file, out);
    }
    free(json);
    free(path);
    if (st) return st;
    kp_component_done(base, component, t0, *out);
    return KILN_OK;
}

/* ---- prompts through an encoder ---------------------------------------------- */

/* A prompt longer than an encoder reads is cut off, as in diffusers, which
 * warns; so does this, naming the encoder (label) and the prompt's start */
static void warn_truncated(const char *label, const char *prompt, int n_tokens, int len) {
    int cut = 0;
    while (prompt[cut] && cut < 40) cut++;
    while (cut > 0 && prompt[cut] && ((unsigned char)prompt[cut] & 0xC0) == 0x80) cut--; /* a whole UTF-8 character */
    kb_log(KILN_LOG_WARN, "the prompt \"%.*s%s\" is %d tokens; %s reads %d, the rest is cut off (as in diffusers)", cut,
           prompt, prompt[cut] ? "..." : "", n_tokens, label, len);
}

/* one encoder over n prompts: ids [n, len] through kiln_run; the outputs
 * asked for (names[k]) land in bufs[k] (malloc'd), their shapes in sh[k];
 * label names the encoder in a truncation warning (NULL: none) */
kiln_status kp_encode_ids(kiln_model *m, const kiln_tokenizer *tok, const char *const *prompts, int n, int len,
                              const char *label, int k_out, const char *const *names, float **bufs, int64_t (*sh)[3]) {
    size_t cells = (size_t)n * (size_t)len;
    int64_t *ids = malloc(sizeof(int64_t) * cells);
    float *f = malloc(sizeof(float) * cells);
    kiln_status st = ids && f ? KILN_OK : KILN_ERR_NOMEM;
    for (int p = 0; p < n && !st; p++) {
        int nt = 0;
        st = kiln_tokenize(tok, prompts[p], len, ids + (size_t)p * (size_t)len, NULL, &nt);
        if (st) st = kb_wrap(st, "prompt %d", p);
        else if (label && nt > len) warn_truncated(label, prompts[p], nt, len);
    }
    for (size_t i = 0; !st && i < cells; i++) f[i] = (float)ids[i]; /* ids < 2^24: exact */
    kiln_tensor in = {"input_ids", KILN_F32, 2, {n, len}, f};
    kiln_output out[2];
    memset(out, 0, sizeof out);
    for (int k = 0; k < k_out; k++) out[k].name = names[k];
    if (!st) st = kiln_run(m, &in, 1, out, (size_t)k_out); /* shapes */
    for (int k = 0; k < k_out && !st; k++) {
        size_t c = 1;
        for (int d = 0; d < out[k].ndim; d++) c *= (size_t)out[k].shape[d];
        if (!(out[k].data = bufs[k] = malloc(sizeof(float) * c))) st = KILN_ERR_NOMEM;
        out[k].capacity = c;
        memset(sh[k], 0, sizeof sh[k]);
        memcpy(sh[k], out[k].shape, sizeof(int64_t) * (size_t)out[k].ndim);
    }
    if (!st) st = kiln_run(m, &in, 1, out, (size_t)k_out);
    free(ids);
    free(f);
    return st;
}

kiln_status kp_output_width(kiln_model *m, int len, const char *name, int64_t *w) {
    float ids[512] = {0};
    if (len < 1 || len > 512) return kb_fail(KILN_ERR_INVALID_ARG, "kp_output_width: %d tokens (1 to 512)", len);
    kiln_tensor in = {"input_ids", KILN_F32, 2, {1, len}, ids};
    kiln_output out = {name, NULL, 0, 0, {0}};
    kiln_status st = kiln_run(m, &in, 1, &out, 1);
    if (!st) *w = out.shape[out.ndim - 1];
    return st;
}

int kp_config_int(const kiln_model *m, const char *key, int dflt) {
    char *js = kiln_model_config_json(m);
    cJSON *j = cJSON_Parse(js ? js : "");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    int r = cJSON_IsNumber(v) && fabs(v->valuedouble) <= 1 << 30 ? (int)v->valuedouble : dflt;
    cJSON_Delete(j);
    free(js);
    return r;
}
