/* embed.c - kiln embedded in a program, through the public API alone
 * (include/kiln.h, libkiln): the example of docs/api.md, which the test
 * suite builds against an installed prefix and runs (tests/test_install.sh).
 *
 *     cc -std=c11 embed.c $(pkg-config --cflags --libs kiln) -o embed
 *     ./embed DIR
 *
 * In DIR it writes a seeded tiny SD3.5-style model (a diffusers folder) and
 * seeded text conditioning (safetensors), loads the model through the weight
 * cache (DIR/cache: converted and published on the first run, mapped on every
 * later one), samples a latent with CFG, and writes it as DIR/latents
 * .safetensors and DIR/latents.png. A real program loads a real checkpoint
 * (source = ".../sd3.5-medium/transformer") and real prompt embeddings. */
#include <kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        kiln_status s_ = (call);                                                         \
        if (s_ != KILN_OK) {                                                             \
            fprintf(stderr, "embed: %s: %s (%s)\n", #call, kiln_last_error(),            \
                    kiln_status_name(s_));                                               \
            goto fail;                                                                   \
        }                                                                                \
    } while (0)

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void on_step(void *user, int step, int steps, double sigma, const float *latent) {
    (void)user;
    (void)latent;
    fprintf(stderr, "  step %d/%d  sigma %.4f\n", step, steps, sigma);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    if (strcmp(kiln_version(), KILN_VERSION)) { /* a libkiln.so of another version */
        fprintf(stderr, "embed: built against kiln %s, running with %s\n", KILN_VERSION, kiln_version());
        return 1;
    }
    printf("kiln %s\n", kiln_version());
    int rc = 1, T = 16;
    kiln_model *m = NULL;
    kiln_tensor *cond = NULL;
    size_t n_cond = 0;
    float *buf = NULL, *latents = NULL;
    uint8_t *rgb = NULL;
    char *model_dir = join(dir, "model"), *cache = join(dir, "cache"), *cond_path = join(dir, "cond.safetensors"),
         *lat_path = join(dir, "latents.safetensors"), *png_path = join(dir, "latents.png");
    if (!model_dir || !cache || !cond_path || !lat_path || !png_path) goto fail;

    /* 1. a checkpoint to load: the demo's tiny config with seeded weights,
     *    written once (the cache key follows the source files: rewriting
     *    them would make the next run a miss) */
    kiln_config cfg = kiln_config_demo();
    char *cfg_json = join(model_dir, "config.json");
    FILE *f = cfg_json ? fopen(cfg_json, "r") : NULL;
    free(cfg_json);
    if (f) fclose(f);
    else CHECK(kiln_write_seeded_model(model_dir, &cfg, 7, KILN_BF16));

    /* 2. conditioning as a pipeline's text encoders would hand it over:
     *    prompt_embeds [1, T, J], pooled_prompt_embeds [1, P] and the negatives */
    size_t ne = (size_t)T * (size_t)cfg.joint_attention_dim, np = (size_t)cfg.pooled_projection_dim;
    if (!(buf = malloc(sizeof(float) * 2 * (ne + np)))) goto fail;
    kiln_noise(11, buf, 2 * (ne + np));
    kiln_tensor out[4] = {
        {"prompt_embeds", KILN_F32, 3, {1, T, cfg.joint_attention_dim}, buf},
        {"pooled_prompt_embeds", KILN_F32, 2, {1, cfg.pooled_projection_dim}, buf + ne},
        {"negative_prompt_embeds", KILN_F32, 3, {1, T, cfg.joint_attention_dim}, buf + ne + np},
        {"negative_pooled_prompt_embeds", KILN_F32, 2, {1, cfg.pooled_projection_dim}, buf + 2 * ne + np},
    };
    CHECK(kiln_tensors_write(cond_path, 4, out));
    CHECK(kiln_tensors_read(cond_path, &cond, &n_cond));
    const char *names[4] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                            "negative_pooled_prompt_embeds"};
    const kiln_tensor *c[4];
    for (int i = 0; i < 4; i++)
        if (!(c[i] = kiln_tensors_find(cond, n_cond, names[i])) || c[i]->dtype != KILN_F32) {
            fprintf(stderr, "embed: %s: no f32 tensor %s\n", cond_path, names[i]);
            goto fail;
        }

    /* 3. the load flow: the weight cache under DIR/cache (a miss converts and
     *    publishes; the second load in this process shares the first) */
    kiln_load_opts lo = kiln_load_defaults();
    lo.model_name = "embed-tiny";
    lo.cache_root = cache;
    lo.source = model_dir;
    CHECK(kiln_load_model(&lo, &m));
    printf("weights: %s %s\n", kiln_model_origin(m), kiln_model_cache_path(m));

    /* 4. sample: 4 Euler steps with CFG at a 32x48 latent */
    kiln_generate_opts o = kiln_generate_defaults();
    o.steps = 4;
    o.guidance = 5;
    o.seed = 1;
    o.latent_h = 32;
    o.latent_w = 48;
    o.context_len = (int)c[0]->shape[1];
    o.cond = c[0]->data;
    o.cond_pooled = c[1]->data;
    o.uncond = c[2]->data;
    o.uncond_pooled = c[3]->data;
    o.on_step = on_step;
    const kiln_config *mc = kiln_model_config(m);
    size_t n = (size_t)mc->in_channels * (size_t)o.latent_h * (size_t)o.latent_w;
    if (!(latents = malloc(sizeof(float) * n)) || !(rgb = malloc((size_t)o.latent_h * (size_t)o.latent_w * 3)))
        goto fail;
    CHECK(kiln_generate(m, &o, latents));
    printf("backbone: %s\n", kiln_model_last_exec(m));

    /* 5. the results: the latents as safetensors, a look at them as PNG */
    kiln_tensor lt = {"latents", KILN_F32, 4, {1, mc->in_channels, o.latent_h, o.latent_w}, latents};
    CHECK(kiln_tensors_write(lat_path, 1, &lt));
    CHECK(kiln_latent_to_rgb(latents, mc->in_channels, o.latent_h, o.latent_w, rgb));
    const char *text[] = {"Software", "kiln embed example"};
    CHECK(kiln_png_write(png_path, rgb, o.latent_h, o.latent_w, text, 1));
    for (size_t i = 0; i < n; i++)
        if (!(latents[i] == latents[i])) {
            fprintf(stderr, "embed: latent %zu is NaN\n", i);
            goto fail;
        }
    printf("wrote %s and %s\n", lat_path, png_path);
    rc = 0;
fail:
    kiln_model_free(m);
    kiln_tensors_free(cond);
    free(buf);
    free(latents);
    free(rgb);
    free(model_dir);
    free(cache);
    free(cond_path);
    free(lat_path);
    free(png_path);
    return rc;
}
