/* config_json.c - reading a config.json the way every family's parser
 * does: the object itself, and keys whose absent or null value keeps the
 * reference's default, each refusal naming the key and what it must be. */
#include "arch/arch.h"
#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kiln_status ka_json_object(const char *json, cJSON **root) {
    *root = cJSON_Parse(json ? json : "");
    if (!*root) return kb_fail(KILN_ERR_FORMAT, "config.json is not valid JSON");
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return kb_fail(KILN_ERR_FORMAT, "config.json must hold a JSON object");
    }
    return KILN_OK;
}

kiln_status ka_json_int(const cJSON *root, const char *key, int *out, int *was_null) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (was_null) *was_null = v == NULL || cJSON_IsNull(v);
    if (!v || cJSON_IsNull(v)) return KILN_OK;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < -2147483648.0 || d > 2147483647.0)
        return kb_fail(KILN_ERR_CONFIG, "config key \"%s\" must be an integer", key);
    *out = (int)d;
    return KILN_OK;
}

kiln_status ka_json_ints(const cJSON *root, const ka_int_key *keys, size_t n) {
    for (size_t i = 0; i < n; i++) {
        kiln_status st = ka_json_int(root, keys[i].key, keys[i].field, NULL);
        if (st) return st;
    }
    return KILN_OK;
}

int ka_json_lists_arch(const cJSON *root, const char *cls) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "architectures"), *e;
    if (!cJSON_IsArray(a)) return 0;
    cJSON_ArrayForEach(e, a) if (cJSON_IsString(e) && !strcmp(e->valuestring, cls)) return 1;
    return 0;
}

kiln_status ka_json_bool(const cJSON *root, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return KILN_OK;
    if (!cJSON_IsBool(v)) return kb_fail(KILN_ERR_CONFIG, "config key \"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return KILN_OK;
}

kiln_status ka_json_num(const cJSON *root, const char *key, double *out, int *present) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (present) *present = 0;
        return KILN_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kb_fail(KILN_ERR_CONFIG, "config key \"%s\" must be a finite number", key);
    *out = v->valuedouble;
    if (present) *present = 1;
    return KILN_OK;
}

cJSON *ka_json_add_num(cJSON *o, const char *key, double v) {
    if (!isfinite(v)) return cJSON_AddNullToObject(o, key);
    char buf[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return cJSON_AddRawToObject(o, key, buf);
}
