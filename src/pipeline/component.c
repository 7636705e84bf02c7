/* component.c - opening one component folder of a pipeline (component.h). */
#include "pipeline/component.h"

#include "base/base.h"
#include "format/checkpoint.h"

#include <cjson/cJSON.h>
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

/* what model_index.json says of a component: 1 listed ([library, class]),
 * 0 not there or [null, null] */
static int listed(const cJSON *index, const char *component, const char **cls) {
    const cJSON *v = index ? cJSON_GetObjectItemCaseSensitive(index, component) : NULL;
    const cJSON *c = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 ? cJSON_GetArrayItem(v, 1) : NULL;
    if (cls) *cls = cJSON_IsString(c) ? c->valuestring : NULL;
    return cJSON_IsString(c);
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
    cJSON *index = NULL;
    if (ip && kb_is_file(ip) && !kb_read_file(ip, &text, NULL)) index = cJSON_Parse(text);
    kb_clear_error();
    free(ip);
    free(text);
    kiln_status st = KILN_OK;
    /* every component the index lists is there */
    for (const cJSON *it = index ? index->child : NULL; it && !st; it = it->next) {
        const char *cls;
        if (!it->string || it->string[0] == '_' || !listed(index, it->string, &cls)) continue;
        if (strchr(it->string, '/') || !strcmp(it->string, "..")) continue; /* not a folder name: not ours to open */
        char *d = kb_path_join(s->dir, it->string);
        if (!d) st = KILN_ERR_NOMEM;
        else if (!kb_is_dir(d))
            st = kb_fail(KILN_ERR_MISSING, "%s: model_index.json lists %s (%s), but there is no %s/ folder", s->dir,
                         it->string, cls, it->string);
        free(d);
    }
    /* and what the pipeline reads, with its files */
    for (size_t i = 0; need && need[i] && !st; i++) {
        const char *c = need[i][0] == '?' ? need[i] + 1 : need[i];
        char *d = kb_path_join(s->dir, c);
        int there = d && kb_is_dir(d);
        free(d);
        if (need[i][0] == '?' && !there && !listed(index, c, NULL)) continue;
        if (!there) st = kb_fail(KILN_ERR_MISSING, "%s: no %s/ folder (a pipeline folder holds one)", s->dir, c);
        else st = check_part(s->dir, c);
    }
    cJSON_Delete(index);
    return st;
}
