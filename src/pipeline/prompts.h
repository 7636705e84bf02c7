/* prompts.h - the prompts file of `kiln generate --prompts-file FILE`: one
 * prompt per line, or a JSON object per line with that prompt's own
 * settings. Below the CLI (which prints the errors, src/cli/generate_pipeline.c)
 * so that a libFuzzer harness can link it (tests/fuzz/fuzz_prompts.c): a
 * prompts file is user input read from disk.
 *
 * The format, line by line (lines end in \n or \r\n; a UTF-8 byte order mark
 * before the first line is skipped; a NUL byte anywhere is an error):
 *   - a blank line (spaces and tabs only) is no prompt; it keeps its number;
 *   - a line whose first non-blank byte is { is one JSON object and nothing
 *     after it: "prompt" (a string, required) and any of "negative_prompt"
 *     (a string), "seed" (integer 0 .. 2^53 - 1), "steps" (1 .. 10000),
 *     "guidance" (a finite number, 0 or more), "width" and "height" (1 ..
 *     2^20), "images_per_prompt" (1 .. 512); an unknown key, a key twice,
 *     or a \u0000 escape in a string is an error;
 *   - a line that is one whole JSON array is an error (a mistake: not a
 *     prompt, not an object);
 *   - any other line is a prompt as it is (leading blanks kept).
 * A file without a prompt, or of more than INT_MAX / 2 lines (the line
 * numbers and the count are ints), is an error. Every message names the path and,
 * for a line, its number (1-based). */
#ifndef KILN_PIPELINE_PROMPTS_H
#define KILN_PIPELINE_PROMPTS_H

#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

/* One request: its prompt and the settings its line gives. Unset: seed -1,
 * the numbers 0, has_guidance 0 (the run's options apply). */
typedef struct kp_prompt {
    char *prompt, *negative; /* malloc'd; negative NULL when the line has none */
    int64_t seed;            /* -1, or 0 .. 2^53 - 1 */
    int steps, width, height, images;
    double guidance; /* finite when has_guidance, else 0 */
    int has_guidance;
    int line; /* the 1-based line it came from (increasing along the list) */
} kp_prompt;

/* Parse text[0..len) (need not be NUL-terminated; path names it in
 * messages). KILN_OK with *out (kp_prompts_free) holding *n >= 1 prompts;
 * else KILN_ERR_FORMAT (what is wrong and where) or KILN_ERR_NOMEM, with
 * *out NULL and *n 0. */
kiln_status kp_prompts_parse(const char *text, size_t len, const char *path, kp_prompt **out, int *n);
/* The same for the file at path (KILN_ERR_IO when it cannot be read). */
kiln_status kp_prompts_read(const char *path, kp_prompt **out, int *n);
void kp_prompts_free(kp_prompt *p, int n);

#endif
