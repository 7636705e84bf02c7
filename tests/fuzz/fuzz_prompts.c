/* fuzz_prompts.c - libFuzzer harness for the prompts file of `kiln generate
 * --prompts-file` (kp_prompts_parse, src/pipeline/prompts.c: lines, CRLF, a
 * byte order mark, JSON objects with per-prompt settings).
 *
 * The input is a whole file, passed as a buffer (not NUL-terminated: the
 * parser reads len bytes only, which ASan checks). Properties checked beyond
 * "no crash, no sanitizer report, no leak": a failure leaves a message and
 * no prompts; a success has n >= 1 prompts, each with a prompt string, line
 * numbers from 1 increasing within the file's line count, and every setting
 * unset or in the range prompts.h documents; the same bytes parse the same
 * way again (no hidden state). */
#include "fuzz_common.h"

#include "base/base.h"
#include "pipeline/prompts.h"

#include <math.h>

static int lines_in(const uint8_t *data, size_t size) {
    size_t k = 1;
    for (size_t i = 0; i < size; i++) k += data[i] == '\n';
    return k > 0x7fffffff ? 0x7fffffff : (int)k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy, so that a read past len is a heap overflow */
    char *buf = malloc(size ? size : 1);
    KFZ_ASSERT(buf);
    if (size) memcpy(buf, data, size);
    kb_clear_error();
    kp_prompt *p = (kp_prompt *)1;
    int n = -1;
    kiln_status st = kp_prompts_parse(buf, size, "fuzz.jsonl", &p, &n);
    if (st != KILN_OK) {
        KFZ_ASSERT(st == KILN_ERR_FORMAT || st == KILN_ERR_NOMEM);
        KFZ_ASSERT(kiln_last_error()[0]);
        KFZ_ASSERT(p == NULL && n == 0);
        free(buf);
        return 0;
    }
    KFZ_ASSERT(p && n >= 1);
    int last = 0, max_line = lines_in(data, size);
    for (int i = 0; i < n; i++) {
        const kp_prompt *q = &p[i];
        KFZ_ASSERT(q->prompt);
        KFZ_ASSERT(strlen(q->prompt) <= size && (!q->negative || strlen(q->negative) <= size));
        KFZ_ASSERT(q->line > last && q->line <= max_line);
        last = q->line;
        KFZ_ASSERT(q->seed == -1 || (q->seed >= 0 && q->seed <= 9007199254740991LL));
        KFZ_ASSERT(q->steps == 0 || (q->steps >= 1 && q->steps <= 10000));
        KFZ_ASSERT(q->width == 0 || (q->width >= 1 && q->width <= 1 << 20));
        KFZ_ASSERT(q->height == 0 || (q->height >= 1 && q->height <= 1 << 20));
        KFZ_ASSERT(q->images == 0 || (q->images >= 1 && q->images <= 512));
        KFZ_ASSERT(q->has_guidance ? isfinite(q->guidance) : (q->has_guidance == 0 && q->guidance == 0));
    }
    /* deterministic: a second parse of the same bytes gives the same prompts */
    kp_prompt *again = NULL;
    int n2 = 0;
    KFZ_ASSERT(kp_prompts_parse(buf, size, "fuzz.jsonl", &again, &n2) == KILN_OK && n2 == n);
    for (int i = 0; i < n; i++) {
        const kp_prompt *a = &p[i], *b = &again[i];
        KFZ_ASSERT(!strcmp(a->prompt, b->prompt) && !a->negative == !b->negative &&
                   (!a->negative || !strcmp(a->negative, b->negative)));
        KFZ_ASSERT(a->seed == b->seed && a->steps == b->steps && a->width == b->width && a->height == b->height &&
                   a->images == b->images && a->has_guidance == b->has_guidance && a->line == b->line);
        KFZ_ASSERT(a->guidance == b->guidance);
    }
    kp_prompts_free(again, n2);
    kp_prompts_free(p, n);
    free(buf);
    return 0;
}
