/* fuzz_pipeline_files.c - libFuzzer harness for a pipeline folder's own
 * files (src/pipeline/pipeline_files.c): model_index.json (the class and
 * the components it lists) and scheduler/scheduler_config.json (SD3's
 * schedule; every setting that would change it refused by name).
 * Input: one byte (even: model_index.json, odd: scheduler_config.json),
 * then the file's text. Properties beyond "no crash, no sanitizer report":
 * a failure leaves a message; an index that parses lists at most
 * KP_INDEX_MAX_PARTS components, each a plain folder name with its class,
 * and kp_index_lists finds each; a scheduler that parses gives a positive
 * finite shift and 1..100000 training steps, as SD3 reads it and as Flux
 * does (dynamic shifting allowed: then 1 <= base_seq < max_seq and finite
 * shifts of at most 100, the line's slope finite).
 * Seeds: tests/fuzz/corpus/pipeline_files (make_file_seeds.py). */
#include "base/base.h"
#include "fuzz_common.h"
#include "pipeline/pipeline_files.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 0) {
        kp_index ix;
        if (kp_index_parse(text, n, "model_index.json", &ix)) {
            KFZ_ASSERT(*kiln_last_error());
            return 0;
        }
        KFZ_ASSERT(ix.n >= 0 && ix.n <= KP_INDEX_MAX_PARTS);
        for (int i = 0; i < ix.n; i++) {
            const char *cls = NULL;
            KFZ_ASSERT(ix.part[i].name[0] && !strchr(ix.part[i].name, '/') && strcmp(ix.part[i].name, "..") &&
                       strcmp(ix.part[i].name, "."));
            KFZ_ASSERT(kp_index_lists(&ix, ix.part[i].name, &cls) && cls);
        }
    } else {
        double shift = -1;
        int steps = -1;
        if (kp_scheduler_parse(text, n, "scheduler", &shift, &steps)) {
            KFZ_ASSERT(*kiln_last_error());
            return 0;
        }
        KFZ_ASSERT(shift > 0 && isfinite(shift) && steps >= 1 && steps <= 100000);
    }
    if (data[0] % 2) { /* a Flux pipeline's reading: dynamic shifting allowed */
        kp_schedule s;
        if (kp_scheduler_parse_full(text, n, "scheduler", 1, &s)) {
            KFZ_ASSERT(*kiln_last_error());
            return 0;
        }
        KFZ_ASSERT(s.shift > 0 && isfinite(s.shift) && s.num_train_timesteps >= 1 && s.num_train_timesteps <= 100000);
        if (s.dynamic) {
            KFZ_ASSERT(s.base_seq >= 1 && s.max_seq > s.base_seq && fabs(s.base_shift) <= 100 && fabs(s.max_shift) <= 100);
            KFZ_ASSERT(isfinite((s.max_shift - s.base_shift) / (double)(s.max_seq - s.base_seq)));
        }
    }
    return 0;
}
