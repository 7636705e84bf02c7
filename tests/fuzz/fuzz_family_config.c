/* fuzz_family_config.c - libFuzzer harness for the config.json parsers of
 * the CLIP, T5, VAE and Flux families (clip_config.c, t5_config.c,
 * vae_config.c, flux_config.c).
 *
 * The input's first byte picks the family (mod 4), the rest is config.json
 * text. Properties checked beyond "no crash, no sanitizer report": a
 * failure leaves a message; a config that parses is valid, serialises,
 * parses back to the same config, and its weight list (when it can be made)
 * has positive shapes; the VAE's latent check takes a 1x1x1 latent or says
 * why not, Flux's a 2x2 one (and refuses 1x1). Seeds: tests/fuzz/corpus/
 * family_config (the cases' configs; Flux's with first byte 3). */
#include "fuzz_common.h"

#include "arch/clip/clip.h"
#include "arch/flux/flux.h"
#include "arch/t5/t5.h"
#include "arch/vae/vae.h"
#include "base/base.h"

static void check_spec(kiln_status st, ka_spec *spec, size_t n) {
    if (st != KILN_OK) {
        KFZ_ASSERT(kiln_last_error()[0]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        KFZ_ASSERT(spec[i].ndim >= 1 && spec[i].ndim <= 4);
        for (int d = 0; d < spec[i].ndim; d++) KFZ_ASSERT(spec[i].shape[d] > 0);
    }
    free(spec);
}

#define ROUND_TRIP(T, parse, validate, to_json, spec_fn)                                                   \
    do {                                                                                                    \
        T cfg, back;                                                                                        \
        if (parse(json, &cfg) != KILN_OK) {                                                                 \
            KFZ_ASSERT(kiln_last_error()[0]);                                                               \
            break;                                                                                          \
        }                                                                                                   \
        KFZ_ASSERT(validate(&cfg) == KILN_OK);                                                              \
        char *again = to_json(&cfg);                                                                        \
        KFZ_ASSERT(again);                                                                                  \
        kiln_status rt = parse(again, &back);                                                               \
        if (rt != KILN_OK) fprintf(stderr, "kiln fuzz: reparsing %s: %s\n", again, kiln_last_error());      \
        free(again);                                                                                        \
        KFZ_ASSERT(rt == KILN_OK && !memcmp(&cfg, &back, sizeof cfg));                                      \
        ka_spec *spec = NULL;                                                                               \
        size_t n = 0;                                                                                       \
        check_spec(spec_fn(&cfg, &spec, &n), spec, n);                                                      \
        if (family == 2 && vae_check_latent((const vae_config *)(const void *)&cfg, 1, 1, 1) != KILN_OK)    \
            KFZ_ASSERT(kiln_last_error()[0]);                                                               \
        if (family == 3) {                                                                                  \
            const flux_config *fc = (const flux_config *)(const void *)&cfg;                                \
            KFZ_ASSERT(flux_check_latent(fc, 2, 2) == KILN_OK && flux_check_latent(fc, 1, 1) != KILN_OK);   \
        }                                                                                                   \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int family = data[0] % 4;
    char *json = kfz_cstr(data + 1, size - 1);
    kb_clear_error();
    if (family == 0) ROUND_TRIP(clip_config, clip_config_parse, clip_config_validate, clip_config_to_json, clip_weight_spec);
    else if (family == 1) ROUND_TRIP(t5_config, t5_config_parse, t5_config_validate, t5_config_to_json, t5_weight_spec);
    else if (family == 2) ROUND_TRIP(vae_config, vae_config_parse, vae_config_validate, vae_config_to_json, vae_weight_spec);
    else ROUND_TRIP(flux_config, flux_config_parse, flux_config_validate, flux_config_to_json, flux_weight_spec);
    free(json);
    return 0;
}
