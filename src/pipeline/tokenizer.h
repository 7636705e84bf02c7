/* tokenizer.h - CLIP (byte-level BPE) and T5 (Unigram) tokenizers, exact to
 * Hugging Face `tokenizers` (the Rust library diffusers runs through
 * transformers). Read from the files of a diffusers tokenizer folder (tokenizer, tokenizer_2, ...).
 *
 *   kiln_tokenizer *t;
 *   kiln_tokenizer_open("sd3/tokenizer_3", &t);          // CLIP or T5, from the files
 *   int64_t ids[256], mask[256]; int n;
 *   kiln_tokenize(t, "a photo of a cat", 0, ids, mask, &n); // padded as the pipeline pads
 *   kiln_tokenizer_free(t);
 *
 * Layers: above src/base only (cJSON for the files, utf8proc for Unicode
 * data). Files: tokenizer.c (shared: UTF-8, hash maps, added tokens, JSON,
 * open/detect, the public calls), tokenizer_clip.c (normalizer, the split
 * patterns, byte-to-unicode, BPE), tokenizer_t5.c (the Precompiled charsmap,
 * Metaspace, Unigram Viterbi, spiece.model's protobuf). Every step mirrored is spelled out in
 * tests/data/goldens/README-pipelines.md of the shared cases.
 *
 * Invalid UTF-8 in a prompt (overlong forms, surrogates such as ED A0 80,
 * bytes past U+10FFFF, truncated sequences) is refused with
 * KILN_ERR_INVALID_ARG naming the byte offset: a Python str, which is what the
 * reference tokenizes, cannot hold it, so there is no reference to mirror.
 *
 * A tokenizer is immutable once open: kiln_tokenize may run on many threads
 * at once. */
#ifndef KILN_PIPELINE_TOKENIZER_H
#define KILN_PIPELINE_TOKENIZER_H

#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

/* ---- a map from byte strings to int32 (open addressing, FNV-1a) --------- */
typedef struct ktok_map {
    uint32_t *slots; /* cap entries: index into keys + 1, 0 = empty */
    size_t cap, n;
    /* entries: key bytes in one arena, offsets and values per entry */
    char *arena;
    size_t arena_len, arena_cap;
    size_t *key_off;  /* [n] */
    uint32_t *key_len; /* [n] */
    int32_t *val;     /* [n] */
    size_t ent_cap;
} ktok_map;
void ktok_map_free(ktok_map *m);
/* insert or overwrite (the last value wins, as a Rust HashMap built from a
 * list does); KILN_ERR_NOMEM on failure */
kiln_status ktok_map_put(ktok_map *m, const char *key, size_t len, int32_t val);
/* 1 and *val when present */
int ktok_map_get(const ktok_map *m, const char *key, size_t len, int32_t *val);

/* A map from a pair of ids to a merge: rank and the merged id. */
typedef struct ktok_pairmap {
    uint64_t *keys; /* (a << 32 | b) + 1, 0 = empty */
    int32_t *rank, *id;
    size_t cap, n;
} ktok_pairmap;
void ktok_pairmap_free(ktok_pairmap *m);
kiln_status ktok_pairmap_put(ktok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
int ktok_pairmap_get(const ktok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);

/* ---- growable buffers ---------------------------------------------------- */
typedef struct ktok_buf {
    char *p;
    size_t len, cap;
} ktok_buf;
kiln_status ktok_buf_add(ktok_buf *b, const void *data, size_t n);
kiln_status ktok_buf_cp(ktok_buf *b, int32_t cp); /* one code point as UTF-8 */

typedef struct ktok_ids {
    int32_t *p;
    size_t len, cap;
} ktok_ids;
kiln_status ktok_ids_add(ktok_ids *v, int32_t id);

/* ---- Unicode (utf8proc) -------------------------------------------------- */
/* The next code point of s[*i..n), advancing *i; -1 on invalid UTF-8 (only
 * ever on text that ktok_check_utf8 did not pass). */
int32_t ktok_next_cp(const char *s, size_t n, size_t *i);
/* KILN_OK, or KILN_ERR_INVALID_ARG naming what (e.g. "prompt") and the byte
 * offset of the first invalid sequence */
kiln_status ktok_check_utf8(const char *s, size_t n, const char *what);
/* White_Space, which is also what Oniguruma's \s matches in UTF-8 and
 * Rust's char::is_whitespace: 9..13, U+0085 and the Z* separators */
int ktok_is_space(int32_t cp);
int ktok_is_letter(int32_t cp); /* \p{L}: Lu Ll Lt Lm Lo */
int ktok_is_number(int32_t cp); /* \p{N}: Nd Nl No */

/* ---- added tokens: cut out of text before the model sees it ------------- */
typedef struct ktok_added {
    char *content; /* as matched: the normalized content for normalized tokens */
    size_t len;
    int32_t id;
    int normalized; /* matched in the normalized text (CLIP's <|startoftext|>) */
} ktok_added;

/* The leftmost, then longest, match in s[from..n) of t's added tokens whose
 * normalized flag is `normalized`, as aho-corasick's LeftmostLongest:
 * 1 and *at (byte offset), *which (index into t->added) when found. */
int ktok_find_added(const kiln_tokenizer *t, int normalized, const char *s, size_t n, size_t from, size_t *at,
                    int *which);
/* t's normalizer (CLIP's or T5's) on s[0..n) */
kiln_status ktok_normalize(const kiln_tokenizer *t, const char *s, size_t n, ktok_buf *out);
/* The split every kind shares: the raw added tokens cut out of the text,
 * each stretch between them normalized, the normalized added tokens cut out
 * of that, and each remaining piece handed to pretok(t, work, piece, out),
 * the kind's pre-tokenizer and model; ids appended to out in order. */
/* The files of a tokenizer: at most KTOK_MAX_FILE bytes, and a JSON file
 * at most KTOK_MAX_JSON_ITEMS values (counted before it is parsed: a
 * 5-million-entry vocab.json took 902 MB to refuse), so the memory a
 * hostile file costs is bounded by these before any table is built. A
 * token id is below KTOK_MAX_ID (ids travel as f32: exact below 2^24). */
#define KTOK_MAX_FILE (64u << 20)
#define KTOK_MAX_JSON_ITEMS (2L << 20)
#define KTOK_MAX_ID (1 << 24)
/* path's bytes (kb_read_file) within KTOK_MAX_FILE; a JSON file's values
 * counted against KTOK_MAX_JSON_ITEMS when json */
kiln_status ktok_read_text(const char *path, char **text, size_t *len);
kiln_status ktok_read_json_text(const char *path, char **text, size_t *len);
/* the longest text a tokenizer takes, in bytes (KILN_ERR_INVALID_ARG past it) */
#define KTOK_MAX_TEXT (256 << 10)
typedef kiln_status (*ktok_pretok_fn)(const kiln_tokenizer *t, void *work, const char *s, size_t n, ktok_ids *out);
kiln_status ktok_encode_split(const kiln_tokenizer *t, const char *text, size_t len, ktok_pretok_fn pretok, void *work,
                              ktok_ids *out);

/* ---- the tokenizer -------------------------------------------------------- */
typedef struct ktok_clip ktok_clip;
typedef struct ktok_t5 ktok_t5;

struct kiln_tokenizer {
    kiln_tokenizer_kind kind;
    int max_length;     /* the pipeline's default: 77 CLIP, 256 T5 */
    int64_t bos_id;     /* -1 when the model has none (T5) */
    int64_t eos_id, pad_id;
    ktok_added *added;
    int n_added;
    uint8_t added_first[2][256]; /* [normalized][byte]: an added token starts with it */
    ktok_map vocab;     /* token -> id */
    int32_t vocab_size; /* 1 + the largest id */
    ktok_clip *clip;
    ktok_t5 *t5;
    char *source;       /* which files it came from, for messages */
};

/* Which files to read; the public open takes KTOK_FILES_AUTO (tokenizer.json
 * when the folder has one). The tests use the others to check that the
 * routes agree. */
typedef enum ktok_files {
    KTOK_FILES_AUTO = 0,
    KTOK_FILES_TOKENIZER_JSON, /* tokenizer.json (+ tokenizer_config.json for pad) */
    KTOK_FILES_VOCAB_MERGES,   /* CLIP: vocab.json + merges.txt + tokenizer_config.json */
    KTOK_FILES_SPIECE,         /* T5: spiece.model + tokenizer_config.json */
} ktok_files;
kiln_status ktok_open(const char *folder, ktok_files files, kiln_tokenizer **out);

/* The model's ids of text[0..len) without specials, untruncated. */
kiln_status ktok_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out);

/* ---- per kind (tokenizer_clip.c, tokenizer_t5.c) ------------------------- */
/* Parsed JSON is passed as cJSON (void * here keeps cJSON.h out of the header). */
kiln_status ktok_clip_from_json(kiln_tokenizer *t, const void *model_json, const void *root_json);
kiln_status ktok_clip_from_files(kiln_tokenizer *t, const char *vocab_path, const char *merges_path);
kiln_status ktok_clip_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out);
/* NFC, White_Space runs -> ' ', per-char lowercase (CLIP's normalizer) */
kiln_status ktok_clip_normalize(const char *s, size_t n, ktok_buf *out);
void ktok_clip_free(ktok_clip *c);

kiln_status ktok_t5_from_json(kiln_tokenizer *t, const void *model_json, const void *root_json);
/* spiece.model (SentencePiece's protobuf) with the extra ids of
 * tokenizer_config.json (cfg may be NULL), read into the pipeline
 * transformers converts it to: Precompiled, WhitespaceSplit, Metaspace. */
kiln_status ktok_t5_from_spiece(kiln_tokenizer *t, const char *path, const void *cfg);
/* the Precompiled normalizer (and what follows it in the Sequence) */
kiln_status ktok_t5_normalize(const ktok_t5 *c, const char *s, size_t n, ktok_buf *out);
kiln_status ktok_t5_encode(const kiln_tokenizer *t, const char *text, size_t len, ktok_ids *out);
void ktok_t5_free(ktok_t5 *c);

/* base64 (RFC 4648, padding optional) into a malloc'd buffer */
kiln_status ktok_base64(const char *s, size_t n, uint8_t **out, size_t *out_len, const char *what);

#endif
