/* manifest.c - a weight cache's manifest as text: the header line, the
 * body's fields (each checked before use), the key a hit must match.
 * Touches no file except kcache_manifest_source's read, so the parse can be
 * fuzzed alone (tests/fuzz/fuzz_cache_manifest.c). */
#define _GNU_SOURCE
#include "cache/cache.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

void kcache_close(kcache_entry *e) {
    if (!e) return;
    kb_unmap(&e->data);
    for (size_t i = 0; e->t && i < e->n; i++) {
        free((char *)e->t[i].name);
        free((char *)e->t[i].layout);
    }
    free(e->t);
    free(e->config_json);
    free(e->key_json);
    free(e->path);
    free(e);
}

/* exactly n lowercase hex digits, then the end of s or a space / newline */
static int hex_run(const char *s, size_t avail, size_t n) {
    if (avail < n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return avail == n || s[n] == ' ' || s[n] == '\n';
}

static uint64_t parse_hex64(const char *s) {
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) v = v << 4 | (uint64_t)(s[i] <= '9' ? s[i] - '0' : s[i] - 'a' + 10);
    return v;
}

kiln_status kcache_manifest_split(const char *text, size_t len, const char *label, int *version, char sig[65],
                                  const char **body, size_t *body_len) {
    *version = 0;
    sig[0] = 0;
    *body = NULL;
    *body_len = 0;
    const char *nl = memchr(text, '\n', len);
    size_t ml = strlen(KCACHE_MAGIC);
    if (!nl || (size_t)(nl - text) < ml + 2 || memcmp(text, KCACHE_MAGIC " ", ml + 1))
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest has no " KCACHE_MAGIC " header line", label);
    /* "<version> xxh3:<16> hmac:<64>" between the magic and the newline */
    const char *p = text + ml + 1, *end = nl;
    long v = 0;
    int digits = 0;
    while (p < end && *p >= '0' && *p <= '9' && digits < 6) v = v * 10 + (*p++ - '0'), digits++;
    if (!digits || p >= end || *p != ' ')
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest header has no format number", label);
    *version = (int)v;
    if (v != KCACHE_FORMAT_VERSION)
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest format %ld, this kiln reads %d (made by another "
                       "kiln version: it is rebuilt)", label, v, KCACHE_FORMAT_VERSION);
    p++;
    if ((size_t)(end - p) < 5 || memcmp(p, "xxh3:", 5) || !hex_run(p + 5, (size_t)(end - p - 5), 16))
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest header has no xxh3:<16 hex digits>", label);
    uint64_t want = parse_hex64(p + 5);
    p += 5 + 16;
    if ((size_t)(end - p) < 6 || memcmp(p, " hmac:", 6) || !hex_run(p + 6, (size_t)(end - p - 6), 64) ||
        p + 6 + 64 != end)
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest header has no hmac:<64 hex digits> (unsigned)",
                       label);
    memcpy(sig, p + 6, 64);
    sig[64] = 0;
    size_t bl = len - (size_t)(nl + 1 - text);
    if (bl && nl[bl] == '\n') bl--; /* the trailing newline */
    if (XXH3_64bits(nl + 1, bl) != want)
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: manifest checksum mismatch", label);
    *body = nl + 1;
    *body_len = bl;
    return KILN_OK;
}

/* a JSON number that is an integer in [0, max]: fractions, negatives, NaN
 * and anything a double holds inexactly refused before the cast */
static int json_uint(const cJSON *v, double max, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= max) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

#define MAX_EXACT 9007199254740992.0 /* 2^53: every integer below is exact in a double */

kiln_status kcache_manifest_parse(const char *body, size_t len, const char *label, kcache_entry *e) {
    memset(e, 0, sizeof *e);
    kiln_status s = KILN_OK;
    cJSON *root = cJSON_ParseWithLength(body, len);
#define CORRUPT(...)                                                              \
    do {                                                                          \
        char why_[512];                                                           \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                 \
        s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: %s", label, why_);    \
        goto done;                                                                \
    } while (0)
    if (!cJSON_IsObject(root)) CORRUPT("manifest is not a JSON object");
    uint64_t fv;
    if (!json_uint(cJSON_GetObjectItemCaseSensitive(root, "format_version"), 1e6, &fv) || fv != KCACHE_FORMAT_VERSION)
        CORRUPT("manifest body says format_version other than %d", KCACHE_FORMAT_VERSION);
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(root, "data_file");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(root, "key");
    const cJSON *config = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (!cJSON_IsString(df) || strcmp(df->valuestring, KCACHE_DATA) || !cJSON_IsArray(tensors))
        CORRUPT("manifest lacks data_file \"" KCACHE_DATA "\" or tensors");
    if (!json_uint(cJSON_GetObjectItemCaseSensitive(root, "data_bytes"), MAX_EXACT, &e->data_bytes))
        CORRUPT("manifest's data_bytes is not an integer in [0, 2^53]");
    if (!cJSON_IsObject(key) || !cJSON_IsObject(config)) CORRUPT("manifest's key or config is not an object");
    e->config_json = cJSON_PrintUnformatted(config);
    e->key_json = cJSON_PrintUnformatted(key);
    if (!e->config_json || !e->key_json) {
        s = kb_fail(KILN_ERR_NOMEM, "out of memory reading cache %s", label);
        goto done;
    }
    int nt = cJSON_GetArraySize(tensors);
    e->t = kb_calloc((size_t)(nt > 0 ? nt : 1), sizeof *e->t);
    if (!e->t) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, tensors) {
        kcache_tensor *t = &e->t[e->n];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *layout = cJSON_GetObjectItemCaseSensitive(it, "layout");
        const cJSON *hash = cJSON_GetObjectItemCaseSensitive(it, "xxh3");
        uint64_t off, bytes;
        if (!cJSON_IsObject(it) || !cJSON_IsString(name) || !*name->valuestring || !cJSON_IsString(dt) ||
            !cJSON_IsArray(shape) || !cJSON_IsString(layout) || !cJSON_IsString(hash))
            CORRUPT("tensor entry %zu is malformed (name, dtype, shape, layout and xxh3 are required)", e->n);
        if (!json_uint(cJSON_GetObjectItemCaseSensitive(it, "offset"), MAX_EXACT, &off) ||
            !json_uint(cJSON_GetObjectItemCaseSensitive(it, "bytes"), MAX_EXACT, &bytes))
            CORRUPT("tensor entry %zu (%.200s): offset and bytes must be integers in [0, 2^53]", e->n,
                    name->valuestring);
        t->name = kb_strdup(name->valuestring);
        t->layout = kb_strdup(layout->valuestring);
        e->n++;
        if (!t->name || !t->layout) {
            s = KILN_ERR_NOMEM;
            goto done;
        }
        t->dtype = kt_dtype_from_name(dt->valuestring);
        int nd = cJSON_GetArraySize(shape);
        if (t->dtype == KILN_DTYPE_INVALID) CORRUPT("tensor %.200s: unknown dtype \"%.40s\"", t->name, dt->valuestring);
        if (nd > 4) CORRUPT("tensor %.200s: rank %d (at most 4)", t->name, nd);
        t->ndim = nd;
        /* numel and numel * element size, overflow-checked: [2^32, 2^32] with
         * bytes 0 is 2^64 elements, not 0 */
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t dim;
            if (!json_uint(cJSON_GetArrayItem(shape, d), 1e15, &dim))
                CORRUPT("tensor %.200s: shape[%d] is not an integer in [0, 1e15]", t->name, d);
            t->shape[d] = (int64_t)dim;
            if (__builtin_mul_overflow(numel, dim, &numel))
                CORRUPT("tensor %.200s: its shape's element count overflows 64 bits", t->name);
        }
        uint64_t need;
        if (__builtin_mul_overflow(numel, (uint64_t)kiln_dtype_size(t->dtype), &need))
            CORRUPT("tensor %.200s: its shape's byte count overflows 64 bits", t->name);
        /* packed layouts may pad; the model checks their size against the layout */
        int rowmajor = !strcmp(t->layout, "rowmajor");
        if (rowmajor ? need != bytes : need > bytes)
            CORRUPT("tensor %.200s: %llu bytes, its shape needs %llu", t->name, (unsigned long long)bytes,
                    (unsigned long long)need);
        if (off % KCACHE_ALIGN || off > e->data_bytes || bytes > e->data_bytes - off)
            CORRUPT("tensor %.200s: range [%llu, +%llu) outside the %llu-byte data file or unaligned", t->name,
                    (unsigned long long)off, (unsigned long long)bytes, (unsigned long long)e->data_bytes);
        if (bytes > SIZE_MAX) CORRUPT("tensor %.200s: %llu bytes do not fit in memory", t->name, (unsigned long long)bytes);
        t->offset = off;
        t->nbytes = (size_t)bytes;
        t->data = NULL;
        size_t hl = strlen(hash->valuestring);
        if (!hex_run(hash->valuestring, hl, 16)) CORRUPT("tensor %.200s: xxh3 is not 16 hex digits", t->name);
        t->xxh3 = parse_hex64(hash->valuestring);
    }
#undef CORRUPT
done:
    cJSON_Delete(root);
    return s;
}

static int in_list(const char *name, const char *const *skip) {
    for (; skip && *skip; skip++)
        if (!strcmp(name, *skip)) return 1;
    return 0;
}

/* a member's value as short text for a message */
static void show(const cJSON *v, char *buf, size_t cap) {
    if (!v) {
        snprintf(buf, cap, "(absent)");
        return;
    }
    char *s = cJSON_PrintUnformatted(v);
    snprintf(buf, cap, "%.200s", s ? s : "?");
    free(s);
}

kiln_status kcache_check_key(const kcache_entry *e, const char *want_json, const char *const *skip) {
    cJSON *want = cJSON_Parse(want_json ? want_json : ""), *have = cJSON_Parse(e->key_json ? e->key_json : "");
    kiln_status s = KILN_OK;
    if (!want) s = kb_fail(KILN_ERR_NOMEM, "out of memory checking the key of cache %s", e->path);
    else if (!cJSON_IsObject(have)) s = kb_fail(KILN_ERR_CORRUPT, "cache %s records no key", e->path);
    const cJSON *w;
    for (int pass = 0; !s && pass < 2; pass++) {
        /* pass 0: what the load asks for; pass 1: what the manifest has besides */
        const cJSON *list = pass ? have : want;
        cJSON_ArrayForEach(w, list) {
            if (!w->string || in_list(w->string, skip)) continue;
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(pass ? want : have, w->string);
            if (pass ? !h : !cJSON_Compare(w, h, 1)) {
                char a[220], b[220];
                show(pass ? w : h, a, sizeof a);
                show(pass ? h : w, b, sizeof b);
                s = kb_fail(KILN_ERR_CORRUPT, "cache %s was made for another key: its %s is %s, this load needs %s",
                            e->path, w->string, a, b);
                break;
            }
        }
    }
    cJSON_Delete(want);
    cJSON_Delete(have);
    return s;
}

char *kcache_manifest_source(const char *dir) {
    char *path = kb_path_join(dir, KCACHE_MANIFEST), *text = NULL, *out = NULL;
    int fd = path ? open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    free(path);
    struct stat st;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size <= KCACHE_MANIFEST_MAX &&
        (text = malloc((size_t)st.st_size + 1))) {
        ssize_t got = read(fd, text, (size_t)st.st_size);
        if (got > 0) {
            text[got] = 0;
            char *nl = strchr(text, '\n');
            cJSON *j = nl && !strncmp(text, KCACHE_MAGIC " ", strlen(KCACHE_MAGIC) + 1) ? cJSON_Parse(nl + 1) : NULL;
            const cJSON *src = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "key"), "source");
            if (cJSON_IsString(src)) out = kb_strdup(src->valuestring);
            cJSON_Delete(j);
        }
    }
    free(text);
    close(fd);
    return out;
}
