/* test_prompts.c - the prompts-file parser (src/pipeline/prompts.c) through
 * its API: kp_prompts_parse on buffers, kp_prompts_read on files. The CLI's
 * use of it (messages on stderr, the run's defaults) is in test_pipeline.c;
 * arbitrary bytes in tests/fuzz/fuzz_prompts.c. */
#include "base/base.h"
#include "pipeline/prompts.h"
#include "test.h"

#include <unistd.h>

/* parse a string literal (its NUL bytes included, not the terminating one) */
#define PARSE(lit, out, n) kp_prompts_parse(lit, sizeof lit - 1, "p.jsonl", out, n)

TEST(plain_and_json_lines) {
    kp_prompt *p = NULL;
    int n = 0;
    /* a BOM, CRLF, blank lines that keep their numbers, a JSON line with
     * every key, leading blanks (kept on a plain line), no final newline */
    CHECK_OK(PARSE("\xEF\xBB\xBF" "a cat\r\n\r\n \t\n"
                   " {\"prompt\": \"b\", \"negative_prompt\": \"n\", \"seed\": 7, \"steps\": 3, \"guidance\": 4.5, "
                   "\"width\": 64, \"height\": 32, \"images_per_prompt\": 2}\r\n"
                   "  two spaces\n{\"prompt\": \"\"}",
                   &p, &n));
    CHECK(n == 4);
    if (n != 4 || !p) return;
    CHECK(!strcmp(p[0].prompt, "a cat") && !p[0].negative && p[0].seed == -1 && p[0].line == 1);
    CHECK(p[0].steps == 0 && p[0].width == 0 && p[0].height == 0 && p[0].images == 0 && !p[0].has_guidance);
    CHECK(!strcmp(p[1].prompt, "b") && p[1].negative && !strcmp(p[1].negative, "n") && p[1].line == 4);
    CHECK(p[1].seed == 7 && p[1].steps == 3 && p[1].has_guidance && p[1].guidance == 4.5);
    CHECK(p[1].width == 64 && p[1].height == 32 && p[1].images == 2);
    CHECK(!strcmp(p[2].prompt, "  two spaces") && p[2].line == 5);
    CHECK(!strcmp(p[3].prompt, "") && p[3].line == 6);
    kp_prompts_free(p, n);

    /* the buffer need not end in a NUL: only len bytes are read */
    static const char longer[] = "ab\nXYZ";
    CHECK_OK(kp_prompts_parse(longer, 3, "p.txt", &p, &n));
    CHECK(n == 1 && p && !strcmp(p[0].prompt, "ab"));
    kp_prompts_free(p, n);
    /* brackets that begin a prompt are text when the line is not one JSON array */
    CHECK_OK(PARSE("[cinematic] a cat\n[1, 2] and more\n", &p, &n));
    CHECK(n == 2 && p && !strcmp(p[0].prompt, "[cinematic] a cat") && !strcmp(p[1].prompt, "[1, 2] and more"));
    kp_prompts_free(p, n);

    /* the ends of the ranges; an escaped backslash before u0000 is text */
    CHECK_OK(PARSE("{\"prompt\": \"x\\\\u0000\", \"seed\": 9007199254740991, \"steps\": 10000, \"width\": 1048576, "
                   "\"height\": 1, \"images_per_prompt\": 512, \"guidance\": 1e300}\n",
                   &p, &n));
    CHECK(n == 1 && p && !strcmp(p[0].prompt, "x\\u0000") && p[0].seed == 9007199254740991LL && p[0].steps == 10000);
    CHECK(n == 1 && p && p[0].width == 1 << 20 && p[0].height == 1 && p[0].images == 512 && p[0].guidance == 1e300);
    kp_prompts_free(p, n);
}

TEST(bad_buffers) {
    kp_prompt *p = (kp_prompt *)1;
    int n = -1;
#define BAD(lit, substr)                                                   \
    do {                                                                   \
        CHECK_FAILS(PARSE(lit, &p, &n), KILN_ERR_FORMAT, substr);          \
        CHECK(p == NULL && n == 0);                                        \
        p = (kp_prompt *)1, n = -1;                                        \
    } while (0)
    BAD("", "p.jsonl holds no prompt");
    BAD("\n \r\n\t\n", "holds no prompt");                /* blank lines are no prompts */
    BAD("\xEF\xBB\xBF\r\n", "holds no prompt");           /* nor is the byte order mark */
    BAD("a\n{\"prompt\": \"b\", \"sed\": 1}\n", "p.jsonl line 2: unknown key \"sed\" (known: prompt,");
    BAD("a\r\n\r\n{\"prompt\": \"b\", \"sed\": 1}\r\n", "line 3: unknown key \"sed\"");
    BAD("{\"prompt\": \"a\", \"seed\": 1, \"seed\": 2}", "line 1: key \"seed\" appears twice");
    BAD("{\"prompt\": \"a\"} {\"prompt\": \"b\"}", "line 1: a line starting with { must be one JSON object and nothing after it");
    BAD("{\"prompt\": \"a\"", "line 1: a line starting with { must be one JSON object");
    BAD("{\"seed\": 1}", "line 1: \"prompt\" (a string) is required");
    BAD("{\"prompt\": 3}", "line 1: \"prompt\" (a string) is required");
    BAD("{\"prompt\": \"a\", \"negative_prompt\": null}", "line 1: \"negative_prompt\" must be a string");
    BAD("{\"prompt\": \"a\", \"guidance\": \"4\"}", "line 1: \"guidance\" must be a number");
    BAD("{\"prompt\": \"a\", \"guidance\": 1e999}", "line 1: \"guidance\" must be a number");
    BAD("{\"prompt\": \"a\", \"guidance\": -3}", "line 1: \"guidance\" must be a number, 0 or more");
    /* a whole line of JSON array is a mistake, not a prompt (issue 41) */
    BAD("a cat\n[\"a dog\", \"a bird\"]\n", "line 2: a JSON array; a line is a prompt, or one JSON object");
    BAD("[1, 2] \t\r\n", "line 1: a JSON array");
    BAD("{\"prompt\": \"a\", \"steps\": 0}", "line 1: \"steps\" must be an integer from 1 to 10000");
    BAD("{\"prompt\": \"a\", \"steps\": 2.5}", "\"steps\" must be an integer from 1 to 10000");
    BAD("{\"prompt\": \"a\", \"seed\": -1}", "\"seed\" must be an integer from 0 to 9007199254740991");
    BAD("{\"prompt\": \"a\", \"seed\": 9007199254740992}", "\"seed\" must be an integer from 0 to 9007199254740991");
    BAD("{\"prompt\": \"a\", \"width\": 1048577}", "\"width\" must be an integer from 1 to 1048576");
    BAD("{\"prompt\": \"a\", \"height\": true}", "\"height\" must be an integer from 1 to 1048576");
    BAD("{\"prompt\": \"a\", \"images_per_prompt\": 513}", "\"images_per_prompt\" must be an integer from 1 to 512");
    BAD("a\0\n{\"prompt\": \"b\", \"sed\": 1}\n", "p.jsonl: a NUL byte at offset 1");
    /* cJSON ends a string at a \u0000 escape: the prompt "a", the key "prompt" (found by review, not the fuzzer) */
    BAD("x\n{\"prompt\": \"a\\u0000b\"}", "line 2: a \\u0000 in a string (byte 14 of the object)");
    BAD("{\"prompt\\u0000x\": \"a\"}", "line 1: a \\u0000 in a string");
    BAD("{\"prompt\": \"a\", \"negative_prompt\": \"\\u0000\"}", "a \\u0000 in a string");
#undef BAD
    /* a failure on a later line frees the prompts before it (ASan: no leak) */
    CHECK_FAILS(PARSE("a\nb\n{\"prompt\": \"c\", \"negative_prompt\": \"d\", \"steps\": -1}", &p, &n), KILN_ERR_FORMAT,
                "line 3: \"steps\"");
    CHECK(p == NULL && n == 0);
    CHECK_FAILS(kp_prompts_parse(NULL, 4, "p.txt", &p, &n), KILN_ERR_INVALID_ARG, "p.txt: no text but a length of 4");
}

TEST(files) {
    char dir[256], path[320];
    test_tmpdir(dir, sizeof dir, "prompts");
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    kp_prompt *p = NULL;
    int n = 0;
    CHECK_FAILS(kp_prompts_read(path, &p, &n), KILN_ERR_IO, "missing.txt");
    CHECK(p == NULL && n == 0);
    CHECK_FAILS(kp_prompts_read(dir, &p, &n), KILN_ERR_IO, "is not a regular file");
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    static const char text[] = "one\n{\"prompt\": \"two\", \"seed\": 3}\n";
    CHECK_OK(kb_write_file_atomic(path, text, sizeof text - 1));
    CHECK_OK(kp_prompts_read(path, &p, &n));
    CHECK(n == 2 && p && !strcmp(p[0].prompt, "one") && !strcmp(p[1].prompt, "two") && p[1].seed == 3 && p[1].line == 2);
    kp_prompts_free(p, n);
    static const char bad[] = "one\n{\"prompt\": \"two\", \"sed\": 3}\n";
    CHECK_OK(kb_write_file_atomic(path, bad, sizeof bad - 1));
    CHECK_FAILS(kp_prompts_read(path, &p, &n), KILN_ERR_FORMAT, "p.jsonl line 2: unknown key \"sed\"");
    CHECK(p == NULL && n == 0);
    test_rmrf(dir);
}

int main(void) {
    RUN(plain_and_json_lines);
    RUN(bad_buffers);
    RUN(files);
    return TEST_SUMMARY();
}
