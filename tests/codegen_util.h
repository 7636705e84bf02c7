/* codegen_util.h - read back the op calls of a package's generated model.c
 * (codegen.c writes each as "/ * N name * / { const kg_call c = {.op = .., .src
 * = {..}, .y = .., .sh = .., .nd = .., .fmt = {..}, .ip = {..}, ...}"), so
 * tests can check what the compiler's passes made of a graph. */
#ifndef KILN_CODEGEN_UTIL_H
#define KILN_CODEGEN_UTIL_H

#include "graph/graph.h"

#include <stdio.h>
#include <string.h>

typedef struct gen_call {
    char op[32];
    int absent[KG_MAX_SRC];  /* source s is absent ("0") */
    int fmt[KG_MAX_SRC + 1]; /* the sources' formats, then the output's (fmt[KG_Y]) */
    char ip[4][96];  /* the integer parameters as C expressions ("0LL", "(2LL*S[1])") */
} gen_call;

/* copy the comma-separated fields after key ("{a, b, ...}") into out[n][cap] */
static int gen_fields(const char *at, const char *key, int n, char *out, size_t cap) {
    const char *p = strstr(at, key);
    if (!p) return 0;
    p += strlen(key);
    for (int i = 0; i < n; i++) {
        size_t len = strcspn(p, ",}");
        if (len >= cap) len = cap - 1;
        memcpy(out + (size_t)i * cap, p, len);
        out[(size_t)i * cap + len] = 0;
        p += strcspn(p, ",}");
        if (*p == ',') p++;
        while (*p == ' ') p++;
    }
    return 1;
}

/* The calls in src, up to max; returns how many */
static int gen_calls(const char *src, gen_call *out, int max) {
    int n = 0;
    for (const char *at = src; n < max && (at = strstr(at, "const kg_call c = {")); at++) {
        const char *c = at;
        while (c > src && strncmp(c, "/* ", 3)) c--;
        gen_call *g = &out[n];
        memset(g, 0, sizeof *g);
        int id;
        if (sscanf(c, "/* %d %31s */", &id, g->op) != 2) continue;
        char f[KG_MAX_SRC + 1][96];
        if (!gen_fields(at, ".src = {", KG_MAX_SRC, &f[0][0], sizeof f[0])) continue;
        for (int s = 0; s < KG_MAX_SRC; s++) g->absent[s] = !strcmp(f[s], "0");
        if (!gen_fields(at, ".fmt = {", KG_MAX_SRC + 1, &f[0][0], sizeof f[0])) continue;
        for (int s = 0; s <= KG_MAX_SRC; s++) g->fmt[s] = f[s][0] - '0';
        if (!gen_fields(at, ".ip = {", 4, &g->ip[0][0], sizeof g->ip[0])) continue;
        n++;
    }
    return n;
}

#endif
