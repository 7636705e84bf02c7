/* cmd_tokenize.c - kiln tokenize FOLDER --prompt TEXT [--max-length N] [--json] */
#include "base/base.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char k_usage[] = "kiln tokenize FOLDER --prompt TEXT [--max-length N] [--json]";

static int help(void) {
    printf("usage: %s\n\n"
           "Token ids of TEXT (UTF-8) as a diffusers pipeline pads them, exact to Hugging Face\n"
           "`tokenizers`. FOLDER is a pipeline folder (every one of tokenizer/, tokenizer_2/,\n"
           "tokenizer_3/ found is used) or one tokenizer folder. CLIP (tokenizer.json or\n"
           "vocab.json + merges.txt): [bos] ids [eos], padded with the pad token; T5 (tokenizer.json,\n"
           "Unigram): ids </s>, padded with <pad>. One line `NAME id id ...` per tokenizer.\n\n"
           "  --prompt TEXT     the prompt (invalid UTF-8 is an error naming the byte offset)\n"
           "  --max-length N    the padded length of every tokenizer printed (default: 77 for\n"
           "                    CLIP, 256 for T5: SD3's max_sequence_length; Flux-dev uses 512)\n"
           "  --json            one JSON object {\"tokenizer\": [ids], ...} instead\n",
           k_usage);
    return 0;
}

/* The folder's last path component (trailing slashes ignored), malloc'd. */
static char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    char *s = malloc(n - b + 1);
    if (!s) return NULL;
    memcpy(s, path + b, n - b);
    s[n - b] = 0;
    return s;
}

int cmd_tokenize(int argc, char **argv) {
    const char *folder = NULL, *prompt = NULL, *ml = NULL;
    long max_length = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if (cli_flag(argv, i, "--json")) {
            json = 1;
            continue;
        }
        if ((r = cli_opt("tokenize", argc, argv, &i, "--prompt", &prompt))) {
            if (r < 0) return 2;
            continue;
        }
        if ((r = cli_opt("tokenize", argc, argv, &i, "--max-length", &ml))) {
            if (r < 0 || cli_parse_int("tokenize", "--max-length", ml, 1, 1 << 20, &max_length)) return 2;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("tokenize", k_usage, "unknown option %s", argv[i]);
        if (folder) return cli_usage_error("tokenize", k_usage, "more than one FOLDER given");
        folder = argv[i];
    }
    if (!folder || !prompt) return cli_usage_error("tokenize", k_usage, "FOLDER and --prompt are required");
    if (!kb_is_dir(folder)) return cli_error("tokenize", "%s is not a folder", folder);

    /* the pipeline's tokenizer subfolders, else FOLDER itself */
    static const char *subs[] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    char *paths[3] = {0}, *names[3] = {0};
    int n = 0, rc = 0;
    for (int k = 0; k < 3; k++) {
        char *p = kb_path_join(folder, subs[k]);
        if (p && kb_is_dir(p)) {
            paths[n] = p;
            names[n++] = kb_strdup(subs[k]);
        } else {
            free(p);
        }
    }
    if (!n) {
        paths[0] = kb_strdup(folder);
        names[0] = base_name(folder);
        n = 1;
    }
    int64_t *ids = NULL;
    if (json) printf("{");
    for (int k = 0; k < n && !rc; k++) {
        kiln_tokenizer *t = NULL;
        kiln_status s = kiln_tokenizer_open(paths[k], &t);
        if (s) {
            rc = cli_fail("tokenize", s);
            break;
        }
        int L = max_length > 0 ? (int)max_length : kiln_tokenizer_max_length(t);
        free(ids);
        ids = malloc(sizeof(int64_t) * (size_t)L);
        if (!ids) {
            rc = cli_error("tokenize", "out of memory for %d ids", L);
        } else if ((s = kiln_tokenize(t, prompt, L, ids, NULL, NULL))) {
            rc = cli_fail("tokenize", s);
        } else if (json) {
            /* names are tokenizer folder names: no JSON escaping needed
             * beyond quotes and backslashes, which a folder name may hold */
            printf("%s\"", k ? ", " : "");
            for (const char *c = names[k]; c && *c; c++) {
                if (*c == '"' || *c == '\\') putchar('\\');
                if ((unsigned char)*c < 0x20) printf("\\u%04x", (unsigned char)*c);
                else putchar(*c);
            }
            printf("\": [");
            for (int i = 0; i < L; i++) printf("%s%lld", i ? ", " : "", (long long)ids[i]);
            printf("]");
        } else {
            printf("%s", names[k] ? names[k] : "?");
            for (int i = 0; i < L; i++) printf(" %lld", (long long)ids[i]);
            printf("\n");
        }
        kiln_tokenizer_free(t);
    }
    if (json && !rc) printf("}\n");
    free(ids);
    for (int k = 0; k < n; k++) {
        free(paths[k]);
        free(names[k]);
    }
    return rc;
}
