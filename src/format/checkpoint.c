/* checkpoint.c - diffusers folders and single-file checkpoints, renamed to
 * diffusers names as zero-copy views. */
#include "format/checkpoint.h"

#include "base/base.h"
#include "tensor/dtype.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    kc_tensor *t;
    size_t n, cap;
} tlist;

static kiln_status tl_push(tlist *l, const char *name, const st_tensor *src) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        kc_tensor *nt = realloc(l->t, cap * sizeof *nt);
        if (!nt) return kb_fail(KILN_ERR_NOMEM, "out of memory listing tensors");
        l->t = nt;
        l->cap = cap;
    }
    kc_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->name = kb_strdup(name);
    if (!t->name) return KILN_ERR_NOMEM;
    t->source_name = src->name;
    t->dtype = src->dtype;
    t->ndim = src->ndim;
    memcpy(t->shape, src->shape, sizeof t->shape);
    t->part[0] = src->data;
    t->part_bytes[0] = src->nbytes;
    l->n++;
    return KILN_OK;
}

int64_t kc_numel(const kc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* ---- a family's original names (its renamer) --------------------------------- */

/* Swap the two halves along dim 0: bytes become part[1] ++ part[0]. */
static kiln_status swap_halves(kc_tensor *t) {
    size_t total = t->part_bytes[0];
    if (t->ndim < 1 || t->shape[0] % 2)
        return kb_fail(KILN_ERR_SHAPE, "%s: cannot swap the two halves of an odd first dim", t->source_name);
    size_t half = total / 2;
    t->part[1] = t->part[0];
    t->part_bytes[1] = half;
    t->part[0] = t->part[0] + half;
    t->part_bytes[0] = half;
    return KILN_OK;
}

/* One original tensor as r says: renamed, split in r->n along dim 0 (in
 * equal parts or by r->ratio), swapped. */
static kiln_status apply_rename(tlist *l, const kc_rename *r, const st_tensor *src) {
    int n = r->n < 1 ? 1 : r->n;
    if (n > KC_RENAME_MAX) return kb_fail(KILN_ERR_INVALID_ARG, "%s: a rename into %d tensors (at most %d)", src->name, n, KC_RENAME_MAX);
    int units = 0, ratio[KC_RENAME_MAX];
    for (int i = 0; i < n; i++) {
        units += ratio[i] = r->ratio[0] ? r->ratio[i] : 1;
        if (ratio[i] < 1) return kb_fail(KILN_ERR_INVALID_ARG, "%s: part %d of a rename has no rows", src->name, i);
    }
    if (n > 1 && (src->ndim < 1 || units < 1 || src->shape[0] % units))
        return kb_fail(KILN_ERR_SHAPE, "%s: fused first dim %lld is not a multiple of %d", src->name,
                       src->ndim ? (long long)src->shape[0] : 0LL, units);
    int64_t unit_rows = n > 1 ? src->shape[0] / units : 0;
    size_t row_bytes = n > 1 && src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0, at = 0;
    for (int i = 0; i < n; i++) {
        kiln_status st = tl_push(l, r->to[i], src);
        if (st) return st;
        kc_tensor *t = &l->t[l->n - 1];
        while (r->squeeze && t->ndim > 1 && t->shape[t->ndim - 1] == 1) t->shape[--t->ndim] = 0;
        if (n > 1) {
            t->shape[0] = unit_rows * ratio[i];
            t->part[0] = (const uint8_t *)src->data + at;
            t->part_bytes[0] = row_bytes * (size_t)t->shape[0];
            at += t->part_bytes[0];
        }
        if (r->swap && (st = swap_halves(t))) return st;
    }
    return KILN_OK;
}

/* ---- open ----------------------------------------------------------------- */

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const kc_tensor *)a)->name, ((const kc_tensor *)b)->name);
}

kiln_status kc_find_weights(const char *dir, char **out) {
    static const char *names[] = {
        "diffusion_pytorch_model.safetensors.index.json",
        "diffusion_pytorch_model.safetensors",
        "model.safetensors.index.json",
        "model.safetensors",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *p = kb_path_join(dir, names[i]);
        if (!p) return KILN_ERR_NOMEM;
        if (kb_is_file(p)) {
            *out = p;
            return KILN_OK;
        }
        free(p);
    }
    return kb_fail(KILN_ERR_MISSING,
                   "%s: no weights found (looked for diffusers' diffusion_pytorch_model.safetensors and "
                   "transformers' model.safetensors, each also as .index.json shards)", dir);
}

/* Name the raw tensors the diffusers way (a family's renamer maps original names),
 * sort them and reject duplicates. Views only: nothing is copied. */
/* A name under prefix (plen bytes; 0: every name), as the renamers see it:
 * the prefix stripped; NULL when it is not under it, or is a position_ids
 * buffer of a component (transformers' CLIP saves them in older files). */
static const char *part_name(const char *name, const char *prefix, size_t plen) {
    if (!plen) return name;
    if (strncmp(name, prefix, plen)) return NULL;
    const char *s = name + plen;
    size_t l = strlen(s);
    if (!l || (l >= 12 && !strcmp(s + l - 12, "position_ids"))) return NULL;
    return s;
}

static kiln_status kc_build(kc_checkpoint *c, const st_tensor *const *all, size_t nall,
                            const kc_renamer *const *renamers, const char *prefix) {
    tlist l = {0};
    kiln_status st = KILN_OK;
    const kc_renamer *ren = NULL;
    int64_t state[4] = {0};
    size_t plen = prefix ? strlen(prefix) : 0, nraw = 0;
    const char **names = kb_calloc(nall ? nall : 1, sizeof *names);
    const st_tensor **raw = kb_calloc(nall ? nall : 1, sizeof *raw);
    if (!names || !raw) {
        free(names);
        free(raw);
        return KILN_ERR_NOMEM;
    }
    for (size_t i = 0; i < nall; i++) {
        const char *n = part_name(all[i]->name, prefix, plen);
        if (!n) continue;
        names[nraw] = n;
        raw[nraw++] = all[i];
    }
    if (plen && !nraw) {
        free(names);
        free(raw);
        return kb_fail(KILN_ERR_MISSING, "%s holds no tensor under %s (the component is not in the file)", c->path,
                       prefix);
    }
    if (plen) { /* the component's bytes, not the file's */
        c->bytes_on_disk = 0;
        for (size_t i = 0; i < nraw; i++) c->bytes_on_disk += (int64_t)raw[i]->nbytes;
    }
    for (size_t k = 0; renamers && renamers[k] && !ren; k++) {
        memset(state, 0, sizeof state);
        if (renamers[k]->detect(names, nraw, state)) ren = renamers[k];
    }
    c->layout = ren ? ren->layout : "diffusers";
    for (size_t i = 0; i < nraw && !st; i++) {
        kc_rename r;
        memset(&r, 0, sizeof r);
        if (ren && ren->rename(state, names[i], &r)) {
            if (!r.drop) st = apply_rename(&l, &r, raw[i]);
        } else {
            st = tl_push(&l, names[i], raw[i]);
        }
    }
    free(names);
    free(raw);
    c->t = l.t;
    c->n = l.n;
    if (st) return st;
    /* a file with no tensors leaves c->t NULL, which qsort may not take */
    if (c->n) qsort(c->t, c->n, sizeof *c->t, cmp_tensor);
    for (size_t i = 1; i < c->n; i++)
        if (!strcmp(c->t[i].name, c->t[i - 1].name))
            return kb_fail(KILN_ERR_FORMAT, "%s: tensor %s appears twice (as %s and %s)", c->path,
                           c->t[i].name, c->t[i - 1].source_name, c->t[i].source_name);
    return KILN_OK;
}

kiln_status kc_open(const char *path, const char *config_path, const kc_renamer *const *renamers,
                    kc_checkpoint **out) {
    return kc_open_part(path, NULL, config_path, NULL, renamers, out);
}

kiln_status kc_open_part(const char *path, const char *prefix, const char *config_path, const char *config_json,
                         const kc_renamer *const *renamers, kc_checkpoint **out) {
    *out = NULL;
    kc_checkpoint *c = kb_calloc(1, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    char *weights = NULL;
    c->path = kb_strdup(path);
    if (!c->path) {
        st = KILN_ERR_NOMEM;
        goto fail;
    }
    if (kb_is_dir(path)) {
        if ((st = kc_find_weights(path, &weights))) goto fail;
        if (!config_path && !config_json) {
            char *cp = kb_path_join(path, "config.json");
            if (!cp) {
                st = KILN_ERR_NOMEM;
                goto fail;
            }
            struct stat cst;
            if (stat(cp, &cst) == 0 && !S_ISREG(cst.st_mode)) { /* a FIFO, a device, a folder */
                st = kb_fail(KILN_ERR_IO, "%s is not a regular file", cp);
                free(cp);
                goto fail;
            }
            if (!kb_is_file(cp)) {
                st = kb_fail(KILN_ERR_MISSING, "%s: no config.json in the model folder", path);
                free(cp);
                goto fail;
            }
            st = kb_read_file(cp, &c->config_json, NULL);
            free(cp);
            if (st) goto fail;
        }
    } else if (kb_is_file(path)) {
        weights = kb_strdup(path);
    } else {
        st = kb_fail(KILN_ERR_IO, "%s: no such file or folder", path);
        goto fail;
    }
    if (config_json && !(c->config_json = kb_strdup(config_json))) {
        st = KILN_ERR_NOMEM;
        goto fail;
    }
    if (!config_json && config_path && (st = kb_read_file(config_path, &c->config_json, NULL))) goto fail;
    if ((st = st_set_open(weights, &c->set))) goto fail;
    c->bytes_on_disk = st_set_bytes(c->set);
    size_t nraw = st_set_count(c->set);
    const st_tensor **raw = kb_calloc(nraw ? nraw : 1, sizeof *raw);
    if (!raw) {
        st = KILN_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < nraw; i++) raw[i] = st_set_at(c->set, i);
    st = kc_build(c, raw, nraw, renamers, prefix);
    free(raw);
    if (st) goto fail;
    free(weights);
    *out = c;
    return KILN_OK;
fail:
    free(weights);
    kc_close(c);
    return st;
}

void kc_close(kc_checkpoint *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) free(c->t[i].name);
    free(c->t);
    st_set_close(c->set);
    for (size_t i = 0; i < c->n_owned; i++) {
        free((char *)c->owned[i].name);
        free((void *)c->owned[i].data);
    }
    free(c->owned);
    free(c->config_json);
    free(c->path);
    free(c);
}

const kc_tensor *kc_find(const kc_checkpoint *c, const char *name) {
    kc_tensor key = {.name = (char *)name};
    if (!c->n) return NULL; /* c->t may be NULL, which bsearch may not take */
    return bsearch(&key, c->t, c->n, sizeof *c->t, cmp_tensor);
}

kiln_status kc_read_f32(const kc_tensor *t, float *out) {
    size_t esz = kiln_dtype_size(t->dtype);
    if (!kt_dtype_is_float_source(t->dtype))
        return kb_fail(KILN_ERR_DTYPE, "%s: dtype %s cannot be used as weights (F32, F16, BF16)",
                       t->source_name, kiln_dtype_name(t->dtype));
    size_t done = 0;
    for (int p = 0; p < 2; p++) {
        if (!t->part_bytes[p]) continue;
        kiln_status s = kt_to_f32(t->dtype, t->part[p], out + done, t->part_bytes[p] / esz);
        if (s) return s;
        done += t->part_bytes[p] / esz;
    }
    return KILN_OK;
}

/* ---- a callback source ------------------------------------------------------- */

static kiln_status collect(void *ctx, const kiln_source_tensor *t) {
    kc_checkpoint *c = ctx;
    if (!t || !t->name || !*t->name) return kb_fail(KILN_ERR_INVALID_ARG, "source emitted a tensor without a name");
    size_t esz = kiln_dtype_size(t->dtype);
    if (!esz) return kb_fail(KILN_ERR_DTYPE, "source tensor %s has an invalid dtype", t->name);
    if (t->ndim < 0 || t->ndim > KILN_MAX_DIMS)
        return kb_fail(KILN_ERR_SHAPE, "source tensor %s has %d dims", t->name, t->ndim);
    size_t n = esz;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || !kb_mul_ok(n, (size_t)t->shape[i], &n))
            return kb_fail(KILN_ERR_SHAPE, "source tensor %s has an impossible shape", t->name);
    if (n && !t->data) return kb_fail(KILN_ERR_INVALID_ARG, "source tensor %s has no data", t->name);
    if (c->n_owned % 64 == 0) {
        st_tensor *no = realloc(c->owned, (c->n_owned + 64) * sizeof *no);
        if (!no) return kb_fail(KILN_ERR_NOMEM, "out of memory collecting source tensors");
        c->owned = no;
    }
    st_tensor *o = &c->owned[c->n_owned];
    memset(o, 0, sizeof *o);
    void *copy = kb_malloc(n);
    o->name = kb_strdup(t->name);
    if (!copy || !o->name) {
        free(copy);
        free((char *)o->name);
        return KILN_ERR_NOMEM;
    }
    if (n) memcpy(copy, t->data, n);
    o->data = copy;
    o->nbytes = n;
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) o->shape[i] = t->shape[i];
    c->n_owned++;
    c->bytes_on_disk += (int64_t)n;
    return KILN_OK;
}

kiln_status kc_from_source(kiln_source_fn fn, void *user, const char *config_json, const char *name,
                           const kc_renamer *const *renamers, kc_checkpoint **out) {
    *out = NULL;
    kc_checkpoint *c = kb_calloc(1, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    c->path = kb_strdup(name ? name : "source callback");
    c->config_json = config_json ? kb_strdup(config_json) : NULL;
    kiln_status st = !c->path || (config_json && !c->config_json) ? KILN_ERR_NOMEM : KILN_OK;
    if (!st) {
        st = fn(user, collect, c);
        if (st) st = kb_wrap(st, "%s", c->path);
    }
    const st_tensor **raw = NULL;
    if (!st && !(raw = kb_calloc(c->n_owned ? c->n_owned : 1, sizeof *raw))) st = KILN_ERR_NOMEM;
    for (size_t i = 0; !st && i < c->n_owned; i++) raw[i] = &c->owned[i];
    if (!st) st = kc_build(c, raw, c->n_owned, renamers, NULL);
    free(raw);
    if (st) {
        kc_close(c);
        return st;
    }
    *out = c;
    return KILN_OK;
}

void kc_release(const kc_checkpoint *c, const kc_tensor *t) {
    if (!c || !t || c->n_owned) return; /* owned copies are heap memory */
    for (int i = 0; i < 2; i++) kb_drop_pages(t->part[i], t->part_bytes[i]);
}
