/* pipeline_files.h - a diffusers pipeline folder's own files, parsed from
 * their text (pipeline_files.c): model_index.json (the pipeline class and
 * the components it lists) and scheduler/scheduler_config.json (SD3's
 * flow-matching schedule, every setting that would make diffusers sample
 * another one refused by name). No file system, no models: the libFuzzer
 * harness tests/fuzz/fuzz_pipeline_files.c calls these alone. */
#ifndef KILN_PIPELINE_FILES_H
#define KILN_PIPELINE_FILES_H

#include "kiln.h"

#include <stddef.h>

#define KP_INDEX_MAX_PARTS 64

/* model_index.json: "_class_name" (cls, "" when absent or not a string) and
 * each component listed with a [library, class] pair whose class is a
 * string (not diffusers' [null, null] for an absent one), in file order */
typedef struct kp_index {
    char cls[128];
    int n;
    struct {
        char name[64], cls[128];
    } part[KP_INDEX_MAX_PARTS];
} kp_index;

/* text[0..n) (where: the file, for messages). KILN_ERR_FORMAT when it is
 * not a JSON object, when a listed name is not a plain folder name (no '/',
 * not "." or "..") or too long, or when it lists more than
 * KP_INDEX_MAX_PARTS components. */
kiln_status kp_index_parse(const char *text, size_t n, const char *where, kp_index *out);
/* 1 when the index lists component (and its class in *cls) */
int kp_index_lists(const kp_index *ix, const char *component, const char **cls);

/* scheduler_config.json of an SD3 pipeline: *shift and *num_train_timesteps
 * (a field the config leaves out takes FlowMatchEulerDiscreteScheduler's
 * default as diffusers builds it: shift 1.0, 1000 steps). KILN_ERR_UNSUPPORTED
 * naming the setting for another scheduler class, dynamic shifting, karras /
 * exponential / beta sigmas, inverted sigmas, stochastic sampling or a
 * shift_terminal; KILN_ERR_CONFIG for values out of range; KILN_ERR_FORMAT
 * for text that is not a JSON object. where: the scheduler folder. */
kiln_status kp_scheduler_parse(const char *text, size_t n, const char *where, double *shift, int *num_train_timesteps);

/* The whole schedule, dynamic shifting included where allow_dynamic (a
 * Flux pipeline's: the shift mu from the image's sequence length on the
 * line through (base_image_seq_len, base_shift) and (max_image_seq_len,
 * max_shift), time_shift_type "exponential"); refusals as kp_scheduler_parse */
typedef struct kp_schedule {
    double shift;
    int num_train_timesteps;
    int dynamic;
    double base_shift, max_shift;
    int64_t base_seq, max_seq;
} kp_schedule;
kiln_status kp_scheduler_parse_full(const char *text, size_t n, const char *where, int allow_dynamic, kp_schedule *out);

#endif
