/* fuzz_single_file.c - libFuzzer harness for an all-in-one SD3 or Flux file as a
 * pipeline's source (src/pipeline/single_file.c: which component prefixes
 * it holds) and each component's config inferred from its tensors' shapes
 * (the families' *_config_infer, through the checkpoint layer's prefix view
 * and renamers: kc_open_part), as `kiln generate FILE --tokenizers DIR`
 * reads a file with no config.json. Input: a .safetensors file.
 * Properties beyond "no crash, no sanitizer report": a failure leaves a
 * message; a config that is inferred validates, serialises, and parses back
 * to the same JSON. Seeds: tests/fuzz/corpus/single_file (make_file_seeds.py:
 * the test data's all-in-one shapes, cut small). */
#include "arch/clip/clip.h"
#include "arch/flux/flux.h"
#include "arch/sd3/sd3.h"
#include "arch/t5/t5.h"
#include "arch/vae/vae.h"
#include "base/base.h"
#include "format/checkpoint.h"
#include "fuzz_common.h"
#include "pipeline/component.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const kc_renamer *const k_renamers[] = {&sd3_renamer, &flux_renamer, &t5_renamer, &vae_ldm_renamer, NULL};

/* infer, validate, serialise and parse back: the same JSON */
static void infer(const kc_checkpoint *c, const char *family) {
    char *j1 = NULL, *j2 = NULL;
    kiln_status st;
    if (!strcmp(family, "sd3")) {
        kiln_config a, b;
        if ((st = sd3_config_infer(c, &a))) goto fail;
        KFZ_ASSERT(sd3_config_validate(&a) == KILN_OK);
        KFZ_ASSERT((j1 = sd3_config_to_json(&a)) && sd3_config_parse(j1, &b) == KILN_OK && (j2 = sd3_config_to_json(&b)));
    } else if (!strncmp(family, "flux", 4)) {
        flux_config a, b;
        if ((st = flux_config_infer(c, &a, !strcmp(family, "flux")))) goto fail;
        KFZ_ASSERT(flux_config_validate(&a) == KILN_OK);
        KFZ_ASSERT((j1 = flux_config_to_json(&a)) && flux_config_parse(j1, &b) == KILN_OK && (j2 = flux_config_to_json(&b)));
    } else if (!strcmp(family, "clip")) {
        clip_config a, b;
        if ((st = clip_config_infer(c, &a))) goto fail;
        KFZ_ASSERT(clip_config_validate(&a) == KILN_OK);
        KFZ_ASSERT((j1 = clip_config_to_json(&a)) && clip_config_parse(j1, &b) == KILN_OK && (j2 = clip_config_to_json(&b)));
    } else if (!strcmp(family, "t5")) {
        t5_config a, b;
        if ((st = t5_config_infer(c, &a))) goto fail;
        KFZ_ASSERT(t5_config_validate(&a) == KILN_OK);
        KFZ_ASSERT((j1 = t5_config_to_json(&a)) && t5_config_parse(j1, &b) == KILN_OK && (j2 = t5_config_to_json(&b)));
    } else {
        vae_config a, b;
        if ((st = vae_config_infer(c, &a))) goto fail;
        KFZ_ASSERT(vae_config_validate(&a) == KILN_OK);
        KFZ_ASSERT((j1 = vae_config_to_json(&a)) && vae_config_parse(j1, &b) == KILN_OK && (j2 = vae_config_to_json(&b)));
    }
    KFZ_ASSERT(!strcmp(j1, j2));
    free(j1);
    free(j2);
    return;
fail:
    KFZ_ASSERT(*kiln_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[700];
    kfz_write("all-in-one.safetensors", data, size, path, sizeof path);
    int single = kp_is_single_file(path);
    kp_source src;
    kiln_status st = kp_source_init(path, NULL, &src);
    if (st) {
        KFZ_ASSERT(*kiln_last_error());
        KFZ_ASSERT(!single); /* what kp_is_single_file calls one, kp_source_init opens */
        return 0;
    }
    static const char *const parts[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        const char *prefix = NULL, *family = NULL;
        if (!kp_part_lookup(path, parts[i], &prefix, &family, NULL)) { /* a Flux file has no third text encoder */
            KFZ_ASSERT(kp_file_is_flux(path) && !strcmp(parts[i], "text_encoder_3") && !kp_has_component(&src, parts[i]));
            continue;
        }
        if (!kp_has_component(&src, parts[i])) continue;
        kc_checkpoint *c = NULL;
        if ((st = kc_open_part(path, prefix, NULL, NULL, k_renamers, &c))) {
            KFZ_ASSERT(*kiln_last_error());
            continue;
        }
        infer(c, family);
        kc_close(c);
    }
    KFZ_ASSERT(kp_check_tokenizers(&src) != KILN_OK); /* no tokenizers folder was given */
    return 0;
}
