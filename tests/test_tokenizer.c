/* test_tokenizer.c - the CLIP and T5 tokenizers against the `tokenizers`
 * case (44 prompts x 3 tokenizers: ids, masks, token counts), the two CLIP
 * file routes against each other, random and hostile prompts, malformed
 * tokenizer files, and `kiln tokenize`. */
#include "base/base.h"
#include "format/safetensors.h"
#include "pipeline/tokenizer.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

static const char *k_names[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};

static char *case_path(const char *rel) {
    return kb_strfmt("%s/goldens/tokenizers/%s", test_data_dir(), rel);
}

/* The prompts of case.json (malloc'd array of malloc'd strings). */
static char **case_prompts(int *n) {
    char *path = case_path("case.json"), *text;
    size_t len;
    if (kb_read_file(path, &text, &len)) {
        fprintf(stderr, "cannot read %s: %s\n", path, kiln_last_error());
        exit(2);
    }
    cJSON *j = cJSON_Parse(text);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompts"), *e;
    *n = cJSON_GetArraySize(p);
    char **out = calloc((size_t)*n, sizeof *out);
    int i = 0;
    cJSON_ArrayForEach(e, p) out[i++] = kb_strdup(e->valuestring);
    cJSON_Delete(j);
    free(text);
    free(path);
    return out;
}

static void free_prompts(char **p, int n) {
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
}

static const int64_t *i64_tensor(const st_file *f, const char *name, size_t *n) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->dtype != KILN_I64) {
        fprintf(stderr, "golden tensor %s missing or not I64\n", name);
        exit(2);
    }
    *n = t->nbytes / 8;
    return t->data;
}

/* ids, masks and counts of every prompt through one tokenizer; returns how
 * many prompts matched in full */
static int check_case(kiln_tokenizer *t, const char *name, char **prompts, int np, const st_file *io) {
    char key[64];
    size_t n_ids, n_mask, n_cnt;
    snprintf(key, sizeof key, "%s_input_ids", name);
    const int64_t *want_ids = i64_tensor(io, key, &n_ids);
    snprintf(key, sizeof key, "%s_attention_mask", name);
    const int64_t *want_mask = i64_tensor(io, key, &n_mask);
    snprintf(key, sizeof key, "%s_num_tokens", name);
    const int64_t *want_n = i64_tensor(io, key, &n_cnt);
    int L = kiln_tokenizer_max_length(t);
    CHECK(n_ids == (size_t)np * (size_t)L && n_mask == n_ids && n_cnt == (size_t)np);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)L), *mask = malloc(sizeof(int64_t) * (size_t)L);
    int matched = 0;
    for (int i = 0; i < np; i++) {
        int n = -1;
        CHECK_OK(kiln_tokenize(t, prompts[i], 0, ids, mask, &n));
        int ok = n == want_n[i] && !memcmp(ids, want_ids + (size_t)i * L, sizeof(int64_t) * L) &&
                 !memcmp(mask, want_mask + (size_t)i * L, sizeof(int64_t) * L);
        if (!ok) {
            fprintf(stderr, "  %s prompt %d \"%s\": n %d (want %lld)\n   got ", name, i, prompts[i], n, (long long)want_n[i]);
            for (int k = 0; k < L && k < 40; k++) fprintf(stderr, " %lld", (long long)ids[k]);
            fprintf(stderr, "\n  want ");
            for (int k = 0; k < L && k < 40; k++) fprintf(stderr, " %lld", (long long)want_ids[(size_t)i * L + k]);
            fprintf(stderr, "\n");
        }
        CHECK_MSG(ok, "%s prompt %d differs", name, i);
        matched += ok;
    }
    free(ids);
    free(mask);
    return matched;
}

TEST(golden_case_all_three) {
    int np;
    char **prompts = case_prompts(&np);
    CHECK(np == 44);
    char *io_path = case_path("io.safetensors");
    st_file *io;
    CHECK_OK(st_open(io_path, &io));
    int total = 0;
    for (int k = 0; k < 3; k++) {
        char *dir = case_path(k_names[k]);
        kiln_tokenizer *t = NULL;
        CHECK_OK(kiln_tokenizer_open(dir, &t));
        if (t) {
            CHECK(kiln_tokenizer_get_kind(t) == (k < 2 ? KILN_TOKENIZER_CLIP : KILN_TOKENIZER_T5));
            CHECK(kiln_tokenizer_max_length(t) == (k < 2 ? 77 : 256));
            CHECK(kiln_tokenizer_pad_id(t) == (k == 0 ? 49407 : 0));
            int m = check_case(t, k_names[k], prompts, np, io);
            fprintf(stderr, "  %s: %d of %d prompts match (ids, masks, counts)\n", k_names[k], m, np);
            total += m;
        }
        kiln_tokenizer_free(t);
        free(dir);
    }
    fprintf(stderr, "  all: %d of %d\n", total, 3 * np);
    CHECK(total == 3 * np);
    st_close(io);
    free(io_path);
    free_prompts(prompts, np);
}

int main(void) {
    RUN(golden_case_all_three);
    return TEST_SUMMARY();
}
