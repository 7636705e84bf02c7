/* vae_decode.c - the VAE between latents and pictures: decode (the
 * pipeline's scaling undone from the config's factors), tiled as diffusers'
 * AutoencoderKL.tiled_decode when the untiled activations would pass a
 * memory budget, each tile one kiln_run of the decoder model; PNG files of
 * the batch; encode of an RGB image to the pipeline's latents. */
#include "pipeline/vae_decode.h"

#include "base/base.h"
#include "model/model.h"
#include "pipeline/image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_OVERLAP 0.25 /* diffusers' tile_overlap_factor */

kiln_status kv_tiling_for(const vae_config *c, int64_t ts, kv_tiling *t) {
    int64_t f = vae_scale(c);
    if (ts < 4 * f || ts % (4 * f) || ts > (int64_t)VAE_MAX_SIDE * f)
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "VAE tile size %lld: a tile must be a positive multiple of %lld pixels (4 x the VAE's factor %lld, "
                       "so that diffusers' overlapping tiles cover the image exactly), at most %lld",
                       (long long)ts, (long long)(4 * f), (long long)f, (long long)VAE_MAX_SIDE * f);
    t->tile_sample = ts;
    t->tile_latent = ts / f; /* int(sample_size / 2 ** (len(block_out_channels) - 1)) */
    t->overlap = (int64_t)((double)t->tile_latent * (1 - KV_OVERLAP));
    t->blend = (int64_t)((double)ts * KV_OVERLAP);
    t->row_limit = ts - t->blend;
    return KILN_OK;
}

static inline int64_t min3(int64_t a, int64_t b, int64_t c) { return a < b ? (a < c ? a : c) : (b < c ? b : c); }

void kv_blend_v(const float *a, int64_t ah, float *b, int64_t bh, int64_t BC, int64_t w, int64_t extent) {
    int64_t e = min3(ah, bh, extent);
    for (int64_t y = 0; y < e; y++) {
        /* torch: tensor * python float -> the scalar as f32, the product in f32 */
        float wa = (float)(1.0 - (double)y / (double)e), wb = (float)((double)y / (double)e);
        for (int64_t k = 0; k < BC; k++) {
            const float *ar = a + ((size_t)k * (size_t)ah + (size_t)(ah - e + y)) * (size_t)w;
            float *br = b + ((size_t)k * (size_t)bh + (size_t)y) * (size_t)w;
            for (int64_t x = 0; x < w; x++) {
                float pa = ar[x] * wa, pb = br[x] * wb;
                br[x] = pa + pb;
            }
        }
    }
}

void kv_blend_h(const float *a, int64_t aw, float *b, int64_t bw, int64_t BC, int64_t h, int64_t extent) {
    int64_t e = min3(aw, bw, extent);
    for (int64_t x = 0; x < e; x++) {
        float wa = (float)(1.0 - (double)x / (double)e), wb = (float)((double)x / (double)e);
        for (int64_t k = 0; k < BC * h; k++) {
            const float *ar = a + (size_t)k * (size_t)aw;
            float *br = b + (size_t)k * (size_t)bw;
            float pa = ar[aw - e + x] * wa, pb = br[x] * wb;
            br[x] = pa + pb;
        }
    }
}

/* Peak activations of a decode, f32 (activations stay f32 in bf16 too):
 * at each level L of the decoder (L = 0 the image's size, side (h f) / 2^L)
 * about four live tensors of the widest channel count there (a resnet's
 * input, its normed input, a conv's output, the shortcut; at a level below
 * the top the upsampled input has the wider channels of the level below),
 * and at the lowest level the mid-block attention's [h w, h w] scores. */
uint64_t kv_decode_bytes(const vae_config *c, int64_t B, int64_t h, int64_t w) {
    int n = c->n_blocks;
    int64_t f = vae_scale(c);
    double peak = 0;
    for (int L = 0; L < n; L++) {
        int64_t cm = c->block_out_channels[L];
        if (L + 1 < n && c->block_out_channels[L + 1] > cm) cm = c->block_out_channels[L + 1];
        double side_h = (double)(h * f) / (double)((int64_t)1 << L), side_w = (double)(w * f) / (double)((int64_t)1 << L);
        double b = 4.0 * 4.0 * (double)B * (double)cm * side_h * side_w;
        if (L == n - 1 && c->mid_block_add_attention) b += 4.0 * (double)B * (double)(h * w) * (double)(h * w);
        if (b > peak) peak = b;
    }
    return peak > 1.8e19 ? UINT64_MAX : (uint64_t)peak;
}

/* ---- models ---------------------------------------------------------- */

static kiln_status vae_cfg(const kiln_model *m, const char *want, const vae_config **out) {
    if (!m) return kb_fail(KILN_ERR_INVALID_ARG, "a VAE model is required");
    const char *fam = kiln_model_family(m);
    if (strcmp(fam, "vae-decoder") && strcmp(fam, "vae-encoder"))
        return kb_fail(KILN_ERR_INVALID_ARG, "the model is a %s, not a VAE (family %s)", fam, want);
    if (want && strcmp(fam, want))
        return kb_fail(KILN_ERR_INVALID_ARG, "the VAE model is opened as %s; this needs %s (kiln_vae_open's family)", fam,
                       want);
    *out = m->cfg;
    return KILN_OK;
}

kiln_status kiln_vae_open(const char *path, const kiln_load_opts *base, const char *family, kiln_model **out) {
    if (!path || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_open: a path and out are required");
    *out = NULL;
    if (!family) family = "vae-decoder";
    if (strcmp(family, "vae-decoder") && strcmp(family, "vae-encoder"))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_open: family %s is no VAE family (vae-decoder, vae-encoder)", family);
    /* a pipeline folder: its vae/ */
    char *sub = kb_path_join(path, "vae"), *subcfg = sub ? kb_path_join(sub, "config.json") : NULL;
    if (!subcfg) {
        free(sub);
        return KILN_ERR_NOMEM;
    }
    const char *dir = kb_is_file(subcfg) ? sub : path;
    if (!kb_is_dir(dir) && !kb_is_file(dir)) {
        free(sub), free(subcfg);
        return kb_fail(KILN_ERR_IO, "VAE %s: no such folder (a VAE folder with config.json, or a pipeline folder with vae/)",
                       path);
    }
    kiln_load_opts o = base ? *base : kiln_load_defaults();
    o.source = dir;
    o.source_fn = NULL;
    o.config_path = NULL;
    o.component = "vae";
    o.family = family;
    kiln_status st = kiln_load_model(&o, out);
    if (st) st = kb_wrap(st, "opening the VAE %s as %s", dir, family);
    free(sub), free(subcfg);
    return st;
}

/* ---- options and plans ------------------------------------------------ */

kiln_vae_opts kiln_vae_defaults(void) {
    kiln_vae_opts o = {.tile = KILN_VAE_TILE_AUTO};
    return o;
}

kiln_status kiln_vae_parse_tile(const char *s, kiln_vae_opts *o) {
    if (!s || !o) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_parse_tile: a value and options are required");
    if (!strcmp(s, "auto")) {
        o->tile = KILN_VAE_TILE_AUTO;
        return KILN_OK;
    }
    if (!strcmp(s, "off")) {
        o->tile = KILN_VAE_TILE_OFF;
        return KILN_OK;
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1 << 20)
        return kb_fail(KILN_ERR_INVALID_ARG, "VAE tiling \"%s\": auto, off or a tile size in pixels (e.g. 512)", s);
    o->tile = KILN_VAE_TILE_ON;
    o->tile_size = (int)v;
    return KILN_OK;
}

kiln_status kiln_vae_parse_memory(const char *s, kiln_vae_opts *o) {
    if (!s || !o) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_parse_memory: a value and options are required");
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (*end && !end[1]) {
        const char *u = strchr("KMGT", *end == 'k' ? 'K' : *end);
        shift = u && *end ? 10 * (int)(u - "KMGT" + 1) : -1;
    } else if (*end) {
        shift = -1;
    }
    if (errno || end == s || s[0] == '-' || shift < 0 || v == 0 || v > (UINT64_MAX >> shift))
        return kb_fail(KILN_ERR_INVALID_ARG, "VAE memory budget \"%s\": a positive number of bytes, optionally with K, M, G or T (e.g. 2G)", s);
    o->memory_budget = (uint64_t)v << shift;
    return KILN_OK;
}

static uint64_t default_budget(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0) return (uint64_t)4 << 30;
    return (uint64_t)pages * (uint64_t)psz / 4;
}

uint64_t kiln_vae_decode_bytes(const kiln_model *vae, int64_t B, int64_t h, int64_t w) {
    if (!vae || (strcmp(kiln_model_family(vae), "vae-decoder") && strcmp(kiln_model_family(vae), "vae-encoder"))) return 0;
    return kv_decode_bytes(vae->cfg, B, h, w);
}

static int64_t n_steps(int64_t len, int64_t step) { return (len + step - 1) / step; }

kiln_status kiln_vae_plan_for(const kiln_model *vae, const int64_t shape[4], const kiln_vae_opts *opts,
                              kiln_vae_plan *plan) {
    const vae_config *c = NULL;
    kiln_status st = vae_cfg(vae, "vae-decoder", &c);
    if (st) return st;
    if (!shape || !plan) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_plan_for: shape and plan are required");
    kiln_vae_opts o = opts ? *opts : kiln_vae_defaults();
    int64_t B = shape[0], C = shape[1], h = shape[2], w = shape[3];
    if (C != c->latent_channels)
        return kb_fail(KILN_ERR_SHAPE, "latents [%lld, %lld, %lld, %lld] have %lld channels; this VAE decodes %d",
                       (long long)B, (long long)C, (long long)h, (long long)w, (long long)C, c->latent_channels);
    if ((st = vae_check_latent(c, B, h, w))) return st;
    memset(plan, 0, sizeof *plan);
    plan->budget = o.memory_budget ? o.memory_budget : default_budget();
    plan->untiled_bytes = kv_decode_bytes(c, B, h, w);
    plan->tiles = 1;
    if (o.tile == KILN_VAE_TILE_OFF || (o.tile == KILN_VAE_TILE_AUTO && plan->untiled_bytes <= plan->budget))
        return KILN_OK;
    int64_t f = vae_scale(c), m = 4 * f;
    int64_t ts = o.tile_size;
    if (!ts) {
        ts = c->sample_size / m * m; /* the config's sample_size, down to a multiple that tiles exactly */
        if (ts < m) ts = m;
    }
    kv_tiling t = {0};
    if ((st = kv_tiling_for(c, ts, &t))) return st;
    /* AUTO with the config's size: halve the tile until one fits the budget */
    while (o.tile == KILN_VAE_TILE_AUTO && !o.tile_size && t.tile_sample / 2 >= m && (t.tile_sample / 2) % m == 0 &&
           kv_decode_bytes(c, B, t.tile_latent, t.tile_latent) > plan->budget)
        if ((st = kv_tiling_for(c, t.tile_sample / 2, &t))) return st;
    /* diffusers tiles only a latent larger than a tile */
    if (h <= t.tile_latent && w <= t.tile_latent) return KILN_OK;
    plan->tiled = 1;
    plan->tile_size = (int)t.tile_sample;
    plan->tile_latent = (int)t.tile_latent;
    plan->tiles = (int)(n_steps(h, t.overlap) * n_steps(w, t.overlap));
    plan->tile_bytes = kv_decode_bytes(c, B, t.tile_latent < h ? t.tile_latent : h, t.tile_latent < w ? t.tile_latent : w);
    return KILN_OK;
}

/* ---- decode ----------------------------------------------------------- */

/* one decoder run: z [B, C, h, w] -> out [B, 3, h f, w f] */
static kiln_status run_decoder(kiln_model *vae, const float *z, int64_t B, int64_t C, int64_t h, int64_t w, float *out,
                               size_t cap) {
    kiln_tensor in = {.name = "latent", .dtype = KILN_F32, .ndim = 4, .shape = {B, C, h, w}, .data = z};
    kiln_output o = {.name = "sample", .data = out, .capacity = cap};
    return kiln_run(vae, &in, 1, &o, 1);
}

/* diffusers' tiled_decode: every tile z[:, :, i : i + tl, j : j + tl] for
 * i, j in range(0, h / w, overlap) decoded; tile (i, j) blended in place
 * with the (already blended) tile above, then the one to its left, and its
 * first row_limit rows and columns kept. Two rows of tiles are held at a
 * time (the one above and the current one), never the whole grid. */
static kiln_status tiled(kiln_model *vae, const vae_config *c, const float *z, const int64_t shape[4],
                         const kv_tiling *t, float *sample) {
    int64_t B = shape[0], C = shape[1], h = shape[2], w = shape[3], f = vae_scale(c), OC = c->out_channels;
    int64_t H = h * f, W = w * f, tl = t->tile_latent, ts = t->tile_sample;
    int64_t nj = n_steps(w, t->overlap);
    size_t tile_cap = (size_t)B * (size_t)OC * (size_t)ts * (size_t)ts;
    float **prev = calloc((size_t)nj, sizeof(float *)), **cur = calloc((size_t)nj, sizeof(float *));
    int64_t *ph = calloc((size_t)nj, sizeof(int64_t)), *chh = calloc((size_t)nj, sizeof(int64_t));
    int64_t *cw = calloc((size_t)nj, sizeof(int64_t));
    float *zt = malloc(sizeof(float) * (size_t)B * (size_t)C * (size_t)tl * (size_t)tl);
    kiln_status st = prev && cur && ph && chh && cw && zt ? KILN_OK : kb_fail(KILN_ERR_NOMEM, "tiled decode: out of memory");
    for (int64_t j = 0; !st && j < nj; j++) {
        prev[j] = malloc(sizeof(float) * tile_cap);
        cur[j] = malloc(sizeof(float) * tile_cap);
        if (!prev[j] || !cur[j]) st = kb_fail(KILN_ERR_NOMEM, "tiled decode: out of memory for %lld tiles", (long long)nj);
    }
    int64_t out_y = 0;
    for (int64_t i = 0, ri = 0; !st && i < h; i += t->overlap, ri++) {
        int64_t th = h - i < tl ? h - i : tl, out_x = 0, keep_h = 0;
        for (int64_t j = 0, rj = 0; !st && j < w; j += t->overlap, rj++) {
            int64_t tw = w - j < tl ? w - j : tl;
            /* the latent tile, contiguous [B, C, th, tw] */
            for (int64_t k = 0; k < B * C; k++)
                for (int64_t y = 0; y < th; y++)
                    memcpy(zt + ((size_t)k * (size_t)th + (size_t)y) * (size_t)tw,
                           z + ((size_t)k * (size_t)h + (size_t)(i + y)) * (size_t)w + (size_t)j, sizeof(float) * (size_t)tw);
            if ((st = run_decoder(vae, zt, B, C, th, tw, cur[rj], tile_cap))) {
                st = kb_wrap(st, "tiled decode: the tile at latent row %lld, column %lld", (long long)i, (long long)j);
                break;
            }
            int64_t sh = th * f, sw = tw * f;
            chh[rj] = sh;
            cw[rj] = sw;
            if (ri > 0) kv_blend_v(prev[rj], ph[rj], cur[rj], sh, B * OC, sw, t->blend);
            if (rj > 0) kv_blend_h(cur[rj - 1], cw[rj - 1], cur[rj], sw, B * OC, sh, t->blend);
            /* tile[:, :, :row_limit, :row_limit] into its place */
            int64_t kh = sh < t->row_limit ? sh : t->row_limit, kw = sw < t->row_limit ? sw : t->row_limit;
            if (out_y + kh > H || out_x + kw > W) {
                st = kb_fail(KILN_ERR_SHAPE, "tiled decode: tile (%lld, %lld) lands outside the %lldx%lld image",
                             (long long)i, (long long)j, (long long)H, (long long)W);
                break;
            }
            for (int64_t k = 0; k < B * OC; k++)
                for (int64_t y = 0; y < kh; y++)
                    memcpy(sample + ((size_t)k * (size_t)H + (size_t)(out_y + y)) * (size_t)W + (size_t)out_x,
                           cur[rj] + ((size_t)k * (size_t)sh + (size_t)y) * (size_t)sw, sizeof(float) * (size_t)kw);
            out_x += kw;
            keep_h = kh;
        }
        if (!st && out_x != W)
            st = kb_fail(KILN_ERR_SHAPE, "tiled decode: a row of tiles covers %lld of %lld columns", (long long)out_x,
                         (long long)W);
        out_y += keep_h;
        /* this row is the one above the next */
        float **sw = prev;
        prev = cur;
        cur = sw;
        memcpy(ph, chh, sizeof(int64_t) * (size_t)nj);
    }
    if (!st && out_y != H)
        st = kb_fail(KILN_ERR_SHAPE, "tiled decode: the tiles cover %lld of %lld rows", (long long)out_y, (long long)H);
    for (int64_t j = 0; j < nj; j++) {
        if (prev) free(prev[j]);
        if (cur) free(cur[j]);
    }
    free(prev), free(cur), free(ph), free(chh), free(cw), free(zt);
    return st;
}

kiln_status kiln_vae_decode(kiln_model *vae, const float *latents, const int64_t shape[4], const kiln_vae_opts *opts,
                            float *sample, kiln_vae_plan *plan_out) {
    const vae_config *c = NULL;
    kiln_status st = vae_cfg(vae, "vae-decoder", &c);
    if (st) return st;
    if (!latents || !shape || !sample)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_decode: latents, their shape and sample are required");
    kiln_vae_opts o = opts ? *opts : kiln_vae_defaults();
    kiln_vae_plan plan;
    if ((st = kiln_vae_plan_for(vae, shape, &o, &plan))) return st;
    int64_t B = shape[0], C = shape[1], h = shape[2], w = shape[3], f = vae_scale(c);
    size_t nz = (size_t)B * (size_t)C * (size_t)h * (size_t)w;
    const float *z = latents;
    float *scaled = NULL;
    if (!o.no_scale) {
        /* the pipeline's step before vae.decode, in f32: latents / scaling_factor + shift_factor */
        scaled = malloc(sizeof(float) * nz);
        if (!scaled) return kb_fail(KILN_ERR_NOMEM, "decode: out of memory for the latents");
        float sf = (float)c->scaling_factor, sh = c->has_shift ? (float)c->shift_factor : 0.0f;
        for (size_t i = 0; i < nz; i++) scaled[i] = latents[i] / sf + sh;
        z = scaled;
    }
    double t0 = kb_now();
    if (plan.tiled) {
        kv_tiling t = {0};
        st = kv_tiling_for(c, plan.tile_size, &t);
        if (!st) st = tiled(vae, c, z, shape, &t, sample);
    } else {
        st = run_decoder(vae, z, B, C, h, w, sample, (size_t)B * (size_t)c->out_channels * (size_t)(h * f) * (size_t)(w * f));
    }
    kb_ledger_add("vae decode", kb_now() - t0, plan.tiled ? "tiled" : "untiled");
    free(scaled);
    if (!st && plan_out) *plan_out = plan;
    return st;
}

kiln_status kiln_vae_decode_rgb(kiln_model *vae, const float *latents, const int64_t shape[4], const kiln_vae_opts *o,
                                uint8_t *rgb, float *sample, kiln_vae_plan *plan) {
    const vae_config *c = NULL;
    kiln_status st = vae_cfg(vae, "vae-decoder", &c);
    if (st) return st;
    if (!rgb || !shape) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_decode_rgb: shape and rgb are required");
    if ((st = vae_check_latent(c, shape[0], shape[2], shape[3]))) return st;
    int64_t f = vae_scale(c), H = shape[2] * f, W = shape[3] * f;
    size_t n = (size_t)shape[0] * (size_t)c->out_channels * (size_t)H * (size_t)W;
    float *x = sample ? sample : malloc(sizeof(float) * n);
    if (!x) return kb_fail(KILN_ERR_NOMEM, "decode: out of memory for a %lldx%lld image", (long long)H, (long long)W);
    st = kiln_vae_decode(vae, latents, shape, o, x, plan);
    if (!st) st = kiln_image_postprocess(x, shape[0], c->out_channels, (int)H, (int)W, rgb);
    if (!sample) free(x);
    return st;
}

char *kiln_image_path(const char *path, int64_t i, int64_t batch) {
    if (!path) return NULL;
    if (batch <= 1) return kb_strdup(path);
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (dot && slash && dot < slash) dot = NULL;
    if (dot == path || (slash && dot == slash + 1)) dot = NULL; /* ".png" alone is a name, not an extension */
    if (!dot) return kb_strfmt("%s-%lld", path, (long long)i);
    return kb_strfmt("%.*s-%lld%s", (int)(dot - path), path, (long long)i, dot);
}

kiln_status kiln_vae_write_png(kiln_model *vae, const float *latents, const int64_t shape[4], const kiln_vae_opts *o,
                               const char *path, const kiln_image_info *info, float *sample, kiln_vae_plan *plan) {
    const vae_config *c = NULL;
    kiln_status st = vae_cfg(vae, "vae-decoder", &c);
    if (st) return st;
    if (!path || !shape) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_write_png: a path and the shape are required");
    if ((st = vae_check_latent(c, shape[0], shape[2], shape[3]))) return st;
    if (c->out_channels != 3)
        return kb_fail(KILN_ERR_SHAPE, "the VAE decodes %d channels; a PNG needs 3 (RGB)", c->out_channels);
    int64_t B = shape[0], f = vae_scale(c), H = shape[2] * f, W = shape[3] * f;
    size_t px = (size_t)H * (size_t)W * 3;
    uint8_t *rgb = malloc(px * (size_t)B);
    if (!rgb) return kb_fail(KILN_ERR_NOMEM, "decode: out of memory for %lld images", (long long)B);
    st = kiln_vae_decode_rgb(vae, latents, shape, o, rgb, sample, plan);
    int64_t written = 0;
    for (int64_t b = 0; !st && b < B; b++) {
        char *p = kiln_image_path(path, b, B);
        st = p ? kiln_image_write_png(p, rgb + (size_t)b * px, (int)H, (int)W, info) : KILN_ERR_NOMEM;
        free(p);
        if (!st) written++;
    }
    /* nothing half-done: the files of this batch written before a failure go */
    for (int64_t b = 0; st && b < written; b++) {
        char *p = kiln_image_path(path, b, B);
        if (p) unlink(p);
        free(p);
    }
    free(rgb);
    return st;
}

/* ---- encode ----------------------------------------------------------- */

kiln_status kiln_vae_encode_rgb(kiln_model *enc, const uint8_t *rgb, int height, int width, int no_scale,
                                float **latents, int64_t shape[4]) {
    const vae_config *c = NULL;
    kiln_status st = vae_cfg(enc, "vae-encoder", &c);
    if (st) return st;
    if (!rgb || !latents || !shape)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_vae_encode_rgb: rgb, latents and shape are required");
    *latents = NULL;
    if (c->in_channels != 3)
        return kb_fail(KILN_ERR_SHAPE, "the VAE encodes %d channels; an RGB image has 3", c->in_channels);
    int64_t f = vae_scale(c);
    size_t n = (size_t)3 * (size_t)(height > 0 ? height : 0) * (size_t)(width > 0 ? width : 0);
    float *img = malloc(sizeof(float) * (n ? n : 1));
    if (!img) return kb_fail(KILN_ERR_NOMEM, "encode: out of memory for a %dx%d image", height, width);
    if ((st = kiln_image_preprocess(rgb, height, width, (int)f, img))) {
        free(img);
        return st;
    }
    int64_t h = height / f, w = width / f;
    size_t nl = (size_t)c->latent_channels * (size_t)h * (size_t)w;
    float *mean = malloc(sizeof(float) * nl), *stdv = malloc(sizeof(float) * nl);
    if (!mean || !stdv) st = kb_fail(KILN_ERR_NOMEM, "encode: out of memory for the latents");
    if (!st) {
        kiln_tensor in = {.name = "image", .dtype = KILN_F32, .ndim = 4, .shape = {1, 3, height, width}, .data = img};
        kiln_output out[2] = {{.name = "mean", .data = mean, .capacity = nl}, {.name = "std", .data = stdv, .capacity = nl}};
        st = kiln_run(enc, &in, 1, out, 2);
    }
    if (!st && !no_scale) {
        /* the pipeline's (x - shift_factor) * scaling_factor, f32 */
        float sf = (float)c->scaling_factor, sh = c->has_shift ? (float)c->shift_factor : 0.0f;
        for (size_t i = 0; i < nl; i++) mean[i] = (mean[i] - sh) * sf;
    }
    free(img);
    free(stdv);
    if (st) {
        free(mean);
        return st;
    }
    *latents = mean;
    shape[0] = 1, shape[1] = c->latent_channels, shape[2] = h, shape[3] = w;
    return KILN_OK;
}
