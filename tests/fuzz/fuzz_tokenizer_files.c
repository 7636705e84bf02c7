/* fuzz_tokenizer_files.c - libFuzzer harness for the tokenizer files
 * themselves (src/pipeline/tokenizer*.c): tokenizer.json (CLIP's BPE and
 * T5's Unigram with its base64 precompiled_charsmap), vocab.json +
 * merges.txt, spiece.model (SentencePiece's protobuf), and the
 * tokenizer_config.json / special_tokens_map.json beside them (added
 * tokens, special ids). A tokenizer folder is something a user downloads.
 *
 * Input: one byte for the route, then the files, separated by the line
 * "@@KILN-FILE@@":
 *   route % 3 == 0  tokenizer.json [, tokenizer_config.json [, special_tokens_map.json]]
 *   route % 3 == 1  vocab.json, merges.txt [, tokenizer_config.json [, special_tokens_map.json]]
 *   route % 3 == 2  spiece.model [, tokenizer_config.json [, special_tokens_map.json]]
 * written into a private folder and opened by that route (ktok_open).
 * Properties beyond "no crash, no sanitizer report, no leak": a failure
 * leaves a message; a tokenizer that opens has a vocabulary, tokenizes a
 * few prompts (each either fine or an invalid-argument error with a
 * message), every id below 2^24, and the padding mask 1s then 0s. Seeds: tests/fuzz/corpus/tokenizer_files (make_file_seeds.py,
 * from the test data's tokenizers, cut small). */
#include "base/base.h"
#include "fuzz_common.h"
#include "pipeline/tokenizer.h"

#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_sep[] = "\n@@KILN-FILE@@\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int route = data[0] % 3;
    static const char *const names[3][4] = {
        {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", NULL},
        {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"},
        {"spiece.model", "tokenizer_config.json", "special_tokens_map.json", NULL}};
    static const ktok_files files[3] = {KTOK_FILES_TOKENIZER_JSON, KTOK_FILES_VOCAB_MERGES, KTOK_FILES_SPIECE};
    char dir[512], path[700];
    snprintf(dir, sizeof dir, "%s/tok", kfz_scratch());
    mkdir(dir, 0700);
    static const char *const all[] = {"tokenizer.json", "vocab.json", "merges.txt", "spiece.model",
                                      "tokenizer_config.json", "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, all[i]);
        unlink(path);
    }
    /* the files, in the route's order */
    const uint8_t *p = data + 1, *end = data + size;
    for (int k = 0; k < 4 && names[route][k] && p <= end; k++) {
        const uint8_t *q = p;
        size_t sl = sizeof k_sep - 1;
        while (q + sl <= end && memcmp(q, k_sep, sl)) q++;
        if (q + sl > end) q = end;
        char rel[600];
        snprintf(rel, sizeof rel, "tok/%s", names[route][k]);
        kfz_write(rel, p, (size_t)(q - p), path, sizeof path);
        p = q + sl;
    }
    kiln_tokenizer *t = NULL;
    kiln_status st = ktok_open(dir, files[route], &t);
    if (st) {
        KFZ_ASSERT(*kiln_last_error());
        KFZ_ASSERT(t == NULL);
        return 0;
    }
    KFZ_ASSERT(t && t->vocab_size > 0);
    static const char *const prompts[] = {"a photo of a cat", "", "  Hello, WORLD!  ", "\xe6\x9d\xb1\xe4\xba\xac 9",
                                          "<|endoftext|> </s> <extra_id_1>", "e\xcc\x81t\xc3\xa9"};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        int64_t ids[80], mask[80];
        int n = 0;
        kiln_status s = kiln_tokenize(t, prompts[i], 80, ids, mask, &n);
        if (s) {
            KFZ_ASSERT(s == KILN_ERR_INVALID_ARG || s == KILN_ERR_FORMAT || s == KILN_ERR_NOMEM);
            KFZ_ASSERT(*kiln_last_error());
            continue;
        }
        KFZ_ASSERT(n >= 0);
        for (int k = 0; k < 80; k++) {
            KFZ_ASSERT(ids[k] >= 0 && ids[k] < KTOK_MAX_ID); /* ids travel as f32 */
            KFZ_ASSERT(mask[k] == (k < n));
        }
    }
    kiln_tokenizer_free(t);
    return 0;
}
