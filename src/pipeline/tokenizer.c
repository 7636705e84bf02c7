/* tokenizer.c - what the CLIP and T5 tokenizers share: UTF-8 and Unicode
 * classes (utf8proc), hash maps, added tokens, reading a tokenizer folder,
 * and the public calls that truncate and pad as the pipelines do. */
#include "pipeline/tokenizer.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* A prompt longer than this many tokens (or asked for a longer padded
 * length) is a caller's mistake, not a prompt: refuse instead of allocating. */
#define KTOK_MAX_LENGTH (1 << 20)

/* ---- buffers ------------------------------------------------------------- */

kiln_status ktok_buf_add(ktok_buf *b, const void *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of text)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return KILN_OK;
}

kiln_status ktok_buf_cp(ktok_buf *b, int32_t cp) {
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, u);
    return ktok_buf_add(b, u, (size_t)k);
}

kiln_status ktok_ids_add(ktok_ids *v, int32_t id) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (%zu ids)", cap);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->len++] = id;
    return KILN_OK;
}

/* ---- hash maps ----------------------------------------------------------- */

static uint64_t ktok_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

void ktok_map_free(ktok_map *m) {
    free(m->slots);
    free(m->arena);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t ktok_map_find(const ktok_map *m, const char *key, size_t len) {
    size_t mask = m->cap - 1, i = (size_t)ktok_hash(key, len) & mask;
    for (;;) {
        uint32_t e = m->slots[i];
        if (!e) return i;
        e--;
        if (m->key_len[e] == len && !memcmp(m->arena + m->key_off[e], key, len)) return i;
        i = (i + 1) & mask;
    }
}

static kiln_status ktok_map_grow(ktok_map *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (vocabulary map)");
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = ktok_map_find(m, m->arena + m->key_off[e], m->key_len[e]);
        m->slots[i] = (uint32_t)e + 1;
    }
    return KILN_OK;
}

kiln_status ktok_map_put(ktok_map *m, const char *key, size_t len, int32_t val) {
    if (len > UINT32_MAX || m->n >= UINT32_MAX - 1)
        return kb_fail(KILN_ERR_RANGE, "tokenizer: vocabulary too large");
    if ((m->n + 1) * 2 > m->cap) {
        kiln_status s = ktok_map_grow(m);
        if (s) return s;
    }
    size_t i = ktok_map_find(m, key, len);
    if (m->slots[i]) {
        m->val[m->slots[i] - 1] = val;
        return KILN_OK;
    }
    if (m->n == m->ent_cap) {
        size_t cap = m->ent_cap ? m->ent_cap * 2 : 1024;
        size_t *ko = realloc(m->key_off, cap * sizeof *ko);
        if (ko) m->key_off = ko;
        uint32_t *kl = realloc(m->key_len, cap * sizeof *kl);
        if (kl) m->key_len = kl;
        int32_t *v = realloc(m->val, cap * sizeof *v);
        if (v) m->val = v;
        if (!ko || !kl || !v) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (vocabulary)");
        m->ent_cap = cap;
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 4096;
        while (cap < m->arena_len + len + 1) cap *= 2;
        char *a = realloc(m->arena, cap);
        if (!a) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (vocabulary)");
        m->arena = a;
        m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_len, key, len);
    m->arena[m->arena_len + len] = 0;
    m->key_off[m->n] = m->arena_len;
    m->key_len[m->n] = (uint32_t)len;
    m->val[m->n] = val;
    m->arena_len += len + 1;
    m->slots[i] = (uint32_t)(++m->n);
    return KILN_OK;
}

int ktok_map_get(const ktok_map *m, const char *key, size_t len, int32_t *val) {
    if (!m->cap) return 0;
    uint32_t e = m->slots[ktok_map_find(m, key, len)];
    if (!e) return 0;
    *val = m->val[e - 1];
    return 1;
}

void ktok_pairmap_free(ktok_pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->id);
    memset(m, 0, sizeof *m);
}

static size_t ktok_pair_slot(const ktok_pairmap *m, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t mask = m->cap - 1, i = (size_t)(h ^ (h >> 32)) & mask;
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & mask;
    return i;
}

kiln_status ktok_pairmap_put(ktok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap) {
        ktok_pairmap g = {.cap = m->cap ? m->cap * 2 : 1024};
        g.keys = calloc(g.cap, sizeof *g.keys);
        g.rank = malloc(g.cap * sizeof *g.rank);
        g.id = malloc(g.cap * sizeof *g.id);
        if (!g.keys || !g.rank || !g.id) {
            ktok_pairmap_free(&g);
            return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (merges)");
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = ktok_pair_slot(&g, m->keys[i]);
            g.keys[j] = m->keys[i];
            g.rank[j] = m->rank[i];
            g.id[j] = m->id[i];
        }
        g.n = m->n;
        ktok_pairmap_free(m);
        *m = g;
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = ktok_pair_slot(m, key);
    if (!m->keys[i]) m->n++;
    m->keys[i] = key;
    m->rank[i] = rank;
    m->id[i] = id;
    return KILN_OK;
}

int ktok_pairmap_get(const ktok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    if (!m->cap) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = ktok_pair_slot(m, key);
    if (!m->keys[i]) return 0;
    *rank = m->rank[i];
    *id = m->id[i];
    return 1;
}

/* ---- Unicode ------------------------------------------------------------- */

int32_t ktok_next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) {
        (*i)++;
        return -1;
    }
    *i += (size_t)k;
    return cp;
}

kiln_status ktok_check_utf8(const char *s, size_t n, const char *what) {
    size_t i = 0;
    while (i < n) {
        size_t at = i;
        if (ktok_next_cp(s, n, &i) < 0) {
            /* the bytes from there (up to 4), e.g. "ED A0 80" */
            char hex[16] = "";
            int k = 0;
            for (size_t j = at; j < n && j < at + 4; j++)
                k += snprintf(hex + k, sizeof hex - (size_t)k, "%s%02X", k ? " " : "", (uint8_t)s[j]);
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "%s is not valid UTF-8: bytes %s at offset %zu are not a code point "
                           "(overlong, a surrogate, past U+10FFFF or cut short); give UTF-8 text",
                           what, hex, at);
        }
    }
    return KILN_OK;
}

int ktok_is_space(int32_t cp) {
    if ((cp >= 9 && cp <= 13) || cp == 0x85) return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

int ktok_is_letter(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

int ktok_is_number(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

/* ---- added tokens -------------------------------------------------------- */

int ktok_find_added(const kiln_tokenizer *t, int normalized, const char *s, size_t n, size_t from, size_t *at,
                    int *which) {
    const uint8_t *first = t->added_first[normalized ? 1 : 0];
    for (size_t i = from; i < n; i++) {
        if (!first[(uint8_t)s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const ktok_added *a = &t->added[k];
            if (a->normalized != normalized || !a->len || a->len > n - i || memcmp(s + i, a->content, a->len)) continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best >= 0) {
            *at = i;
            *which = best;
            return 1;
        }
    }
    return 0;
}

/* ---- base64 -------------------------------------------------------------- */

static int ktok_b64(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

kiln_status ktok_base64(const char *s, size_t n, uint8_t **out, size_t *out_len, const char *what) {
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return kb_fail(KILN_ERR_FORMAT, "%s: base64 text of %zu characters is cut short", what, n);
    uint8_t *b = malloc(n / 4 * 3 + 3);
    if (!b) return kb_fail(KILN_ERR_NOMEM, "%s: out of memory", what);
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = ktok_b64((unsigned char)s[i]);
        if (v < 0) {
            free(b);
            return kb_fail(KILN_ERR_FORMAT, "%s: '%c' at offset %zu is not base64", what, s[i], i);
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            b[k++] = (uint8_t)(acc >> bits);
        }
    }
    *out = b;
    *out_len = k;
    return KILN_OK;
}

/* ---- reading a folder ---------------------------------------------------- */

kiln_status ktok_read_text(const char *path, char **text, size_t *len) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > KTOK_MAX_FILE)
        return kb_fail(KILN_ERR_FORMAT, "%s: %lld bytes; a tokenizer file is at most %u", path, (long long)sb.st_size,
                       KTOK_MAX_FILE);
    kiln_status s = kb_read_file(path, text, len);
    if (!s && *len > KTOK_MAX_FILE) { /* grew while read */
        free(*text);
        *text = NULL;
        return kb_fail(KILN_ERR_FORMAT, "%s: more than %u bytes; a tokenizer file is at most that", path, KTOK_MAX_FILE);
    }
    return s;
}

kiln_status ktok_read_json_text(const char *path, char **text, size_t *len) {
    kiln_status s = ktok_read_text(path, text, len);
    if (s) return s;
    long items = kb_json_values(*text, *len);
    if (items > KTOK_MAX_JSON_ITEMS) {
        free(*text);
        *text = NULL;
        return kb_fail(KILN_ERR_FORMAT, "%s: about %ld JSON values; a tokenizer file holds at most %ld (the largest "
                       "real vocabularies hold well under a million)", path, items, KTOK_MAX_JSON_ITEMS);
    }
    return KILN_OK;
}

static kiln_status ktok_read_json(const char *path, cJSON **out) {
    char *text;
    size_t len;
    kiln_status s = ktok_read_json_text(path, &text, &len);
    if (s) return s;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        free(text);
        return kb_fail(KILN_ERR_FORMAT, "%s is not valid JSON (near byte %zu)", path, at);
    }
    free(text);
    *out = j;
    return KILN_OK;
}

/* A special token's text in a config: "x" or {"content": "x", ...}. */
static const char *ktok_token_name(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static kiln_status ktok_add_added(kiln_tokenizer *t, const char *content, int64_t id, int normalized,
                                  const char *where) {
    if (!content || !*content) return kb_fail(KILN_ERR_FORMAT, "%s: an added token has no content", where);
    if (id < 0 || id >= INT32_MAX) return kb_fail(KILN_ERR_FORMAT, "%s: added token \"%s\" has id %lld", where, content, (long long)id);
    if (ktok_check_utf8(content, strlen(content), "an added token")) return kb_wrap(KILN_ERR_FORMAT, "%s", where);
    ktok_added *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a) return kb_fail(KILN_ERR_NOMEM, "%s: out of memory", where);
    t->added = a;
    ktok_added *e = &a[t->n_added];
    memset(e, 0, sizeof *e);
    e->id = (int32_t)id;
    e->normalized = normalized;
    if (normalized) {
        /* matched in the normalized text: match its normalized form */
        ktok_buf b = {0};
        kiln_status s = ktok_normalize(t, content, strlen(content), &b);
        if (s) {
            free(b.p);
            return s;
        }
        e->content = b.p ? b.p : kb_strdup("");
        e->len = b.len;
    } else {
        e->content = kb_strdup(content);
        e->len = strlen(content);
    }
    if (!e->content) return kb_fail(KILN_ERR_NOMEM, "%s: out of memory", where);
    if (e->len) t->added_first[normalized ? 1 : 0][(uint8_t)e->content[0]] = 1;
    t->n_added++;
    if (id + 1 > t->vocab_size) t->vocab_size = (int32_t)(id + 1);
    return KILN_OK;
}

static int ktok_bool(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* One added-token object ({"content", "normalized", "lstrip", ...}). */
static kiln_status ktok_added_entry(kiln_tokenizer *t, const cJSON *e, int64_t id, const char *where) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
    if (!cJSON_IsString(c)) return kb_fail(KILN_ERR_FORMAT, "%s: added token %lld has no \"content\" string", where, (long long)id);
    if (ktok_bool(e, "lstrip") || ktok_bool(e, "rstrip") || ktok_bool(e, "single_word"))
        return kb_fail(KILN_ERR_UNSUPPORTED,
                       "%s: added token \"%s\" asks for lstrip/rstrip/single_word, which kiln's "
                       "tokenizers do not implement (no diffusers pipeline uses them)",
                       where, c->valuestring);
    /* transformers' default for added tokens is normalized = !special */
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(e, "normalized");
    int normalized = cJSON_IsBool(nz) ? cJSON_IsTrue(nz) : !ktok_bool(e, "special");
    return ktok_add_added(t, c->valuestring, id, normalized, where);
}

/* The id of a token by its text: added tokens first, then the vocabulary. */
static int ktok_lookup(const kiln_tokenizer *t, const char *name, int64_t *id) {
    for (int k = 0; k < t->n_added; k++)
        if (!t->added[k].normalized && !strcmp(t->added[k].content, name)) {
            *id = t->added[k].id;
            return 1;
        }
    int32_t v;
    if (ktok_map_get(&t->vocab, name, strlen(name), &v)) {
        *id = v;
        return 1;
    }
    for (int k = 0; k < t->n_added; k++)
        if (!strcmp(t->added[k].content, name)) {
            *id = t->added[k].id;
            return 1;
        }
    return 0;
}

/* The special token `key` of the configs (tokenizer_config.json first), else
 * dflt; its id into *id. */
static kiln_status ktok_special(const kiln_tokenizer *t, const cJSON *cfg, const cJSON *map, const char *key,
                                const char *dflt, int64_t *id) {
    const char *name = cfg ? ktok_token_name(cfg, key) : NULL;
    if (!name && map) name = ktok_token_name(map, key);
    if (!name) name = dflt;
    if (!ktok_lookup(t, name, id))
        return kb_fail(KILN_ERR_MISSING, "%s: the %s \"%s\" is neither an added token nor in the vocabulary",
                       t->source, key, name);
    return KILN_OK;
}

/* Added tokens without tokenizer.json: tokenizer_config.json's
 * "added_tokens_decoder" (id -> {content, normalized, ...}); without one,
 * the special tokens and "additional_special_tokens" that are in the
 * vocabulary, as transformers adds them (not normalized). */
static kiln_status ktok_added_from_config(kiln_tokenizer *t, const cJSON *cfg, const cJSON *map, const char *p_cfg) {
    const cJSON *dec = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL, *e;
    kiln_status s = KILN_OK;
    if (cJSON_IsObject(dec)) {
        cJSON_ArrayForEach(e, dec) {
            char *end;
            long long id = strtoll(e->string, &end, 10);
            if (end == e->string || *end)
                return kb_fail(KILN_ERR_FORMAT, "%s: \"added_tokens_decoder\" key \"%s\" is not an id", p_cfg, e->string);
            if ((s = ktok_added_entry(t, e, id, p_cfg))) return s;
        }
        return KILN_OK;
    }
    int clip = t->kind == KILN_TOKENIZER_CLIP;
    static const char *keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    const char *dflt_clip[] = {"<|startoftext|>", "<|endoftext|>", "<|endoftext|>", "<|endoftext|>"};
    const char *dflt_t5[] = {NULL, "</s>", "<unk>", "<pad>"};
    const cJSON *extra = NULL;
    for (int k = 0; k < 5 && !s; k++) {
        const char *names[128];
        int n = 0;
        if (k < 4) {
            const char *name = cfg ? ktok_token_name(cfg, keys[k]) : NULL;
            if (!name && map) name = ktok_token_name(map, keys[k]);
            if (!name) name = clip ? dflt_clip[k] : dflt_t5[k];
            if (name) names[n++] = name;
        } else {
            extra = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens") : NULL;
            if (!extra && map) extra = cJSON_GetObjectItemCaseSensitive(map, "additional_special_tokens");
            cJSON_ArrayForEach(e, extra) if (cJSON_IsString(e) && n < 128) names[n++] = e->valuestring;
        }
        for (int j = 0; j < n && !s; j++) {
            int32_t id;
            if (!ktok_map_get(&t->vocab, names[j], strlen(names[j]), &id)) {
                if (k < 4 && clip)
                    return kb_fail(KILN_ERR_MISSING, "%s: the %s \"%s\" is not in the vocabulary", t->source, keys[k], names[j]);
                continue;
            }
            int dup = 0;
            for (int i = 0; i < t->n_added; i++) dup |= t->added[i].id == id;
            if (!dup) s = ktok_add_added(t, names[j], id, 0, p_cfg);
        }
    }
    return s;
}

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    for (int k = 0; k < t->n_added; k++) free(t->added[k].content);
    free(t->added);
    ktok_map_free(&t->vocab);
    ktok_clip_free(t->clip);
    ktok_t5_free(t->t5);
    free(t->source);
    free(t);
}

/* a name in the folder that stands for something (a file, a link even to
 * /dev/zero): read, and refused there if it is not a readable file, never
 * passed over for the next kind of file */
static int present(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static kiln_status ktok_open_inner(kiln_tokenizer *t, const char *folder, ktok_files files, cJSON **cfg,
                                   cJSON **map, cJSON **root) {
    char *p_json = kb_path_join(folder, "tokenizer.json");
    char *p_vocab = kb_path_join(folder, "vocab.json");
    char *p_merges = kb_path_join(folder, "merges.txt");
    char *p_cfg = kb_path_join(folder, "tokenizer_config.json");
    char *p_map = kb_path_join(folder, "special_tokens_map.json");
    char *p_spiece = kb_path_join(folder, "spiece.model");
    kiln_status s = KILN_OK;
    if (!p_json || !p_vocab || !p_merges || !p_cfg || !p_map || !p_spiece) {
        s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (!kb_is_dir(folder)) {
        s = kb_fail(KILN_ERR_IO, "tokenizer folder %s is not a folder", folder);
        goto done;
    }
    if (present(p_cfg) && (s = ktok_read_json(p_cfg, cfg))) goto done;
    if (present(p_map) && (s = ktok_read_json(p_map, map))) goto done;
    int use_json = files == KTOK_FILES_TOKENIZER_JSON || (files == KTOK_FILES_AUTO && present(p_json));
    if (use_json) {
        if (!(t->source = kb_strdup(p_json))) {
            s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        if ((s = ktok_read_json(p_json, root))) goto done;
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(*root, "model");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
        if (!cJSON_IsObject(model) || !cJSON_IsString(type)) {
            s = kb_fail(KILN_ERR_FORMAT, "%s has no \"model\" object with a \"type\"", p_json);
            goto done;
        }
        if (!strcmp(type->valuestring, "BPE")) {
            t->kind = KILN_TOKENIZER_CLIP;
            s = ktok_clip_from_json(t, model, *root);
        } else if (!strcmp(type->valuestring, "Unigram")) {
            t->kind = KILN_TOKENIZER_T5;
            s = ktok_t5_from_json(t, model, *root);
        } else {
            s = kb_fail(KILN_ERR_UNSUPPORTED, "%s: model type \"%s\" is not one kiln reads (BPE: CLIP, Unigram: T5)",
                        p_json, type->valuestring);
        }
        if (s) goto done;
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(*root, "added_tokens"), *e;
        cJSON_ArrayForEach(e, added) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            if (!cJSON_IsNumber(id)) {
                s = kb_fail(KILN_ERR_FORMAT, "%s: an entry of \"added_tokens\" has no numeric \"id\"", p_json);
                goto done;
            }
            if ((s = ktok_added_entry(t, e, (int64_t)id->valuedouble, p_json))) goto done;
        }
    } else if ((files == KTOK_FILES_AUTO || files == KTOK_FILES_VOCAB_MERGES) && present(p_vocab) &&
               present(p_merges)) {
        if (!(t->source = kb_strdup(p_vocab))) {
            s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        t->kind = KILN_TOKENIZER_CLIP;
        if ((s = ktok_clip_from_files(t, p_vocab, p_merges))) goto done;
        s = ktok_added_from_config(t, *cfg, *map, p_cfg);
    } else if (files != KTOK_FILES_TOKENIZER_JSON && files != KTOK_FILES_VOCAB_MERGES && present(p_spiece)) {
        if (!(t->source = kb_strdup(p_spiece))) {
            s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        t->kind = KILN_TOKENIZER_T5;
        if ((s = ktok_t5_from_spiece(t, p_spiece, *cfg))) goto done;
        s = ktok_added_from_config(t, *cfg, *map, p_cfg);
    } else {
        s = kb_fail(KILN_ERR_MISSING,
                    "tokenizer folder %s has %s: kiln reads tokenizer.json (CLIP BPE or T5 Unigram), "
                    "CLIP's vocab.json + merges.txt or T5's spiece.model",
                    folder, files == KTOK_FILES_TOKENIZER_JSON ? "no tokenizer.json"
                            : files == KTOK_FILES_VOCAB_MERGES ? "no vocab.json + merges.txt"
                            : files == KTOK_FILES_SPIECE     ? "no spiece.model"
                                                             : "neither tokenizer.json, vocab.json + merges.txt nor spiece.model");
        goto done;
    }
    if (s) goto done;
    if (t->kind == KILN_TOKENIZER_CLIP) {
        t->max_length = 77;
        if ((s = ktok_special(t, *cfg, *map, "bos_token", "<|startoftext|>", &t->bos_id))) goto done;
        if ((s = ktok_special(t, *cfg, *map, "eos_token", "<|endoftext|>", &t->eos_id))) goto done;
        if ((s = ktok_special(t, *cfg, *map, "pad_token", "<|endoftext|>", &t->pad_id))) goto done;
    } else {
        t->max_length = 256;
        t->bos_id = -1;
        if ((s = ktok_special(t, *cfg, *map, "eos_token", "</s>", &t->eos_id))) goto done;
        if ((s = ktok_special(t, *cfg, *map, "pad_token", "<pad>", &t->pad_id))) goto done;
    }
done:
    free(p_json);
    free(p_vocab);
    free(p_merges);
    free(p_cfg);
    free(p_map);
    free(p_spiece);
    return s;
}

kiln_status ktok_open(const char *folder, ktok_files files, kiln_tokenizer **out) {
    if (!folder || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_tokenizer_open: folder and out are required");
    *out = NULL;
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    cJSON *cfg = NULL, *map = NULL, *root = NULL;
    kiln_status s = ktok_open_inner(t, folder, files, &cfg, &map, &root);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    cJSON_Delete(root);
    if (s) {
        kiln_tokenizer_free(t);
        return kb_wrap(s, "opening tokenizer %s", folder);
    }
    *out = t;
    return KILN_OK;
}

kiln_status kiln_tokenizer_open(const char *folder, kiln_tokenizer **out) {
    return ktok_open(folder, KTOK_FILES_AUTO, out);
}

kiln_tokenizer_kind kiln_tokenizer_get_kind(const kiln_tokenizer *t) { return t ? t->kind : 0; }
int kiln_tokenizer_max_length(const kiln_tokenizer *t) { return t ? t->max_length : 0; }
int64_t kiln_tokenizer_pad_id(const kiln_tokenizer *t) { return t ? t->pad_id : -1; }

kiln_status ktok_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out) {
    kiln_status s = ktok_check_utf8(text, len, "the prompt");
    if (s) return s;
    return t->kind == KILN_TOKENIZER_CLIP ? ktok_clip_encode(t, text, len, out) : ktok_t5_encode(t, text, len, out);
}

kiln_status kiln_tokenize(const kiln_tokenizer *t, const char *utf8, int max_length, int64_t *ids,
                          int64_t *mask, int *n_tokens) {
    if (!t || !utf8 || !ids) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_tokenize: tokenizer, text and ids are required");
    if (max_length <= 0) max_length = t->max_length;
    int specials = t->bos_id >= 0 ? 2 : 1;
    if (max_length < specials || max_length > KTOK_MAX_LENGTH)
        return kb_fail(KILN_ERR_RANGE, "kiln_tokenize: max_length %d is outside %d..%d (%s)", max_length, specials,
                       KTOK_MAX_LENGTH, t->kind == KILN_TOKENIZER_CLIP ? "CLIP: bos + eos" : "T5: </s>");
    ktok_ids v = {0};
    kiln_status s = ktok_encode(t, utf8, strlen(utf8), &v);
    if (s) {
        free(v.p);
        return s;
    }
    if (v.len > KTOK_MAX_LENGTH) {
        free(v.p);
        return kb_fail(KILN_ERR_RANGE, "kiln_tokenize: the prompt gives %zu tokens, more than %d", v.len, KTOK_MAX_LENGTH);
    }
    size_t keep = v.len < (size_t)(max_length - specials) ? v.len : (size_t)(max_length - specials);
    int k = 0;
    if (t->bos_id >= 0) ids[k++] = t->bos_id;
    for (size_t i = 0; i < keep; i++) ids[k++] = v.p[i];
    ids[k++] = t->eos_id;
    int real = k;
    for (; k < max_length; k++) ids[k] = t->pad_id;
    if (mask)
        for (int i = 0; i < max_length; i++) mask[i] = i < real;
    if (n_tokens) *n_tokens = (int)v.len + specials;
    free(v.p);
    return KILN_OK;
}

kiln_status ktok_normalize(const kiln_tokenizer *t, const char *s, size_t n, ktok_buf *out) {
    return t->kind == KILN_TOKENIZER_CLIP ? ktok_clip_normalize(s, n, out) : ktok_t5_normalize(t->t5, s, n, out);
}

kiln_status ktok_encode_split(const kiln_tokenizer *t, const char *text, size_t len, ktok_pretok_fn pretok, void *work,
                              ktok_ids *out) {
    /* bounded before any work: a server tokenizes strangers' prompts, and
     * the pipeline keeps CLIP's first 77 and T5's first 512 tokens anyway */
    if (len > KTOK_MAX_TEXT)
        return kb_fail(KILN_ERR_INVALID_ARG, "a prompt of %zu bytes: at most %d (the pipeline keeps only its first 77 "
                       "CLIP and at most 512 T5 tokens)", len, KTOK_MAX_TEXT);
    ktok_buf norm = {0};
    kiln_status s = KILN_OK;
    size_t pos = 0;
    while (pos <= len && !s) {
        size_t at = len;
        int which = -1;
        if (!ktok_find_added(t, 0, text, len, pos, &at, &which)) at = len;
        if (at > pos && !(s = ktok_normalize(t, text + pos, at - pos, &norm))) {
            /* a stretch between raw added tokens: cut the normalized added tokens out of it */
            size_t q = 0;
            while (q <= norm.len && !s) {
                size_t at2 = norm.len;
                int w2 = -1;
                if (!ktok_find_added(t, 1, norm.p, norm.len, q, &at2, &w2)) at2 = norm.len;
                if (at2 > q) s = pretok(t, work, norm.p + q, at2 - q, out);
                if (w2 < 0 || s) break;
                s = ktok_ids_add(out, t->added[w2].id);
                q = at2 + t->added[w2].len;
            }
        }
        if (which < 0 || s) break;
        s = ktok_ids_add(out, t->added[which].id);
        pos = at + t->added[which].len;
    }
    free(norm.p);
    return s;
}
