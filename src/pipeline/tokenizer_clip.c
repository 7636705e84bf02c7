/* tokenizer_clip.c - CLIP's byte-level BPE as `tokenizers` runs it
 * (transformers' CLIPTokenizerFast / CLIPTokenizer of transformers 5):
 *   1. added tokens cut out of the raw text (tokenizer.c);
 *   2. each stretch: NFC, runs of White_Space -> ' ', lowercase per char;
 *      normalized added tokens (<|startoftext|>) cut out of that;
 *   3. the Split pattern below, then ByteLevel's GPT-2 pattern on each piece;
 *   4. each piece's UTF-8 bytes -> GPT-2 byte-to-unicode chars, the suffix
 *      ("</w>") glued to the last one, BPE merges by rank.
 * The two patterns are not run by a regex engine: their alternatives are
 * simple enough to scan by hand with utf8proc's categories, in the order
 * Oniguruma tries them (leftmost alternative that matches wins, + greedy). */
#include "pipeline/tokenizer.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* The exact patterns of CLIP's tokenizer.json; another pattern is refused
 * rather than tokenized differently. */
static const char k_clip_split[] =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";

struct ktok_clip {
    int32_t byte_id[256];      /* id of byte b's char, -1 when not in the vocabulary */
    int32_t byte_id_last[256]; /* the same with the end-of-word suffix */
    int32_t unk_id;            /* -1: none */
    int fuse_unk;
    ktok_pairmap merges; /* (left id, right id) -> rank, merged id */
};

void ktok_clip_free(ktok_clip *c) {
    if (!c) return;
    ktok_pairmap_free(&c->merges);
    free(c);
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order. */
static int32_t ktok_byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) n++;
    return 256 + n;
}

/* ---- normalizer ---------------------------------------------------------- */

kiln_status ktok_clip_normalize(const char *s, size_t n, ktok_buf *out) {
    out->len = 0;
    kiln_status st = ktok_buf_add(out, "", 0);
    if (st || !n) return st;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) {
        free(nfc);
        return m == UTF8PROC_ERROR_NOMEM ? kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (NFC)")
                                         : kb_fail(KILN_ERR_INVALID_ARG, "tokenizer: NFC failed: %s", utf8proc_errmsg(m));
    }
    size_t i = 0;
    int in_space = 0;
    while (i < (size_t)m && !st) {
        int32_t cp = ktok_next_cp((const char *)nfc, (size_t)m, &i);
        if (cp < 0) continue;
        if (ktok_is_space(cp)) {
            if (!in_space) st = ktok_buf_add(out, " ", 1);
            in_space = 1;
            continue;
        }
        in_space = 0;
        if (cp == 0x130) {
            /* Rust's char::to_lowercase is the full mapping; U+0130 is the
             * one letter whose lowercase is two chars (SpecialCasing.txt),
             * which utf8proc's simple mapping gives as plain 'i'. */
            st = ktok_buf_add(out, "i\xcc\x87", 3);
        } else {
            st = ktok_buf_cp(out, utf8proc_tolower(cp));
        }
    }
    free(nfc);
    return st;
}

/* ---- the split patterns ---------------------------------------------------- */

/* Length of a contraction ('s 't 're 've 'm 'll 'd, ASCII ' only) at s, or 0. */
static size_t ktok_contraction(const char *s, size_t n) {
    if (n < 2 || s[0] != '\'') return 0;
    if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd') return 2;
    if (n >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') || (s[1] == 'l' && s[2] == 'l')))
        return 3;
    return 0;
}

enum { KTOK_LETTER, KTOK_NUMBER, KTOK_SPACE, KTOK_OTHER };
static int ktok_class(int32_t cp) {
    if (ktok_is_letter(cp)) return KTOK_LETTER;
    if (ktok_is_number(cp)) return KTOK_NUMBER;
    if (ktok_is_space(cp)) return KTOK_SPACE;
    return KTOK_OTHER;
}

/* End of the run of chars of class cls starting at i. */
static size_t ktok_run(const char *s, size_t n, size_t i, int cls) {
    while (i < n) {
        size_t j = i;
        int32_t cp = ktok_next_cp(s, n, &j);
        if (cp < 0 || ktok_class(cp) != cls) break;
        i = j;
    }
    return i;
}

/* ---- BPE ------------------------------------------------------------------- */

typedef struct {
    int32_t id, prev, next, len; /* len 0: merged into its left neighbour */
} ktok_sym;

typedef struct {
    int32_t rank, pos, id;
} ktok_merge;

static int ktok_merge_less(const ktok_merge *a, const ktok_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

typedef struct {
    ktok_merge *p;
    size_t n, cap;
} ktok_heap;

static kiln_status ktok_heap_push(ktok_heap *h, ktok_merge m) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        ktok_merge *p = realloc(h->p, cap * sizeof *p);
        if (!p) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (BPE)");
        h->p = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->p[i] = m;
    while (i && ktok_merge_less(&h->p[i], &h->p[(i - 1) / 2])) {
        ktok_merge t = h->p[i];
        h->p[i] = h->p[(i - 1) / 2];
        h->p[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
    return KILN_OK;
}

static ktok_merge ktok_heap_pop(ktok_heap *h) {
    ktok_merge top = h->p[0];
    h->p[0] = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && ktok_merge_less(&h->p[l], &h->p[m])) m = l;
        if (r < h->n && ktok_merge_less(&h->p[r], &h->p[m])) m = r;
        if (m == i) break;
        ktok_merge t = h->p[i];
        h->p[i] = h->p[m];
        h->p[m] = t;
        i = m;
    }
    return top;
}

typedef struct {
    ktok_sym *sym;
    size_t cap;
    ktok_heap heap;
} ktok_bpe_work;

static kiln_status ktok_sym_add(ktok_bpe_work *w, size_t *n, int32_t id, int32_t len) {
    if (*n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        ktok_sym *p = realloc(w->sym, cap * sizeof *p);
        if (!p) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory (BPE)");
        w->sym = p;
        w->cap = cap;
    }
    w->sym[*n] = (ktok_sym){.id = id, .prev = (int32_t)*n - 1, .next = (int32_t)*n + 1, .len = len};
    (*n)++;
    return KILN_OK;
}

/* BPE of one pre-token (bytes p[0..n)), as tokenizers' Word::merge_all: the
 * pending merge of lowest (rank, position) first; a queued merge whose pair
 * has changed since is skipped. */
static kiln_status ktok_bpe(const kiln_tokenizer *t, ktok_bpe_work *w, const uint8_t *p, size_t n, ktok_ids *out) {
    const ktok_clip *c = t->clip;
    size_t ns = 0;
    int32_t unk_len = 0; /* a pending unknown (fused when fuse_unk) */
    kiln_status s = KILN_OK;
    for (size_t i = 0; i < n && !s; i++) {
        int32_t id = (i + 1 == n ? c->byte_id_last : c->byte_id)[p[i]];
        if (id >= 0) {
            if (unk_len && (s = ktok_sym_add(w, &ns, c->unk_id, unk_len))) break;
            unk_len = 0;
            s = ktok_sym_add(w, &ns, id, 1);
            continue;
        }
        if (c->unk_id < 0)
            return kb_fail(KILN_ERR_FORMAT,
                           "%s: the vocabulary has no token for byte 0x%02X (as GPT-2's byte-to-unicode "
                           "char U+%04X%s) and no unknown token",
                           t->source, p[i], (unsigned)ktok_byte_char(p[i]), i + 1 == n ? " with the word-end suffix" : "");
        if (unk_len && !c->fuse_unk && (s = ktok_sym_add(w, &ns, c->unk_id, unk_len))) break;
        unk_len = unk_len && c->fuse_unk ? unk_len + 1 : 1;
    }
    if (!s && unk_len) s = ktok_sym_add(w, &ns, c->unk_id, unk_len);
    if (s) return s;
    if (!ns) return KILN_OK;
    w->sym[ns - 1].next = -1;
    w->heap.n = 0;
    int32_t rank, nid;
    for (size_t i = 0; i + 1 < ns && !s; i++)
        if (ktok_pairmap_get(&c->merges, w->sym[i].id, w->sym[i + 1].id, &rank, &nid))
            s = ktok_heap_push(&w->heap, (ktok_merge){rank, (int32_t)i, nid});
    while (!s && w->heap.n) {
        ktok_merge top = ktok_heap_pop(&w->heap);
        ktok_sym *a = &w->sym[top.pos];
        if (!a->len || a->next < 0) continue;
        ktok_sym *b = &w->sym[a->next];
        if (!ktok_pairmap_get(&c->merges, a->id, b->id, &rank, &nid) || nid != top.id) continue;
        a->id = top.id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) w->sym[a->next].prev = top.pos;
        if (a->prev >= 0 && ktok_pairmap_get(&c->merges, w->sym[a->prev].id, a->id, &rank, &nid))
            s = ktok_heap_push(&w->heap, (ktok_merge){rank, a->prev, nid});
        if (!s && a->next >= 0 && ktok_pairmap_get(&c->merges, a->id, w->sym[a->next].id, &rank, &nid))
            s = ktok_heap_push(&w->heap, (ktok_merge){rank, top.pos, nid});
    }
    for (int32_t i = 0; !s && i >= 0; i = w->sym[i].next) s = ktok_ids_add(out, w->sym[i].id);
    return s;
}

/* ByteLevel's pattern on a piece of the Split pattern (which holds no
 * whitespace, so its " ?" and \s alternatives never apply), then BPE. */
static kiln_status ktok_bytelevel(const kiln_tokenizer *t, ktok_bpe_work *w, const char *s, size_t n, ktok_ids *out) {
    size_t i = 0;
    kiln_status st = KILN_OK;
    while (i < n && !st) {
        size_t e = ktok_contraction(s + i, n - i);
        if (e) {
            e += i;
        } else {
            size_t j = i;
            int32_t cp = ktok_next_cp(s, n, &j);
            e = cp < 0 ? j : ktok_run(s, n, i, ktok_class(cp));
        }
        st = ktok_bpe(t, w, (const uint8_t *)s + i, e - i, out);
        i = e;
    }
    return st;
}

/* The Split pattern (matches kept, the rest removed) over normalized text. */
static kiln_status ktok_clip_pretok(const kiln_tokenizer *t, ktok_bpe_work *w, const char *s, size_t n, ktok_ids *out) {
    size_t i = 0;
    kiln_status st = KILN_OK;
    while (i < n && !st) {
        size_t e = 0;
        if (n - i >= 15 && !memcmp(s + i, "<|startoftext|>", 15)) e = i + 15;
        else if (n - i >= 13 && !memcmp(s + i, "<|endoftext|>", 13)) e = i + 13;
        else if ((e = ktok_contraction(s + i, n - i))) e += i;
        else {
            size_t j = i;
            int32_t cp = ktok_next_cp(s, n, &j);
            int cls = cp < 0 ? KTOK_OTHER : ktok_class(cp);
            if (cls == KTOK_SPACE) {
                i = j;
                continue;
            }
            e = cls == KTOK_NUMBER ? j : ktok_run(s, n, i, cls);
            if (e == i) e = j;
        }
        st = ktok_bytelevel(t, w, s + i, e - i, out);
        i = e;
    }
    return st;
}

static kiln_status clip_piece(const kiln_tokenizer *t, void *work, const char *s, size_t n, ktok_ids *out) {
    return ktok_clip_pretok(t, work, s, n, out);
}

kiln_status ktok_clip_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out) {
    ktok_bpe_work w = {0};
    kiln_status s = ktok_encode_split(t, text, len, clip_piece, &w, out);
    free(w.sym);
    free(w.heap.p);
    return s;
}

/* ---- loading --------------------------------------------------------------- */

/* token -> id, every token valid UTF-8 (a Python str), every id in [0,
 * 2^24) (ids travel as f32) and held by one token: a vocabulary where two
 * tokens share an id would decode one as the other */
static kiln_status ktok_clip_vocab(kiln_tokenizer *t, const cJSON *vocab, const char *where) {
    if (!cJSON_IsObject(vocab)) return kb_fail(KILN_ERR_FORMAT, "%s: no vocabulary object (token -> id)", where);
    const cJSON *e;
    uint8_t *seen = calloc((size_t)KTOK_MAX_ID / 8, 1);
    if (!seen) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    kiln_status s = KILN_OK;
    long k = 0;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= KTOK_MAX_ID ||
            e->valuedouble != (double)(int64_t)e->valuedouble) {
            s = kb_fail(KILN_ERR_FORMAT, "%s: vocabulary entry %ld (\"%.80s\") has no id (an integer in 0..%d)", where, k,
                        e->string, KTOK_MAX_ID - 1);
            break;
        }
        size_t len = strlen(e->string);
        if (ktok_check_utf8(e->string, len, "a vocabulary token")) {
            s = kb_wrap(KILN_ERR_FORMAT, "%s: vocabulary entry %ld", where, k);
            break;
        }
        int32_t id = (int32_t)e->valuedouble;
        if (seen[id >> 3] >> (id & 7) & 1) {
            const char *other = "?";
            const cJSON *o;
            cJSON_ArrayForEach(o, vocab) if (o != e && cJSON_IsNumber(o) && o->valuedouble == id) { other = o->string; break; }
            s = kb_fail(KILN_ERR_FORMAT, "%s: the tokens \"%.80s\" and \"%.80s\" share id %d (an id is one token's)",
                        where, other, e->string, id);
            break;
        }
        seen[id >> 3] |= (uint8_t)(1u << (id & 7));
        if ((s = ktok_map_put(&t->vocab, e->string, len, id))) break;
        if (id + 1 > t->vocab_size) t->vocab_size = id + 1;
        k++;
    }
    free(seen);
    if (s) return s;
    if (!t->vocab.n) return kb_fail(KILN_ERR_FORMAT, "%s: the vocabulary is empty", where);
    return KILN_OK;
}

static kiln_status ktok_clip_tables(kiln_tokenizer *t, const char *suffix, const char *unk, const char *where) {
    ktok_clip *c = t->clip;
    c->unk_id = -1;
    if (unk && !ktok_map_get(&t->vocab, unk, strlen(unk), &c->unk_id))
        return kb_fail(KILN_ERR_MISSING, "%s: the unknown token \"%s\" is not in the vocabulary", where, unk);
    size_t sl = strlen(suffix);
    for (int b = 0; b < 256; b++) {
        char u[8 + 64];
        utf8proc_ssize_t k = utf8proc_encode_char(ktok_byte_char(b), (utf8proc_uint8_t *)u);
        if (!ktok_map_get(&t->vocab, u, (size_t)k, &c->byte_id[b])) c->byte_id[b] = -1;
        if (sl > 64) return kb_fail(KILN_ERR_FORMAT, "%s: end_of_word_suffix is too long", where);
        memcpy(u + k, suffix, sl);
        if (!ktok_map_get(&t->vocab, u, (size_t)k + sl, &c->byte_id_last[b])) c->byte_id_last[b] = -1;
    }
    return KILN_OK;
}

/* One merge (rank r) of tokens a and b; suffix-free concatenation is the
 * merged token. */
static kiln_status ktok_clip_merge(kiln_tokenizer *t, const char *a, size_t na, const char *b, size_t nb, int32_t r,
                                   const char *where, long line) {
    int32_t ia, ib, iab;
    const char *bad = NULL;
    size_t nbad = 0;
    if (!ktok_map_get(&t->vocab, a, na, &ia)) bad = a, nbad = na;
    else if (!ktok_map_get(&t->vocab, b, nb, &ib)) bad = b, nbad = nb;
    char stack[256], *ab = na + nb <= sizeof stack ? stack : malloc(na + nb);
    if (!ab) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    if (!bad && !ktok_map_get(&t->vocab, ab, na + nb, &iab)) bad = ab, nbad = na + nb;
    kiln_status s = KILN_OK;
    if (bad)
        s = kb_fail(KILN_ERR_FORMAT, "%s: merge %ld (\"%.*s\" + \"%.*s\") names the token \"%.*s\", which is not in the vocabulary",
                    where, line, (int)na, a, (int)nb, b, (int)(nbad > 200 ? 200 : nbad), bad);
    else
        s = ktok_pairmap_put(&t->clip->merges, ia, ib, r, iab);
    if (ab != stack) free(ab);
    return s;
}

static const char *ktok_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The normalizer and pre-tokenizer of tokenizer.json must be CLIP's. */
static kiln_status ktok_clip_check_pipeline(const cJSON *root, const char *where) {
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(nz, "normalizers");
    const char *want_n = "Sequence [NFC, Replace \\s+ -> \" \", Lowercase]";
    int ok = cJSON_IsArray(list) && cJSON_GetArraySize(list) == 3;
    if (ok) {
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1), *c = cJSON_GetArrayItem(list, 2);
        const char *ta = ktok_str(a, "type"), *tb = ktok_str(b, "type"), *tc = ktok_str(c, "type");
        const char *re = ktok_str(cJSON_GetObjectItemCaseSensitive(b, "pattern"), "Regex");
        const char *content = ktok_str(b, "content");
        ok = ta && !strcmp(ta, "NFC") && tb && !strcmp(tb, "Replace") && re && !strcmp(re, "\\s+") && content &&
             !strcmp(content, " ") && tc && !strcmp(tc, "Lowercase");
    }
    if (!ok) return kb_fail(KILN_ERR_UNSUPPORTED, "%s: the normalizer is not CLIP's (%s)", where, want_n);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    ok = cJSON_IsArray(list) && cJSON_GetArraySize(list) == 2;
    if (ok) {
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        const char *ta = ktok_str(a, "type"), *tb = ktok_str(b, "type"), *beh = ktok_str(a, "behavior");
        const char *re = ktok_str(cJSON_GetObjectItemCaseSensitive(a, "pattern"), "Regex");
        ok = ta && !strcmp(ta, "Split") && re && !strcmp(re, k_clip_split) && beh && !strcmp(beh, "Removed") &&
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "invert")) && tb && !strcmp(tb, "ByteLevel") &&
             !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "add_prefix_space")) &&
             !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(b, "use_regex"));
    }
    if (!ok)
        return kb_fail(KILN_ERR_UNSUPPORTED,
                       "%s: the pre-tokenizer is not CLIP's (Sequence [Split on CLIP's pattern, removed, "
                       "inverted; ByteLevel without prefix space])",
                       where);
    return KILN_OK;
}

kiln_status ktok_clip_from_json(kiln_tokenizer *t, const void *model_json, const void *root_json) {
    const cJSON *model = model_json, *root = root_json;
    const char *where = t->source;
    kiln_status s = ktok_clip_check_pipeline(root, where);
    if (s) return s;
    const char *pre = ktok_str(model, "continuing_subword_prefix");
    if ((pre && *pre) || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
        cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(model, "dropout")))
        return kb_fail(KILN_ERR_UNSUPPORTED, "%s: BPE with a continuing-subword prefix, byte fallback or dropout is not CLIP's", where);
    if (!(t->clip = calloc(1, sizeof *t->clip))) return kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    t->clip->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    if ((s = ktok_clip_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), where))) return s;
    const char *suffix = ktok_str(model, "end_of_word_suffix");
    if ((s = ktok_clip_tables(t, suffix ? suffix : "", ktok_str(model, "unk_token"), where))) return s;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges"), *e;
    if (!cJSON_IsArray(merges)) return kb_fail(KILN_ERR_FORMAT, "%s: the BPE model has no \"merges\" list", where);
    int32_t r = 0;
    cJSON_ArrayForEach(e, merges) {
        if (cJSON_IsString(e)) {
            /* "a b": exactly one space */
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == e->valuestring || !sp[1])
                return kb_fail(KILN_ERR_FORMAT, "%s: merge %d \"%s\" is not two tokens \"a b\"", where, r + 1, e->valuestring);
            s = ktok_clip_merge(t, e->valuestring, (size_t)(sp - e->valuestring), sp + 1, strlen(sp + 1), r, where, r + 1);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
            s = ktok_clip_merge(t, a, strlen(a), b, strlen(b), r, where, r + 1);
        } else {
            return kb_fail(KILN_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", where, r + 1);
        }
        if (s) return s;
        r++;
    }
    return KILN_OK;
}

kiln_status ktok_clip_from_files(kiln_tokenizer *t, const char *vocab_path, const char *merges_path) {
    char *text = NULL;
    size_t len;
    kiln_status s = ktok_read_json_text(vocab_path, &text, &len);
    if (s) return s;
    const char *end = NULL;
    cJSON *vocab = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end && end >= text ? (size_t)(end - text) : 0;
    free(text);
    if (!vocab) return kb_fail(KILN_ERR_FORMAT, "%s is not valid JSON (near byte %zu)", vocab_path, at);
    if (!(t->clip = calloc(1, sizeof *t->clip))) s = kb_fail(KILN_ERR_NOMEM, "tokenizer: out of memory");
    if (!s) s = ktok_clip_vocab(t, vocab, vocab_path);
    cJSON_Delete(vocab);
    /* what CLIPTokenizer builds: suffix </w>, unknown <|endoftext|> */
    if (!s) s = ktok_clip_tables(t, "</w>", "<|endoftext|>", vocab_path);
    if (s) return s;
    if ((s = ktok_read_text(merges_path, &text, &len))) return s;
    /* one merge "a b" a line; a first line "#version..." is skipped */
    size_t i = 0;
    long line = 0;
    int32_t r = 0;
    while (i < len && !s) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        size_t e = j;
        if (e > i && text[e - 1] == '\r') e--;
        line++;
        if (!(line == 1 && e - i >= 8 && !memcmp(text + i, "#version", 8))) {
            const char *sp = memchr(text + i, ' ', e - i);
            if (!sp || sp == text + i || sp + 1 == text + e || memchr(sp + 1, ' ', (size_t)(text + e - sp - 1)))
                s = kb_fail(KILN_ERR_FORMAT, "%s: line %ld \"%.*s\" is not a merge \"a b\"", merges_path, line,
                            (int)(e - i > 80 ? 80 : e - i), text + i);
            else
                s = ktok_clip_merge(t, text + i, (size_t)(sp - text - i), sp + 1, (size_t)(text + e - sp - 1), r++,
                                    merges_path, line);
        }
        i = j + 1;
    }
    free(text);
    return s;
}
