/* prompts.c - the prompts file of --prompts-file: one prompt per line, or a
 * JSON object per line with that prompt's own settings (prompts.h has the
 * format). Untrusted input: tests/fuzz/fuzz_prompts.c. */
#include "pipeline/prompts.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_keys[] = {"prompt", "negative_prompt", "seed", "steps", "guidance", "width", "height",
                                     "images_per_prompt"};
#define N_KEYS (sizeof k_keys / sizeof *k_keys)

/* an integer field of line's object in [lo, hi] (absent: *v unchanged) */
static kiln_status json_int(const char *path, int line, const cJSON *o, const char *key, double lo, double hi,
                            int64_t *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j) return KILN_OK;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return kb_fail(KILN_ERR_FORMAT, "%s line %d: \"%s\" must be an integer from %.0f to %.0f", path, line, key, lo,
                       hi);
    *v = (int64_t)j->valuedouble;
    return KILN_OK;
}

/* The offset of the first \u0000 escape inside a string of json (valid JSON,
 * NUL-terminated), or -1. cJSON decodes it to a NUL byte and keeps what is
 * before it only: "a\u0000b" would be the prompt "a", silently (and the key
 * "prompt\u0000x" the key "prompt"). */
static long nul_escape(const char *json) {
    int in_str = 0;
    for (const char *c = json; *c; c++) {
        if (!in_str) in_str = *c == '"';
        else if (*c == '"') in_str = 0;
        else if (*c == '\\') {
            /* the escape's letter; valid JSON never ends a string on a backslash */
            if (c[1] == 'u' && c[2] == '0' && c[3] == '0' && c[4] == '0' && c[5] == '0') return (long)(c - json);
            if (c[1]) c++;
        }
    }
    return -1;
}

/* text: the line from its first non-blank byte, a { */
static kiln_status parse_object(const char *path, int line, const char *text, kp_prompt *p) {
    /* the whole line one object: text after it (a second object) is an
     * error, not ignored */
    cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
    kiln_status rc = KILN_OK;
    long at;
    if (!cJSON_IsObject(o)) {
        rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: a line starting with { must be one JSON object and nothing after it (%s)",
                     path, line, "{\"prompt\": \"...\", \"seed\": 1, ...}");
        goto out;
    }
    if ((at = nul_escape(text)) >= 0) {
        rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: a \\u0000 in a string (byte %ld of the object): a prompt is text, "
                     "and the NUL would end it there", path, line, at + 1);
        goto out;
    }
    unsigned seen = 0; /* bit i: k_keys[i] came already (a second one would be silently ignored) */
    for (const cJSON *k = o->child; k; k = k->next) {
        size_t i = 0;
        while (i < N_KEYS && strcmp(k->string, k_keys[i])) i++;
        if (i == N_KEYS) {
            rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: unknown key \"%s\" (known: prompt, negative_prompt, seed, steps, "
                         "guidance, width, height, images_per_prompt)", path, line, k->string);
            goto out;
        }
        if (seen >> i & 1u) {
            rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: key \"%s\" appears twice (each key once a line)", path, line,
                         k->string);
            goto out;
        }
        seen |= 1u << i;
    }
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *ng = cJSON_GetObjectItemCaseSensitive(o, "negative_prompt"),
                *g = cJSON_GetObjectItemCaseSensitive(o, "guidance");
    if (!cJSON_IsString(pr)) {
        rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: \"prompt\" (a string) is required", path, line);
        goto out;
    }
    if (ng && !cJSON_IsString(ng)) {
        rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: \"negative_prompt\" must be a string", path, line);
        goto out;
    }
    if (g && (!cJSON_IsNumber(g) || !isfinite(g->valuedouble) || g->valuedouble < 0)) {
        rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: \"guidance\" must be a number, 0 or more", path, line);
        goto out;
    }
    int64_t steps = 0, w = 0, h = 0, n = 0;
    if ((rc = json_int(path, line, o, "seed", 0, 9007199254740991.0, &p->seed)) ||
        (rc = json_int(path, line, o, "steps", 1, 10000, &steps)) ||
        (rc = json_int(path, line, o, "width", 1, 1 << 20, &w)) ||
        (rc = json_int(path, line, o, "height", 1, 1 << 20, &h)) ||
        (rc = json_int(path, line, o, "images_per_prompt", 1, 512, &n)))
        goto out;
    p->steps = (int)steps, p->width = (int)w, p->height = (int)h, p->images = (int)n;
    if (g) {
        p->guidance = g->valuedouble;
        p->has_guidance = 1;
    }
    if (!(p->prompt = kb_strdup(pr->valuestring)) || (ng && !(p->negative = kb_strdup(ng->valuestring))))
        rc = kb_fail(KILN_ERR_NOMEM, "%s line %d: out of memory", path, line);
out:
    cJSON_Delete(o);
    return rc;
}

/* text: a NUL-terminated copy of the file, cut into lines in place */
static kiln_status parse_lines(char *text, size_t len, const char *path, kp_prompt **out, int *n) {
    int cap = 0, line = 0;
    kiln_status rc = KILN_OK;
    kp_prompt *v = NULL;
    char *start = text;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) start += 3; /* a UTF-8 byte order mark (Windows editors) */
    for (char *p = start; p && *p && !rc; line++) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        char *end = e ? e : p + strlen(p);
        if (end > p && end[-1] == '\r') end[-1] = 0; /* CRLF, the last line's too */
        if (line >= INT_MAX / 2) { /* the line numbers and the prompts' count are ints */
            rc = kb_fail(KILN_ERR_FORMAT, "%s: more than %d lines", path, INT_MAX / 2);
            break;
        }
        const char *s = p;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) { /* a blank line separates, it is no prompt ({"prompt": ""} is the empty one) */
            p = e ? e + 1 : NULL;
            continue;
        }
        if (*n == cap) {
            kp_prompt *g = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                rc = kb_fail(KILN_ERR_NOMEM, "%s line %d: out of memory for %d prompts", path, line + 1, cap);
                break;
            }
            v = g;
        }
        kp_prompt *q = &v[*n];
        memset(q, 0, sizeof *q);
        q->seed = -1;
        q->line = line + 1;
        /* a line that is one whole JSON array (and only that: "[cinematic] a cat" is a prompt) */
        size_t ll = strlen(s); /* the line ends in a NUL here (its \n and \r are gone) */
        const char *after = NULL;
        cJSON *arr = *s == '[' ? cJSON_ParseWithLengthOpts(s, ll, &after, 0) : NULL;
        while (arr && after && after < s + ll && (*after == ' ' || *after == '\t')) after++;
        if (arr && cJSON_IsArray(arr) && after == s + ll) /* a whole line of JSON that is not an object: a mistake, not a prompt */
            rc = kb_fail(KILN_ERR_FORMAT, "%s line %d: a JSON array; a line is a prompt, or one JSON object "
                         "{\"prompt\": ...} with that prompt's settings", path, line + 1);
        else if (*s == '{') rc = parse_object(path, line + 1, s, q);
        else if (!(q->prompt = kb_strdup(p))) rc = kb_fail(KILN_ERR_NOMEM, "%s line %d: out of memory", path, line + 1);
        cJSON_Delete(arr);
        (*n)++; /* counted even when it failed: its strings are freed below */
        p = e ? e + 1 : NULL;
    }
    if (!rc && !*n) rc = kb_fail(KILN_ERR_FORMAT, "%s holds no prompt (one per line, or a JSON object per line)", path);
    if (rc) {
        kp_prompts_free(v, *n);
        *n = 0;
        return rc;
    }
    *out = v;
    return KILN_OK;
}

kiln_status kp_prompts_parse(const char *text, size_t len, const char *path, kp_prompt **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!path) path = "prompts";
    if (!text && len) return kb_fail(KILN_ERR_INVALID_ARG, "%s: no text but a length of %zu", path, len);
    const char *nul = len ? memchr(text, 0, len) : NULL;
    if (nul) /* the lines after a NUL byte would be dropped silently */
        return kb_fail(KILN_ERR_FORMAT, "%s: a NUL byte at offset %zu: a prompts file is text (UTF-8, one prompt per line)",
                       path, (size_t)(nul - text));
    char *copy = len < SIZE_MAX ? kb_malloc(len + 1) : NULL; /* the lines are cut in place */
    if (!copy) return kb_fail(KILN_ERR_NOMEM, "%s: out of memory for a copy of %zu bytes", path, len);
    if (len) memcpy(copy, text, len);
    copy[len] = 0;
    kiln_status rc = parse_lines(copy, len, path, out, n);
    free(copy);
    return rc;
}

kiln_status kp_prompts_read(const char *path, kp_prompt **out, int *n) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    *n = 0;
    kiln_status rc = kb_read_file(path, &text, &len);
    if (rc) return rc; /* its message names the path */
    /* the parser's own copy costs a second buffer of the file's size: a
     * prompts file is small, and the buffer API stays one code path */
    rc = kp_prompts_parse(text, len, path, out, n);
    free(text);
    return rc;
}

void kp_prompts_free(kp_prompt *p, int n) {
    for (int i = 0; p && i < n; i++) {
        free(p[i].prompt);
        free(p[i].negative);
    }
    free(p);
}
