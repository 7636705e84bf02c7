/* manifest.c - a package manifest's text into a checked kx_manifest
 * (manifest.h). Nothing here touches the file system or the kernels, so a
 * fuzz harness links this file with base and cJSON alone. package.c calls
 * it only after the manifest's signature has been verified; the checks here
 * still assume the worst of every byte (a manifest is also read by `kiln
 * package ls` and by the fuzzer), so a bad field is KILN_ERR_CORRUPT naming
 * the field, never undefined behaviour. */
#define _GNU_SOURCE
#include "compile/manifest.h"

#include "base/base.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PKG_MAGIC "kiln-package"
#define MANIFEST_MAX (64u << 20) /* a real manifest is well under 1 MiB */

const char *kx_place_name(kx_place_kind k) {
    static const char *names[] = {"none", "arena", "input", "output", "weight", "const"};
    return (unsigned)k <= KX_CONST ? names[k] : "?";
}

void kx_manifest_free(kx_manifest *m) {
    if (!m) return;
    for (int i = 0; m->w && i < m->nw; i++) free(m->w[i].name);
    free(m->w);
    free(m->place);
    free(m);
}

/* j as an integer in [lo, hi]. The range is checked on the double before
 * the cast (casting a double outside int64_t is undefined) and a value with
 * a fraction is refused rather than truncated. */
static int as_int(const cJSON *j, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= (double)lo && v <= (double)hi)) return 0; /* NaN fails too */
    int64_t i = (int64_t)v;
    if ((double)i != v) return 0;
    *out = i;
    return 1;
}

static int get_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    return as_int(cJSON_GetObjectItemCaseSensitive(o, key), lo, hi, out);
}

static const char *get_str(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) && j->valuestring ? j->valuestring : NULL;
}

/* an optional list: absent is empty, anything else must be an array */
static int get_list(const cJSON *o, const char *key, const cJSON **out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = j;
    return !j || cJSON_IsArray(j);
}

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* The largest |value| of e over the symbols' ranges: sum over monomials of
 * |c| * prod hi (every symbol is >= 1, so each partial product kx_eval
 * forms is no larger). 0 when it overflows the bound kx_solve relies on
 * (2^62: sums and differences of two such values stay inside int64_t). */
static int expr_bounded(const kx_expr *e, const kx_sym *sym, int nsym) {
    int64_t total = 0;
    for (int m = 0; m < KX_NMONO; m++) {
        if (!e->c[m]) continue;
        if (m >> nsym) return 0; /* a factor the manifest has no symbol for */
        int64_t t = e->c[m] < 0 ? -e->c[m] : e->c[m]; /* |c| <= 2^32: no overflow */
        for (int i = 0; i < nsym; i++)
            if (m >> i & 1 && __builtin_mul_overflow(t, sym[i].hi, &t)) return 0;
        if (__builtin_add_overflow(total, t, &total) || total > (1LL << 62)) return 0;
    }
    return 1;
}

static kiln_status parse(kx_manifest *p, const cJSON *m, const char *path) {
#define BAD(fmt, ...) return kb_fail(KILN_ERR_CORRUPT, "package %s: manifest " fmt, path, ##__VA_ARGS__)
    const char *fmt = get_str(m, "format");
    const cJSON *e;
    int64_t v = 0;
    if (!cJSON_IsObject(m) || !fmt || strcmp(fmt, PKG_MAGIC)) BAD("is not a kiln package manifest");
    const cJSON *fv = cJSON_GetObjectItemCaseSensitive(m, "format_version"), *abi = cJSON_GetObjectItemCaseSensitive(m, "abi");
    if (!cJSON_IsNumber(fv) || fv->valuedouble != KX_FORMAT_VERSION)
        return kb_fail(KILN_ERR_UNSUPPORTED, "package %s: format version %g, this kiln reads %d", path,
                       cJSON_IsNumber(fv) ? fv->valuedouble : 0.0, KX_FORMAT_VERSION);
    if (!cJSON_IsNumber(abi) || abi->valuedouble != KX_ABI)
        return kb_fail(KILN_ERR_UNSUPPORTED, "package %s: runtime ABI %g, this kiln has %d", path,
                       cJSON_IsNumber(abi) ? abi->valuedouble : 0.0, KX_ABI);
    const char *sha = get_str(m, "library_sha256");
    if (!sha || !is_hex64(sha)) BAD("has no library_sha256 (64 lowercase hex digits)");
    snprintf(p->so_sha, sizeof p->so_sha, "%s", sha);

    const cJSON *cpu, *syms, *ins, *pl, *ws;
    if (!get_list(m, "cpu_features", &cpu)) BAD("has a cpu_features that is not a list");
    cJSON_ArrayForEach(e, cpu) {
        if (!cJSON_IsString(e) || p->n_cpu >= 4 || strlen(e->valuestring) >= sizeof p->cpu[0])
            BAD("has a bad cpu_features list (at most 4 names of under %zu characters)", sizeof p->cpu[0]);
        snprintf(p->cpu[p->n_cpu++], sizeof p->cpu[0], "%s", e->valuestring);
    }

    /* symbols: 1 <= min <= max <= KX_SYM_MAX, as kx_export_graph makes them */
    if (!get_list(m, "symbols", &syms)) BAD("has symbols that are not a list");
    cJSON_ArrayForEach(e, syms) {
        int64_t lo, hi;
        const char *name = get_str(e, "name");
        if (p->nsym >= KX_MAX_SYMS) BAD("has more than %d symbols", KX_MAX_SYMS);
        if (!name || !*name || strlen(name) >= sizeof p->sym[0].name) BAD("has a symbol without a name (under 16 characters)");
        if (!get_int(e, "min", 1, KX_SYM_MAX, &lo) || !get_int(e, "max", 1, KX_SYM_MAX, &hi) || lo > hi)
            BAD("symbol %s needs integers 1 <= min <= max <= %lld", name, (long long)KX_SYM_MAX);
        kx_sym *s = &p->sym[p->nsym++];
        snprintf(s->name, sizeof s->name, "%s", name);
        s->lo = lo;
        s->hi = hi;
    }

    /* inputs: a slot each (distinct, < the number of inputs) and at most 4
     * dimensions, each 16 integer coefficients */
    if (!get_list(m, "inputs", &ins)) BAD("has inputs that are not a list");
    cJSON_ArrayForEach(e, ins) {
        const char *name = get_str(e, "name");
        const cJSON *coef = cJSON_GetObjectItemCaseSensitive(e, "coef"), *c;
        if (p->n_in >= KX_MAX_IN) BAD("has more than %d inputs", KX_MAX_IN);
        if (!name || strlen(name) >= sizeof p->in[0].name) BAD("has an input without a name (under 48 characters)");
        if (!get_int(e, "slot", 0, KX_MAX_IN - 1, &v)) BAD("input %s has a slot that is not an integer in [0, %d]", name, KX_MAX_IN - 1);
        if (!cJSON_IsArray(coef) || cJSON_GetArraySize(coef) > 4) BAD("input %s has a bad coef list (at most 4 dimensions)", name);
        kx_iospec *io = &p->in[p->n_in];
        p->in_slot[p->n_in++] = (int)v;
        snprintf(io->name, sizeof io->name, "%s", name);
        cJSON_ArrayForEach(c, coef) {
            if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != KX_NMONO)
                BAD("input %s dimension %d needs %d coefficients", name, io->ndim, KX_NMONO);
            int k = 0;
            const cJSON *x;
            cJSON_ArrayForEach(x, c) {
                if (!as_int(x, -KX_COEF_MAX, KX_COEF_MAX, &io->dim[io->ndim].c[k++]))
                    BAD("input %s dimension %d has a coefficient that is not an integer of magnitude <= 2^32", name, io->ndim);
            }
            if (!expr_bounded(&io->dim[io->ndim], p->sym, p->nsym))
                BAD("input %s dimension %d names a symbol the manifest lacks or exceeds 2^62 at the largest shape", name,
                    io->ndim);
            io->ndim++;
        }
    }
    for (int i = 0; i < p->n_in; i++) {
        if (p->in_slot[i] >= p->n_in) BAD("input %s has slot %d, but there are %d inputs", p->in[i].name, p->in_slot[i], p->n_in);
        for (int j = 0; j < i; j++)
            if (p->in_slot[i] == p->in_slot[j]) BAD("inputs %s and %s share slot %d", p->in[j].name, p->in[i].name, p->in_slot[i]);
    }

    /* outputs: by name, in slot order */
    const cJSON *outs;
    if (!get_list(m, "outputs", &outs)) BAD("has outputs that are not a list");
    cJSON_ArrayForEach(e, outs) {
        const char *name = get_str(e, "name");
        if (p->n_out >= KX_MAX_OUT) BAD("has more than %d outputs", KX_MAX_OUT);
        if (!name || !*name || strlen(name) >= sizeof p->out_name[0]) BAD("has an output without a name (under 48 characters)");
        for (int j = 0; j < p->n_out; j++)
            if (!strcmp(p->out_name[j], name)) BAD("names output %s twice", name);
        snprintf(p->out_name[p->n_out++], sizeof p->out_name[0], "%s", name);
    }
    if (!p->n_out) BAD("has no outputs");

    if (!get_int(m, "arena_bytes", 0, KX_ARENA_MAX, &v)) BAD("has no arena_bytes (an integer in [0, 2^46])");
    p->arena_bytes = (size_t)v;
    if (!get_int(m, "const_bytes", 0, KX_ARENA_MAX, &v)) BAD("has no const_bytes (an integer in [0, 2^46])");
    p->const_bytes = (size_t)v;

    /* placements: one per node; an arena offset inside the arena, an input
     * or output slot the forward has, a weight index checked below */
    if (!get_list(m, "placement", &pl)) BAD("has a placement that is not a list");
    int n = cJSON_GetArraySize(pl);
    if (n > KX_NODES_MAX) BAD("has %d placements (at most %d)", n, KX_NODES_MAX);
    if (!(p->place = calloc((size_t)n + 1, sizeof *p->place))) return kb_fail(KILN_ERR_NOMEM, "package %s: out of memory", path);
    p->n_nodes = n;
    int i = 0;
    cJSON_ArrayForEach(e, pl) {
        const cJSON *k = cJSON_GetArrayItem(e, 0), *at = cJSON_GetArrayItem(e, 1);
        int kind = -1;
        for (int q = KX_NONE; q <= KX_CONST && cJSON_IsString(k); q++)
            if (!strcmp(k->valuestring, kx_place_name((kx_place_kind)q))) kind = q;
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || kind < 0 || !as_int(at, 0, KX_ARENA_MAX, &v))
            BAD("has a bad placement for node %d (needs [kind, integer >= 0])", i);
        if (kind == KX_ARENA && (size_t)v >= p->arena_bytes)
            BAD("places node %d at %lld, outside the arena of %zu bytes", i, (long long)v, p->arena_bytes);
        if (kind == KX_CONST && (size_t)v >= p->const_bytes)
            BAD("places constant %d at %lld, outside the constants' %zu bytes", i, (long long)v, p->const_bytes);
        if ((kind == KX_INPUT && v >= p->n_in) || (kind == KX_OUTPUT && v >= p->n_out))
            BAD("names an input or output slot the forward does not have (node %d, slot %lld)", i, (long long)v);
        p->place[i++] = (kx_place){(kx_place_kind)kind, v};
    }

    /* weights: weight k sits at a node placed as ["weight", k] */
    if (!get_list(m, "weights", &ws)) BAD("has weights that are not a list");
    int nw = cJSON_GetArraySize(ws);
    if (nw > n) BAD("has %d weights for %d nodes", nw, n);
    if (!(p->w = calloc((size_t)nw + 1, sizeof *p->w))) return kb_fail(KILN_ERR_NOMEM, "package %s: out of memory", path);
    i = 0;
    cJSON_ArrayForEach(e, ws) {
        kx_pkg_weight *w = &p->w[i];
        const char *name = get_str(e, "name"), *view = get_str(e, "view"), *dt = get_str(e, "dtype"),
                   *layout = get_str(e, "layout");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape"), *d;
        if (!name || !*name || !view || !dt || !layout || strlen(layout) >= sizeof w->layout)
            BAD("weight %d needs a name, view, dtype and layout", i);
        if (!get_int(e, "node", 0, n - 1, &v)) BAD("weight %s has a node that is not an integer in [0, %d)", name, n);
        if (p->place[v].kind != KX_WEIGHT || p->place[v].at != i)
            BAD("weight %s names node %lld, which is not placed as weight %d", name, (long long)v, i);
        if (strcmp(view, "gemm") && strcmp(view, "f32")) BAD("weight %s has view '%s' (gemm or f32)", name, view);
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > 4) BAD("weight %s needs a shape of at most 4 dimensions", name);
        if (!(w->name = kb_strdup(name))) return KILN_ERR_NOMEM;
        p->nw = ++i; /* freed from here on */
        w->node = (int)v;
        w->gemm = !strcmp(view, "gemm");
        w->dtype = kt_dtype_from_name(dt);
        if (w->dtype == KILN_DTYPE_INVALID) BAD("weight %s has dtype '%s', which this kiln does not know", name, dt);
        snprintf(w->layout, sizeof w->layout, "%s", layout);
        int64_t elems = 1;
        cJSON_ArrayForEach(d, shape) {
            int64_t x;
            if (!as_int(d, 0, KX_DIM_MAX, &x) || __builtin_mul_overflow(elems, x, &elems) || elems > KX_DIM_MAX)
                BAD("weight %s has a shape that is not integers in [0, 2^40] with a product <= 2^40", name);
            w->shape[w->ndim++] = x;
        }
    }
    int placed = 0;
    for (int k = 0; k < n; k++) placed += p->place[k].kind == KX_WEIGHT;
    if (placed != nw) BAD("places %d weights but lists %d", placed, nw);

    size_t len = 0;
    for (int s = 0; s < p->nsym; s++) {
        const kx_sym *y = &p->sym[s];
        if (y->lo == y->hi) snprintf(p->summary + len, sizeof p->summary - len, "%s%s=%lld", s ? " " : "", y->name, (long long)y->lo);
        else snprintf(p->summary + len, sizeof p->summary - len, "%s%s=%lld..%lld", s ? " " : "", y->name, (long long)y->lo, (long long)y->hi);
        len = strlen(p->summary);
    }
    const char *mode = get_str(m, "mode"), *dtype = get_str(m, "dtype");
    snprintf(p->summary + len, sizeof p->summary - len, "  %.24s %.24s", dtype ? dtype : "?", mode ? mode : "?");
    return KILN_OK;
#undef BAD
}

kiln_status kx_manifest_parse(const char *text, size_t len, const char *label, kx_manifest **out) {
    *out = NULL;
    if (!label) label = "(manifest)";
    if (len > MANIFEST_MAX) return kb_fail(KILN_ERR_CORRUPT, "package %s: manifest of %zu bytes (at most %u)", label, len, MANIFEST_MAX);
    kx_manifest *p = kb_calloc(1, sizeof *p);
    if (!p) return KILN_ERR_NOMEM;
    cJSON *m = cJSON_ParseWithLength(text, len);
    kiln_status st = m ? parse(p, m, label) : kb_fail(KILN_ERR_CORRUPT, "package %s: manifest is not valid JSON", label);
    cJSON_Delete(m);
    if (st) {
        kx_manifest_free(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

/* The shared object carries the digest of the manifest it was generated
 * with, so a manifest edited after the build (a guard widened, a placement
 * moved, a weight view swapped) is refused even with a valid signature. */
void kx_manifest_digest(const kx_manifest *p, char hex[65]) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        memset(hex, '0', 64);
        hex[64] = 0;
        return;
    }
    for (int i = 0; i < p->nsym; i++) fprintf(f, "s %s %lld %lld\n", p->sym[i].name, (long long)p->sym[i].lo, (long long)p->sym[i].hi);
    for (int i = 0; i < p->n_in; i++) {
        fprintf(f, "i %s %d %d", p->in[i].name, p->in_slot[i], p->in[i].ndim);
        for (int d = 0; d < p->in[i].ndim; d++)
            for (int k = 0; k < KX_NMONO; k++) fprintf(f, " %lld", (long long)p->in[i].dim[d].c[k]);
        fprintf(f, "\n");
    }
    fprintf(f, "a %zu %zu %d\n", p->arena_bytes, p->const_bytes, p->n_nodes);
    for (int i = 0; i < p->n_nodes; i++) fprintf(f, "%d:%lld ", (int)p->place[i].kind, (long long)p->place[i].at);
    for (int i = 0; i < p->nw; i++) {
        const kx_pkg_weight *w = &p->w[i];
        fprintf(f, "\nw %s %d %d %d %s %d", w->name, w->node, w->gemm, (int)w->dtype, w->layout, w->ndim);
        for (int d = 0; d < w->ndim; d++) fprintf(f, " %lld", (long long)w->shape[d]);
    }
    fclose(f);
    kb_sha256(buf, len, hex);
    free(buf);
}
