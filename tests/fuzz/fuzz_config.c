/* fuzz_config.c - libFuzzer harness for config.json parsing of the SD3
 * backbone (sd3_config_parse, src/model/sd3_config.c).
 *
 * The input is config.json text. Properties checked beyond "no crash, no
 * sanitizer report": a failure leaves a message; a config that parses is
 * valid (sd3_config_validate), serialises (sd3_config_to_json), parses back
 * to the same config, and gives a weight list whose shapes are positive;
 * the latent check accepts the config's own sample size or says why not. */
#include "fuzz_common.h"

#include "base/base.h"
#include "arch/sd3/sd3.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = kfz_cstr(data, size);
    kb_clear_error();
    kiln_config cfg;
    kiln_status st = sd3_config_parse(json, &cfg);
    free(json);
    if (st != KILN_OK) {
        KFZ_ASSERT(kiln_last_error()[0]);
        return 0;
    }
    KFZ_ASSERT(sd3_config_validate(&cfg) == KILN_OK);

    char *again = sd3_config_to_json(&cfg);
    KFZ_ASSERT(again);
    kiln_config back;
    st = sd3_config_parse(again, &back);
    if (st != KILN_OK) fprintf(stderr, "kiln fuzz: reparsing %s: %s\n", again, kiln_last_error());
    free(again);
    KFZ_ASSERT(st == KILN_OK);
    KFZ_ASSERT(!memcmp(&cfg, &back, sizeof cfg));

    ka_spec *spec = NULL;
    size_t n = 0;
    if (sd3_weight_spec(&cfg, &spec, &n) == KILN_OK) {
        for (size_t i = 0; i < n; i++) {
            KFZ_ASSERT(spec[i].ndim >= 1 && spec[i].ndim <= 4);
            for (int d = 0; d < spec[i].ndim; d++) KFZ_ASSERT(spec[i].shape[d] > 0);
        }
        free(spec);
    } else {
        KFZ_ASSERT(kiln_last_error()[0]);
    }
    int64_t hw = (int64_t)cfg.sample_size;
    if (sd3_check_latent(&cfg, hw, hw) != KILN_OK) KFZ_ASSERT(kiln_last_error()[0]);
    return 0;
}
