/* tokenizer_t5.c - T5's Unigram tokenizer as `tokenizers` runs it
 * (transformers' T5TokenizerFast):
 *   1. added tokens (<pad> </s> <unk> <extra_id_*>) cut out of the raw text;
 *   2. each stretch through the Precompiled normalizer: the model's nmt_nfkc
 *      charsmap (a darts-clone double-array trie + a blob of replacements),
 *      applied per extended grapheme cluster: a cluster under 6 bytes whose
 *      start matches an entry is replaced as a whole by the shortest match's
 *      replacement, other clusters char by char;
 *   3. WhitespaceSplit, then Metaspace: every word gets a leading U+2581 and
 *      is split before each U+2581 it holds;
 *   4. per piece, the Viterbi of tokenizers' Unigram::encode_optimized:
 *      double scores accumulated left to right, at each char boundary every
 *      piece that prefixes the rest (shortest first) replaces the best path
 *      to its end only when strictly better (ties: the first stays). The
 *      pieces that prefix the rest come from a byte trie of the vocabulary
 *      walked along the text (sentencepiece's common prefix search), so a
 *      position costs the length of its longest match, never a lookup per
 *      possible length: linear in the text whatever the pieces (a vocabulary
 *      of 3,000-character pieces made the lookups quadratic); a char
 *      with no single-char piece is <unk> at min_score - 10; consecutive
 *      unknowns fused into one token.
 * SentencePiece's own library differs on clusters and ties (README-pipelines). */
#include "pipeline/tokenizer.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define KTOK_UNK_PENALTY 10.0
static const char k_meta[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's word boundary */

struct ktok_t5 {
    double *score; /* [vocab_size] by id */
    int32_t unk_id; /* -1: the model has none */
    double min_score;
    size_t max_piece; /* bytes of the longest piece */
    /* the Precompiled charsmap; trie_n == 0: no normalizer */
    uint8_t *blob;
    const uint8_t *trie; /* trie_n little-endian u32 units */
    size_t trie_n;
    const char *norm; /* NUL-terminated replacements */
    size_t norm_len;
    /* normalizers after Precompiled (SpmConverter's newer Sequence) */
    int strip_right, collapse_spaces;
    int whitespace_split; /* WhitespaceSplit before Metaspace */
    /* the pieces as a byte trie: node 0 the root, whose children are
     * root_child[byte]; the others' in sibling lists (0: none) */
    struct ktok_pnode {
        int32_t id;       /* the piece that ends here, or -1 */
        uint32_t child;   /* first child */
        uint32_t sibling; /* next child of the same parent */
        uint8_t byte;     /* the byte that leads here */
    } *pnode;
    size_t n_pnode, cap_pnode;
    uint32_t root_child[256];
};

void ktok_t5_free(ktok_t5 *c) {
    if (!c) return;
    free(c->score);
    free(c->blob);
    free(c->pnode);
    free(c);
}

/* ---- the pieces' trie ------------------------------------------------------- */

static uint32_t ktok_pchild(const ktok_t5 *c, uint32_t node, uint8_t b) {
    if (!node) return c->root_child[b];
    for (uint32_t k = c->pnode[node].child; k; k = c->pnode[k].sibling)
        if (c->pnode[k].byte == b) return k;
    return 0;
}

/* Every piece of the vocabulary (its map: one id a piece, the last one
 * listed, as the lookups see it) into the trie; called once the vocabulary
 * is complete. Its size is the pieces' bytes, bounded by the file's. */
static kiln_status ktok_t5_build_trie(kiln_tokenizer *t) {
    ktok_t5 *c = t->t5;
    const ktok_map *m = &t->vocab;
    free(c->pnode);
    c->pnode = NULL;
    c->n_pnode = c->cap_pnode = 0;
    memset(c->root_child, 0, sizeof c->root_child);
    for (size_t i = 0; i < m->n; i++) {
        const uint8_t *k = (const uint8_t *)m->arena + m->key_off[i];
        uint32_t node = 0;
        for (uint32_t j = 0; j < m->key_len[i]; j++) {
            uint32_t next = ktok_pchild(c, node, k[j]);
            if (!next) {
                if (c->n_pnode + 1 >= c->cap_pnode) {
                    size_t cap = c->cap_pnode ? 2 * c->cap_pnode : 4096;
                    struct ktok_pnode *g = realloc(c->pnode, cap * sizeof *g);
                    if (!g) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (the pieces' trie)");
                    c->pnode = g;
                    c->cap_pnode = cap;
                    if (!c->n_pnode) c->pnode[c->n_pnode++] = (struct ktok_pnode){-1, 0, 0, 0}; /* the root */
                }
                next = (uint32_t)c->n_pnode++;
                c->pnode[next] = (struct ktok_pnode){-1, 0, 0, k[j]};
                if (!node) {
                    c->root_child[k[j]] = next;
                } else {
                    c->pnode[next].sibling = c->pnode[node].child;
                    c->pnode[node].child = next;
                }
            }
            node = next;
        }
        if (node) c->pnode[node].id = m->val[i];
    }
    return KILN_OK;
}

/* ---- the charsmap: darts-clone's common prefix search -------------------- */

static uint32_t ktok_unit(const ktok_t5 *c, size_t i) {
    const uint8_t *p = c->trie + 4 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The replacement of the shortest charsmap key that prefixes key[0..n):
 * 1 and *rep, *rep_len when there is one. Positions outside the trie (a
 * damaged map) end the search: no match, never a read out of bounds. */
static int ktok_transform(const ktok_t5 *c, const uint8_t *key, size_t n, const char **rep, size_t *rep_len) {
    if (!c->trie_n) return 0;
    size_t pos = 0;
    uint32_t unit = ktok_unit(c, 0);
    pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
    for (size_t i = 0; i < n; i++) {
        if (!key[i]) break;
        pos ^= key[i];
        if (pos >= c->trie_n) return 0;
        unit = ktok_unit(c, pos);
        if ((unit & (0x80000000u | 0xFFu)) != key[i]) return 0;
        pos ^= (size_t)((unit >> 10) << ((unit & (1u << 9)) >> 6));
        if (unit >> 8 & 1) {
            if (pos >= c->trie_n) return 0;
            size_t v = ktok_unit(c, pos) & 0x7FFFFFFFu;
            if (v >= c->norm_len) return 0;
            *rep = c->norm + v;
            *rep_len = strlen(c->norm + v); /* the blob ends with a NUL (checked at load) */
            return 1;
        }
    }
    return 0;
}

kiln_status ktok_t5_normalize(const ktok_t5 *c, const char *s, size_t n, ktok_buf *out) {
    out->len = 0;
    kiln_status st = ktok_buf_add(out, "", 0);
    size_t i = 0;
    /* utf8proc's break state runs through the whole stretch, as a
     * segmentation of the string does (it carries GB11's emoji + ZWJ and
     * GB12/13's regional-indicator pairs across calls) */
    utf8proc_int32_t state = 0;
    while (i < n && !st) {
        /* one extended grapheme cluster [i, e) */
        size_t e = i;
        int32_t prev = ktok_next_cp(s, n, &e);
        while (e < n) {
            size_t j = e;
            int32_t cp = ktok_next_cp(s, n, &j);
            if (utf8proc_grapheme_break_stateful(prev, cp, &state)) break;
            prev = cp;
            e = j;
        }
        const char *rep;
        size_t rl;
        if (e - i < 6 && ktok_transform(c, (const uint8_t *)s + i, e - i, &rep, &rl)) {
            st = ktok_buf_add(out, rep, rl);
        } else {
            for (size_t k = i; k < e && !st;) {
                size_t j = k;
                ktok_next_cp(s, n, &j);
                if (ktok_transform(c, (const uint8_t *)s + k, j - k, &rep, &rl)) st = ktok_buf_add(out, rep, rl);
                else st = ktok_buf_add(out, s + k, j - k);
                k = j;
            }
        }
        i = e;
    }
    if (st) return st;
    if (c->strip_right) {
        /* Strip(right): trailing White_Space */
        size_t last = 0;
        for (size_t k = 0; k < out->len;) {
            int32_t cp = ktok_next_cp(out->p, out->len, &k);
            if (!ktok_is_space(cp)) last = k;
        }
        out->len = last;
        out->p[out->len] = 0;
    }
    if (c->collapse_spaces) {
        /* Replace(" {2,}", "\u2581") */
        ktok_buf b = {0};
        for (size_t k = 0; k < out->len && !st;) {
            size_t r = k;
            while (r < out->len && out->p[r] == ' ') r++;
            if (r - k >= 2) {
                st = ktok_buf_add(&b, k_meta, 3);
                k = r;
            } else {
                st = ktok_buf_add(&b, out->p + k, 1);
                k++;
            }
        }
        if (!st) st = ktok_buf_add(&b, "", 0);
        free(out->p);
        *out = b;
    }
    return st;
}

/* ---- Unigram --------------------------------------------------------------- */

typedef struct {
    double score;
    int32_t id;
    int32_t start; /* -1: not reached yet */
} ktok_node;

typedef struct {
    ktok_node *node;
    size_t cap;
    ktok_buf piece;
    int32_t *rev;
    size_t rev_cap;
} ktok_t5_work;

static kiln_status ktok_unigram(const kiln_tokenizer *t, ktok_t5_work *w, const char *s, size_t n, ktok_ids *out) {
    const ktok_t5 *c = t->t5;
    if (!n) return KILN_OK;
    if (n + 1 > w->cap) {
        ktok_node *p = realloc(w->node, (n + 1) * sizeof *p);
        int32_t *r = realloc(w->rev, (n + 1) * sizeof *r);
        if (p) w->node = p;
        if (r) w->rev = r;
        if (!p || !r) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (Viterbi)");
        w->cap = n + 1;
    }
    ktok_node *node = w->node;
    for (size_t i = 0; i <= n; i++) node[i] = (ktok_node){0, -1, -1};
    node[0].start = 0;
    double unk_score = c->min_score - KTOK_UNK_PENALTY;
    for (size_t at = 0; at < n;) {
        double here = node[at].score;
        size_t mb = at;
        ktok_next_cp(s, n, &mb);
        size_t mblen = mb - at;
        int single = 0;
        /* every piece that prefixes s[at..n), shortest first: the trie walked
         * along the text (a piece is whole UTF-8, so it ends on a char boundary) */
        uint32_t pn = 0;
        for (size_t e = at; e < n && (pn = ktok_pchild(c, pn, (uint8_t)s[e]));) {
            e++;
            int32_t id = c->pnode[pn].id;
            if (id < 0) continue;
            double cand = c->score[id] + here;
            if (node[e].start < 0 || cand > node[e].score) {
                node[e].score = cand;
                node[e].start = (int32_t)at;
                node[e].id = id;
            }
            if (e - at == mblen) single = 1;
        }
        if (!single) {
            if (c->unk_id < 0)
                return kb_fail(KILN_ERR_FORMAT, "%s: \"%.*s\" has no piece and the Unigram model has no unk_id", t->source,
                               (int)mblen, s + at);
            double cand = unk_score + here;
            if (node[mb].start < 0 || cand > node[mb].score) {
                node[mb].score = cand;
                node[mb].start = (int32_t)at;
                node[mb].id = c->unk_id;
            }
        }
        at = mb;
    }
    /* back from the end; unknowns next to each other become one token,
     * looked up again as a whole (it may be a piece after all) */
    size_t nrev = 0;
    kiln_status st = KILN_OK;
    size_t end = n, fuse_end = 0;
    int fusing = 0;
    while (end > 0) {
        ktok_node *nd = &node[end];
        size_t start = (size_t)nd->start;
        if (nd->id == c->unk_id) {
            if (!fusing) fuse_end = end;
            fusing = 1;
        } else {
            if (fusing) {
                int32_t id;
                if (!ktok_map_get(&t->vocab, s + end, fuse_end - end, &id)) id = c->unk_id;
                w->rev[nrev++] = id;
                fusing = 0;
            }
            w->rev[nrev++] = nd->id;
        }
        end = start;
    }
    if (fusing) {
        int32_t id;
        if (!ktok_map_get(&t->vocab, s, fuse_end, &id)) id = c->unk_id;
        w->rev[nrev++] = id;
    }
    while (nrev && !st) st = ktok_ids_add(out, w->rev[--nrev]);
    return st;
}

/* Metaspace on one word (split true, prepend "always"): ' ' -> U+2581, a
 * U+2581 prepended unless there is one, then split before every U+2581. */
static kiln_status ktok_metaspace(const kiln_tokenizer *t, ktok_t5_work *w, const char *s, size_t n, ktok_ids *out) {
    ktok_buf *b = &w->piece;
    b->len = 0;
    kiln_status st = KILN_OK;
    if (n < 3 || memcmp(s, k_meta, 3)) st = ktok_buf_add(b, k_meta, 3);
    for (size_t i = 0; i < n && !st; i++) st = s[i] == ' ' ? ktok_buf_add(b, k_meta, 3) : ktok_buf_add(b, s + i, 1);
    if (st) return st;
    size_t from = 0;
    for (size_t i = 3; i + 3 <= b->len && !st; i++) {
        if (memcmp(b->p + i, k_meta, 3)) continue;
        st = ktok_unigram(t, w, b->p + from, i - from, out);
        from = i;
        i += 2;
    }
    if (!st) st = ktok_unigram(t, w, b->p + from, b->len - from, out);
    return st;
}

static kiln_status ktok_t5_pretok(const kiln_tokenizer *t, ktok_t5_work *w, const char *s, size_t n, ktok_ids *out) {
    if (!t->t5->whitespace_split) return n ? ktok_metaspace(t, w, s, n, out) : KILN_OK;
    size_t i = 0;
    kiln_status st = KILN_OK;
    while (i < n && !st) {
        size_t j = i;
        int32_t cp = ktok_next_cp(s, n, &j);
        if (ktok_is_space(cp)) {
            i = j;
            continue;
        }
        size_t e = j;
        while (e < n) {
            size_t k = e;
            if (ktok_is_space(ktok_next_cp(s, n, &k))) break;
            e = k;
        }
        st = ktok_metaspace(t, w, s + i, e - i, out);
        i = e;
    }
    return st;
}

static kiln_status t5_piece(const kiln_tokenizer *t, void *work, const char *s, size_t n, ktok_ids *out) {
    return ktok_t5_pretok(t, work, s, n, out);
}

kiln_status ktok_t5_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out) {
    ktok_t5_work w = {0};
    kiln_status s = ktok_encode_split(t, text, len, t5_piece, &w, out);
    free(w.node);
    free(w.rev);
    free(w.piece.p);
    return s;
}

/* ---- loading --------------------------------------------------------------- */

static const char *ktok_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The charsmap's bytes (in c->blob, n bytes): a u32 trie size, the trie,
 * the NUL-terminated replacements. */
static kiln_status ktok_charsmap_bytes(ktok_t5 *c, size_t n, const char *where) {
    const uint8_t *b = c->blob;
    if (n < 4)
        return kb_fail(KILN_ERR_FORMAT, "%s: the precompiled_charsmap is truncated (%zu bytes, not even its trie size)", where, n);
    size_t trie_size = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (trie_size < 4 || trie_size % 4 || trie_size > n - 4)
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: the precompiled_charsmap is truncated or damaged: its trie of %zu bytes does not fit "
                       "in the %zu bytes after its size (a whole number of 4-byte units is expected)",
                       where, trie_size, n - 4);
    c->trie = b + 4;
    c->trie_n = trie_size / 4;
    c->norm = (const char *)b + 4 + trie_size;
    c->norm_len = n - 4 - trie_size;
    if (c->norm_len && c->norm[c->norm_len - 1])
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: the precompiled_charsmap is truncated: its replacements (%zu bytes) do not end with a NUL",
                       where, c->norm_len);
    /* every replacement is UTF-8 (they are spliced into the text) */
    for (size_t i = 0; i < c->norm_len;) {
        size_t l = strlen(c->norm + i);
        if (ktok_check_utf8(c->norm + i, l, "a precompiled_charsmap replacement"))
            return kb_wrap(KILN_ERR_FORMAT, "%s", where);
        i += l + 1;
    }
    return KILN_OK;
}

static kiln_status ktok_charsmap(ktok_t5 *c, const char *b64, const char *where) {
    size_t n;
    kiln_status s = ktok_base64(b64, strlen(b64), &c->blob, &n, "the precompiled_charsmap");
    if (s) return kb_wrap(s, "%s", where);
    return ktok_charsmap_bytes(c, n, where);
}

static kiln_status ktok_t5_normalizer(ktok_t5 *c, const cJSON *nz, const char *where) {
    const char *type = ktok_str(nz, "type");
    if (type && !strcmp(type, "Precompiled")) {
        const char *m = ktok_str(nz, "precompiled_charsmap");
        if (!m) return kb_fail(KILN_ERR_FORMAT, "%s: the Precompiled normalizer has no precompiled_charsmap string", where);
        return ktok_charsmap(c, m, where);
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *e;
        int have = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(nz, "normalizers")) {
            const char *ty = ktok_str(e, "type");
            const char *re = ktok_str(cJSON_GetObjectItemCaseSensitive(e, "pattern"), "Regex");
            const char *content = ktok_str(e, "content");
            if (ty && !strcmp(ty, "Precompiled") && !have) {
                kiln_status s = ktok_t5_normalizer(c, e, where);
                if (s) return s;
                have = 1;
            } else if (ty && !strcmp(ty, "Strip") && !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "left")) && have) {
                c->strip_right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "right"));
            } else if (ty && !strcmp(ty, "Replace") && re && !strcmp(re, " {2,}") && content && !strcmp(content, k_meta) &&
                       have) {
                c->collapse_spaces = 1;
            } else {
                return kb_fail(KILN_ERR_UNSUPPORTED,
                               "%s: normalizer \"%s\" in the Sequence is not one kiln reads for T5 (Precompiled, "
                               "then Strip right and Replace \" {2,}\" -> U+2581)",
                               where, ty ? ty : "?");
            }
        }
        if (have) return KILN_OK;
    }
    return kb_fail(KILN_ERR_UNSUPPORTED, "%s: the normalizer is not T5's Precompiled charsmap", where);
}

static kiln_status ktok_t5_pretokenizer(ktok_t5 *c, const cJSON *pt, const char *where) {
    const char *type = ktok_str(pt, "type");
    const cJSON *meta = pt;
    c->whitespace_split = 0;
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        const char *t0 = ktok_str(cJSON_GetArrayItem(list, 0), "type");
        if (cJSON_GetArraySize(list) == 2 && t0 && !strcmp(t0, "WhitespaceSplit")) {
            c->whitespace_split = 1;
            meta = cJSON_GetArrayItem(list, 1);
        } else {
            meta = NULL;
        }
    }
    const char *mt = ktok_str(meta, "type"), *rep = ktok_str(meta, "replacement");
    const char *scheme = ktok_str(meta, "prepend_scheme");
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(meta, "split");
    int always = scheme ? !strcmp(scheme, "always") : cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "add_prefix_space"));
    if (!mt || strcmp(mt, "Metaspace") || !rep || strcmp(rep, k_meta) || !always || cJSON_IsFalse(split))
        return kb_fail(KILN_ERR_UNSUPPORTED,
                       "%s: the pre-tokenizer is not T5's ([WhitespaceSplit,] Metaspace U+2581, prepend always, split)",
                       where);
    return KILN_OK;
}

kiln_status ktok_t5_from_json(kiln_tokenizer *t, const void *model_json, const void *root_json) {
    const cJSON *model = model_json, *root = root_json;
    const char *where = t->source;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return kb_fail(KILN_ERR_UNSUPPORTED, "%s: Unigram with byte fallback is not T5's", where);
    ktok_t5 *c = calloc(1, sizeof *c);
    if (!c) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    t->t5 = c;
    kiln_status s = ktok_t5_normalizer(c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), where);
    if (!s) s = ktok_t5_pretokenizer(c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), where);
    if (s) return s;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *e;
    int n = cJSON_GetArraySize(vocab);
    if (!cJSON_IsArray(vocab) || n <= 0)
        return kb_fail(KILN_ERR_FORMAT, "%s: the Unigram model has no \"vocab\" list of [piece, score]", where);
    if (!(c->score = malloc((size_t)n * sizeof *c->score))) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    int32_t id = 0;
    c->min_score = 0;
    cJSON_ArrayForEach(e, vocab) {
        const cJSON *p = cJSON_GetArrayItem(e, 0), *sc = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(p) || !cJSON_IsNumber(sc))
            return kb_fail(KILN_ERR_FORMAT, "%s: vocabulary entry %d is not [piece, score]", where, id);
        size_t len = strlen(p->valuestring);
        if (ktok_check_utf8(p->valuestring, len, "a vocabulary piece")) return kb_wrap(KILN_ERR_FORMAT, "%s", where);
        if ((s = ktok_map_put(&t->vocab, p->valuestring, len, id))) return s;
        c->score[id] = sc->valuedouble;
        if (!id || sc->valuedouble < c->min_score) c->min_score = sc->valuedouble;
        if (len > c->max_piece) c->max_piece = len;
        id++;
    }
    t->vocab_size = id;
    if ((s = ktok_t5_build_trie(t))) return s;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    c->unk_id = -1;
    if (cJSON_IsNumber(unk)) {
        if (unk->valuedouble < 0 || unk->valuedouble >= n)
            return kb_fail(KILN_ERR_FORMAT, "%s: unk_id %g is outside the vocabulary of %d pieces", where, unk->valuedouble, n);
        c->unk_id = (int32_t)unk->valuedouble;
    }
    return KILN_OK;
}

/* ---- spiece.model: SentencePiece's ModelProto (protobuf) ------------------- */

typedef struct {
    const uint8_t *p, *end;
} ktok_pb;

static int ktok_pb_varint(ktok_pb *b, uint64_t *v) {
    *v = 0;
    for (int sh = 0; sh < 64 && b->p < b->end; sh += 7) {
        uint8_t c = *b->p++;
        *v |= (uint64_t)(c & 0x7F) << sh;
        if (!(c & 0x80)) return 1;
    }
    return 0;
}

/* The next field: number, wire type, and for wire type 2 its bytes, for
 * 0/1/5 its value. 0 at the end, -1 when damaged. */
static int ktok_pb_next(ktok_pb *b, uint32_t *field, int *wt, ktok_pb *sub, uint64_t *val) {
    if (b->p >= b->end) return 0;
    uint64_t key;
    if (!ktok_pb_varint(b, &key) || key >> 3 == 0 || key >> 3 > UINT32_MAX) return -1;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return ktok_pb_varint(b, val) ? 1 : -1;
    case 1:
        if (b->end - b->p < 8) return -1;
        memcpy(val, b->p, 8);
        b->p += 8;
        return 1;
    case 5: {
        if (b->end - b->p < 4) return -1;
        uint32_t u;
        memcpy(&u, b->p, 4);
        *val = u;
        b->p += 4;
        return 1;
    }
    case 2: {
        uint64_t n;
        if (!ktok_pb_varint(b, &n) || n > (uint64_t)(b->end - b->p)) return -1;
        sub->p = b->p;
        sub->end = b->p + n;
        b->p += n;
        return 1;
    }
    default: return -1; /* groups: not in ModelProto */
    }
}

static kiln_status ktok_t5_add_piece(kiln_tokenizer *t, size_t *cap, const char *piece, size_t len, double score,
                                     const char *where) {
    ktok_t5 *c = t->t5;
    int32_t id = t->vocab_size;
    if ((size_t)id == *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        double *s = realloc(c->score, nc * sizeof *s);
        if (!s) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
        c->score = s;
        *cap = nc;
    }
    if (ktok_check_utf8(piece, len, "a vocabulary piece")) return kb_wrap(KILN_ERR_FORMAT, "%s", where);
    kiln_status s = ktok_map_put(&t->vocab, piece, len, id);
    if (s) return s;
    c->score[id] = score;
    if (!id || score < c->min_score) c->min_score = score;
    if (len > c->max_piece) c->max_piece = len;
    t->vocab_size = id + 1;
    return KILN_OK;
}

kiln_status ktok_t5_from_spiece(kiln_tokenizer *t, const char *path, const void *cfg_json) {
    const cJSON *cfg = cfg_json;
    kb_map m;
    kiln_status s = kb_map_file(path, &m);
    if (s) return s;
    if (m.size > KTOK_MAX_FILE || !m.size || !m.data) {
        size_t bytes = m.size;
        kb_unmap(&m);
        return bytes ? kb_fail(KILN_ERR_FORMAT, "%s: %zu bytes; a tokenizer file is at most %u", path, bytes, KTOK_MAX_FILE)
                     : kb_fail(KILN_ERR_FORMAT, "%s is empty (a SentencePiece model holds its pieces)", path);
    }
    ktok_t5 *c = calloc(1, sizeof *c);
    if (!c) {
        kb_unmap(&m);
        return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->t5 = c;
    c->unk_id = -1;
    /* the pipeline transformers gives T5's tokenizer.json: Precompiled,
     * WhitespaceSplit, Metaspace (prepend always) */
    c->whitespace_split = 1;
    size_t cap = 0;
    int64_t unk_pb = 0; /* TrainerSpec.unk_id (default 0) */
    int have_unk_pb = 0, r;
    uint32_t f;
    int wt;
    uint64_t v;
    ktok_pb b = {m.data, m.data + m.size}, sub, sub2;
    while (!s && (r = ktok_pb_next(&b, &f, &wt, &sub, &v)) == 1) {
        if (f == 1 && wt == 2) { /* SentencePiece { piece = 1, score = 2, type = 3 } */
            const char *piece = NULL;
            size_t plen = 0;
            float score = 0;
            uint64_t type = 1;
            int r2;
            while ((r2 = ktok_pb_next(&sub, &f, &wt, &sub2, &v)) == 1) {
                if (f == 1 && wt == 2) piece = (const char *)sub2.p, plen = (size_t)(sub2.end - sub2.p);
                else if (f == 2 && wt == 5) {
                    uint32_t u = (uint32_t)v;
                    memcpy(&score, &u, 4);
                } else if (f == 3 && wt == 0) type = v;
            }
            if (r2 < 0 || !piece)
                s = kb_fail(KILN_ERR_FORMAT, "%s: piece %d is damaged (no piece text)", path, t->vocab_size);
            else if (type == 6)
                s = kb_fail(KILN_ERR_UNSUPPORTED, "%s: byte pieces (byte fallback) are not T5's", path);
            else {
                if (type == 2 && c->unk_id < 0) c->unk_id = t->vocab_size;
                s = ktok_t5_add_piece(t, &cap, piece, plen, (double)score, path);
            }
        } else if (f == 2 && wt == 2) { /* TrainerSpec: model_type = 3, unk_id = 40 */
            int r2;
            while ((r2 = ktok_pb_next(&sub, &f, &wt, &sub2, &v)) == 1) {
                if (f == 3 && wt == 0 && v != 1)
                    s = kb_fail(KILN_ERR_UNSUPPORTED, "%s: model_type %llu is not Unigram (1)", path, (unsigned long long)v);
                if (f == 40 && wt == 0) unk_pb = (int64_t)(int32_t)v, have_unk_pb = 1;
            }
            if (r2 < 0) s = kb_fail(KILN_ERR_FORMAT, "%s: its trainer_spec is damaged", path);
        } else if (f == 3 && wt == 2) { /* NormalizerSpec: precompiled_charsmap = 2 */
            int r2;
            while (!s && (r2 = ktok_pb_next(&sub, &f, &wt, &sub2, &v)) == 1) {
                if (f == 2 && wt == 2 && sub2.end > sub2.p) {
                    size_t n = (size_t)(sub2.end - sub2.p);
                    free(c->blob);
                    if (!(c->blob = malloc(n))) s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
                    else {
                        memcpy(c->blob, sub2.p, n);
                        s = ktok_charsmap_bytes(c, n, path);
                    }
                }
            }
            if (!s && r2 < 0) s = kb_fail(KILN_ERR_FORMAT, "%s: its normalizer_spec is damaged", path);
        }
    }
    kb_unmap(&m);
    if (s) return s;
    if (r < 0) return kb_fail(KILN_ERR_FORMAT, "%s is not a SentencePiece model (damaged protobuf)", path);
    if (!t->vocab_size) return kb_fail(KILN_ERR_FORMAT, "%s holds no pieces", path);
    if (have_unk_pb) {
        if (unk_pb < 0 || unk_pb >= t->vocab_size)
            return kb_fail(KILN_ERR_FORMAT, "%s: unk_id %lld is outside its %d pieces", path, (long long)unk_pb, t->vocab_size);
        c->unk_id = (int32_t)unk_pb;
    } else if (c->unk_id < 0) {
        c->unk_id = 0;
    }
    /* transformers appends the extra ids to the Unigram vocabulary (score
     * 0): the tokens of tokenizer_config.json past the pieces, in id order,
     * else <extra_id_{N-1}> .. <extra_id_0> for "extra_ids": N */
    const cJSON *dec = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL;
    if (cJSON_IsObject(dec)) {
        for (;;) {
            const cJSON *e, *hit = NULL;
            char want[16];
            snprintf(want, sizeof want, "%d", t->vocab_size);
            cJSON_ArrayForEach(e, dec) if (!strcmp(e->string, want)) hit = e;
            const char *content = ktok_str(hit, "content");
            if (!content) break;
            if ((s = ktok_t5_add_piece(t, &cap, content, strlen(content), 0.0, path))) return s;
        }
    } else {
        const cJSON *ex = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "extra_ids") : NULL;
        int n = cJSON_IsNumber(ex) && ex->valuedouble > 0 && ex->valuedouble <= 10000 ? (int)ex->valuedouble : 0;
        for (int i = n - 1; i >= 0; i--) {
            char name[32];
            snprintf(name, sizeof name, "<extra_id_%d>", i);
            if ((s = ktok_t5_add_piece(t, &cap, name, strlen(name), 0.0, path))) return s;
        }
    }
    return ktok_t5_build_trie(t);
}
