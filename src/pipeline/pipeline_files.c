/* pipeline_files.c - model_index.json and scheduler_config.json from their
 * text (pipeline_files.h). */
#include "pipeline/pipeline_files.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static cJSON *parse_object(const char *text, size_t n, const char *where, kiln_status *st) {
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *st = kb_fail(KILN_ERR_FORMAT, "%s is not a JSON object", where);
        return NULL;
    }
    *st = KILN_OK;
    return j;
}

kiln_status kp_index_parse(const char *text, size_t n, const char *where, kp_index *out) {
    memset(out, 0, sizeof *out);
    kiln_status st;
    cJSON *j = parse_object(text, n, where, &st);
    if (!j) return st;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "_class_name");
    if (cJSON_IsString(c)) snprintf(out->cls, sizeof out->cls, "%s", c->valuestring);
    for (const cJSON *it = j->child; it && !st; it = it->next) {
        if (!it->string || it->string[0] == '_') continue;
        const cJSON *cls = cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 ? cJSON_GetArrayItem(it, 1) : NULL;
        if (!cJSON_IsString(cls)) continue; /* [null, null]: not there; anything else: not a component */
        size_t len = strlen(it->string);
        if (!len || len >= sizeof out->part[0].name || strchr(it->string, '/') || !strcmp(it->string, ".") ||
            !strcmp(it->string, ".."))
            st = kb_fail(KILN_ERR_FORMAT, "%s: component \"%.80s\" is not a folder name of the pipeline", where, it->string);
        else if (out->n == KP_INDEX_MAX_PARTS)
            st = kb_fail(KILN_ERR_FORMAT, "%s lists more than %d components", where, KP_INDEX_MAX_PARTS);
        else {
            snprintf(out->part[out->n].name, sizeof out->part[0].name, "%s", it->string);
            snprintf(out->part[out->n].cls, sizeof out->part[0].cls, "%s", cls->valuestring);
            out->n++;
        }
    }
    cJSON_Delete(j);
    return st;
}

int kp_index_lists(const kp_index *ix, const char *component, const char **cls) {
    for (int i = 0; ix && i < ix->n; i++)
        if (!strcmp(ix->part[i].name, component)) {
            if (cls) *cls = ix->part[i].cls;
            return 1;
        }
    return 0;
}

/* a number field of the scheduler config: absent or null keeps *v */
static kiln_status sched_num(const cJSON *sch, const char *key, const char *where, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(sch, key);
    if (!x || cJSON_IsNull(x)) return KILN_OK;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return kb_fail(KILN_ERR_CONFIG, "%s: %s must be a number", where, key);
    *v = x->valuedouble;
    return KILN_OK;
}

kiln_status kp_scheduler_parse_full(const char *text, size_t n, const char *where, int allow_dynamic, kp_schedule *out) {
    kiln_status st;
    cJSON *sch = parse_object(text, n, where, &st);
    if (!sch) return st;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(sch, "_class_name"),
                *s = cJSON_GetObjectItemCaseSensitive(sch, "shift"),
                *nt = cJSON_GetObjectItemCaseSensitive(sch, "num_train_timesteps"),
                *d = cJSON_GetObjectItemCaseSensitive(sch, "use_dynamic_shifting"),
                *tt = cJSON_GetObjectItemCaseSensitive(sch, "time_shift_type");
    int dynamic = cJSON_IsTrue(d);
    if (cJSON_IsString(c) && strcmp(c->valuestring, "FlowMatchEulerDiscreteScheduler"))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "%s: %.80s; kiln samples with FlowMatchEulerDiscreteScheduler", where,
                     c->valuestring);
    else if (dynamic && !allow_dynamic)
        st = kb_fail(KILN_ERR_UNSUPPORTED, "%s: use_dynamic_shifting is true; SD3 pipelines use a static shift", where);
    else if (dynamic && tt && !cJSON_IsNull(tt) && !(cJSON_IsString(tt) && !strcmp(tt->valuestring, "exponential")))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "%s: time_shift_type %.40s; kiln shifts by the sequence length the "
                     "\"exponential\" way (Flux's)", where, cJSON_IsString(tt) ? tt->valuestring : "(not a string)");
    /* the options that would make diffusers sample another schedule (or add
     * noise each step): refused by name, never ignored */
    static const char *const other[] = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                                        "invert_sigmas", "stochastic_sampling"};
    for (size_t i = 0; !st && i < sizeof other / sizeof other[0]; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sch, other[i])))
            st = kb_fail(KILN_ERR_UNSUPPORTED, "%s: %s is true; kiln samples the flow-matching schedule (a shift, "
                         "deterministic Euler steps), where it is false", where, other[i]);
    const cJSON *term = cJSON_GetObjectItemCaseSensitive(sch, "shift_terminal");
    if (!st && term && !cJSON_IsNull(term))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "%s: shift_terminal is set; kiln samples the schedule where it is null "
                     "(no stretch of the last sigma)", where);
    /* a field the config leaves out takes FlowMatchEulerDiscreteScheduler's
     * default, as diffusers builds it: shift 1.0, not SD3's 3.0 */
    double sh = 1.0;
    double steps = 1000;
    if (!st && s && !cJSON_IsNumber(s)) st = kb_fail(KILN_ERR_CONFIG, "%s: shift must be a number", where);
    if (!st && nt && (!cJSON_IsNumber(nt) || nt->valuedouble != floor(nt->valuedouble)))
        st = kb_fail(KILN_ERR_CONFIG, "%s: num_train_timesteps must be an integer", where);
    if (cJSON_IsNumber(s)) sh = s->valuedouble;
    if (cJSON_IsNumber(nt)) steps = nt->valuedouble;
    if (!st && (!(sh > 0) || !isfinite(sh) || !(steps >= 1) || steps > 100000))
        st = kb_fail(KILN_ERR_CONFIG, "%s: shift %g must be a positive number and num_train_timesteps %g in 1..100000",
                     where, sh, steps);
    /* the dynamic shift's line through (base_image_seq_len, base_shift) and
     * (max_image_seq_len, max_shift): FlowMatchEulerDiscreteScheduler's defaults */
    double bs = 0.5, ms = 1.15, bl = 256, ml = 4096;
    if (!st) st = sched_num(sch, "base_shift", where, &bs);
    if (!st) st = sched_num(sch, "max_shift", where, &ms);
    if (!st) st = sched_num(sch, "base_image_seq_len", where, &bl);
    if (!st) st = sched_num(sch, "max_image_seq_len", where, &ml);
    if (!st && dynamic && (bl != floor(bl) || ml != floor(ml) || !(bl >= 1) || !(ml > bl) || ml > 1e9 || fabs(bs) > 100 ||
                           fabs(ms) > 100))
        st = kb_fail(KILN_ERR_CONFIG, "%s: base_image_seq_len %g and max_image_seq_len %g must be integers with "
                     "1 <= base < max, base_shift %g and max_shift %g numbers of at most 100", where, bl, ml, bs, ms);
    if (!st) {
        /* the line's fields only matter (and were only checked) with dynamic shifting */
        *out = dynamic ? (kp_schedule){sh, (int)steps, 1, bs, ms, (int64_t)bl, (int64_t)ml}
                       : (kp_schedule){sh, (int)steps, 0, 0.5, 1.15, 256, 4096};
    }
    cJSON_Delete(sch);
    return st;
}

kiln_status kp_scheduler_parse(const char *text, size_t n, const char *where, double *shift, int *num_train_timesteps) {
    kp_schedule s;
    kiln_status st = kp_scheduler_parse_full(text, n, where, 0, &s);
    if (!st) {
        *shift = s.shift;
        *num_train_timesteps = s.num_train_timesteps;
    }
    return st;
}
