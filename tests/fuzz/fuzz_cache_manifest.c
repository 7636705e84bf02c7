/* fuzz_cache_manifest.c - libFuzzer harness for a weight cache's manifest:
 * the header line split (kcache_manifest_split) and the body parse
 * (kcache_manifest_parse), the code that reads every field of a manifest
 * before anything is mapped. The signature check that runs between the two
 * in kcache_open is skipped: an input that is not a header line goes to the
 * body parse directly, so the fuzzer reaches it without forging an HMAC.
 * Any return code is fine; a crash, a sanitizer report or a leak is not.
 *
 *   clang -fsanitize=fuzzer,address,undefined -Iinclude -Isrc tests/fuzz/fuzz_cache_manifest.c \
 *       src/cache/manifest.c src/base/error.c src/base/mem.c src/base/fs.c src/base/log.c \
 *       src/tensor/dtype.c $(pkg-config --cflags --libs libcjson libxxhash)
 * Seeds: tests/fuzz/corpus/cache_manifest/ (manifests of a test cache). */
#include "cache/cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private NUL-terminated copy: the parsers take text and a length */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    const char *body = text;
    size_t body_len = size;
    if (size >= 11 && !memcmp(text, KCACHE_MAGIC " ", 11)) {
        int version;
        char sig[65];
        const char *b;
        size_t bl;
        /* a failing checksum still lets the body be parsed: the fuzzer cannot
         * keep the xxh3 right while it mutates */
        if (kcache_manifest_split(text, size, "fuzz", &version, sig, &b, &bl) == KILN_OK) {
            body = b;
            body_len = bl;
        } else {
            const char *nl = memchr(text, '\n', size);
            if (nl) {
                body = nl + 1;
                body_len = size - (size_t)(nl + 1 - text);
            }
        }
    }
    kcache_entry *e = calloc(1, sizeof *e);
    if (e) {
        kiln_status st = kcache_manifest_parse(body, body_len, "fuzz", e);
        if (!st) {
            /* what the parse promises: every range inside data_bytes, aligned */
            for (size_t i = 0; i < e->n; i++)
                if (e->t[i].offset % KCACHE_ALIGN || e->t[i].offset > e->data_bytes ||
                    e->t[i].nbytes > e->data_bytes - e->t[i].offset || !e->t[i].name || e->t[i].ndim > 4)
                    abort();
            /* the key check against itself and against an empty key */
            if (e->key_json) {
                e->path = strdup("fuzz");
                kcache_check_key(e, e->key_json, NULL);
                kcache_check_key(e, "{}", NULL);
            }
        }
        kcache_close(e);
    }
    free(text);
    return 0;
}
