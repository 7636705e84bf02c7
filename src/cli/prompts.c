/* prompts.c - --prompts-file: one prompt per line, or a JSON object per
 * line with that prompt's own settings (cli.h, cli_prompt). */
#include "base/base.h"
#include "cli.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_keys[] = {"prompt", "negative_prompt", "seed", "steps", "guidance", "width", "height",
                                     "images_per_prompt"};

/* an integer field of line's object in [lo, hi] (absent: *v unchanged) */
static int json_int(const char *cmd, const char *path, int line, const cJSON *o, const char *key, double lo, double hi,
                    int64_t *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi)
        return cli_error(cmd, "%s line %d: \"%s\" must be an integer from %.0f to %.0f", path, line, key, lo, hi);
    *v = (int64_t)j->valuedouble;
    return 0;
}

static int parse_object(const char *cmd, const char *path, int line, const char *text, cli_prompt *p) {
    /* the whole line one object: text after it (a second object) is an
     * error, not ignored */
    cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        rc = cli_error(cmd, "%s line %d: a line starting with { must be one JSON object and nothing after it (%s)", path,
                       line, "{\"prompt\": \"...\", \"seed\": 1, ...}");
        goto out;
    }
    unsigned seen = 0; /* bit i: k_keys[i] came already (a second one would be silently ignored) */
    for (const cJSON *k = o->child; k; k = k->next) {
        size_t i = 0;
        while (i < sizeof k_keys / sizeof *k_keys && strcmp(k->string, k_keys[i])) i++;
        if (i == sizeof k_keys / sizeof *k_keys) {
            rc = cli_error(cmd, "%s line %d: unknown key \"%s\" (known: prompt, negative_prompt, seed, steps, guidance, "
                           "width, height, images_per_prompt)", path, line, k->string);
            goto out;
        }
        if (seen >> i & 1u) {
            rc = cli_error(cmd, "%s line %d: key \"%s\" appears twice (each key once a line)", path, line, k->string);
            goto out;
        }
        seen |= 1u << i;
    }
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *ng = cJSON_GetObjectItemCaseSensitive(o, "negative_prompt"),
                *g = cJSON_GetObjectItemCaseSensitive(o, "guidance");
    if (!cJSON_IsString(pr)) {
        rc = cli_error(cmd, "%s line %d: \"prompt\" (a string) is required", path, line);
        goto out;
    }
    if (ng && !cJSON_IsString(ng)) {
        rc = cli_error(cmd, "%s line %d: \"negative_prompt\" must be a string", path, line);
        goto out;
    }
    if (g && (!cJSON_IsNumber(g) || !isfinite(g->valuedouble))) {
        rc = cli_error(cmd, "%s line %d: \"guidance\" must be a number", path, line);
        goto out;
    }
    int64_t steps = 0, w = 0, h = 0, n = 0;
    if ((rc = json_int(cmd, path, line, o, "seed", 0, 9007199254740991.0, &p->seed)) ||
        (rc = json_int(cmd, path, line, o, "steps", 1, 10000, &steps)) ||
        (rc = json_int(cmd, path, line, o, "width", 1, 1 << 20, &w)) ||
        (rc = json_int(cmd, path, line, o, "height", 1, 1 << 20, &h)) ||
        (rc = json_int(cmd, path, line, o, "images_per_prompt", 1, 512, &n)))
        goto out;
    p->steps = (int)steps, p->width = (int)w, p->height = (int)h, p->images = (int)n;
    if (g) {
        p->guidance = g->valuedouble;
        p->has_guidance = 1;
    }
    if (!(p->prompt = kb_strdup(pr->valuestring)) || (ng && !(p->negative = kb_strdup(ng->valuestring))))
        rc = cli_error(cmd, "out of memory");
out:
    cJSON_Delete(o);
    return rc;
}

int cli_prompts_read(const char *cmd, const char *path, cli_prompt **out, int *n) {
    char *text = NULL;
    size_t len;
    *out = NULL;
    *n = 0;
    if (kb_read_file(path, &text, &len)) return cli_fail(cmd, KILN_ERR_IO);
    if (strlen(text) != len) { /* the lines after a NUL byte would be dropped silently */
        int rc = cli_error(cmd, "%s: a NUL byte at offset %zu: a prompts file is text (UTF-8, one prompt per line)", path,
                           strlen(text));
        free(text);
        return rc;
    }
    int cap = 0, rc = 0, line = 0;
    cli_prompt *v = NULL;
    char *start = text;
    if (len >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) start += 3; /* a UTF-8 byte order mark (Windows editors) */
    for (char *p = start; p && *p && !rc; line++) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        char *end = e ? e : p + strlen(p);
        if (end > p && end[-1] == '\r') end[-1] = 0; /* CRLF, the last line's too */
        if (line >= INT_MAX / 2) { /* the line numbers and the prompts' count are ints */
            rc = cli_error(cmd, "%s: more than %d lines", path, INT_MAX / 2);
            break;
        }
        const char *s = p;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) { /* a blank line separates, it is no prompt ({"prompt": ""} is the empty one) */
            p = e ? e + 1 : NULL;
            continue;
        }
        if (*n == cap) {
            cli_prompt *g = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 16));
            if (!g) {
                rc = cli_error(cmd, "out of memory");
                break;
            }
            v = g;
        }
        cli_prompt *q = &v[*n];
        memset(q, 0, sizeof *q);
        q->seed = -1;
        q->line = line + 1;
        if (*s == '{') rc = parse_object(cmd, path, line + 1, s, q);
        else if (!(q->prompt = kb_strdup(p))) rc = cli_error(cmd, "out of memory");
        (*n)++;
        p = e ? e + 1 : NULL;
    }
    free(text);
    if (!rc && !*n) rc = cli_error(cmd, "%s holds no prompt (one per line, or a JSON object per line)", path);
    if (rc) {
        cli_prompts_free(v, *n);
        *n = 0;
        return rc;
    }
    *out = v;
    return 0;
}

void cli_prompts_free(cli_prompt *p, int n) {
    for (int i = 0; p && i < n; i++) {
        free(p[i].prompt);
        free(p[i].negative);
    }
    free(p);
}
