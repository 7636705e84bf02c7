/* fuzz_tokenizer.c - libFuzzer harness for the CLIP and T5 tokenizers
 * (src/pipeline/tokenizer*.c) on the prompt bytes.
 *
 * The tokenizers are the `tokenizers` case's three folders, opened once:
 * $KILN_FUZZ_TOKENIZERS (a folder holding tokenizer/, tokenizer_2/,
 * tokenizer_3/), else tests/data/goldens/tokenizers beside this file.
 * Properties beyond "no crash, no sanitizer report": invalid UTF-8 is
 * KILN_ERR_INVALID_ARG with a message naming the offset, and nothing else
 * fails; ids lie inside the vocabulary; the mask is 1s then 0s over exactly
 * min(n, max_length) tokens, the last real one the eos; and the padded ids
 * agree with the untruncated encoding (ktok_encode, which takes the bytes
 * with their length, NULs included).
 *
 * Needs the src/pipeline sources and utf8proc (PkgConfig::UTF8PROC) in the
 * harnesses' parser set (tests/fuzz/CMakeLists.txt). */
#include "base/base.h"
#include "pipeline/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KFZ_CHECK(c)                                                                      \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "kiln fuzz: %s:%d: %s (%s)\n", __FILE__, __LINE__, #c, kiln_last_error()); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

static kiln_tokenizer *g_tok[3];

static void open_all(void) {
    static const char *names[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    const char *root = getenv("KILN_FUZZ_TOKENIZERS");
    char *dflt = NULL;
    if (!root || !*root) {
        char *here = kb_dirname(__FILE__);
        dflt = kb_strfmt("%s/../data/goldens/tokenizers", here ? here : ".");
        free(here);
        root = dflt;
    }
    for (int k = 0; k < 3; k++) {
        char *p = kb_path_join(root, names[k]);
        if (!p || kiln_tokenizer_open(p, &g_tok[k])) {
            fprintf(stderr, "kiln fuzz: cannot open %s: %s (set KILN_FUZZ_TOKENIZERS)\n", p ? p : names[k],
                    kiln_last_error());
            abort();
        }
        free(p);
    }
    free(dflt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0]) open_all();
    const char *text = (const char *)data;
    int valid = ktok_check_utf8(text, size, "the input") == KILN_OK;
    /* the C API takes a C string: the bytes up to the first NUL */
    size_t clen = 0;
    while (clen < size && data[clen]) clen++;
    char *cstr = malloc(clen + 1);
    KFZ_CHECK(cstr);
    memcpy(cstr, data, clen);
    cstr[clen] = 0;
    int cvalid = ktok_check_utf8(cstr, clen, "the input") == KILN_OK;
    for (int k = 0; k < 3; k++) {
        const kiln_tokenizer *t = g_tok[k];
        ktok_ids all = {0};
        kiln_status s = ktok_encode(t, text, size, &all);
        KFZ_CHECK(valid ? s == KILN_OK : (s == KILN_ERR_INVALID_ARG && strstr(kiln_last_error(), "offset")));
        for (size_t i = 0; s == KILN_OK && i < all.len; i++) KFZ_CHECK(all.p[i] >= 0 && all.p[i] < t->vocab_size);
        free(all.p);
        all = (ktok_ids){0};

        int L = k == 2 ? 64 : 77, n = -1;
        int64_t ids[77], mask[77];
        s = kiln_tokenize(t, cstr, L, ids, mask, &n);
        KFZ_CHECK(cvalid ? s == KILN_OK : (s == KILN_ERR_INVALID_ARG && strstr(kiln_last_error(), "offset")));
        if (s != KILN_OK) continue;
        KFZ_CHECK(ktok_encode(t, cstr, clen, &all) == KILN_OK);
        int specials = t->bos_id >= 0 ? 2 : 1;
        KFZ_CHECK(n == (int)all.len + specials);
        int real = n < L ? n : L, off = t->bos_id >= 0 ? 1 : 0;
        for (int i = 0; i < L; i++) {
            KFZ_CHECK(mask[i] == (i < real));
            KFZ_CHECK(ids[i] >= 0 && ids[i] < t->vocab_size);
            if (i >= off && i < real - 1) KFZ_CHECK(ids[i] == all.p[i - off]);
            if (i >= real) KFZ_CHECK(ids[i] == t->pad_id);
        }
        KFZ_CHECK(ids[real - 1] == t->eos_id);
        if (off) KFZ_CHECK(ids[0] == t->bos_id);
        free(all.p);
    }
    free(cstr);
    return 0;
}
